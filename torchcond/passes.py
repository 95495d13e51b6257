"""Graph passes over exported programs.

``portable(ep)`` rewrites torchcond's operators into torch's own
(``torch.ops.higher_order.cond`` and aten ops), so that the program loads and runs
where torchcond is not installed: ``torch.export.load``, ExecuTorch, OpenVINO and
AOTInductor packages.

``lower_to_select(ep)`` replaces every ``torchcond_cond``/``torchcond_switch`` node.
The replacement computes every branch, then applies one fused ``torchcond::select``
(or ``select_n``) to all outputs. The result has no control flow, so it suits
backends without conditionals. Running it never reads the predicate on the host. It
costs the sum of the branches, not the cost of the taken one.
"""

from __future__ import annotations

import copy
from typing import cast

import torch

from ._src import portable as _portable
from ._src import select_ops  # noqa: F401  (registers the select operators' rules)
from ._src.ops import cond_op, switch_op
from ._src.subgraph import bool_predicate, call_with_value, output_values
from .errors import BranchMismatchError


def lower_to_select(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Return a copy of ``ep`` with every conditional lowered to all branches plus a select.

    Nested conditionals (inside branches) are lowered first. The program's inputs,
    outputs and signature are unchanged.

    The lowered program has no control flow, so it suits backends without
    conditionals. Running it never reads a predicate on the host. It computes every
    branch, so it costs the sum of the branches, not the cost of the taken one.

    Args:
        ep: an exported program, as :func:`torch.export.export` returns it. It is not
            modified.

    Returns:
        A new :class:`~torch.export.ExportedProgram` that computes the same outputs.

    Raises:
        BranchMismatchError: the branches of a conditional return outputs of
            different shapes or dtypes (for example an unbacked size that differs
            between branches), which an elementwise select cannot combine.

    Examples:
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torchcond.cond(x.sum() > 0, torch.log, torch.zeros_like, (x,))
        >>> x = torch.tensor([1.0, 2.0, 4.0])
        >>> ep = torch.export.export(Model(), (x,))
        >>> flat = torchcond.passes.lower_to_select(ep)
        >>> [n.target for n in flat.graph.nodes if n.op == "call_function"]
        [<OpOverload(op='aten.sum', overload='default')>, ...]
        >>> flat.module()(x)
        tensor([0.0000, 0.6931, 1.3863])
    """
    lowered = copy.deepcopy(ep)
    _lower_module(lowered.graph_module)
    return lowered


def _lower_module(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (cond_op, switch_op):
            _lower_node(gm, node)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()


def _lower_node(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    selector, *branch_nodes, operands = node.args
    graph = gm.graph
    branches = [getattr(gm, str(cast(torch.fx.Node, b).target)) for b in branch_nodes]
    outputs = []
    with graph.inserting_before(node):
        for branch in branches:
            _lower_module(branch)
            outputs.append(_inline(graph, branch, operands))
        _check_same_metadata(node, branches)
        if node.target is cond_op:
            pred = bool_predicate(graph, _as_tensor(graph, selector, torch.bool))
            selected = graph.call_function(
                torch.ops.torchcond.select.default, (pred, outputs[0], outputs[1])
            )
        else:
            index = _as_tensor(graph, selector, torch.int64)
            flat = [value for outs in outputs for value in outs]
            selected = graph.call_function(
                torch.ops.torchcond.select_n.default, (index, flat, len(branches))
            )
    selected.meta["val"] = node.meta.get("val")
    node.replace_all_uses_with(selected)
    graph.erase_node(node)


def _inline(graph: torch.fx.Graph, branch: torch.fx.GraphModule, operands) -> list:
    """Copy ``branch``'s nodes into ``graph`` and return the nodes of its outputs."""
    env = dict(zip(branch.graph.find_nodes(op="placeholder"), operands))
    for sub in branch.graph.nodes:
        if sub.op in ("placeholder", "output"):
            continue
        if sub.op == "get_attr":
            raise AssertionError(f"branch reads attribute {sub.target} after lowering")
        env[sub] = graph.node_copy(sub, lambda n: env[n])
    (results,) = branch.graph.find_nodes(op="output")[0].args
    return [env[r] for r in results]


def _as_tensor(graph: torch.fx.Graph, selector, dtype: torch.dtype):
    """Return ``selector`` as a 0-d tensor for the kernel. The operator's tensor selector
    has one element and any shape. A SymBool or SymInt selector (a shape predicate)
    becomes a 0-d tensor of ``dtype``. The kernels clamp an index themselves."""
    value = selector.meta.get("val") if isinstance(selector, torch.fx.Node) else None
    if isinstance(value, torch.Tensor):
        return (
            call_with_value(graph, torch.ops.aten.reshape.default, selector, [])
            if value.dim()
            else selector
        )
    return call_with_value(graph, torch.ops.aten.scalar_tensor.default, selector, dtype=dtype)


def _check_same_metadata(node, branches) -> None:
    """Raise unless all branches' outputs agree in shape and dtype, as a select needs."""
    per_branch = [output_values(b) for b in branches]
    for i, values in enumerate(zip(*per_branch)):
        first = values[0]
        for k, other in enumerate(values[1:], 1):
            if tuple(other.shape) != tuple(first.shape) or other.dtype != first.dtype:
                raise BranchMismatchError(
                    f"lower_to_select: {node.name} output[{i}] differs between branches "
                    f"(branch 0: {tuple(first.shape)} {first.dtype}, branch {k}: "
                    f"{tuple(other.shape)} {other.dtype}); an elementwise select needs "
                    "them equal, so this conditional cannot be lowered"
                )


def portable(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Return a copy of ``ep`` that uses only operators torch itself knows.

    ``torchcond_cond`` becomes ``torch.ops.higher_order.cond`` with the same branch
    graphs and operands; a predicate that is not bool becomes ``pred != 0``.
    ``torchcond_switch`` becomes a chain of conds,
    ``b0 if index <= 0 else (b1 if index <= 1 else ... bn)``, which clamps the index
    as switch does. The select operators that :func:`lower_to_select` leaves become
    ``aten.where``. Nested conditionals, buffer writes (program-level mutations),
    unbacked output sizes, int outputs and SymBool predicates carry over. An output
    of a conditional read at or after a later conditional is copied once, because
    ExecuTorch would otherwise let the later one's branches overwrite it.

    The result needs no torchcond to load or run. Keep ``ep`` itself for what stays
    in torchcond's hands (training through export, higher-order derivatives, branches
    that write in training): ``portable`` is the last step before shipping.

    Args:
        ep: an exported program, as :func:`torch.export.export` returns it, possibly
            after :func:`lower_to_select` or ``run_decompositions``. It is not modified.

    Returns:
        A new :class:`~torch.export.ExportedProgram` that computes the same outputs.

    Raises:
        UnsupportedCondError: a branch graph writes in place to one of its inputs,
            which ``torch.ops.higher_order.cond`` cannot express (an exported program's
            branches return their writes instead); the message names the node and
            the branch graph.

    Examples:
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torchcond.cond(x.sum() > 0, torch.log, torch.zeros_like, (x,))
        >>> x = torch.tensor([1.0, 2.0, 4.0])
        >>> shipped = torchcond.passes.portable(torch.export.export(Model(), (x,)))
        >>> [str(n.target) for n in shipped.graph.nodes if n.op == "call_function"]
        ['aten.sum.default', 'aten.gt.Scalar', 'cond', '<built-in function getitem>']
        >>> shipped.module()(x)
        tensor([0.0000, 0.6931, 1.3863])
    """
    return _portable.portable(ep)


__all__ = ["lower_to_select", "portable"]
