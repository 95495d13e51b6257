"""torchcond.passes.lower_to_select: conditionals become all branches plus one select."""

import pytest
import torch
from helpers import count_nodes
from torch.export import Dim, export

from torchcond import BranchMismatchError, cond, switch
from torchcond.passes import lower_to_select


def conditional_nodes(gm) -> int:
    return sum(
        count_nodes(m, name)
        for m in gm.modules()
        if isinstance(m, torch.fx.GraphModule)
        for name in ("torchcond_cond", "torchcond_switch")
    )


def select_nodes(gm) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("torchcond.select")
    )


class Pytrees(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, i):
        a = cond(
            x.sum() > 0,
            lambda t: {"h": self.lin(t), "l": [t * 2]},
            lambda t: {"h": t.cos(), "l": [t]},
            (x,),
        )
        b = switch(i, [lambda t: t + 1, lambda t: t * 3, lambda t: t.exp()], (a["h"],))
        return a["l"][0], b


class Nested(torch.nn.Module):
    def forward(self, x):
        inner = lambda t: cond(t.mean() > 0.5, lambda u: u * 10, lambda u: u - 10, (t,))  # noqa: E731
        return cond(x.sum() > 0, inner, lambda t: -t, (x,))


class ShapePredicate(torch.nn.Module):
    def forward(self, x):
        return cond(x.shape[0] > 4, lambda t: t.sin(), lambda t: t.cos(), (x,))


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
def test_lowered_program_has_no_control_flow_and_matches_eager(strict):
    model = Pytrees()
    args = (torch.randn(4, 3), torch.tensor(1))
    ep = export(model, args, strict=strict)
    flat = lower_to_select(ep)
    assert conditional_nodes(flat.graph_module) == 0
    assert select_nodes(flat.graph_module) == 2
    assert conditional_nodes(ep.graph_module) == 2  # the input program is left as it was
    for sign in (1.0, -1.0):
        for i in (-1, 0, 1, 2, 5):
            x = sign * torch.rand(4, 3) + sign
            got, want = flat.module()(x, torch.tensor(i)), model(x, torch.tensor(i))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)


def test_nested_conditionals_are_lowered_too():
    model = Nested()
    flat = lower_to_select(export(model, (torch.randn(5),)))
    assert conditional_nodes(flat.graph_module) == 0
    for x in (torch.full((5,), 1.0), torch.full((5,), 0.2), -torch.ones(5)):
        torch.testing.assert_close(flat.module()(x), model(x))


def test_shape_predicates_under_dynamic_shapes():
    model = ShapePredicate()
    ep = export(model, (torch.randn(6),), dynamic_shapes={"x": {0: Dim("n", min=2, max=64)}})
    flat = lower_to_select(ep)
    assert conditional_nodes(flat.graph_module) == 0
    for n in (3, 5, 9):
        torch.testing.assert_close(flat.module()(torch.ones(n)), model(torch.ones(n)))


def test_lowered_program_survives_save_and_load(tmp_path):
    model = Pytrees()
    args = (torch.randn(4, 3), torch.tensor(2))
    flat = lower_to_select(export(model, args))
    path = tmp_path / "flat.pt2"
    torch.export.save(flat, path)
    loaded = torch.export.load(path)
    for g, w in zip(loaded.module()(*args), model(*args)):
        torch.testing.assert_close(g, w)


def test_branches_of_different_shapes_cannot_be_lowered():
    class M(torch.nn.Module):
        def forward(self, x):
            return cond(x.sum() > 0, lambda t: t[1:], lambda t: t[:1] * 2, (x,))

    with pytest.raises(
        BranchMismatchError, match=r"lower_to_select: .* output\[0\] differs between branches"
    ):
        lower_to_select(export(M(), (torch.randn(4),)))
