"""Branches read tensors they were not given: a parameter, a second input and an intermediate.

Closed-over tensors are lifted into extra operands of the ``torchcond_cond`` node, so
the exported graph stays closure-free and the caller need not thread them through.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Branches closing over tensors"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        hidden = x * 2 + 1  # an intermediate of the outer graph

        def true_fn():
            return hidden * self.weight + y

        def false_fn():
            return hidden - y.sin()

        return torchcond.cond(y.sum() > 0, true_fn, false_fn)


_g = torch.Generator().manual_seed(0)
_batch = Dim("batch", min=2, max=64)
example_args = (torch.randn(4, 4, generator=_g), torch.randn(4, 4, generator=_g))
dynamic_shapes = ({0: _batch}, {0: _batch})
branch_inputs = [
    (torch.randn(4, 4, generator=_g), torch.randn(4, 4, generator=_g).abs()),  # true_fn
    (torch.randn(9, 4, generator=_g), -torch.randn(9, 4, generator=_g).abs()),  # false_fn
    (torch.randn(2, 4, generator=_g), torch.ones(2, 4)),
    (torch.randn(64, 4, generator=_g), -torch.ones(64, 4)),
]
