"""A four-way ``switch`` on a runtime integer tensor, with jax.lax.switch clamping.

The index is a graph input, so all branches are exported; an index below 0 takes the
first branch and one past the end takes the last, in eager and exported runs alike.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "A four-way switch"


class Model(torch.nn.Module):
    def forward(self, index, x):
        branches = [
            lambda x: x + 1,
            lambda x: x * 2,
            lambda x: x.sin(),
            lambda x: torch.zeros_like(x) - x.sum(dim=0, keepdim=True),
        ]
        return torchcond.switch(index, branches, (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.tensor(1), torch.randn(4, 3, generator=_g))
dynamic_shapes = (None, {0: Dim("batch", min=2, max=64)})
branch_inputs = [
    (torch.tensor(0), torch.randn(4, 3, generator=_g)),
    (torch.tensor(1), torch.randn(5, 3, generator=_g)),
    (torch.tensor(2), torch.randn(2, 3, generator=_g)),
    (torch.tensor(3), torch.randn(64, 3, generator=_g)),
    (torch.tensor(-3), torch.randn(4, 3, generator=_g)),  # clamped to branch 0
    (torch.tensor(17), torch.randn(7, 3, generator=_g)),  # clamped to branch 3
]
