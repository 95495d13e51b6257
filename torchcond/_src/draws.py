"""Random draws in branch graphs. The forward saves them, and the derivative replays them.

A traced derivative recomputes a branch from its inputs (autograd.py). A branch that
draws random numbers (dropout, ``rand_like``, ``bernoulli``) would draw new ones
there, and its gradient would belong to a different mask than its output. cond_v2
turns what the backward needs into outputs. In the same way, the forward conditional
here returns every draw. The derivative runs branches in which each random op is
replaced by the value it drew.

Branches must return the same outputs, so each branch returns every branch's draws.
It returns its own draws, and zeros shaped like the other branches' draws. Nothing
reads the untaken branches' zeros, because each branch replays only its own draws. A
nested conditional whose branches draw is rewritten the same way, recursively. It
returns its draws after its outputs, and the enclosing branch returns them on. In the
replay, the nested conditional gets them back as operands.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple, cast

import torch

from .. import _compat
from ..errors import UnsupportedCondError
from .kinds import is_conditional_op, pack, unpack
from .subgraph import getattr_path, written_arguments


class Draws(NamedTuple):
    """Branch graphs rewritten for a conditional whose branches draw random numbers.

    ``forward[i]`` returns branch ``i``'s outputs, then ``n_draws`` draws. There is one
    slot per random value that any branch draws. ``replay[i]`` takes the operands,
    then the ``n_draws`` draws. It uses its own draws instead of drawing.
    """

    forward: tuple[torch.fx.GraphModule, ...]
    replay: tuple[torch.fx.GraphModule, ...]
    values: tuple[torch.Tensor, ...]  # Each draw's (fake) value.

    @property
    def n_draws(self) -> int:
        return len(self.values)


class _Slot(NamedTuple):
    """One drawn value in a branch graph."""

    node: torch.fx.Node  # A random op, or a nested conditional whose branches draw.
    output_at: int | None  # The index in the node's output, or None for the output itself.
    value: torch.Tensor
    inner: Draws | None = None  # A nested conditional's rewritten branches.


def saved_for_derivative(branches: Sequence, labels: Sequence[str]) -> Draws | None:
    """Return the branches rewritten to save and replay their draws, or None if none draws."""
    if not all(isinstance(b, torch.fx.GraphModule) for b in branches):
        return None
    found = [_random_values(gm, label) for gm, label in zip(branches, labels)]
    if not any(found):
        return None
    slots = [(i, slot) for i, own in enumerate(found) for slot in own]
    return Draws(
        forward=tuple(_returning_draws(gm, i, slots) for i, gm in enumerate(branches)),
        replay=tuple(_replaying_draws(gm, i, slots) for i, gm in enumerate(branches)),
        values=tuple(slot.value for _, slot in slots),
    )


# A GraphModule meta key. It marks a graph that replays the forward's draws, given as
# inputs.
_REPLAYS_DRAWS = "torchcond_replays_draws"


def replays_draws(gm) -> bool:
    """True when ``gm`` is a branch that ``saved_for_derivative`` rewrote to replay draws."""
    return isinstance(gm, torch.fx.GraphModule) and bool(gm.meta.get(_REPLAYS_DRAWS))


def refuse_redraws(derivative: torch.fx.GraphModule) -> None:
    """Raise if ``derivative`` reads a draw, since it would draw anew, not replay.

    Branches that ``saved_for_derivative`` rewrote have no replayable random op left.
    Two kinds of draws remain. Some ops cannot be replayed. A branch that it did not
    rewrite may draw in its derivative (torch.func transforms over Python branches).
    Only a derivative that reads such a draw is refused. A forward is right, and so is
    a derivative that does not need the drawn value (``normal(mean, std)``'s gradient
    for ``mean``).
    """
    node = _read_draw(derivative)
    if node is None:
        return
    if not _replayable(node):
        raise UnsupportedCondError(
            f"cannot trace this derivative of a conditional: its branch calls "
            f"{node.target}, whose output depends on its inputs through a random draw the "
            "derivative cannot replay. Draw the noise alone (torch.randn_like, "
            "torch.rand_like) and combine it with the inputs, or differentiate eagerly"
        )
    raise UnsupportedCondError(
        f"cannot trace this derivative of a conditional: its branch calls {node.target}, "
        "and the traced derivative would draw new random numbers instead of the "
        "forward's. Differentiate with torch.autograd.grad or .backward() inside the "
        "traced function, or under torch.compile: both replay the forward's draws"
    )


def _read_draw(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """Return a random op whose value something reads, in ``gm`` or a graph it calls."""
    for node in gm.graph.nodes:
        if _is_random(node) and node.users:  # An unread draw changes nothing.
            return node
        if node.op == "get_attr":
            sub = getattr_path(gm, node.target)
            found = _read_draw(sub) if isinstance(sub, torch.fx.GraphModule) else None
            if found is not None:
                return found
    return None


def _is_random(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return node.op == "call_function" and torch.Tag.nondeterministic_seeded in tags


# Random ops whose derivative with respect to their inputs is zero or undefined. The
# saved draw replaces such an op exactly. Other random ops have gradients that read the
# draw, such as a reparameterized sample (``_standard_gamma`` under ``Gamma.rsample``).
_DRAWS = frozenset(
    {
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "bernoulli",
        "bernoulli_",
        "uniform",
        "uniform_",
        "normal",  # Autograd gives torch.normal's mean and std zero gradients.
        "normal_",
        "normal_functional",
        "exponential",
        "exponential_",
        "geometric",
        "geometric_",
        "cauchy",
        "cauchy_",
        "log_normal",
        "log_normal_",
        "random",
        "random_",
        "multinomial",
        "poisson",
    }
)
_NATIVE_DROPOUT = torch.ops.aten.native_dropout.default


def _random_values(gm: torch.fx.GraphModule, label: str) -> list[_Slot]:
    """Return the draws that ``gm`` can replay, including its nested conditionals'.
    Other random ops, and draws in other operators' graphs, stay for ``refuse_redraws``."""
    refs: list[_Slot] = []
    for node in gm.graph.nodes:
        if _is_conditional(node):
            refs.extend(_nested_draws(gm, node, label))
            continue
        if not (_is_random(node) and _replayable(node)):
            continue
        val = node.meta.get("val")
        if node.target is _NATIVE_DROPOUT:
            refs.append(_Slot(node, 1, val[1]))  # The mask. The output is recomputed from it.
            continue
        if isinstance(val, torch.Tensor):
            refs.append(_Slot(node, None, val))
        else:
            refs.extend(
                _Slot(node, k, v)
                for k, v in enumerate(cast(tuple, val))
                if isinstance(v, torch.Tensor)
            )
    return refs


def _is_conditional(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_conditional_op(node.target)


def _nested_draws(gm, node: torch.fx.Node, label: str) -> list[_Slot]:
    """Rewrite the branches of a nested conditional that draws. Return one slot per draw,
    which the rewritten node returns after its outputs."""
    _, branch_nodes, _ = unpack(node.args)
    inner_branches = [getattr_path(gm, b.target) for b in branch_nodes]
    inner_labels = [f"{label} (nested branch {k})" for k in range(len(inner_branches))]
    inner = saved_for_derivative(inner_branches, inner_labels)
    if inner is None:
        return []
    n_out = len(node.meta["val"])
    return [_Slot(node, n_out + t, v, inner) for t, v in enumerate(inner.values)]


def _replayable(node: torch.fx.Node) -> bool:
    if node.target is _NATIVE_DROPOUT:
        return True
    name = str(node.target)
    return name.count(".") >= 1 and name.split(".")[1] in _DRAWS


def _copy(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict, list]:
    """Return a new GraphModule over a copy of ``gm``'s graph, without its output node."""
    graph = torch.fx.Graph()
    env: dict = {}
    outputs = graph.graph_copy(gm.graph, env)
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    return copy, env, list(cast(tuple, outputs))


def _returning_draws(gm, i: int, slots: Sequence[tuple[int, _Slot]]) -> torch.fx.GraphModule:
    copy, env, outputs = _copy(gm)
    graph = copy.graph
    for nested in _nested_nodes(slots, i):
        inner = cast(Draws, nested.inner)
        node = env[nested.node]
        _swap_branches(copy, node, inner.forward)
        node.meta["val"] = (*node.meta["val"], *inner.values)
    returned = set(outputs)
    sizes = _SizeNodes(graph)  # Appended at the end, since there is no output node yet.
    for j, slot in slots:
        if j == i:
            node = _own_value(graph, env, slot)
            if node in returned or _written_after(gm, slot):
                # Save the value as drawn, before the branch writes to it in place.
                # Outputs of a conditional also never alias each other.
                with graph.inserting_after(node):
                    node = _clone(graph, node, slot.value)
        else:
            node = _zeros_like_in(graph, sizes, slot.value)
        outputs.append(node)
        returned.add(node)
    graph.output(tuple(outputs))
    graph.lint()
    copy.recompile()
    return copy


def _replaying_draws(gm, i: int, slots: Sequence[tuple[int, _Slot]]) -> torch.fx.GraphModule:
    copy, env, outputs = _copy(gm)
    copy.meta[_REPLAYS_DRAWS] = True
    graph = copy.graph
    graph.output(tuple(outputs))
    after_inputs = next(n for n in graph.nodes if n.op != "placeholder")
    replaced = []
    nested_inputs: dict[torch.fx.Node, list] = {}
    for k, (j, slot) in enumerate(slots):
        with graph.inserting_before(after_inputs):  # After the operands, in slot order.
            placeholder = graph.placeholder(f"draw_{k}")
        placeholder.meta["val"] = slot.value
        if j == i and slot.inner is not None:
            nested_inputs.setdefault(slot.node, []).append(placeholder)
        elif j == i:
            node, index = slot.node, slot.output_at
            mine = env[node]
            value = placeholder
            if _written_after(gm, slot):  # The branch writes to its draw, so clone the input.
                with graph.inserting_after(mine):
                    value = _clone(graph, placeholder, slot.value)
            if index is None:
                mine.replace_all_uses_with(value)
                _redirect_destination(graph, mine, value)
            else:
                for user in list(mine.users):
                    if user.target is operator.getitem and user.args[1] == index:
                        user.replace_all_uses_with(value)
                        graph.erase_node(user)
            if node.target is _NATIVE_DROPOUT:
                _dropout_from_mask(graph, mine, placeholder)
            replaced.append(mine)
    for node in dict.fromkeys(replaced):
        if not node.users:
            graph.erase_node(node)
    for nested in _nested_nodes(slots, i):
        # The inner conditional calls branches that replay and gets its draws as operands.
        node = env[nested.node]
        _swap_branches(copy, node, cast(Draws, nested.inner).replay)
        selector, branch_nodes, operands = unpack(node.args)
        node.args = pack(selector, branch_nodes, (*operands, *nested_inputs[nested.node]))
    graph.lint()
    copy.recompile()
    return copy


def _nested_nodes(slots: Sequence[tuple[int, _Slot]], i: int) -> list[_Slot]:
    """Return branch ``i``'s nested conditionals that draw, one slot each."""
    seen: dict = {}
    for j, slot in slots:
        if j == i and slot.inner is not None:
            seen.setdefault(slot.node, slot)
    return list(seen.values())


def _swap_branches(gm: torch.fx.GraphModule, node: torch.fx.Node, graphs) -> None:
    """Make the conditional ``node`` of ``gm`` call ``graphs`` as its branches."""
    selector, branch_nodes, operands = unpack(node.args)
    swapped = []
    for old, new in zip(branch_nodes, graphs):
        name, k = f"{old.target}_draws", 0
        while hasattr(gm, f"{name}_{k}"):
            k += 1
        gm.add_submodule(f"{name}_{k}", new)
        with gm.graph.inserting_before(node):
            swapped.append(gm.graph.get_attr(f"{name}_{k}"))
    node.args = pack(selector, swapped, operands)
    for old in branch_nodes:
        if not old.users:
            gm.graph.erase_node(old)


def _written_after(gm: torch.fx.GraphModule, slot: _Slot) -> bool:
    """True when a node after the random op writes in place to the value it drew."""
    if slot.inner is not None:  # A nested conditional's output is fresh.
        return False
    node = slot.node
    key = _compat.storage_key(slot.value)
    later = False
    for other in gm.graph.nodes:
        if other is node:
            later = True
        elif later and other.op == "call_function" and isinstance(other.target, _compat.OpOverload):
            for written in written_arguments(other.target, other.args, other.kwargs):
                val = written.meta.get("val") if isinstance(written, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and _compat.storage_key(val) == key:
                    return True
    return False


def _redirect_destination(graph: torch.fx.Graph, random_node, value) -> None:
    """Make later readers of an in-place draw's destination read the replayed draw. An
    in-place draw such as ``empty.bernoulli_(p)`` writes its destination."""
    if not isinstance(random_node.target, _compat.OpOverload):
        return
    for dest in written_arguments(random_node.target, random_node.args, random_node.kwargs):
        if not isinstance(dest, torch.fx.Node):
            continue
        order = {n: k for k, n in enumerate(graph.nodes)}
        for user in list(dest.users):
            if user is not random_node and order[user] > order[random_node]:
                user.replace_input_with(dest, value)


def _clone(graph, node, val) -> torch.fx.Node:
    with _compat.outside_trace_and_transforms():
        copy = val.clone()
    return _call(graph, torch.ops.aten.clone.default, (node,), copy)


def _dropout_from_mask(graph: torch.fx.Graph, dropout: torch.fx.Node, mask: torch.fx.Node) -> None:
    """Recompute ``native_dropout``'s output from its saved mask, as ATen does. The
    output is ``input * mask * (1 / (1 - p))``, or the input itself when not training."""
    x, p, train = (*dropout.args, None)[:3]
    p = float(cast(float, p))
    scale = (0.0 if p == 1 else 1.0 / (1.0 - p)) if train is not False else 1.0
    for user in list(dropout.users):
        if user.target is operator.getitem and user.args[1] == 0:
            with graph.inserting_before(user):
                masked = _call(graph, torch.ops.aten.mul.Tensor, (x, mask), user.meta.get("val"))
                out = _call(graph, torch.ops.aten.mul.Tensor, (masked, scale), user.meta.get("val"))
            user.replace_all_uses_with(out)
            graph.erase_node(user)


def _own_value(graph: torch.fx.Graph, env: dict, slot: _Slot) -> torch.fx.Node:
    mine, k = env[slot.node], slot.output_at
    if k is None:
        return mine
    for user in mine.users:
        if user.target is operator.getitem and user.args[1] == k:
            return user
    with graph.inserting_after(mine):
        return _call(graph, operator.getitem, (mine, k), slot.value)


def _call(graph, target, args, val, kwargs=None) -> torch.fx.Node:
    node = graph.call_function(target, args, kwargs or {})
    node.meta["val"] = val
    return node


def _zeros_like_in(graph: torch.fx.Graph, sizes: _SizeNodes, value: torch.Tensor) -> torch.fx.Node:
    """Return zeros shaped like another branch's draw, with sizes from this graph's inputs."""
    size = [sizes.node_for(s) for s in value.shape]
    with _compat.outside_trace_and_transforms():
        val = value.new_zeros(value.shape)
    return _call(
        graph,
        torch.ops.aten.zeros.default,
        (size,),
        val,
        {"dtype": value.dtype, "device": value.device},
    )


class _SizeNodes:
    """Nodes for symbolic sizes, built from the sizes of the graph's placeholders.

    Every branch graph takes the same inputs, so a size of one branch's draw that is
    an expression in input sizes can be rebuilt in another branch.
    """

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph
        self.known: dict = {}
        for ph in graph.find_nodes(op="placeholder"):
            val = ph.meta.get("val")
            if isinstance(val, torch.SymInt):
                self.known.setdefault(val.node.expr, (ph, val))
            elif isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt):
                        self.known.setdefault(s.node.expr, ((ph, d), s))

    def node_for(self, size):
        if not isinstance(size, torch.SymInt):
            return int(size)
        built = self._build(size.node.expr)
        if built is None:
            raise UnsupportedCondError(
                f"cannot save a random draw of a traced branch for its derivative: its size "
                f"{size} is not an expression in the sizes of the conditional's inputs"
            )
        return built[0]

    def _build(self, expr):
        """Return ``(node or int, SymInt or int)`` for ``expr``, or None if it cannot."""
        if expr.is_Integer:
            return int(expr), int(expr)
        hit = self.known.get(expr)
        if hit is not None:
            where, val = hit
            if isinstance(where, tuple):
                ph, d = where
                node = _call(self.graph, torch.ops.aten.sym_size.int, (ph, d), val)
                self.known[expr] = (node, val)
                return node, val
            return where, val
        # These are sympy's own flags, like ``is_Integer`` above. Importing sympy costs
        # most of a second, and torch imports it only when shapes go symbolic.
        if expr.is_Add or expr.is_Mul:
            combine = operator.add if expr.is_Add else operator.mul
            parts = [self._build(arg) for arg in expr.args]
            if any(p is None for p in parts):
                return None
            node, val = parts[0]
            for other, other_val in parts[1:]:
                val = combine(val, other_val)
                node = _call(self.graph, combine, (node, other), val)
            return node, val
        return None
