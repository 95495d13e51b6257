"""torch.compile's dynamo capture (backends eager, aot_eager) in inference.

The full compile matrix (Inductor, training) belongs to the compile issue; this pins
what the core already promises: one node, our operator, no fallback to torch.cond.
"""

import pytest
import torch

from torchcond import UnsupportedCondError, cond, switch


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
        out, (gm,) = capture(model, torch.randn(4, 3), torch.tensor(1))
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


@pytest.mark.filterwarnings("ignore:Error detected in _TracedBackwardRefusedBackward")
def test_training_through_a_compiled_cond_is_refused_clearly():
    def f(x):
        return cond(x.sum() > 0, lambda x: x.cos(), lambda x: x.sin(), (x,))

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(Exception, match="backward through a conditional whose selector is symbolic") as info:
        torch.compile(f, backend="aot_eager", fullgraph=True)(x).sum().backward()
    assert isinstance(info.value, UnsupportedCondError) or "UnsupportedCondError" in str(info.value)
