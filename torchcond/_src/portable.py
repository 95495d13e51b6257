"""Rewrite an exported program into operators that torch itself knows.

A program that keeps torchcond's operators needs torchcond wherever it loads. This
module rewrites each of them into ``torch.ops.higher_order.cond`` and aten ops, so
that ``torch.export.load``, ExecuTorch, OpenVINO and AOTInductor take the program
without torchcond, as they take one written with ``torch.cond``.

* ``torchcond_cond(pred, t, f, operands)`` has torch.cond's argument convention after
  export: closure-free functional branch graphs and one flat operand tuple. Only the
  target changes. A predicate that is not bool becomes ``pred != 0``.
* ``torchcond_switch(i, b0, ..., bn, operands)`` becomes a chain of conds:
  ``b0 if i <= 0 else (b1 if i <= 1 else (... bn))``. The ``<=`` tests clamp the index
  as switch does. Each rest of the chain is a small graph that takes the operands and
  the index.
* ``torchcond::select(pred, trues, falses)`` and ``select_n(index, cases, n)``, which
  ``lower_to_select`` leaves, become ``aten.where`` (a chain of them for select_n).

Branch graphs are rewritten first, so nested conditionals carry over. Anything that
torch.cond cannot express raises ``UnsupportedCondError`` naming the node.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import operator
from typing import Any, cast

import torch

from ..errors import UnsupportedCondError
from .ops import cond_op, switch_op
from .subgraph import bool_predicate, call_with_value, getattr_path, written_inputs

_COND = torch.ops.higher_order.cond
_aten = torch.ops.aten
_SELECT = torch.ops.torchcond.select.default
_SELECT_N = torch.ops.torchcond.select_n.default


def portable(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Return a copy of ``ep`` whose conditionals are torch's own operators
    (``torchcond.passes.portable`` documents it)."""
    out = copy.deepcopy(ep)
    _rewrite_module(out.graph_module)
    _rename_outputs(out)
    return out


def _rename_outputs(ep: torch.export.ExportedProgram) -> None:
    """Name in the signature each output that a copy now gives."""
    (results,) = ep.graph.find_nodes(op="output")[0].args
    for spec, result in zip(ep.graph_signature.output_specs, results):
        arg = spec.arg
        if isinstance(result, torch.fx.Node) and getattr(arg, "name", result.name) != result.name:
            spec.arg = dataclasses.replace(arg, name=result.name)


def _rewrite_module(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is cond_op:
            _rewrite_cond(gm, node)
        elif node.target is switch_op:
            _rewrite_switch(gm, node)
        elif node.target is _SELECT:
            _rewrite_select(gm.graph, node)
        elif node.target is _SELECT_N:
            _rewrite_select_n(gm.graph, node)
        elif node.target is _COND:
            for branch in _args(node)[1:3]:
                _rewrite_module(getattr_path(gm, branch.target))
    gm.graph.eliminate_dead_code()
    _copy_outputs_read_across_conditionals(gm.graph)
    _drop_unused_children(gm)
    gm.graph.lint()
    gm.recompile()


def _copy_outputs_read_across_conditionals(graph: torch.fx.Graph) -> None:
    """Copy each conditional output that is read at or after a later conditional.

    ExecuTorch 1.5 plans the memory of every branch graph in one region that is reserved
    only while that conditional runs. So a later conditional's branches overwrite an
    earlier one's outputs, and a program that reads them afterwards gets wrong values
    (torch.cond's programs too). A copy lives in the outer graph's memory. It costs
    one copy of such an output and changes no value.
    """
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    conds = [i for i, n in enumerate(nodes) if n.op == "call_function" and n.target is _COND]
    for i, later in itertools.pairwise(conds):
        for item in list(nodes[i].users):
            late = [u for u in item.users if position[u] >= later]
            if late and isinstance(item.meta.get("val"), torch.Tensor):
                with graph.inserting_after(item):
                    copy_node = call_with_value(graph, _aten.clone.default, item)
                for user in late:
                    user.replace_input_with(item, copy_node)


def _drop_unused_children(gm: torch.fx.GraphModule) -> None:
    """Delete the child modules no node reads, such as a switch's branches that the chain
    replaced with copies. (``delete_all_unused_submodules`` would also delete the
    branches of a nested conditional, which only a child's graph reads.)"""
    used = {
        str(n.target).split(".")[0] for n in gm.graph.nodes if n.op in ("get_attr", "call_module")
    }
    for name, child in list(gm.named_children()):
        if name not in used and isinstance(child, torch.fx.GraphModule):
            delattr(gm, name)


def _branches(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.fx.GraphModule]:
    """Return ``node``'s branch graphs, rewritten, after checking that torch.cond can hold
    them: no branch writes to its inputs (an in-place op on its own values is fine)."""
    branches = []
    for graph_node in _args(node)[1:-1]:
        branch = getattr_path(gm, graph_node.target)
        written = sorted(written_inputs(branch))
        if written:
            raise UnsupportedCondError(
                f"portable: {node.name}: branch graph {graph_node.target} writes in place "
                f"to its input {written[0]}; torch.ops.higher_order.cond's branches must "
                "not. torch.export.export gives branches that return their writes instead"
            )
        _rewrite_module(branch)
        branches.append(branch)
    return branches


def _rewrite_cond(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    pred, true_node, false_node, operands = _args(node)
    _branches(gm, node)
    with gm.graph.inserting_before(node):
        pred = bool_predicate(gm.graph, pred)
    node.target = _COND
    node.args = (pred, true_node, false_node, tuple(operands))


def _rewrite_switch(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    index, *branch_nodes, operands = _args(node)
    index = _unclamped(index)
    branches = _branches(gm, node)
    if len(branches) == 1:  # taken for every index: the same graph on both sides
        with gm.graph.inserting_before(node):
            pred = _at_most(gm.graph, index, 0)
        node.target = _COND
        node.args = (pred, branch_nodes[0], branch_nodes[0], tuple(operands))
        return
    with gm.graph.inserting_before(node):
        chain = _link(gm, gm.graph, branches, 0, list(operands), index, node.meta["val"])
    node.replace_all_uses_with(chain)
    gm.graph.erase_node(node)


def _link(root, graph, branches, start: int, operands, index, out_value) -> torch.fx.Node:
    """Add to ``graph`` (of module ``root``) the cond node of one link of a switch chain
    over ``branches``, the switch's branches from position ``start`` on:
    ``b_start if index <= start else <the rest>``. Each side takes the operands and the
    index. The rest is a graph holding the next link, or the last branch."""
    values = [_value(o) for o in operands]
    case = _taking_index(branches[0], _value(index))
    if len(branches) == 2:
        rest = _taking_index(branches[1], _value(index))
    else:
        rest_root, rest_graph = torch.nn.Module(), torch.fx.Graph()
        inputs = [_placeholder(rest_graph, f"arg{i}", v) for i, v in enumerate(values)]
        inner_index = _placeholder(rest_graph, "index", _value(index))
        inner = _link(
            rest_root, rest_graph, branches[1:], start + 1, inputs, inner_index, out_value
        )
        rest_graph.output(tuple(_items(rest_graph, inner, out_value)))
        rest = torch.fx.GraphModule(rest_root, rest_graph)
    names = []
    for part, graph_module in (("case", case), ("rest", rest)):
        names.append(_free_name(root, f"switch_{part}_{start}"))
        root.add_module(names[-1], graph_module)
    pred = _at_most(graph, index, start)
    case_node, rest_node = graph.get_attr(names[0]), graph.get_attr(names[1])
    cond = graph.call_function(_COND, (pred, case_node, rest_node, (*operands, index)))
    cond.meta["val"] = out_value
    return cond


def _items(graph: torch.fx.Graph, node: torch.fx.Node, values) -> list[torch.fx.Node]:
    """``node[i]`` for each of its output ``values``."""
    items = []
    for i, value in enumerate(values):
        item = graph.call_function(operator.getitem, (node, i))
        item.meta["val"] = value
        items.append(item)
    return items


def _taking_index(branch: torch.fx.GraphModule, index_value) -> torch.fx.GraphModule:
    """A copy of ``branch`` with one more input, the switch's index, which it ignores."""
    taking = copy.deepcopy(branch)
    last = taking.graph.find_nodes(op="placeholder")[-1]
    with taking.graph.inserting_after(last):
        index = taking.graph.placeholder("switch_index")
    index.meta["val"] = index_value
    taking.recompile()
    return taking


def _unclamped(index):
    """A SymInt index before switch's ``sym_min(sym_max(i, 0), n - 1)``. The chain's
    ``<=`` tests clamp by themselves, and ExecuTorch has no ``torch.sym_min``."""
    if (
        isinstance(index, torch.fx.Node)
        and index.target is torch.sym_min
        and isinstance(index.args[0], torch.fx.Node)
        and index.args[0].target is torch.sym_max
    ):
        return index.args[0].args[0]
    return index


def _at_most(graph: torch.fx.Graph, index, bound: int):
    """``index <= bound``: a bool tensor for a tensor index, a SymBool for a SymInt."""
    value = _value(index)
    if isinstance(value, torch.Tensor):
        return call_with_value(graph, _aten.le.Scalar, index, bound)
    node = graph.call_function(operator.le, (index, bound))
    node.meta["val"] = value <= bound
    return node


def _rewrite_select(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``select(pred, trues, falses)[i]`` becomes ``where(pred, trues[i], falses[i])``."""
    pred, trues, falses = _args(node)
    with graph.inserting_before(node):
        pred = bool_predicate(graph, pred)
        values = [_where(graph, pred, t, f) for t, f in zip(trues, falses)]
    _replace_items(node, values)


def _rewrite_select_n(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``select_n(index, cases, n)[i]`` becomes a chain of ``where(index <= k, ...)``."""
    index, flat, n = _args(node)
    n_out = len(flat) // n
    cases = [flat[k * n_out : (k + 1) * n_out] for k in range(n)]
    with graph.inserting_before(node):
        below = [_at_most(graph, index, k) for k in range(n - 1)]
        values = []
        for i in range(n_out):
            value = cases[-1][i]
            for k in range(n - 2, -1, -1):
                value = _where(graph, below[k], cases[k][i], value)
            values.append(value)
    _replace_items(node, values)


def _where(graph: torch.fx.Graph, pred, a, b):
    """``where(pred, a, b)`` for a selector whose shape is a prefix of ``a``'s."""
    for _ in range(_value(a).dim() - _value(pred).dim()):
        pred = call_with_value(graph, _aten.unsqueeze.default, pred, -1)
    return call_with_value(graph, _aten.where.self, pred, a, b)


def _replace_items(node: torch.fx.Node, values) -> None:
    """Point each ``node[i]`` user at ``values[i]`` and drop the node."""
    for user in list(node.users):
        if user.target is not operator.getitem:
            raise UnsupportedCondError(
                f"portable: {node.name} is used as a whole by {user.name}; expected getitems"
            )
        user.replace_all_uses_with(values[user.args[1]])
        node.graph.erase_node(user)
    node.graph.erase_node(node)


def _placeholder(graph: torch.fx.Graph, name: str, value) -> torch.fx.Node:
    node = graph.placeholder(name)
    node.meta["val"] = value
    return node


def _args(node: torch.fx.Node) -> tuple[Any, ...]:
    """``node.args``, typed loosely: an operator node's arguments are graphs, nodes,
    tuples of nodes and ints, which the passes here know by position."""
    return cast(tuple[Any, ...], node.args)


def _value(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _free_name(gm: torch.nn.Module, base: str) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name
