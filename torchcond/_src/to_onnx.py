"""The conditionals in ONNX: ``cond`` is an ``If``, ``switch`` a chain of ``If``s.

``torch.onnx.export(..., dynamo=True)`` translates each branch graph into an ONNX
function and passes it here. A branch of the ``If`` is a graph of one node that calls
that function on the operands, which the ``If``'s subgraph reads from the enclosing
scope, as torch's translation of ``torch.cond`` does.

``switch(i, b0, ..., bn)`` is ``b0 if i < 1 else (b1 if i < 2 else ... bn)``: the
comparisons are made once, outside the chain, and the clamping of an out-of-range
index (to ``b0`` or ``bn``) falls out of the ``<`` tests.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._compat import onnx as _compat_onnx


def translate_cond(pred, true_func, false_func, operands: Sequence):
    """``torchcond_cond(pred, true_graph, false_graph, operands)`` as an ``If``."""
    call_op = _compat_onnx.call_op()
    (flag,) = call_op("Cast", pred, to=_ir().DataType.BOOL)
    then_graph = _calling(true_func, operands)
    else_graph = _calling(false_func, operands)
    return call_op(
        "If",
        flag,
        _num_outputs=len(true_func.outputs),
        then_branch=then_graph,
        else_branch=else_graph,
    )


def translate_switch(index, *funcs_then_operands):
    """``torchcond_switch(index, graph_0, ..., graph_n, operands)`` as nested ``If``s."""
    *funcs, operands = funcs_then_operands
    call_op = _compat_onnx.call_op()
    ir = _ir()
    if len(funcs) == 1:
        return call_op("Identity", *_calling(funcs[0], operands).outputs)
    (index,) = call_op("Cast", index, to=ir.DataType.INT64)
    below = []
    for k in range(1, len(funcs)):
        (bound,) = call_op("Constant", value_int=k)
        below.extend(call_op("Less", index, bound))
    # Innermost first: the last two branches, then each earlier one around them.
    chain = _calling(funcs[-1], operands)
    for k in range(len(funcs) - 2, 0, -1):
        inner = ir.Node(
            "",
            "If",
            [below[k]],
            attributes=[
                ir.AttrGraph("then_branch", _calling(funcs[k], operands)),
                ir.AttrGraph("else_branch", chain),
            ],
            num_outputs=len(funcs[k].outputs),
        )
        for j, value in enumerate(inner.outputs):
            value.name = f"{funcs[k].name}_switch_{k}_{j}"
        chain = ir.Graph((), inner.outputs, nodes=[inner], name=f"switch_from_{k}")
    return call_op(
        "If",
        below[0],
        _num_outputs=len(funcs[0].outputs),
        then_branch=_calling(funcs[0], operands),
        else_branch=chain,
    )


def _calling(func, operands: Sequence):
    """A graph with no inputs whose one node calls ``func`` on the outer ``operands``."""
    ir = _ir()
    node = ir.Node(func.domain, func.name, list(operands), num_outputs=len(func.outputs))
    # Every value in a model needs its own name; a function's output names repeat.
    for declared, value in zip(func.outputs, node.outputs):
        value.name = f"{declared.name}_{func.name}"
    return ir.Graph((), node.outputs, nodes=[node], name=func.name)


def _ir():
    import onnx_ir

    return onnx_ir
