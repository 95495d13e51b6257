"""Checks and rewrites of a traced branch graph, based on its fake values.

* A branch's writes to its inputs (operands or lifted closures) become extra outputs.
  The new values follow the branch's own outputs (``writes_as_outputs``).
* No branch may write to a graph constant.
* No output aliases an input, a constant, or another output. Such outputs are copied.
* Where branches disagree on an output's strides, each branch returns it contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.fx.experimental.symbolic_shapes import free_symbols

from .. import _compat
from .._compat import pytree
from ..errors import BranchMutationError
from .merge import same_layout


def reject_input_writes(gm: torch.fx.GraphModule, label: str, n_operands: int) -> None:
    """Raise if an op writes to an input or a constant, in place or through ``out=``.

    The first ``n_operands`` placeholders are the conditional's operands. The message
    names them by flat position. Later placeholders are closures lifted into inputs.
    """
    for root, i in _input_writes(gm):
        why = (
            "A traced branch may mutate its own intermediates and the tensors it is "
            "given or closes over, not a constant of the program"
        )
        if i is not None and i < n_operands:
            raise BranchMutationError.at(
                "operand", i, f"{label} writes in place to its input {{path}}. {why}"
            )
        raise BranchMutationError(f"{label} writes in place to {_describe_root(root, i)}. {why}")


def written_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Return the positions of the placeholders some op writes to, directly or via a view."""
    return {i for _, i in _input_writes(gm) if i is not None}


def _input_writes(gm: torch.fx.GraphModule):
    """Yield ``(root, placeholder position or None)`` for each write to an input or constant."""
    roots = _root_storages(gm)
    placeholders = gm.graph.find_nodes(op="placeholder")
    for node in gm.graph.nodes:
        for arg in _written_nodes(node):
            # Match by the chain of views as well as by storage. A trace on real
            # tensors may record fake values that share no storage with the input.
            root = roots.get(_storage(arg.meta.get("val"))) or _view_root(arg)
            if root is not None:
                yield root, placeholders.index(root) if root in placeholders else None


def writes_as_outputs(gm: torch.fx.GraphModule, written: Sequence[int]) -> None:
    """Make ``gm`` return the new values of the inputs at ``written`` after its outputs.

    ``gm`` is functionalized. Its only writes are the trailing ``copy_(input, value)``
    nodes that functionalization adds for each input it wrote. Those become outputs.
    An input in ``written`` that this graph leaves alone is returned with its old
    value, and ``copy_aliased_outputs`` later copies it.
    """
    placeholders = gm.graph.find_nodes(op="placeholder")
    new_value: dict[int, torch.fx.Node] = {}
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)):
        target, value = node.args[0], node.args[1]
        if target in placeholders and not node.users:
            new_value[placeholders.index(target)] = value
            gm.graph.erase_node(node)
    if not set(new_value) <= set(written):
        raise AssertionError(f"writes to inputs {sorted(new_value)} not all in {written}")
    output = gm.graph.find_nodes(op="output")[0]
    extra = tuple(new_value.get(i, placeholders[i]) for i in written)
    output.args = (tuple(output.args[0]) + extra,)
    gm.graph.lint()
    gm.recompile()


def copy_aliased_outputs(gm: torch.fx.GraphModule) -> None:
    """Replace each output that aliases an input, a constant or another output by a copy.

    An identity branch then works everywhere without a ``.clone()`` from the user. The
    operator's outputs also never alias its inputs or each other.
    """
    roots = _root_storages(gm)
    seen: set = set()
    aliased = set()
    for i, val in enumerate(output_values(gm)):
        key = _storage(val)
        if key in roots or key in seen:
            aliased.add(i)
        seen.add(key)
    _copy_outputs(gm, aliased)


def align_output_layouts(graphs: Sequence[torch.fx.GraphModule]) -> None:
    """Make each branch return an output contiguous where the branches' strides differ.

    In that case the merged fake output promises contiguous strides (merge.py).
    """
    outputs = [output_values(gm) for gm in graphs]
    # Size arithmetic on the branches' values (a stride s0**2, say) belongs to no
    # trace. With the parent's proxy mode on, it would be recorded there and fail.
    with _compat.disable_proxy_modes_tracing():
        contiguous_needed = [
            [not _compat.definitely_contiguous(val) for val in per_branch]
            if not same_layout(per_branch)
            else [False] * len(graphs)
            for per_branch in zip(*outputs)
        ]
    for i, needed in enumerate(contiguous_needed):
        for gm, copy in zip(graphs, needed):
            if copy:
                _copy_outputs(gm, {i}, memory_format=torch.contiguous_format)


def returned_inputs(gm: torch.fx.GraphModule) -> dict[int, int]:
    """Map each output position to the input it returns, directly or as a clone.

    ``copy_aliased_outputs`` makes such a clone of an input returned unchanged."""
    placeholders = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    found = {}
    for j, out in enumerate(gm.graph.find_nodes(op="output")[0].args[0]):
        if isinstance(out, torch.fx.Node) and out.target is torch.ops.aten.clone.default:
            out = out.args[0]
        if out in placeholders:
            found[j] = placeholders[out]
    return found


def output_values(gm: torch.fx.GraphModule) -> list:
    return [n.meta["val"] for n in gm.graph.find_nodes(op="output")[0].args[0]]


def _storage(value):
    return _compat.storage_key(value) if isinstance(value, torch.Tensor) else None


def _root_storages(gm) -> dict:
    """Map each storage to the placeholder or constant node that owns it."""
    roots: dict[object, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("val")
        elif node.op == "get_attr":
            value = node.meta.get("val", getattr(gm, node.target, None))
        else:
            continue
        key = _storage(value)
        if key is not None:
            roots.setdefault(key, node)
    return roots


def writes_in_place(gm: torch.fx.GraphModule) -> bool:
    """Return whether an op of ``gm`` writes to an argument. Nested graphs do not count."""
    return any(_written_nodes(node) for node in gm.graph.nodes)


def _written_nodes(node) -> list:
    """Return the argument nodes that ``node``'s schema marks as written (``a!``)."""
    if node.op != "call_function" or not isinstance(node.target, _compat.OpOverload):
        return []
    written = written_arguments(node.target, node.args, node.kwargs)
    return [leaf for leaf in written if isinstance(leaf, torch.fx.Node)]


def _view_root(node):
    """Return the placeholder or constant that ``node`` is a view of, or None.

    Each view op in the chain has a first output that aliases its first argument."""
    while node.op == "call_function" and isinstance(node.target, _compat.OpOverload):
        returns = _compat.schema_of(node.target).returns
        if not returns or returns[0].alias_info is None or not node.args:
            return None
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return None
    return node if node.op in ("placeholder", "get_attr") else None


def written_arguments(op, args, kwargs) -> list:
    """Return the leaves of the arguments that ``op``'s schema marks as written (``a!``).

    This covers both in-place writes and ``out=`` arguments."""
    written = []
    for i, arg in enumerate(_compat.schema_of(op).arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.name in kwargs:
            value = kwargs[arg.name]
        elif i < len(args) and not arg.kwarg_only:
            value = args[i]
        else:
            continue
        written.extend(pytree.tree_leaves(value))
    return written


def _describe_root(node, placeholder_index: int | None) -> str:
    what = "a tensor it closes over" if placeholder_index is not None else "a constant tensor"
    val = node.meta.get("val")
    shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
    return f"{what} (traced as '{node.name}', shape {shape})"


def _copy_outputs(gm, indices, memory_format=None) -> None:
    """Replace the graph's outputs at ``indices`` with fresh copies."""
    if not indices:
        return
    output = gm.graph.find_nodes(op="output")[0]
    outs = list(output.args[0])
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    for i in sorted(indices):
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(torch.ops.aten.clone.default, (outs[i],), kwargs)
        # A trace records values that no torch.func level wraps, active or not.
        with _compat.outside_trace_and_transforms():
            copy.meta["val"] = outs[i].meta["val"].clone(**kwargs)
        outs[i] = copy
    output.args = (tuple(outs),)
    gm.recompile()


def symbols_of(value) -> set:
    """Return the free symbols of a SymInt, SymFloat or SymBool, or of a tensor's sizes
    and strides. Anything else has none."""
    if isinstance(value, torch.Tensor):
        return set().union(*map(free_symbols, (*value.shape, *value.stride())))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(free_symbols(value))
    return set()


def is_symbolic_scalar(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def getattr_path(module: torch.nn.Module, target: str):
    """Resolve a get_attr node's dotted target, such as ``a.b`` to ``module.a.b``."""
    value = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def call_with_value(graph: torch.fx.Graph, op, *args, **kwargs) -> torch.fx.Node:
    """Add ``op(*args, **kwargs)`` to ``graph`` with its fake value in ``meta["val"]``,
    computed in the fake mode of the first tensor argument's value."""
    node = graph.call_function(op, args, kwargs)
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
    mode = next((getattr(v, "fake_mode", None) for v in values if hasattr(v, "fake_mode")), None)
    if mode is not None:
        with mode:
            node.meta["val"] = op(*values, **kwargs)
    return node


def bool_predicate(graph: torch.fx.Graph, pred):
    """``pred`` as a bool tensor (``pred != 0`` unless it is bool), or a SymBool as it is:
    how cond reads an operator's predicate, as graph ops."""
    value = pred.meta.get("val") if isinstance(pred, torch.fx.Node) else pred
    if isinstance(value, torch.Tensor) and value.dtype != torch.bool:
        return call_with_value(graph, torch.ops.aten.ne.Scalar, pred, 0)
    return pred
