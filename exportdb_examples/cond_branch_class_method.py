"""Branches are bound methods: one of the module itself and one of a submodule.

Real models keep their branch logic in methods that read ``self``; ``cond`` must trace
a bound method exactly like a free function, attributes and submodule weights included.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Bound methods as branches"


class Refine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.proj(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.refine = Refine()
        self.scale = 0.5

    def damp(self, x):
        return x.cos() * self.scale

    def forward(self, x):
        return torchcond.cond(x.sum() > 0, self.refine.forward, self.damp, (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 3, generator=_g).abs(),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(4, 3, generator=_g).abs(),),  # sum > 0: self.refine.forward
    (-torch.randn(6, 3, generator=_g).abs(),),  # sum < 0: self.damp
    (torch.randn(2, 3, generator=_g).abs() + 1,),  # smallest batch
    (-torch.randn(64, 3, generator=_g).abs(),),  # largest batch
]
