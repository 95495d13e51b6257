"""A branch writes in place to a module buffer: a decoder-style cache.

The prefill branch writes the new rows into ``self.cache`` and counts the step; the
decode branch only reads the cache. The conditional returns the buffers' new values
(the untaken branch passes the old ones through), and the exported program writes
them back: after ``run_decompositions()`` its signature lists them as buffer
mutations, and ``ep.module()`` updates its buffers as the eager module does.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "A branch that writes to a buffer"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(16, 8))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, pos):
        def prefill(x, pos):
            self.cache.index_copy_(0, pos, x)
            self.steps.add_(1)
            return self.cache.sum(0) + x.sum(0)

        def decode(x, pos):
            return self.cache.sum(0) - x.sum(0)

        return torchcond.cond(x.sum() > 0, prefill, decode, (x, pos))


_g = torch.Generator().manual_seed(0)
_rows = Dim("rows", min=1, max=16)
example_args = (torch.rand(2, 8, generator=_g), torch.tensor([0, 1]))
dynamic_shapes = ({0: _rows}, {0: _rows})
branch_inputs = [
    (torch.rand(3, 8, generator=_g), torch.tensor([2, 3, 4])),  # sum > 0: prefill
    (-torch.rand(2, 8, generator=_g), torch.tensor([0, 1])),  # sum < 0: decode
    (torch.rand(1, 8, generator=_g), torch.tensor([7])),
]
