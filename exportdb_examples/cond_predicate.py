"""The predicate is a data-dependent tensor expression: "more than two positive entries".

A one-element tensor predicate is kept as a graph value, so the exported program
decides at run time; a Python ``if`` on it would have failed or specialized.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "A data-dependent predicate"


class Model(torch.nn.Module):
    def forward(self, x):
        pred = (x > 0).sum() > 2
        return torchcond.cond(pred, lambda x: x.relu() + 1, lambda x: x.abs().neg(), (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 3, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.ones(4, 3),),  # 12 positive entries: true branch
    (-torch.ones(5, 3),),  # none positive: false branch
    (torch.tensor([[1.0, 1.0, -1.0], [-1.0, -1.0, -1.0]]),),  # exactly two: false branch
    (torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]),),  # three: true branch
    (torch.randn(64, 3, generator=_g),),
]
