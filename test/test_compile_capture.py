"""torch.compile's dynamo capture: one node, our operator, no fallback to torch.cond.

Graph shapes the compile matrix (test_compile.py) does not cover: pytree outputs,
nested conditionals, views, strides and sizes that differ between branches, run
through every backend.
"""

import pytest
import torch

from torchcond import cond, switch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, i):
        y = cond(x.sum() > 0, lambda x: self.lin(x), lambda x: x.sin(), (x,))
        return switch(i, [lambda y: y + 1, lambda y: y, lambda y: y * 2], (y,))


def capture(model, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    out = torch.compile(model, backend=backend, fullgraph=True)(*args)
    return out, graphs


def test_dynamo_captures_our_operators():
    model = Model()
    with torch.no_grad():
        _, (gm,) = capture(model, torch.randn(4, 3), torch.tensor(1))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    names = [getattr(t, "__name__", "") for t in targets]
    assert "torchcond_cond" in names and "torchcond_switch" in names
    assert torch.ops.higher_order.cond not in targets


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_inference_matches_eager(backend):
    model = Model()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        for x in (torch.ones(4, 3), -torch.ones(4, 3)):
            for i in (-2, 1, 2, 9):
                idx = torch.tensor(i)
                torch.testing.assert_close(compiled(x, idx), model(x, idx))


def test_training_through_a_compiled_cond_uses_the_backward_cond():
    def f(x):
        return cond(x.sum() > 0, lambda a: a.cos() * a, lambda a: a.sin(), (x,))

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for sign in (1.0, -1.0):
        x = (sign * torch.rand(3) + sign).requires_grad_()
        (got,) = torch.autograd.grad(compiled(x).sum(), x)
        (want,) = torch.autograd.grad(f(x).sum(), x)
        torch.testing.assert_close(got, want)


X = torch.arange(6.0).reshape(2, 3)

DYNAMO_CASES = {
    "switch_tuple_outputs": lambda x, i: switch(
        i, [lambda a: (a + 1, a), lambda a: (a - 1, a * 2)], (x,)
    ),
    "cond_nested_in_switch": lambda x, i: switch(
        i, [lambda a: a + 1, lambda a: cond(a.sum() > 0, lambda b: b * 2, lambda b: b, (a,))], (x,)
    ),
    "views_with_offsets": lambda x, i: cond(
        x.sum() > 0, lambda a: (a, a[1:]), lambda a: (a * 2, a[:-1] + 0), (x,)
    ),
    "different_strides": lambda x, i: cond(
        x.sum() > 0, lambda a: a.t().contiguous().t(), lambda a: a * 2, (x,)
    ),
    "different_sizes": lambda x, i: cond(x.sum() > 0, lambda a: a[1:], lambda a: a[:1] * 2, (x,)),
    "no_operands": lambda x, i: switch(
        i, [lambda: torch.ones(2), lambda: torch.zeros(2), lambda: torch.full((2,), 3.0)], ()
    ),
    "dict_outputs": lambda x, i: cond(
        x.sum() > 0, lambda a: {"h": a + 1, "l": [a]}, lambda a: {"h": a, "l": [a * 3]}, (x,)
    ),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", list(DYNAMO_CASES), ids=list(DYNAMO_CASES))
def test_compiled_graph_shapes_match_eager(name, backend):
    fn = DYNAMO_CASES[name]
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for x in (X, -X):
        for i in (0, 1, 3):
            idx = torch.tensor(i)
            torch.testing.assert_close(compiled(x, idx), fn(x, idx))


def test_dynamo_keeps_torchcond_messages():
    def f(x):
        return cond(x.sum() > 0, lambda a: (a, {"h": a}), lambda a: (a, {"h": a.long()}), (x,))

    # Dynamo wraps exceptions raised while it traces; the message names the output path.
    with pytest.raises(Exception, match=r"output\[1\]\['h'\]: branches must agree on dtype"):
        torch.compile(f, backend="eager", fullgraph=True)(X)
