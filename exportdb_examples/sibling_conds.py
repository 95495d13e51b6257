"""Two conditionals in one ``forward``, the second reading the first's output.

Each gets its own pair of subgraphs (``true_graph_0``/``false_graph_0`` and
``true_graph_1``/``false_graph_1``); names must not collide and outputs must chain.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Two conditionals in one forward"


class Model(torch.nn.Module):
    def forward(self, x):
        h = torchcond.cond(x.sum() > 0, lambda x: x * 2, lambda x: x.abs(), (x,))
        out = torchcond.cond(h.mean() > 1, lambda h: h - 1, lambda h: h.exp(), (h,))
        return out, h


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 3, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.full((4, 3), 2.0),),  # first true (h = 4), second true
    (torch.full((5, 3), 0.1),),  # first true (h = 0.2), second false
    (torch.full((6, 3), -3.0),),  # first false (h = 3), second true
    (torch.full((2, 3), -0.5),),  # first false (h = 0.5), second false
    (torch.randn(64, 3, generator=_g),),
]
