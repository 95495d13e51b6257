"""A symbolic predicate that the sizes' ranges decide.

Under torch.compile, dynamo's guards check the ranges of the sizes on every call, so a
predicate they decide (``x.shape[0] > 1`` where the size is at least 2) takes its
branch alone, and the other branch is never traced. An exported program has no such
guards: export traces a dynamic size as at least 2 but admits 0 and 1, so there both
branches stay and the program decides when it runs.
"""

import pytest
import torch

from torchcond import cond, switch


def _sum(x):
    return x.sum(0)


def _sum_plus_100(x):
    return x.sum(0) + 100


def _one_row(x):
    assert x.shape[0] == 1  # holds wherever this branch is taken
    return x[0] * 2


def _flat(x):
    return x.reshape(-1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_takes_the_branch_the_sizes_decide(backend):
    """PyTorch issue 138141: the false branch asserts what holds when it is taken."""

    def f(x):
        return cond(x.shape[0] > 1, _flat, _one_row, (x,))

    compiled = torch.compile(f, backend=backend, dynamic=True, fullgraph=True)
    for rows in (8, 1, 5):
        x = torch.randn(rows, 12)
        torch.testing.assert_close(compiled(x), _flat(x) if rows > 1 else _one_row(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_gives_the_python_if_value_on_every_size(backend):
    def f(x):
        return cond(x.shape[0] > 1, _sum, _sum_plus_100, (x,))

    compiled = torch.compile(f, backend=backend, dynamic=True, fullgraph=True)
    for rows in (8, 1, 0, 3):
        x = torch.ones(rows, 2)
        torch.testing.assert_close(compiled(x), _sum(x) if rows > 1 else _sum_plus_100(x))


def test_compile_takes_the_case_a_clamped_size_decides():
    branches = [lambda x: x * 0, lambda x: x * 1, lambda x: x * 2]

    def f(x):
        return switch(x.shape[0], branches, (x,))  # at least 2 clamps to the last case

    compiled = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (6, 1, 0, 2):
        x = torch.ones(rows, 3)
        torch.testing.assert_close(compiled(x), branches[min(rows, 2)](x))


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_export_keeps_both_branches_of_a_predicate_on_sizes_0_and_1(strict):
    """Export traces the size as at least 2, where ``x.shape[0] > 0`` holds. The
    program admits 0 rows, so it keeps both branches and decides when it runs."""

    class M(torch.nn.Module):
        def forward(self, x):
            return cond(x.shape[0] > 0, _sum, _sum_plus_100, (x,))

    dims = {"x": {0: torch.export.Dim("n", min=0)}}
    ep = torch.export.export(M(), (torch.ones(3, 2),), dynamic_shapes=dims, strict=strict)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.higher_order.torchcond_cond in targets
    for rows in (3, 0):
        x = torch.ones(rows, 2)
        torch.testing.assert_close(ep.module()(x), M()(x))
