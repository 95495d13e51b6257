"""Inductor support: torchcond's operators lower to Inductor's conditional IR.

``torchcond_cond`` lowers exactly as torch's cond does: one conditional IR node whose
branches are lowered as subgraphs, emitted by the wrapper as ``if pred: ... else:``
around calls of the compiled branch functions. Nothing runs through Python per call
but the wrapper's own ``if``.

Two shapes of that IR exist. torch 2.11 and 2.13 have the two-way ``ir.Conditional``;
torch 2.14 replaced it with the N-way ``ir.Switch`` (``if i == 0: ... elif i == 1: ...
else: ...``, with ``torch.cond`` as the two-branch case), which torch 2.15 keeps. With
``ir.Switch``, ``torchcond_switch`` lowers to one node over the clamped index. With
``ir.Conditional`` it has no N-way counterpart, so it lowers to a chain of them:
``switch(i, b0, b1, ..., bn)`` is ``b0 if i <= 0 else switch(i - 1, b1, ..., bn)``,
the inner switch living in a small synthesized subgraph that takes the index as an
extra input (and lowers through this same rule). That keeps the clamping semantics (a
negative index takes ``b0``, a too-large one the last branch) without a clamp. A
tensor index that is not on the CPU is copied to the host once at the top, so the
chain costs one device sync, as a cond does.

Also here: Inductor's fake-tensor updater learns which arguments our branches take
(otherwise it warns once per compile and re-propagates them without inputs), a tensor
constant a branch makes among them.

Checked on torch 2.11.0, 2.13.0 (``ir.Conditional``), 2.14.1 and 2.15.0
(``ir.Switch``): both ``create``s read the operands' fake values from
``V.graph.current_node.args[-1]``, which is why the chain's links are created under a
stand-in node whose last argument lists the extra input.
"""

from __future__ import annotations

import contextlib
import functools
import operator

import torch

from . import TORCH_VERSION, FakeTensor
from .after_import import when_imported

_LOWERING = "torch._inductor.lowering"
_FX_UTILS = "torch._inductor.fx_utils"


def install(cond_op, switch_op, in_place) -> None:
    """Register the lowerings once Inductor's lowering table is imported.

    ``in_place(node, branch_graphs)`` (reinplace.py) gives branch graphs that write to
    operands in place, and which outputs they no longer return, or None.
    """
    when_imported(
        _LOWERING, lambda lowering: _register_lowerings(lowering, cond_op, switch_op, in_place)
    )
    when_imported(_FX_UTILS, lambda fx_utils: _teach_subgraph_args(fx_utils, (cond_op, switch_op)))


def _register_lowerings(lowering, cond_op, switch_op, in_place) -> None:
    """Each operator's lowering, bound to it and to reinplace.py's ``in_place``."""
    cond_rule = functools.partial(_lower_cond, lowering, cond_op, in_place)
    switch_rule = functools.partial(_lower_switch, lowering, switch_op, in_place)
    lowering.register_lowering(cond_op, type_promotion_kind=None)(cond_rule)
    lowering.register_lowering(switch_op, type_promotion_kind=None)(switch_rule)


def _lower_cond(lowering, cond_op, in_place, pred, true_subgraph, false_subgraph, operands):
    from torch._inductor.virtualized import V

    _refuse_unbound_predicate(cond_op.name(), V.graph.current_node, pred)
    _disable_cudagraphs_if_on_gpu(lowering, cond_op.name(), [pred, *operands])
    (true_subgraph, false_subgraph), written = _writing_in_place(
        in_place, [true_subgraph, false_subgraph]
    )
    # An output written back into its operand is the operand: copy_ skips it.
    outputs = _conditional(pred, true_subgraph, false_subgraph, operands)
    return outputs + [operands[w] for w in written]


def _lower_switch(lowering, switch_op, in_place, index, *branches_then_operands):
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    *branches, operands = branches_then_operands
    node = V.graph.current_node
    _disable_cudagraphs_if_on_gpu(lowering, switch_op.name(), [index, *operands])
    if _n_way():
        branches, written = _writing_in_place(in_place, branches)
        return _n_way_switch(lowering, index, branches, operands) + [operands[w] for w in written]
    if len(branches) == 1:
        # A one-branch switch: both sides of the conditional are that branch.
        only = branches[0]
        branches = [only, ir.Subgraph(name=f"{node.name}_only", graph_module=only.graph_module)]
    return _switch_chain(lowering, switch_op, node, index, branches, operands)


def _switch_chain(lowering, switch_op, node, index, branches, operands):
    """``ir.Conditional``'s switch: b0 if the index is at most 0, else a subgraph
    holding ``switch(index - 1, b1, ..., bn)``."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    index, index_value = _on_host(lowering, index, _fx_value(node.args[0]))
    first_taken = _at_most(lowering, index, 0)
    if len(branches) == 2:
        return _conditional(first_taken, branches[0], branches[1], operands)
    index, index_value = _bindable(lowering, index, index_value)
    link = _LinkBuilder(node, [_fx_value(a) for a in node.args[-1]], index_value)
    first = ir.Subgraph(name=f"{node.name}_case_0", graph_module=link.ignoring_index(branches[0]))
    rest = ir.Subgraph(name=f"{node.name}_rest", graph_module=link.rest(switch_op, branches[1:]))
    with V.graph.set_current_node(link.stand_in(switch_op)):
        return _conditional(first_taken, first, rest, [*operands, index])


def _n_way() -> bool:
    """torch 2.14 replaced ir.Conditional with the N-way ir.Switch."""
    from torch._inductor import ir

    return hasattr(ir, "Switch")


def _branches_may_write() -> bool:
    """Branches that write to an operand: ir.Conditional orders them with the operand's
    readers (a MutationOutput per written operand) from torch 2.13 on, ir.Switch too
    (checked on 2.13.0, 2.14.1, 2.15.0; 2.11.0's ir.Conditional does not)."""
    return _n_way() or TORCH_VERSION >= (2, 13)


def _disable_cudagraphs_if_on_gpu(lowering, op_name, values) -> None:
    """Inductor's cudagraph trees cannot record a host-side branch: same reason, same
    flag as torch.cond's lowering."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if any(isinstance(v, ir.IRNode) and lowering.is_triton(v) for v in values):
        message = (
            f"control flow operator: {op_name} picks its branch on the host; "
            "strategy='select' keeps a conditional on the device and in the graph."
        )
        stack_trace = V.graph.current_node.meta.get("stack_trace")
        if stack_trace:
            message = f"{message} Found from :\n {stack_trace}"
        V.graph.disable_cudagraphs_reason = message


def _writing_in_place(in_place, subgraphs):
    """The branches, writing in place what the graph only writes back, and the
    operands that stand for the outputs they no longer return (in order)."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if not _branches_may_write():
        return subgraphs, []
    plan = in_place(V.graph.current_node, [s.graph_module for s in subgraphs])
    if plan is None:
        return subgraphs, []
    graphs, written = plan
    subgraphs = [ir.Subgraph(name=s.name, graph_module=g) for s, g in zip(subgraphs, graphs)]
    return subgraphs, [written[j] for j in sorted(written)]


def _conditional(pred, true_subgraph, false_subgraph, operands):
    from torch._inductor import ir

    with _no_donated_branch_inputs():
        if _n_way():  # a bool selector reads as 0 (false) or 1 (true)
            outputs = ir.Switch.create(
                pred, [false_subgraph, true_subgraph], list(operands), is_cond=True
            )
        else:
            outputs = ir.Conditional.create(pred, true_subgraph, false_subgraph, list(operands))
    _depend_on_predicate_symbols(pred, outputs)
    return list(map(ir.TensorBox.create, outputs))


def _n_way_switch(lowering, index, branches, operands):
    from torch._inductor import ir

    # ir.Switch takes the last branch for any index it does not list, negative ones
    # included: clamping first keeps a negative index on the first branch.
    index = _clamped(lowering, index, len(branches))
    with _no_donated_branch_inputs():
        outputs = ir.Switch.create(index, list(branches), list(operands))
    _depend_on_predicate_symbols(index, outputs)
    return list(map(ir.TensorBox.create, outputs))


@contextlib.contextmanager
def _no_donated_branch_inputs():
    """While the branch graphs are lowered, no input of theirs is a donated buffer.

    Inductor lowers each branch graph with the backward graph's donated-buffer
    positions (``fw_metadata.bw_donated_idxs``, read when a graph is made), so a
    branch input at such a position, a gradient say, was reused in place. Another
    input that is the same tensor then read the result (2.11 and 2.13; the field is
    the same on 2.14 and 2.15). The positions are put back afterwards, so the
    backward graph itself still donates its buffers.
    """
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None or not getattr(meta, "bw_donated_idxs", None):
        yield
        return
    saved = meta.bw_donated_idxs
    meta.bw_donated_idxs = []
    try:
        yield
    finally:
        meta.bw_donated_idxs = saved


_HOST = torch.device("cpu")


def _on_host(lowering, index, index_value):
    """The chain reads the index once per link: a device index would sync each time."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if isinstance(index, ir.IRNode) and index.get_device() != _HOST:
        with V.fake_mode:
            index_value = index_value.to(_HOST)
        index = lowering.lowerings[torch.ops.aten._to_copy.default](index, device=_HOST)
    return index, index_value


def _bindable(lowering, index, index_value):
    """A subgraph input binds a plain symbol only (``u0``, not ``min(2, u0)``), so a
    compound symbolic index enters the chain as a host tensor."""
    import sympy
    from torch._inductor.virtualized import V

    if isinstance(index, sympy.Expr) and not isinstance(index, (sympy.Symbol, sympy.Integer)):
        with V.fake_mode:
            index_value = torch.empty((), dtype=torch.int64, device=_HOST)
        index = lowering.lowerings[torch.ops.aten.scalar_tensor.default](
            index, dtype=torch.int64, device=_HOST
        )
    return index, index_value


def _refuse_unbound_predicate(op_name: str, node: torch.fx.Node, pred) -> None:
    """A graph input such as ``Sym(zuf0 > 0.0)`` cannot be read by Inductor's wrapper.

    That happens in a backward graph when the forward's predicate came from
    ``.item()``: the partitioner saves the relation itself, and Inductor binds only
    plain symbols from graph inputs, so the compiled code would fail with a NameError
    on its first call (torch.cond fails the same way on 2.13).
    """
    import sympy
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from ..errors import UnsupportedCondError

    selector = node.args[0]
    if (
        isinstance(selector, torch.fx.Node)
        and selector.op == "placeholder"
        and isinstance(pred, sympy.Basic)
        and not isinstance(pred, sympy.Symbol)
        and free_unbacked_symbols(pred)
    ):
        raise UnsupportedCondError(
            f"{op_name}: Inductor cannot compile a graph whose predicate is the input "
            f"{selector.name} = {pred}, a relation over a value read with .item(). This "
            "happens in the backward of a conditional on a Python scalar taken from a "
            "tensor. Keep the predicate a tensor (for example `x.sum() > 0` rather than "
            "`x.sum().item() > 0`), or train with backend='aot_eager'."
        )


def _depend_on_predicate_symbols(pred, outputs) -> None:
    """Keep alive the ``.item()`` that defines a data-dependent predicate's symbol.

    A symbolic predicate is a sympy relation (``u0 > 0``), which is not a sympy
    ``Expr``; ``ExternKernel.get_free_symbol_uses`` only collects symbols from
    ``Expr`` arguments, so the scheduler drops the node that defines ``u0`` and the
    wrapper reads an undefined name (torch.cond fails the same way on 2.13). Listing
    the predicate's symbols as constant arguments (which the conditional's codegen
    never prints) records the dependency.
    """
    import sympy
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if not isinstance(pred, sympy.Basic) or not outputs:
        return
    symbols = sorted(free_unbacked_symbols(pred), key=str)
    if symbols:
        conditional = outputs[0].inputs[0]
        conditional.constant_args = (*conditional.constant_args, *symbols)


def _fx_value(arg):
    return arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg


def _clamped(lowering, index, num_branches: int):
    """``index`` clamped to ``[0, num_branches - 1]``, as a tensor or a sympy expression:
    switch's index rule (``_src/kinds.py``, ``clamp_index``) in Inductor's IR."""
    import sympy
    from torch._inductor import ir

    if isinstance(index, ir.IRNode):
        aten = torch.ops.aten
        at_least_0 = lowering.lowerings[aten.clamp_min.default](index, 0)
        return lowering.lowerings[aten.clamp_max.default](at_least_0, num_branches - 1)
    return sympy.Min(sympy.Max(sympy.sympify(index), 0), num_branches - 1)


def _at_most(lowering, index, bound: int):
    """``index <= bound`` as Inductor's predicate: a bool tensor or a sympy condition."""
    import sympy
    from torch._inductor import ir

    if isinstance(index, ir.IRNode):
        return lowering.lowerings[torch.ops.aten.le.Scalar](index, bound)
    return sympy.Le(sympy.sympify(index), bound)


class _LinkBuilder:
    """Builds the graphs of one link of a switch chain: operands, then the index."""

    def __init__(self, node: torch.fx.Node, operand_values, index_value):
        self.node = node
        self.operand_values = operand_values
        self.index_value = index_value

    def _placeholders(self, graph: torch.fx.Graph):
        inputs = []
        for i, value in enumerate([*self.operand_values, self.index_value]):
            placeholder = graph.placeholder(
                "index" if i == len(self.operand_values) else f"operand_{i}"
            )
            placeholder.meta["val"] = value
            inputs.append(placeholder)
        return inputs[:-1], inputs[-1]

    def ignoring_index(self, branch) -> torch.fx.GraphModule:
        """The branch's graph, taking the index as a last, unused input."""
        graph = torch.fx.Graph()
        outputs = graph.graph_copy(branch.graph_module.graph, {})
        inputs = [n for n in graph.nodes if n.op == "placeholder"]
        where = graph.inserting_after(inputs[-1]) if inputs else graph.inserting_before(None)
        with where:
            graph.placeholder("unused_index").meta["val"] = self.index_value
        graph.output(outputs)
        return torch.fx.GraphModule(branch.graph_module, graph)

    def rest(self, switch_op, branches) -> torch.fx.GraphModule:
        """``(*operands, index) -> switch(index - 1, *branches, operands)``."""
        graph = torch.fx.Graph()
        operands, index = self._placeholders(graph)
        shifted = graph.call_function(self._minus_one_target(), (index, 1))
        shifted.meta["val"] = self.index_value - 1
        names = [f"case_{k + 1}" for k in range(len(branches))]
        attrs = [graph.get_attr(name) for name in names]
        inner = graph.call_function(switch_op, (shifted, *attrs, tuple(operands)))
        inner.meta = dict(self.node.meta)
        outputs = []
        for i, value in enumerate(self.node.meta["val"]):
            out = graph.call_function(operator.getitem, (inner, i))
            out.meta["val"] = value
            outputs.append(out)
        graph.output(tuple(outputs))
        return torch.fx.GraphModule({n: b.graph_module for n, b in zip(names, branches)}, graph)

    def stand_in(self, switch_op) -> torch.fx.Node:
        """A node like the switch being lowered whose operands end with the index."""
        graph = torch.fx.Graph()
        operands, index = self._placeholders(graph)
        stand_in = graph.call_function(switch_op, (index, (*operands, index)))
        stand_in.meta = dict(self.node.meta)
        return stand_in

    def _minus_one_target(self):
        if isinstance(self.index_value, torch.Tensor):
            return torch.ops.aten.sub.Tensor
        return operator.sub


def _teach_subgraph_args(fx_utils, ops) -> None:
    """Tell Inductor's fake-tensor updater that every branch takes the operands.

    torch 2.13 looks up each higher-order operator's subgraph arguments in
    ``_extract_subgraphs_and_args``; an unknown operator gets a warning per compile.
    torch 2.11 has no such table (and no warning): nothing to do.
    """
    original = getattr(fx_utils, "_extract_subgraphs_and_args", None)
    if original is None or original.__module__ == __name__:  # absent, or ours already
        return

    def extract_subgraphs_and_args(node, valid_subgraphs, *args, **kwargs):
        if node.target not in ops:
            yield from original(node, valid_subgraphs, *args, **kwargs)
            return
        operands = tuple(args[-1])
        for branch in args[1:-1]:
            if branch in valid_subgraphs:
                placeholders = branch.graph.find_nodes(op="placeholder")
                yield branch, tuple(map(_fake_of, operands, placeholders))

    fx_utils._extract_subgraphs_and_args = extract_subgraphs_and_args


def _fake_of(operand, placeholder: torch.fx.Node):
    """What the updater compares with a branch input's value.

    A tensor constant a branch makes (``torch.tensor(2.0)``) is lifted into the
    operands: the branch input's value is then the real tensor, while the operand's
    is a fake one, and the updater refuses two values of different types. A constant
    never changes: the input's own value.
    """
    value = placeholder.meta.get("val")
    return value if _is_constant(value) or _is_constant(operand) else operand


def _is_constant(value) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)
