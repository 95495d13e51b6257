"""Operands and outputs are nested dicts, lists and tuples of tensors.

``cond`` flattens the operand pytree for the graph and rebuilds the branch's output
structure afterwards, so the exported module keeps the user's structure on both sides.
"""

import torch
from torch.export import Dim

import torchcond

#: The example's title in the docs gallery (docs/gen_gallery.py).
TITLE = "Pytree operands and outputs"


def true_fn(feats, extras):
    a, (b,) = feats["a"], feats["b"]
    (scale,) = extras
    return {"sum": [a + b, a * scale], "pair": (b.sin(), scale.clone())}


def false_fn(feats, extras):
    a, (b,) = feats["a"], feats["b"]
    (scale,) = extras
    return {"sum": [a - b, b * scale], "pair": (a.cos(), scale + 1)}


class Model(torch.nn.Module):
    def forward(self, feats, extras):
        return torchcond.cond(
            feats["a"].sum() > feats["b"][0].sum(), true_fn, false_fn, (feats, tuple(extras))
        )


def _inputs(batch, sign, g):
    a = torch.randn(batch, 3, generator=g)
    b = a - sign  # a.sum() > b.sum() exactly when sign > 0
    return ({"a": a, "b": [b]}, [torch.randn(3, generator=g)])


_g = torch.Generator().manual_seed(0)
_batch = Dim("batch", min=2, max=64)
example_args = _inputs(4, 1.0, _g)
dynamic_shapes = ({"a": {0: _batch}, "b": [{0: _batch}]}, [None])
branch_inputs = [
    _inputs(4, 1.0, _g),  # true_fn
    _inputs(6, -1.0, _g),  # false_fn
    _inputs(2, 1.0, _g),
    _inputs(64, -1.0, _g),
]
