"""Whether the host can read a selector now: one rule, and the eager fast path's copy.

``host.host_readable`` answers for every situation that asks (its ``asker``). The
eager fast path (``_C.taken_branch``, ``csrc/eager.cpp``) keeps a copy in C for speed;
the table below pins the rule's answers and checks that the copy agrees with it: the
fast path runs exactly where the rule reads and the fast path handles the selector (a
plain one-element tensor of a cond dtype, with no CUDA graph capturing).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

from torchcond import _C
from torchcond._src.api import _EAGER as EAGER
from torchcond._src.host import PLAIN, TRANSFORM, UNDER_MODE, host_readable
from torchcond._src.ops import cond_op


class Quiet(TorchDispatchMode):
    """A mode that traces nothing: it runs every op as given."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def answers(selector) -> dict:
    """Every asker's answer, and whether the eager fast paths took a branch."""
    x = torch.ones(2)
    fast = _C.taken_branch(EAGER, selector, torch.cos, torch.sin, (x,)) is not None
    integral = isinstance(selector, torch.Tensor) and not selector.is_floating_point()
    if integral and selector.dtype not in (torch.bool, torch.uint64) and not selector.is_complex():
        # switch's fast path reads an integer selector under the same rule.
        assert (_C.taken_case(EAGER, selector, [torch.cos, torch.sin], (x,)) is not None) == fast
    return {
        "plain": host_readable(selector, PLAIN),
        "under_mode": host_readable(selector, UNDER_MODE, cond_op),
        "transform": host_readable(selector, TRANSFORM, cond_op),
        "fast": fast,
    }


def plain(selector):
    return lambda: answers(selector)


def fake_outside_its_mode():
    return answers(FakeTensorMode().from_tensor(torch.tensor(True)))


def fake_inside_its_mode():
    mode = FakeTensorMode()
    fake = mode.from_tensor(torch.tensor(True))
    with mode:
        return answers(fake)


def under_make_fx():
    seen = []
    make_fx(lambda x: seen.append(answers(x > 0)) or x)(torch.ones(()))
    return seen[0]


def under_quiet_mode():
    p = torch.tensor(True)
    with Quiet():
        return answers(p)


def vmapped(batched: bool):
    def run():
        seen = []
        p = torch.tensor(True)
        torch.vmap(lambda v: seen.append(answers(v > 0 if batched else p)) or v)(torch.ones(3))
        return seen[0]

    return run


def under_grad():
    seen = []

    def f(x):
        seen.append(answers(x > 0))
        return x.sum()

    torch.func.grad(f)(torch.ones(()))
    return seen[0]


def symbolic(kind: str):
    def run():
        s = ShapeEnv().create_unbacked_symint()
        return answers(s if kind == "SymInt" else s > 0)

    return run


def cuda_graph_capturing():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: no CUDA graph to capture")
    p = torch.tensor(True, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        return answers(p)


ALL, NONE = (True, True, True), (False, False, False)
# name: (the situation, (plain, under_mode, transform), whether the fast path handles it)
CASES = {
    "bool 0-d": (plain(torch.tensor(True)), ALL, True),
    "float one element": (plain(torch.tensor([0.5])), ALL, True),
    "int 0-d": (plain(torch.tensor(3)), ALL, True),
    "several elements": (plain(torch.tensor([1.0, 2.0])), ALL, False),
    "complex tensor": (plain(torch.tensor(1j)), ALL, False),
    "meta tensor": (plain(torch.ones((), device="meta")), NONE, True),
    "fake tensor": (fake_outside_its_mode, NONE, True),
    "fake tensor in its mode": (fake_inside_its_mode, NONE, True),
    "under make_fx": (under_make_fx, NONE, True),
    "under a mode that traces nothing": (under_quiet_mode, (False, True, True), False),
    "vmap, batched selector": (vmapped(batched=True), NONE, True),
    "vmap, unbatched selector": (vmapped(batched=False), ALL, True),
    "grad, wrapped selector": (under_grad, (True, False, True), True),
    "cuda graph capturing": (cuda_graph_capturing, ALL, False),
    "SymBool": (symbolic("SymBool"), NONE, False),
    "SymInt": (symbolic("SymInt"), NONE, False),
    "Python bool": (plain(True), ALL, False),
    "Python int": (plain(2), ALL, False),
    "Python float": (plain(0.5), NONE, False),
    "Python complex": (plain(1j), NONE, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_rule_answers_as_the_table_says(name):
    situation, expected, _ = CASES[name]
    got = situation()
    assert (got["plain"], got["under_mode"], got["transform"]) == expected


@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_path_reads_where_the_rule_does(name):
    situation, _, handled = CASES[name]
    got = situation()
    assert got["fast"] == (got["plain"] and handled)
