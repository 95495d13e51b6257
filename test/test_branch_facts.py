"""A branch may assume its own predicate, and its checks stay its own (issue 46).

While a branch is traced, the predicate's outcome for that branch is known: an
``assert`` or ``torch._check`` that it implies holds, and one that it does not imply
becomes a check inside that branch's graph. It raises, with the user's message, only
when that branch runs, and it never restricts the inputs of the whole program.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim, export

import torchcond

MODES = ["non-strict", "strict"]


def _export(module, args, dynamic_shapes, mode):
    shapes = (tuple(dynamic_shapes.values()),)  # forward(*args): one per argument
    return export(module, args, dynamic_shapes=shapes, strict=mode == "strict")


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# --- the first reproducer: the false branch asserts what its predicate implies ------


# pytest rewrites the asserts of test modules; a branch's assert is the user's own.
_USER: dict = {}
exec(
    compile(
        "def _one_row(x):\n"
        "    assert x.shape[0] == 1\n"
        "    return x[0] * 2\n"
        "\n"
        "def _assert_six_rows(x):\n"
        "    assert x.shape[0] > 5, 'true_fn needs more than 5 rows'\n"
        "    return x * 2\n",
        "user_branches.py",
        "exec",
    ),
    _USER,
)
_one_row, _assert_six_rows = _USER["_one_row"], _USER["_assert_six_rows"]


def _reshape_or_first(x):
    return torchcond.cond(x.shape[0] > 1, lambda x: x.reshape(-1), _one_row, (x,))


@pytest.mark.parametrize("mode", MODES)
def test_assert_implied_by_the_predicate_exports(mode):
    ep = _export(_Fn(_reshape_or_first), (torch.randn(8, 12),), {"x": {0: Dim("n", min=0)}}, mode)
    for rows in (8, 1):
        x = torch.randn(rows, 12)
        assert torch.equal(ep.module()(x), _reshape_or_first(x))


def test_assert_implied_by_the_predicate_traces_with_make_fx():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(_reshape_or_first, tracing_mode="symbolic")(torch.randn(8, 12))
    for rows in (8, 1):
        x = torch.randn(rows, 12)
        assert torch.equal(gm(x), _reshape_or_first(x))


# --- a check the predicate does not imply stays in its branch -----------------------


def _needs_six_rows(x):
    torch._check(x.shape[0] > 5, lambda: "true_fn needs more than 5 rows")
    return x * 2


def _checked(x):
    return torchcond.cond(x.sum() > 0, _needs_six_rows, lambda x: x - 1, (x,))


def _asserted(x):
    return torchcond.cond(x.sum() > 0, _assert_six_rows, lambda x: x - 1, (x,))


def _is_size(x, n):
    k = n.item()
    torch._check_is_size(k, "k must be a size")
    torch._check(k <= x.shape[0], lambda: "k must be at most the rows")
    return x[:k].sum(0)


def _sliced(x, n):
    return torchcond.cond(x.sum() > 0, _is_size, lambda x, n: x[0] * 0, (x, n))


def _switch_checked(i, x):
    def small(x):
        torch._check(x.shape[0] < 4, lambda: "branch 1 takes fewer than 4 rows")
        return x + 1

    return torchcond.switch(i, [lambda x: x - 1, small, lambda x: x * 3], (x,))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("program", ["torch._check", "assert"])
def test_check_not_implied_stays_in_its_branch(mode, program):
    fn = _checked if program == "torch._check" else _asserted
    ep = _export(_Fn(fn), (torch.ones(8, 3),), {"x": {0: Dim("n", min=0)}}, mode)
    # No range of the whole program: 2 rows still take the other branch.
    assert torch.equal(ep.module()(-torch.ones(2, 3)), fn(-torch.ones(2, 3)))
    assert torch.equal(ep.module()(torch.ones(8, 3)), fn(torch.ones(8, 3)))
    # The check runs when its branch does, as in eager.
    with pytest.raises(Exception) as eager:
        fn(torch.ones(2, 3))
    with pytest.raises(Exception) as exported:
        ep.module()(torch.ones(2, 3))
    assert "true_fn needs more than 5 rows" in str(eager.value)
    if program == "assert" and mode == "strict":
        # Dynamo evaluates an assert's condition without its message: the check names
        # the branch and the condition instead.
        assert "true_fn" in str(exported.value)
    else:
        assert "true_fn needs more than 5 rows" in str(exported.value)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_check_not_implied_under_compile(backend):
    torch._dynamo.reset()
    compiled = torch.compile(_checked, backend=backend, dynamic=True, fullgraph=True)
    for x in (torch.ones(8, 3), -torch.ones(2, 3), -torch.ones(7, 3)):
        assert torch.equal(compiled(x), _checked(x))
    with pytest.raises(Exception, match="true_fn needs more than 5 rows"):
        compiled(torch.ones(2, 3))


def test_data_dependent_checks_stay_in_their_branch():
    mode = "non-strict"  # strict export refuses .item() inside a branch (dynamo)
    x, n = torch.ones(6, 3), torch.tensor(4)
    ep = _export(_Fn(_sliced), (x, n), {"x": {0: Dim("n", min=0)}, "n": None}, mode)
    assert torch.equal(ep.module()(x, n), _sliced(x, n))
    assert torch.equal(ep.module()(-x, torch.tensor(9)), _sliced(-x, torch.tensor(9)))
    with pytest.raises(Exception, match="k must be at most the rows"):
        _sliced(x, torch.tensor(9))
    with pytest.raises(RuntimeError):
        ep.module()(x, torch.tensor(9))


@pytest.mark.parametrize("mode", MODES)
def test_switch_branch_check_stays_in_its_branch(mode):
    i = torch.tensor(1)
    ep = _export(_Fn(_switch_checked), (i, torch.ones(3, 2)), {"i": None, "x": {0: Dim("n")}}, mode)
    for index in (0, 1, 2):
        x = torch.ones(3, 2)
        assert torch.equal(
            ep.module()(torch.tensor(index), x), _switch_checked(torch.tensor(index), x)
        )
    x = torch.ones(6, 2)
    assert torch.equal(ep.module()(torch.tensor(2), x), _switch_checked(torch.tensor(2), x))
    with pytest.raises(Exception, match="branch 1 takes fewer than 4 rows"):
        ep.module()(torch.tensor(1), x)


# --- a branch that the example does not take is traced for its own sizes ------------


def _first_row_or_sum(x):
    def one_or_none(x):
        if x.shape[0] == 1:
            return x[0]
        return x.new_zeros(x.shape[1])

    return torchcond.cond(x.shape[0] > 1, lambda x: x.sum(0), one_or_none, (x,))


@pytest.mark.parametrize("mode", MODES)
def test_if_in_an_untaken_branch_follows_its_predicate(mode):
    """The example (8 rows) takes the true branch. The false branch runs for 0 or 1
    rows; its ``if`` is traced for 1 row, the value nearest the example, and checked."""
    ep = _export(_Fn(_first_row_or_sum), (torch.randn(8, 3),), {"x": {0: Dim("n", min=0)}}, mode)
    for rows in (8, 2, 1):
        x = torch.randn(rows, 3)
        assert torch.equal(ep.module()(x), _first_row_or_sum(x))
    with pytest.raises(Exception, match="traced for"):
        ep.module()(torch.randn(0, 3))


@pytest.mark.parametrize("mode", MODES)
def test_torch_cond_narrows_the_program_where_torchcond_does_not(mode):
    """The same program with torch.cond: the branch's check restricts every input."""

    def with_torch_cond(x):
        return torch.cond(x.sum() > 0, _needs_six_rows, lambda x: x - 1, (x,))

    with pytest.raises(Exception, match="Constraints violated"):
        _export(_Fn(with_torch_cond), (torch.ones(8, 3),), {"x": {0: Dim("n", min=0)}}, mode)
    ep = _export(_Fn(_checked), (torch.ones(8, 3),), {"x": {0: Dim("n", min=0)}}, mode)
    assert torch.equal(ep.module()(-torch.ones(2, 3)), _checked(-torch.ones(2, 3)))


# --- the second reproducer: a branch taken only for 0 rows ---------------------------


def _nop(x, w):
    torch._check(x.shape[0] == 0)
    return x.new_zeros(0, w.shape[0])


class _Chunk(torch.nn.Module):
    def forward(self, x, w):
        return torchcond.cond(x.shape[0] > 0, torch.nn.functional.linear, _nop, (x, w))


def _chunk_exported():
    shapes = {"x": {0: Dim("n", min=0)}, "w": None}
    return export(_Chunk(), (torch.randn(3, 4), torch.randn(5, 4)), dynamic_shapes=shapes)


def test_branch_taken_for_zero_rows_exports():
    """Export traces ``x.shape[0]`` as positive, so ``x.shape[0] > 0`` reads as true;
    the false branch, taken only for 0 rows, is traced on 0 rows."""
    ep = _chunk_exported()
    w = torch.randn(5, 4)
    for rows in (3, 0):
        x = torch.randn(rows, 4)
        assert torch.equal(ep.module()(x, w), _Chunk()(x, w))


_RUN = """
import sys, torch
program = torch.export.load(sys.argv[1]).module()
w = torch.load(sys.argv[2])
out = [program(torch.ones(rows, 4), w) for rows in (3, 0)]
assert "torchcond" not in sys.modules, "torchcond was imported"
torch.save(out, sys.argv[3])
"""


def test_branch_taken_for_zero_rows_runs_without_torchcond(tmp_path):
    import os
    import subprocess
    import sys

    shipped = torchcond.passes.portable(_chunk_exported())
    w = torch.randn(5, 4)
    torch.export.save(shipped, str(tmp_path / "p.pt2"))
    torch.save(w, tmp_path / "w.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [str(tmp_path / "p.pt2"), str(tmp_path / "w.pt"), str(tmp_path / "out.pt")]
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *args], capture_output=True, text=True, env=env, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt")
    for rows, value in zip((3, 0), got):
        assert torch.equal(value, _Chunk()(torch.ones(rows, 4), w))
