"""Selector tensors in every allowed form, through every path, against a Python ``if``.

The operator takes a selector tensor as the user gave it (one element, any shape, any
allowed dtype), and each rule reads it itself (``kinds.py``). So each form must give
the Python-``if`` result in eager code, under ``strategy="select"`` with a gradient,
under ``vmap`` with a per-example selector, traced by ``make_fx``, exported (and made
portable) and compiled.
"""

from __future__ import annotations

import pytest
import torch

import torchcond

# (selector values, one per branch taken) in each form; cond reads ``pred != 0``.
PREDICATES = {
    "bool[1]": [torch.tensor([True]), torch.tensor([False])],
    "float[1, 1]": [torch.tensor([[2.5]]), torch.tensor([[0.0]])],
    "int64[]": [torch.tensor(-3), torch.tensor(0)],
    "uint8[1]": [torch.tensor([7], dtype=torch.uint8), torch.tensor([0], dtype=torch.uint8)],
}
# Switch indices, clamped to [0, 2].
INDICES = {
    "int64[]": [torch.tensor(k) for k in (-2, 1, 9)],
    "int8[1]": [torch.tensor([k], dtype=torch.int8) for k in (-2, 1, 100)],
    "uint8[1, 1]": [torch.tensor([[k]], dtype=torch.uint8) for k in (0, 1, 200)],
}
BRANCHES = [lambda x: x.sin() * 2, lambda x: x.cos() + 1, lambda x: x * x]


def python_if(kind, selector, x):
    if kind == "cond":
        return BRANCHES[0](x) if bool(selector) else BRANCHES[1](x)
    return BRANCHES[min(max(int(selector), 0), 2)](x)


def conditional(kind, selector, x, strategy="auto"):
    if kind == "cond":
        return torchcond.cond(selector, BRANCHES[0], BRANCHES[1], (x,), strategy=strategy)
    return torchcond.switch(selector, BRANCHES, (x,), strategy=strategy)


CASES = [("cond", form, s) for form, values in PREDICATES.items() for s in values] + [
    ("switch", form, s) for form, values in INDICES.items() for s in values
]
IDS = [f"{kind}-{form}-{i % 3}" for i, (kind, form, _) in enumerate(CASES)]


@pytest.mark.parametrize(("kind", "form", "selector"), CASES, ids=IDS)
@pytest.mark.parametrize("strategy", ["auto", "select"])
def test_eager_and_select_with_gradient(kind, form, selector, strategy):
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    got = conditional(kind, selector, x, strategy)
    expected = python_if(kind, selector, x)
    torch.testing.assert_close(got, expected)
    (g,) = torch.autograd.grad(got.sum(), x)
    (e,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g, e)


@pytest.mark.parametrize(
    ("kind", "form"), [("cond", f) for f in PREDICATES] + [("switch", f) for f in INDICES]
)
def test_vmap_per_example_selector(kind, form):
    values = (PREDICATES if kind == "cond" else INDICES)[form]
    selectors = torch.stack(values)  # one selector per example, each in the form
    xs = torch.randn(len(values), 4)
    got = torch.vmap(lambda s, x: conditional(kind, s, x))(selectors, xs)
    expected = torch.stack([python_if(kind, s, x) for s, x in zip(values, xs)])
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(("kind", "form", "selector"), CASES, ids=IDS)
def test_make_fx_export_and_portable(kind, form, selector):
    x = torch.randn(3, 4)
    others = (PREDICATES if kind == "cond" else INDICES)[form]

    def f(s, x):
        return conditional(kind, s, x)

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="symbolic")(selector, x)

    class Model(torch.nn.Module):
        def forward(self, s, x):
            return f(s, x)

    ep = torch.export.export(Model(), (selector, x))
    shipped = torchcond.passes.portable(ep)
    for s in others:
        expected = python_if(kind, s, x)
        for run in (gm, ep.module(), shipped.module()):
            torch.testing.assert_close(run(s, x), expected)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize(("kind", "form"), [("cond", "float[1, 1]"), ("switch", "int8[1]")])
def test_compiled(kind, form, backend):
    torch._dynamo.reset()
    values = (PREDICATES if kind == "cond" else INDICES)[form]
    compiled = torch.compile(lambda s, x: conditional(kind, s, x), backend=backend, fullgraph=True)
    x = torch.randn(4)
    for s in values:
        torch.testing.assert_close(compiled(s, x), python_if(kind, s, x))
