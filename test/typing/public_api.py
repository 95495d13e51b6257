"""The public API as a type checker sees it (`make typecheck`, run by `make test`).

Type-checks clean with mypy: a return type that stops being inferred, or a bad
argument that stops being flagged (an unused ``type: ignore``), fails the check.
It also runs: `python test/typing/public_api.py`.
"""

from collections.abc import Callable
from typing import assert_type

import torch

import torchcond
from torchcond import cond, select, select_n, switch

x = torch.ones(3)


def plus(a: torch.Tensor) -> torch.Tensor:
    return a + 1


def pair(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a, a * 2


# The branches' return type is the conditional's.
assert_type(cond(x.sum() > 0, plus, torch.neg, (x,)), torch.Tensor)
assert_type(cond(True, pair, pair, (x,), check_branches=True), tuple[torch.Tensor, torch.Tensor])
branches: list[Callable[[torch.Tensor], torch.Tensor]] = [torch.sin, torch.cos, plus]
assert_type(switch(torch.tensor(1), branches, (x,), strategy="select"), torch.Tensor)
assert_type(select(torch.tensor(True), [x], [x]), list[torch.Tensor])
assert_type(select_n(torch.tensor(0), [[x], [x]]), list[torch.Tensor])
assert_type(torchcond.__version__, str)

# Mistakes a type checker catches before anything runs.
if not torch.compiler.is_compiling():
    try:
        cond(x.sum() > 0, plus, plus, (x,), strategy="selct")  # type: ignore[arg-type]
    except torchcond.CondArgumentError:
        pass
