"""An Inductor rewrite that makes a branch's write to an operand happen in place again.

A traced conditional is functional. A branch that writes to an operand returns the
operand's new value, and the enclosing graph writes it back with ``copy_`` (see
tracing.py). Compiled as it is, a one-row write into a large buffer costs the whole
buffer several times over. The branch builds the new buffer, the untaken branch
copies the old one, and ``copy_`` copies the result back.

The branches can often write in place instead, as the user's code did. This needs
two things. The graph only writes such an output back into the operand it came from.
Nothing reads the operand's old value afterwards. The op that makes the new value
(``index_put``) then becomes its in-place form (``index_put_``) on the branch's input.
A branch that leaves the operand alone returns nothing for it. The conditional's
output is the operand itself, so the ``copy_`` has nothing to do. Inductor's
conditional IR supports branches that mutate an operand from torch 2.13 on. The
lowering (``_compat/inductor.py``) asks ``in_place`` for the rewritten branch graphs.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from .. import _compat

_COPY_ = torch.ops.aten.copy_.default
_CLONE = torch.ops.aten.clone.default


def in_place(
    node: torch.fx.Node, graphs: Sequence[torch.fx.GraphModule]
) -> tuple[list[torch.fx.GraphModule], dict[int, int]] | None:
    """Return branch graphs of conditional ``node`` that write in place, and a plan.

    The plan is ``{output: operand}`` for the outputs that the branches no longer
    return. These are always the last outputs. Return None when no output can go, or
    when some branch cannot write one of them in place."""
    written = _written_back(node)
    n_outputs = len(node.meta["val"])
    plan: dict[int, int] = {}
    j = n_outputs - 1
    while j in written:  # Only trailing outputs can go, so the rest keep their places.
        plan[j] = written[j]
        j -= 1
    if not plan:
        return None
    rewritten = [_writing_in_place(gm, plan) for gm in graphs]
    if any(gm is None for gm in rewritten):
        return None
    return [gm for gm in rewritten if gm is not None], plan


def _written_back(node: torch.fx.Node) -> dict[int, int]:
    """Return ``{output: operand}`` for outputs of ``node`` whose one use is a ``copy_``
    into that operand. The operand must be a graph input that nothing else reads after
    ``node``."""
    operands = list(_sequence(node.args[-1]))
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    found: dict[int, int] = {}
    for user in node.users:
        if user.target is not operator.getitem or len(user.users) != 1:
            continue
        (copy,) = user.users
        if copy.target is not _COPY_ or copy.args[1] is not user or copy.users:
            continue
        target = copy.args[0]
        if not isinstance(target, torch.fx.Node) or target.op != "placeholder":
            continue
        if operands.count(target) != 1:
            continue
        if any(order[u] > order[node] for u in target.users if u is not copy):
            continue
        index = user.args[1]
        if isinstance(index, int):
            found[index] = operands.index(target)
    return found


def _sequence(arg) -> Sequence:
    return arg if isinstance(arg, (tuple, list)) else ()


def _writing_in_place(gm: torch.fx.GraphModule, plan: dict[int, int]):
    """Return a copy of ``gm`` that writes the inputs in ``plan`` in place. The copy
    returns only the outputs before them. Return None if the rewrite is not possible."""
    gm = _copy(gm)
    graph = gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    output = graph.find_nodes(op="output")[0]
    outs = list(output.args[0])
    order = {n: i for i, n in enumerate(graph.nodes)}
    dropped_clones = []
    for j, w in plan.items():
        value, target = outs[j], placeholders[w]
        if value is target:
            continue
        # A clone of the input means that this branch leaves the operand alone.
        if value.target is _CLONE and value.args[0] is target:
            dropped_clones.append(value)
            continue
        in_place_op = _in_place_variant(value.target)
        if in_place_op is None or not value.args or value.args[0] is not target:
            return None
        if any(order[u] > order[value] for u in target.users if u is not value):
            return None  # Something reads the old value after the write.
        value.target = in_place_op
    output.args = (tuple(outs[: min(plan)]),)
    for clone in dropped_clones:
        if not clone.users:
            graph.erase_node(clone)
    graph.lint()
    gm.recompile()
    return gm


def _in_place_variant(op):
    """Return ``aten.foo_.overload`` for ``aten.foo.overload``. Return None unless that
    variant exists and writes to its first argument."""
    if not isinstance(op, _compat.OpOverload):
        return None
    namespace, name, overload = str(op).split(".")
    packet = getattr(getattr(torch.ops, namespace), name + "_", None)
    variant = getattr(packet, overload, None) if packet is not None else None
    if not isinstance(variant, _compat.OpOverload):
        return None
    arguments = _compat.schema_of(variant).arguments
    first = arguments[0] if arguments else None
    if first is None or first.alias_info is None or not first.alias_info.is_write:
        return None
    return variant


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(gm, graph)
