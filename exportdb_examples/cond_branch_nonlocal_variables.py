"""Tensors computed in ``forward`` reach the branches as explicit operands.

Passing enclosing-scope values through ``operands`` (instead of closing over them)
keeps each branch a pure function of its inputs; Python numbers stay constants.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Enclosing-scope values passed as operands"


class Model(torch.nn.Module):
    def forward(self, x):
        center = x.mean(dim=0, keepdim=True)
        spread = x.std(dim=0, keepdim=True) + 1e-3
        limit = 3.0  # a Python float: baked into both branches as a constant

        def true_fn(x, center, spread):
            return ((x - center) / spread).clamp(-limit, limit)

        def false_fn(x, center, spread):
            return x - center + spread * limit

        return torchcond.cond(spread.max() > 1.0, true_fn, false_fn, (x, center, spread))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(8, 4, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(8, 4, generator=_g) * 5,),  # wide spread: true_fn
    (torch.randn(10, 4, generator=_g) * 0.01,),  # narrow spread: false_fn
    (torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]]),),  # batch 2, true_fn
    (torch.randn(64, 4, generator=_g) * 0.1,),
]
