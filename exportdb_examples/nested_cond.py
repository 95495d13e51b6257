"""A ``cond`` inside a branch of another ``cond``: three reachable paths.

The inner conditional is traced while the outer branch is being traced, so it must
become a node of the outer branch's subgraph, with its own nested subgraphs.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "A cond nested in a branch"


class Model(torch.nn.Module):
    def forward(self, x, y):
        def inner_true(x, y):
            return x + y

        def inner_false(x, y):
            return x - y

        def outer_true(x, y):
            return torchcond.cond(y.sum() > 0, inner_true, inner_false, (x, y)) * 2

        def outer_false(x, y):
            return x.cos()

        return torchcond.cond(x.sum() > 0, outer_true, outer_false, (x, y))


_g = torch.Generator().manual_seed(0)
_batch = Dim("batch", min=2, max=64)
example_args = (torch.randn(4, 3, generator=_g), torch.randn(4, 3, generator=_g))
dynamic_shapes = ({0: _batch}, {0: _batch})
branch_inputs = [
    (torch.ones(4, 3), torch.ones(4, 3)),  # outer true, inner true
    (torch.ones(5, 3), -torch.ones(5, 3)),  # outer true, inner false
    (-torch.ones(6, 3), torch.ones(6, 3)),  # outer false
    (torch.randn(2, 3, generator=_g).abs(), -torch.randn(2, 3, generator=_g).abs()),
    (-torch.randn(64, 3, generator=_g).abs(), torch.randn(64, 3, generator=_g)),
]
