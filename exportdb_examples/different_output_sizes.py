"""Branches return different sizes along dim 0: the first two rows, or all of them.

The exported output gets an unbacked size covering both branches, so the program is
still one graph; code after the conditional must not assume a fixed row count.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Branches with different output sizes"


class Model(torch.nn.Module):
    def forward(self, x):
        return torchcond.cond(x.sum() > 0, lambda x: x[:2] * 10, lambda x: x - 1, (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 3, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(4, 3, generator=_g).abs(),),  # true: 2 rows
    (-torch.randn(5, 3, generator=_g).abs(),),  # false: 5 rows
    (torch.randn(2, 3, generator=_g).abs(),),  # true, and all rows anyway
    (-torch.randn(64, 3, generator=_g).abs(),),  # false: 64 rows
    (torch.randn(64, 3, generator=_g).abs(),),  # true: 2 rows
]
