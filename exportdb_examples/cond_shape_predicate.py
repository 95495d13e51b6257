"""The predicate is ``x.shape[0] > 4``, a SymBool over the dynamic batch size.

Under export it stays symbolic, so one program serves batches on both sides of the
threshold instead of being specialized to the example's batch size.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "A predicate on a dynamic shape"


class Model(torch.nn.Module):
    def forward(self, x):
        return torchcond.cond(
            x.shape[0] > 4,
            lambda x: x.sum(dim=0, keepdim=True).expand_as(x) * 0.1,
            lambda x: x.cumsum(dim=0),
            (x,),
        )


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(6, 3, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(8, 3, generator=_g),),  # batch > 4: true branch
    (torch.randn(3, 3, generator=_g),),  # batch <= 4: false branch
    (torch.randn(4, 3, generator=_g),),  # boundary: false branch
    (torch.randn(5, 3, generator=_g),),  # boundary + 1: true branch
    (torch.randn(2, 3, generator=_g),),
    (torch.randn(64, 3, generator=_g),),
]
