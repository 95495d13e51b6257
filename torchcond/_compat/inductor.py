"""Inductor support. torchcond's operators lower to Inductor's conditional IR.

``torchcond_cond`` lowers exactly as torch's cond does. It becomes one conditional IR
node, and its branches are lowered as subgraphs. The wrapper emits the node as
``if pred: ... else:`` around calls of the compiled branch functions. Per call, only
the wrapper's own ``if`` runs in Python.

That IR has two forms. torch 2.11 and 2.13 have the two-way ``ir.Conditional``.
torch 2.14 replaced it with the N-way ``ir.Switch`` (``if i == 0: ... elif i == 1: ...
else: ...``), and torch 2.15 keeps it. ``torch.cond`` is its two-branch case. With
``ir.Switch``, ``torchcond_switch`` lowers to one node over the clamped index.
``ir.Conditional`` has no N-way form, so there the switch lowers to a chain of them:
``switch(i, b0, b1, ..., bn)`` is ``b0 if i <= 0 else switch(i - 1, b1, ..., bn)``.
The inner switch lives in a small synthesized subgraph. That subgraph takes the index
as an extra input and lowers through this same rule. The chain keeps the clamping
semantics without a clamp. A negative index takes ``b0``, and a too-large one takes
the last branch. A tensor index that is not on the CPU is copied to the host once at
the top. The chain then costs one device sync, as a cond does.

This module also tells Inductor's fake-tensor updater which arguments our branches
take. Without that, the updater warns once per compile and re-propagates the branches
without inputs. These arguments can include a tensor constant that a branch makes.

Checked on torch 2.11.0 and 2.13.0 (``ir.Conditional``), and on 2.14.1 and 2.15.0
(``ir.Switch``). Both ``create`` methods read the operands' fake values from
``V.graph.current_node.args[-1]``. That is why the chain's links are created under a
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

    ``in_place(node, branch_graphs)`` comes from reinplace.py. It returns None, or branch
    graphs that write to operands in place together with the outputs they no longer return.
    """
    when_imported(
        _LOWERING, lambda lowering: _register_lowerings(lowering, cond_op, switch_op, in_place)
    )
    when_imported(_FX_UTILS, lambda fx_utils: _teach_subgraph_args(fx_utils, (cond_op, switch_op)))


def _register_lowerings(lowering, cond_op, switch_op, in_place) -> None:
    """Register each operator's lowering, bound to it and to reinplace.py's ``in_place``."""
    cond_rule = functools.partial(_lower_cond, lowering, cond_op, in_place)
    switch_rule = functools.partial(_lower_switch, lowering, switch_op, in_place)
    lowering.register_lowering(cond_op, type_promotion_kind=None)(cond_rule)
    lowering.register_lowering(switch_op, type_promotion_kind=None)(switch_rule)


def _lower_cond(lowering, cond_op, in_place, pred, true_subgraph, false_subgraph, operands):
    from torch._inductor.virtualized import V

    _refuse_unbound_predicate(cond_op.name(), V.graph.current_node, pred)
    _disable_cudagraphs_if_on_gpu(lowering, cond_op.name(), [pred, *operands])
    pred = _read_predicate(lowering, pred)
    (true_subgraph, false_subgraph), written = _writing_in_place(
        in_place, [true_subgraph, false_subgraph]
    )
    # An output written back into its operand is that operand, so copy_ skips it.
    outputs = _conditional(pred, true_subgraph, false_subgraph, operands)
    return outputs + [operands[w] for w in written]


def _lower_switch(lowering, switch_op, in_place, index, *branches_then_operands):
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    *branches, operands = branches_then_operands
    node = V.graph.current_node
    _disable_cudagraphs_if_on_gpu(lowering, switch_op.name(), [index, *operands])
    index = _read_index(lowering, index)
    if _n_way():
        branches, written = _writing_in_place(in_place, branches)
        return _n_way_switch(lowering, index, branches, operands) + [operands[w] for w in written]
    if len(branches) == 1:
        # A switch with one branch puts that branch on both sides of the conditional.
        only = branches[0]
        branches = [only, ir.Subgraph(name=f"{node.name}_only", graph_module=only.graph_module)]
    return _switch_chain(lowering, switch_op, node, index, branches, operands)


def _switch_chain(lowering, switch_op, node, index, branches, operands):
    """Lower a switch to ``ir.Conditional``. It takes b0 if the index is at most 0, and
    otherwise a subgraph that holds ``switch(index - 1, b1, ..., bn)``."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    index_value = _fx_value(node.args[0])
    if isinstance(index_value, torch.Tensor):  # as _read_index made it
        with V.fake_mode:
            index_value = torch.empty((), dtype=torch.int64, device=index_value.device)
    index, index_value = _on_host(lowering, index, index_value)
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
    """Return whether Inductor has the N-way ir.Switch, new in torch 2.14."""
    from torch._inductor import ir

    return hasattr(ir, "Switch")


def _branches_may_write() -> bool:
    """Return whether branches may write to operands. ir.Switch, and ir.Conditional from
    torch 2.13 on, order those writes with the operand's readers (one MutationOutput per
    written operand). Checked on 2.13.0, 2.14.1 and 2.15.0. 2.11.0's ir.Conditional does not."""
    return _n_way() or TORCH_VERSION >= (2, 13)


def _disable_cudagraphs_if_on_gpu(lowering, op_name, values) -> None:
    """Disable cudagraphs when a value is on the GPU, because cudagraph trees cannot record
    a host-side branch. torch.cond's lowering sets the same flag for the same reason."""
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
    """Return the branches rewritten to write in place what the graph only writes back.
    Also return, in order, the operands that stand for the outputs they no longer return."""
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

    # ir.Switch takes the last branch for any index it does not list, including negative
    # ones. Clamping first keeps a negative index on the first branch.
    index = _clamped(lowering, index, len(branches))
    with _no_donated_branch_inputs():
        outputs = ir.Switch.create(index, list(branches), list(operands))
    _depend_on_predicate_symbols(index, outputs)
    return list(map(ir.TensorBox.create, outputs))


@contextlib.contextmanager
def _no_donated_branch_inputs():
    """Lower the branch graphs with no donated input buffers.

    Inductor lowers each branch graph with the backward graph's donated-buffer positions.
    It reads them from ``fw_metadata.bw_donated_idxs`` when it makes a graph. Without
    this, a branch input at such a position, such as a gradient, is reused in place.
    Another input that is the same tensor then reads the overwritten value. This happens
    on 2.11 and 2.13, and the field is the same on 2.14 and 2.15. The positions are
    restored afterwards, so the backward graph itself still donates its buffers.
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
    """Copy a device index to the host. The chain reads the index once per link, and a
    device index would sync each time."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if isinstance(index, ir.IRNode) and index.get_device() != _HOST:
        with V.fake_mode:
            index_value = index_value.to(_HOST)
        index = lowering.lowerings[torch.ops.aten._to_copy.default](index, device=_HOST)
    return index, index_value


def _bindable(lowering, index, index_value):
    """Turn a compound symbolic index into a host tensor. A subgraph input binds only a
    plain symbol (``u0``, not ``min(2, u0)``)."""
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
    """Raise on a predicate input such as ``Sym(zuf0 > 0.0)``. Inductor's wrapper cannot read it.

    Such an input appears in a backward graph when the forward's predicate came from
    ``.item()``. The partitioner saves the relation itself, but Inductor binds only plain
    symbols from graph inputs. The compiled code would fail with a NameError on its
    first call. torch.cond fails the same way on 2.13.
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

    A symbolic predicate is a sympy relation (``u0 > 0``), which is not a sympy ``Expr``.
    ``ExternKernel.get_free_symbol_uses`` collects symbols only from ``Expr`` arguments.
    The scheduler then drops the node that defines ``u0``, and the wrapper reads an
    undefined name. torch.cond fails the same way on 2.13. Listing the predicate's
    symbols as constant arguments records the dependency. The conditional's codegen
    never prints them.
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


# The operator takes a selector tensor as the user gave it: one element, any shape and
# allowed dtype (_src/kinds.py). It is converted here, in Inductor's IR, so the compiled
# code reads it when it runs. An FX op between a buffer and the operator would be folded
# into a constant by AOTInductor, even where the program writes the buffer.


def _read_predicate(lowering, pred):
    """A one-element predicate tensor as a bool tensor (``pred != 0``), as cond reads it."""
    from torch._inductor import ir

    if isinstance(pred, ir.IRNode) and pred.get_dtype() != torch.bool:
        return lowering.lowerings[torch.ops.aten.ne.Scalar](pred, 0)
    return pred


_INT64_MAX = torch.iinfo(torch.int64).max


def _read_index(lowering, index):
    """A one-element index tensor as a 0-d int64 tensor. A uint64 at or above 2**63
    becomes the int64 maximum, so it takes the last branch, as in
    ``kinds.clamped_switch_indices``. The N-way switch clamps it; the chain's ``<=``
    tests need no clamp."""
    from torch._inductor import ir

    if not isinstance(index, ir.IRNode):
        return index
    aten = torch.ops.aten
    wide_from = index.get_dtype()
    index = lowering.lowerings[aten.view.default](index, [])
    index = lowering.lowerings[torch.ops.prims.convert_element_type.default](index, torch.int64)
    if wide_from == torch.uint64:
        wrapped = lowering.lowerings[aten.lt.Scalar](index, 0)
        index = lowering.lowerings[aten.where.self](wrapped, _INT64_MAX, index)
    return index


def _clamped(lowering, index, num_branches: int):
    """Clamp ``index`` to ``[0, num_branches - 1]`` as a tensor or a sympy expression.
    This is switch's index rule (``clamp_index`` in ``_src/kinds.py``) in Inductor's IR."""
    import sympy
    from torch._inductor import ir

    if isinstance(index, ir.IRNode):
        aten = torch.ops.aten
        at_least_0 = lowering.lowerings[aten.clamp_min.default](index, 0)
        return lowering.lowerings[aten.clamp_max.default](at_least_0, num_branches - 1)
    return sympy.Min(sympy.Max(sympy.sympify(index), 0), num_branches - 1)


def _at_most(lowering, index, bound: int):
    """Return ``index <= bound`` as Inductor's predicate, a bool tensor or a sympy condition."""
    import sympy
    from torch._inductor import ir

    if isinstance(index, ir.IRNode):
        return lowering.lowerings[torch.ops.aten.le.Scalar](index, bound)
    return sympy.Le(sympy.sympify(index), bound)


class _LinkBuilder:
    """Builds the graphs of one link of a switch chain. They take the operands, then the index."""

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
        """Return the branch's graph with the index as an extra, unused last input."""
        graph = torch.fx.Graph()
        outputs = graph.graph_copy(branch.graph_module.graph, {})
        inputs = [n for n in graph.nodes if n.op == "placeholder"]
        where = graph.inserting_after(inputs[-1]) if inputs else graph.inserting_before(None)
        with where:
            graph.placeholder("unused_index").meta["val"] = self.index_value
        graph.output(outputs)
        return torch.fx.GraphModule(branch.graph_module, graph)

    def rest(self, switch_op, branches) -> torch.fx.GraphModule:
        """Return the graph ``(*operands, index) -> switch(index - 1, *branches, operands)``."""
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
        """Return a node like the switch being lowered, whose operands end with the index."""
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
    ``_extract_subgraphs_and_args``. An unknown operator gets a warning per compile.
    torch 2.11 has no such table and no warning, so this does nothing there.
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
    """Return the value that the updater compares with a branch input's value.

    A tensor constant that a branch makes (``torch.tensor(2.0)``) is lifted into the
    operands. The branch input's value is then the real tensor, but the operand's value
    is fake. The updater refuses two values of different types. A constant never
    changes, so for a constant this returns the input's own value.
    """
    value = placeholder.meta.get("val")
    return value if _is_constant(value) or _is_constant(operand) else operand


def _is_constant(value) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)
