"""Branches use ``nn.Linear`` parameters and a registered buffer of the module.

Parameters and buffers are lifted into operands of the conditional and appear in the
exported program's signature as inputs, so ``state_dict`` still owns them.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Parameters and buffers in branches"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 4)
        self.fallback = torch.nn.Linear(8, 4, bias=False)
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, 4))

    def forward(self, x):
        def true_fn(x):
            return torch.relu(self.encoder(x)) + self.offset

        def false_fn(x):
            return self.fallback(x) * self.offset

        return torchcond.cond(x.max() > 1.0, true_fn, false_fn, (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 8, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(4, 8, generator=_g) + 3,),  # max > 1: encoder
    (torch.rand(6, 8, generator=_g) - 0.5,),  # max < 1: fallback
    (torch.rand(2, 8, generator=_g) * 0.1,),
    (torch.randn(64, 8, generator=_g) * 4,),
]
