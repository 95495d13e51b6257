"""Branches are closures defined in ``forward`` that call further nested helpers.

Tracing follows ordinary Python calls, so helpers may be nested to any depth; only
the branch functions handed to ``cond`` become subgraphs.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Branches calling nested helpers"


def _normalize(t):
    return t / (t.norm(dim=-1, keepdim=True) + 1e-6)


class Model(torch.nn.Module):
    def forward(self, x):
        def shift(t, amount):
            return t + amount

        def squash(t):
            def gate(u):
                return torch.sigmoid(u)

            return torch.tanh(t) * gate(t)

        def true_fn(x):
            return squash(shift(x, 1.0))

        def false_fn(x):
            return _normalize(shift(x, -1.0)) * 2

        return torchcond.cond(x.mean() > 0, true_fn, false_fn, (x,))


_g = torch.Generator().manual_seed(0)
example_args = (torch.randn(4, 5, generator=_g),)
dynamic_shapes = ({0: Dim("batch", min=2, max=64)},)
branch_inputs = [
    (torch.randn(4, 5, generator=_g).abs(),),  # mean > 0: true_fn
    (-torch.randn(7, 5, generator=_g).abs(),),  # mean < 0: false_fn
    (torch.randn(33, 5, generator=_g).abs(),),
    (-torch.randn(2, 5, generator=_g).abs(),),
]
