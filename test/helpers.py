"""Shared test utilities: graph text normalisation and version pinning."""

import re

import pytest
import torch

TORCH_2_13 = torch.__version__.startswith("2.13")

# Expected graph printouts are pinned to the torch CI runs; elsewhere they may differ.
pinned_printout = pytest.mark.skipif(
    not TORCH_2_13, reason="expected graph printouts are pinned to torch 2.13"
)


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
