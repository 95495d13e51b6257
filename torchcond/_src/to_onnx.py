"""ONNX translations of the conditionals. ``cond`` becomes an ``If``, and ``switch``
becomes a chain of ``If``s.

``torch.onnx.export(..., dynamo=True)`` translates each branch graph into an ONNX
function and passes it here. Each branch of the ``If`` is a graph of one node. That
node calls the function on the operands, which the ``If``'s subgraph reads from the
enclosing scope. Torch's translation of ``torch.cond`` works the same way.

``switch(i, b0, ..., bn)`` is ``b0 if i < 1 else (b1 if i < 2 else ... bn)``. The
comparisons run once, outside the chain. The ``<`` tests also clamp an out-of-range
index to ``b0`` or ``bn``, which is switch's index rule (``kinds.clamp_index``).

The select operators become ``Where``s. ``passes.lower_to_select`` leaves these
operators for runtimes without control flow. The selector gains trailing axes of size
one, because ONNX broadcasts from the right and a selector's shape is a prefix of the
values' shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._compat import onnx as _compat_onnx


def translations(cond_op, switch_op) -> dict:
    """Return ``{operator: translation}`` for the exporter's registry."""
    return {
        cond_op: translate_cond,
        switch_op: translate_switch,
        torch.ops.torchcond.select.default: translate_select,
        torch.ops.torchcond.select_n.default: translate_select_n,
    }


def translate_cond(pred, true_func, false_func, operands: Sequence):
    """Translate ``torchcond_cond(pred, true_graph, false_graph, operands)`` to an ``If``."""
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
    """Translate ``torchcond_switch(index, graph_0, ..., graph_n, operands)`` to nested
    ``If``s."""
    *funcs, operands = funcs_then_operands
    call_op = _compat_onnx.call_op()
    ir = _ir()
    if len(funcs) == 1:
        return call_op("Identity", *_calling(funcs[0], operands).outputs)
    index = _as_int64(index, len(funcs))
    below = []
    for k in range(1, len(funcs)):
        (bound,) = call_op("Constant", value_int=k)
        below.extend(call_op("Less", index, bound))
    # Build the chain from the inside out. The innermost ``If`` picks between the last
    # two branches. Each earlier branch then wraps the chain.
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


def translate_select(pred, true_values: Sequence, false_values: Sequence):
    """Translate ``torchcond.select(pred, true_values, false_values)`` to one ``Where``
    per output."""
    call_op = _compat_onnx.call_op()
    (flag,) = call_op("Cast", pred, to=_ir().DataType.BOOL)
    return [
        call_op("Where", _broadcastable(flag, len(pred.shape), t), t, f)[0]
        for t, f in zip(true_values, false_values)
    ]


def translate_select_n(index, cases: Sequence, num_branches: int):
    """Translate ``torchcond.select_n(index, cases, n)`` to a chain of ``Where``s per
    output. Each chain computes ``case_0 if index < 1 else (case_1 if index < 2 else
    ... case_n)``."""
    call_op = _compat_onnx.call_op()
    index_rank = index.shape
    index = _as_int64(index, num_branches)
    per_case = len(cases) // num_branches
    below = []
    for k in range(1, num_branches):
        (bound,) = call_op("Constant", value_int=k)
        below.extend(call_op("Less", index, bound))
    outputs = []
    for i in range(per_case):
        value = cases[(num_branches - 1) * per_case + i]
        for k in range(num_branches - 2, -1, -1):
            case = cases[k * per_case + i]
            selector = _broadcastable(below[k], len(index_rank), case)
            (value,) = call_op("Where", selector, case, value)
        outputs.append(value)
    return outputs


def _as_int64(index, num_branches: int):
    """Cast an integer index to INT64. A UINT64 index is first capped at ``n - 1``, so
    one at or above 2**63 takes the last branch, as in ``kinds.clamped_switch_indices``."""
    call_op = _compat_onnx.call_op()
    ir = _ir()
    if index.dtype == ir.DataType.UINT64:
        (bound,) = call_op("Constant", value_int=num_branches - 1)
        (bound,) = call_op("Cast", bound, to=ir.DataType.UINT64)
        (index,) = call_op("Min", index, bound)
    (index,) = call_op("Cast", index, to=ir.DataType.INT64)
    return index


def _broadcastable(selector, selector_rank: int, value):
    """Give ``selector`` (of rank ``selector_rank``) trailing axes of size one up to
    ``value``'s rank."""
    call_op = _compat_onnx.call_op()
    rank = len(value.shape)
    if selector_rank in (0, rank):
        return selector
    (axes,) = call_op("Constant", value_ints=list(range(selector_rank, rank)))
    (expanded,) = call_op("Unsqueeze", selector, axes)
    return expanded


def _calling(func, operands: Sequence):
    """Return a graph with no inputs whose one node calls ``func`` on the outer
    ``operands``."""
    ir = _ir()
    node = ir.Node(func.domain, func.name, list(operands), num_outputs=len(func.outputs))
    # Every value in a model needs a unique name, but a function's output names repeat.
    for declared, value in zip(func.outputs, node.outputs):
        value.name = f"{declared.name}_{func.name}"
    return ir.Graph((), node.outputs, nodes=[node], name=func.name)


def _ir():
    import onnx_ir

    return onnx_ir
