"""Shared test utilities: graph text normalisation, version pinning, and a custom
autograd.Function whose backward is distinguishable from its forward's derivative."""

import os
import re

import torch

# (major, minor) of the running torch. Expected graph printouts that differ between
# supported releases keep one text per release, chosen with this.
TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


# `make test-long` multiplies every hypothesis property's example count by this.
EXAMPLES_SCALE = int(os.environ.get("TORCHCOND_EXAMPLES_SCALE", "1"))


def examples(n: int) -> int:
    """Hypothesis ``max_examples`` for a property: ``n`` in the default suite."""
    return n * EXAMPLES_SCALE


def readable(gm: torch.fx.GraphModule) -> str:
    """print_readable() without source comments, so expectations do not move with line numbers."""
    text = gm.print_readable(print_output=False)
    lines = [
        line.rstrip()
        for line in text.splitlines()
        if not re.match(r"\s*# (File:|No stacktrace)", line)
    ]
    return "\n".join(line for line in lines if line.strip()) + "\n"


def count_nodes(gm: torch.fx.GraphModule, name: str) -> int:
    """Number of call_function nodes targeting torch.ops.higher_order.<name>, at the root."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and getattr(n.target, "__name__", None) == name
    )


class TimesThree(torch.autograd.Function):
    """Rounds forward; its backward (times three) is nothing like round's derivative."""

    @staticmethod
    def forward(x):
        return x.round()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 3

    @staticmethod
    def jvp(ctx, t):
        return t * 3
