"""AOTInductor: export with a dynamic batch, ``aoti_compile_and_package``, ``aoti_load_package``.

A deployed model is C++: the conditionals must survive as branches chosen at run
time in the generated code, for every batch size the package accepts. Two modules,
each compiled once per test session (an AOTInductor compile is a C++ build, ~10 s on
2 cores):

* ``Combined``: a data-dependent cond over Linear layers, a nested cond, a cond on a
  shape predicate (``x.shape[0] > 4``) and a three-way switch, one after the other;
* ``KVCache``: a branch that writes a registered buffer in place (a cache row
  ``index_copy_`` and a step counter ``add_``), read again after the conditional.

Each package runs on inputs that take every branch (the eager reference, a Python
``if``, records the branches taken and the test checks that every one was) at several
batch sizes on both sides of the shape predicate, and must give eager's outputs and,
for the KV cache, eager's buffer state after every call. The same two modules written
with ``torch.cond`` (a switch as nested ``torch.cond``) are deployed the same way and
must give the same results (parity), where torch.cond exports them.

The packages run with ``AOTI_RUNTIME_CHECK_INPUTS=1``: each checks its inputs against
the size range it was compiled for and each conditional's output against the size and
stride its wrapper assumed. Batch sizes start at 2: export's ``Dim(min=1)`` still
compiles for >= 2 (0/1 specialization), and the checked package refuses 1.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from helpers import TORCH_VERSION
from torch.export import Dim

import torchcond

# Tests check results, not speed: an unoptimised wrapper compiles in about half the time.
AOTI_CONFIGS = {"aot_inductor.compile_wrapper_opt_level": "O0"}
BATCH = Dim("batch", min=2, max=64)
SIZES = (2, 3, 4, 5, 9, 64)  # the shape predicate is x.shape[0] > 4
FEATURES = 8


# --- the three ways of writing a conditional --------------------------------------------


class PythonIf:
    """The eager reference: a Python ``if``, recording which branch each call took."""

    def __init__(self):
        self.taken: set[tuple[str, int]] = set()

    def cond(self, pred, true_fn, false_fn, operands):
        fn = true_fn if bool(pred) else false_fn
        self.taken.add((fn.__name__, -1))
        return fn(*operands)

    def switch(self, index, branches, operands):
        i = min(max(int(index), 0), len(branches) - 1)
        self.taken.add(("switch", i))
        return branches[i](*operands)


class TorchCond:
    """``torch.cond``, with a switch written as nested ``torch.cond`` (same clamping)."""

    cond = staticmethod(torch.cond)

    @staticmethod
    def switch(index, branches, operands):
        first, second, third = branches
        return torch.cond(
            index <= 0,
            first,
            lambda *ops: torch.cond(index == 1, second, third, ops),
            operands,
        )


class TorchCondLib:
    cond = staticmethod(torchcond.cond)
    switch = staticmethod(torchcond.switch)


# --- the modules ------------------------------------------------------------------------


class Combined(torch.nn.Module):
    def __init__(self, lib):
        super().__init__()
        self.lib = lib
        gen = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(FEATURES, FEATURES)
        self.b = torch.nn.Linear(FEATURES, FEATURES)
        self.c = torch.nn.Linear(FEATURES, FEATURES)
        with torch.no_grad():  # the same weights in every instance
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, x, i):
        cond, switch = self.lib.cond, self.lib.switch

        def linear_a(x):
            return self.a(x)

        def linear_b(x):
            return self.b(x).relu()

        y = cond(x.sum() > 0, linear_a, linear_b, (x,))  # data-dependent, over Linear layers

        def inner_true(y, x):
            return y * 2 + x

        def inner_false(y, x):
            return self.c(y) - x

        def outer_true(y, x):
            return cond(x[:, 0].sum() > 0, inner_true, inner_false, (y, x))  # nested

        def outer_false(y, x):
            return y - 1

        z = cond(x[:, 1].sum() > 0, outer_true, outer_false, (y, x))

        def big_batch(z):
            return z.sin()

        def small_batch(z):
            return z.cos() + 1

        w = cond(x.shape[0] > 4, big_batch, small_batch, (z,))  # shape predicate
        return switch(i, [lambda w: w + 1, lambda w: w * 3, lambda w: w.tanh()], (w,))


def combined_inputs():
    """Every sign pattern of the three data predicates, every switch index (two out of
    range), at every size: x[:, 0] and x[:, 1] decide the nested conds, x[:, 2] (ten
    times larger than the rest) the sign of x.sum()."""
    gen = torch.Generator().manual_seed(1)
    for n, signs, i in itertools.product(
        SIZES, itertools.product((1.0, -1.0), repeat=3), (-2, 0, 1, 2, 7)
    ):
        x = torch.rand(n, FEATURES, generator=gen) * 0.5
        x[:, 0], x[:, 1], x[:, 2] = signs[0], signs[1], signs[2] * 10
        yield x, torch.tensor(i)


COMBINED_BRANCHES = {
    *((name, -1) for name in ("linear_a", "linear_b", "inner_true", "inner_false")),
    *((name, -1) for name in ("outer_true", "outer_false", "big_batch", "small_batch")),
    *(("switch", i) for i in range(3)),
}


class KVCache(torch.nn.Module):
    """A decoder-style cache: one branch writes rows and counts its calls, the other reads."""

    def __init__(self, lib):
        super().__init__()
        self.lib = lib
        self.register_buffer("cache", torch.zeros(16, 4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, pos):
        def prefill(x, pos):
            self.cache.index_copy_(0, pos, x)
            self.steps.add_(1)
            return self.cache.index_select(0, pos) * 2  # reads its own write

        def decode(x, pos):
            return self.cache.index_select(0, pos) - x

        out = self.lib.cond(x.sum() > 0, prefill, decode, (x, pos))
        return out + self.cache.sum(0) + self.steps  # reads the written buffers after it


def kv_inputs():
    """Writes and reads interleaved, at several batch sizes, rows overwritten and read back."""
    steps = [(2, 0, 1.0), (2, 1, -1.0), (5, 3, 3.0), (2, 4, -1.0), (9, 7, 0.5), (4, 0, -2.0)]
    steps += [(2, 14, 4.0), (16, 0, -1.0), (3, 1, 2.0), (16, 0, -0.5)]
    for n, start, value in steps:
        x = torch.full((n, 4), value) + torch.arange(n * 4.0).reshape(n, 4) / 100 * (value > 0)
        yield x, torch.arange(start, start + n)


# --- deployment -------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def check_inputs():
    """The packages check every input's sizes against the range they were compiled for,
    and every conditional's output against the size and stride the wrapper assumed
    (``AOTI_RUNTIME_CHECK_INPUTS``, read by a package at its first call): a batch size
    outside what the package was built for fails instead of running by chance."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")
        yield


def deploy(module, args, dynamic_shapes, folder):
    """export -> aoti_compile_and_package -> aoti_load_package; returns the package's path."""
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return torch._inductor.aoti_compile_and_package(
        ep, package_path=str(folder / "model.pt2"), inductor_configs=AOTI_CONFIGS
    )


def deploy_unless_torch_refuses(module, args, dynamic_shapes, folder):
    """The torch.cond twin of the KV cache; None on torch 2.11, whose torch.cond
    refuses a branch that writes its input (checked here, so a change shows)."""
    if TORCH_VERSION >= (2, 13):
        return deploy(module, args, dynamic_shapes, folder)
    with pytest.raises(Exception, match="input mutation"):
        deploy(module, args, dynamic_shapes, folder)
    return None


@pytest.fixture(scope="module")
def combined_package(tmp_path_factory):
    return deploy(
        Combined(TorchCondLib),
        (torch.randn(6, FEATURES), torch.tensor(1)),
        ({0: BATCH}, None),
        tmp_path_factory.mktemp("combined"),
    )


@pytest.fixture(scope="module")
def combined_torch_cond_package(tmp_path_factory):
    return deploy(
        Combined(TorchCond),
        (torch.randn(6, FEATURES), torch.tensor(1)),
        ({0: BATCH}, None),
        tmp_path_factory.mktemp("combined_torch_cond"),
    )


KV_DYNAMIC = ({0: Dim("rows", min=2, max=16)}, {0: Dim("rows", min=2, max=16)})


@pytest.fixture(scope="module")
def kv_package(tmp_path_factory):
    return deploy(
        KVCache(TorchCondLib),
        (torch.ones(3, 4), torch.arange(3)),
        KV_DYNAMIC,
        tmp_path_factory.mktemp("kv"),
    )


@pytest.fixture(scope="module")
def kv_torch_cond_package(tmp_path_factory):
    with torch.no_grad():  # torch.cond takes a write in inference only
        return deploy_unless_torch_refuses(
            KVCache(TorchCond),
            (torch.ones(3, 4), torch.arange(3)),
            KV_DYNAMIC,
            tmp_path_factory.mktemp("kv_torch_cond"),
        )


def load(path):
    return torch._inductor.aoti_load_package(path)


# --- tests ------------------------------------------------------------------------------


@functools.cache
def combined_expected():
    """Eager (Python ``if``) outputs for combined_inputs(), and the branches they took."""
    lib = PythonIf()
    reference = Combined(lib)
    with torch.no_grad():
        outputs = [reference(x, i) for x, i in combined_inputs()]
    return outputs, lib.taken


def test_combined_reference_takes_every_branch():
    _, taken = combined_expected()
    assert taken == COMBINED_BRANCHES


def test_combined_package_matches_eager(combined_package):
    package = load(combined_package)
    expected, _ = combined_expected()
    for (x, i), want in zip(combined_inputs(), expected, strict=True):
        torch.testing.assert_close(
            package(x, i), want, msg=lambda m, n=x.shape[0], i=i: f"batch {n}, index {i}: {m}"
        )


def test_combined_eager_torchcond_matches_python_if():
    """The module the package came from, run eagerly, is the reference's twin."""
    expected, _ = combined_expected()
    module = Combined(TorchCondLib)
    with torch.no_grad():
        for (x, i), want in zip(combined_inputs(), expected, strict=True):
            torch.testing.assert_close(module(x, i), want)


def test_combined_torch_cond_parity(combined_package, combined_torch_cond_package):
    ours, theirs = load(combined_package), load(combined_torch_cond_package)
    for x, i in combined_inputs():
        torch.testing.assert_close(ours(x, i), theirs(x, i))


def run_kv(run, buffers):
    """Calls ``run`` on kv_inputs() beside an eager Python-``if`` reference: outputs and
    (when ``buffers`` is given: the tensors the package writes) the buffers after each call."""
    lib = PythonIf()
    reference = KVCache(lib)
    outputs = []
    with torch.no_grad():
        for step, (x, pos) in enumerate(kv_inputs()):
            got, want = run(x, pos), reference(x, pos)
            torch.testing.assert_close(got, want, msg=lambda m, s=step: f"call {s}: {m}")
            outputs.append(got)
            for name, tensor in (buffers or {}).items():
                torch.testing.assert_close(
                    tensor,
                    getattr(reference, name),
                    msg=lambda m, s=step, name=name: f"{name} after call {s}: {m}",
                )
    assert lib.taken == {("prefill", -1), ("decode", -1)}
    assert int(reference.steps) == 5
    return outputs


def user_managed_buffers(package):
    """Fresh zero buffers handed to the package as its constants: it writes into them."""
    buffers = {name: b.clone() for name, b in KVCache(TorchCondLib).named_buffers()}
    assert sorted(package.get_constant_fqns()) == sorted(buffers)
    package.load_constants(buffers, check_full_update=True, user_managed=True)
    return buffers


def test_kv_package_state_persists_between_calls(kv_package):
    """The package keeps its own copy of the buffers: every output depends on them."""
    run_kv(load(kv_package), None)


def test_kv_package_writes_the_buffers_in_place(kv_package):
    package = load(kv_package)
    buffers = user_managed_buffers(package)
    run_kv(package, buffers)


def test_kv_torch_cond_parity(kv_package, kv_torch_cond_package):
    if kv_torch_cond_package is None:
        return  # torch.cond cannot deploy it here (checked in the fixture): nothing to compare
    ours, theirs = load(kv_package), load(kv_torch_cond_package)
    ours_buffers, theirs_buffers = user_managed_buffers(ours), user_managed_buffers(theirs)
    for x, pos in kv_inputs():
        torch.testing.assert_close(ours(x, pos), theirs(x, pos))
        for name in ours_buffers:
            torch.testing.assert_close(ours_buffers[name], theirs_buffers[name])


# --- selectors read from buffers that the program writes --------------------------------


class BufferSelectors(torch.nn.Module):
    """PyTorch's ``test_cond_predicate_on_cpu``, widened: each conditional reads its
    selector from a buffer that the program writes after it. A one-element bool flag,
    a 0-d int flag (cond reads ``flag != 0``) and a one-element int8 index (switch
    clamps it). The package must read each buffer when it runs, not fold it into a
    constant at compile time."""

    def __init__(self):
        super().__init__()
        self.register_buffer("flag", torch.zeros(1, dtype=torch.bool))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("index", torch.full((1,), -1, dtype=torch.int8))

    def forward(self, x, i):
        a = torchcond.cond(self.flag, lambda x: x + 2, lambda x: x + 1, (x,))
        b = torchcond.cond(self.count, lambda x: x + 2, lambda x: x + 1, (x,))
        c = torchcond.switch(self.index, [lambda x: x + 1, lambda x: x + 2, lambda x: x + 3], (x,))
        # Writes that do not read the buffer: torch 2.13's AOTInductor also folds the
        # read in ``self.index.add_(1)`` (the user's own op), with torch.cond too.
        self.flag.fill_(True)
        self.count.fill_(7)
        self.index.copy_(i)
        return a, b, c


def test_package_reads_buffer_selectors_when_it_runs(tmp_path):
    indices = [torch.tensor([k], dtype=torch.int8) for k in (1, 2, 0, 5)]
    eager = BufferSelectors()
    expected = [[float(t[0]) for t in eager(torch.zeros(3), i)] for i in indices]
    assert expected == [[1, 1, 1], [2, 2, 2], [2, 2, 3], [2, 2, 1]]
    path = deploy(BufferSelectors(), (torch.zeros(3), indices[0]), None, tmp_path)
    run = load(path)
    assert [[float(t[0]) for t in run(torch.zeros(3), i)] for i in indices] == expected
