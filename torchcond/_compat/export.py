"""A torch.export hook that gives branch placeholders the exported program's input names.

After tracing, export renames the top-level placeholders (``p_lin_weight``, ``x``,
...). The pass ``torch._export.utils._name_hoo_subgraph_placeholders`` then copies
those names into the subgraphs of torch's own higher-order operators, which it picks
by name. We wrap that pass so that our operators' branch graphs get the same names.
A branch then reads ``x`` and ``p_lin_weight`` instead of ``arg0_1`` and ``arg0_2``.

Checked on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0. If the pass moves, nothing is
renamed. The graphs stay correct but are less readable.
"""

from __future__ import annotations

from collections import defaultdict

import torch

_PASS = "_name_hoo_subgraph_placeholders"
# These modules import the pass by name, so each one needs the wrapper set on it.
_BINDERS = ("torch._export.utils", "torch.export.exported_program")


def install(op_names: frozenset[str]) -> None:
    import importlib

    utils = importlib.import_module("torch._export.utils")
    original = getattr(utils, _PASS, None)
    helpers = (
        getattr(utils, "_build_cache", None),
        getattr(utils, "_rename_without_collisions", None),
    )
    if original is None or None in helpers or original.__module__ == __name__:  # already installed
        return

    def name_subgraph_placeholders(gm: torch.fx.GraphModule) -> None:
        original(gm)
        for node in gm.graph.nodes:
            if node.op == "call_function" and getattr(node.target, "__name__", None) in op_names:
                operands = node.args[-1]
                for graph_node in node.args[1:-1]:
                    subgraph = getattr(gm, graph_node.target)
                    _take_operand_names(subgraph, operands, *helpers)
                    name_subgraph_placeholders(subgraph)  # nested conditionals
                    subgraph.recompile()

    for module_name in _BINDERS:
        module = importlib.import_module(module_name)
        if getattr(module, _PASS, None) is original:
            setattr(module, _PASS, name_subgraph_placeholders)


def _take_operand_names(subgraph, operands, build_cache, rename_without_collisions) -> None:
    """Give placeholder i the name of operand i, and rename other nodes to avoid clashes."""
    name_map: dict[str, str] = {}
    find_available: dict[str, int] = defaultdict(int)
    used_names: set[str] = set()
    placeholders = subgraph.graph.find_nodes(op="placeholder")
    for node in subgraph.graph.nodes:
        if node.op == "placeholder":
            i = placeholders.index(node)
            operand = operands[i] if i < len(operands) else None
            if isinstance(operand, torch.fx.Node):
                name = operand.name
                if name in used_names:  # one tensor passed twice becomes x and x_1
                    name = rename_without_collisions(
                        name_map, find_available, used_names, node.name, name
                    )
                name_map[node.name] = name
                node.name = node.target = name
            build_cache(node.name, find_available, used_names)
        else:
            node.name = rename_without_collisions(
                name_map, find_available, used_names, node.name, node.name
            )
