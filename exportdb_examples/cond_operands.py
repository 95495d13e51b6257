"""Several operands of different shapes, one of which only the true branch reads.

Every branch receives every operand; an operand a branch ignores is simply an unused
input of its subgraph and must not break tracing or serialization.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Several operands, one unused"


def true_fn(x, bias, gate):
    return (x + bias) * torch.sigmoid(gate)


def false_fn(x, bias, gate):  # `bias` is unused here
    return x * torch.sigmoid(gate) - 1


class Model(torch.nn.Module):
    def forward(self, x, bias, gate):
        return torchcond.cond(gate.mean() > 0, true_fn, false_fn, (x, bias, gate))


_g = torch.Generator().manual_seed(0)
_batch = Dim("batch", min=2, max=64)
example_args = (
    torch.randn(4, 6, generator=_g),
    torch.randn(6, generator=_g),
    torch.randn(4, 1, generator=_g),
)
dynamic_shapes = ({0: _batch}, None, {0: _batch})
branch_inputs = [
    (torch.randn(4, 6, generator=_g), torch.randn(6, generator=_g), torch.ones(4, 1)),
    (torch.randn(5, 6, generator=_g), torch.randn(6, generator=_g), -torch.ones(5, 1)),
    (torch.randn(2, 6, generator=_g), torch.randn(6, generator=_g), torch.full((2, 1), 0.5)),
    (torch.randn(64, 6, generator=_g), torch.randn(6, generator=_g), -torch.ones(64, 1)),
]
