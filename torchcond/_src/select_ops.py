"""Fused branch select, which picks every output of a conditional on the device.

``select(pred, true_values, false_values)`` returns, for each pair, the true value
where ``pred`` holds and the false value elsewhere. ``select_n(index, cases)`` is the
N-way form. ``cases[k]`` holds branch ``k``'s outputs, and the index is clamped as in
``switch``. The selector is a 0-d tensor, or its shape is a prefix of every value's
shape. A prefix shape makes one choice per leading element, as under vmap. A 0-d
selector on the values' device is read there with no host sync. A 0-d selector on
the CPU is read on the host for free.

Both functions call the C++/CUDA operators ``torch.ops.torchcond.select`` and
``torch.ops.torchcond.select_n`` (``csrc/``). Each operator runs one parallel loop
(CPU) or one kernel launch (CUDA) for all outputs. Each element reads only the side
it selects. As in the C++, ``select`` is ``select_n`` over two branches (true, then
false) with a bool selector. So every rule below is written once, over a selector and
its branches. A ``_Kind`` says how each operator lays them out: ``_PRED`` for
``select`` and ``_INDEX`` for ``select_n``.

This module holds everything Python knows about the operators, in the order of
pytorch/extension-cpp's ``ops.py``:

* the public functions ``select`` and ``select_n``;
* the fake kernel (``register_fake``);
* the Autograd kernel. The gradient goes to the selected branch and is zero on the
  others. The select op itself computes it against a stride-0 zero, so no ``NaN`` or
  ``Inf`` from an unselected branch's cotangent can leak. The tangent is the select
  of the tangents;
* the vmap rule (``register_vmap``);
* the ``autograd.Function`` that ``select`` and ``select_n`` apply eagerly under
  ``torch.func`` transforms and forward-mode AD.

C++ checks the arguments once (``csrc/select_common.cpp``). The kernels run these
checks, and so does the fake kernel through ``torchcond._C._check_select`` and
``_check_select_n``. The public functions turn the errors into ``CondArgumentError``.
Python checks only what the operators cannot see: the nesting and Python types of the
list arguments, and tensors of a layout that has no registered kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from .. import _C, _compat
from ..errors import CondArgumentError, UnsupportedCondError
from .untraced import refuse_untraced

__all__ = ["select", "select_n"]

_OPS = torch.ops.torchcond


# --- the two operators' forms ----------------------------------------------------------
#
# A rule sees ``branches``, which holds one list of values per branch. All lists have
# one length, the output count. Only the operators' own arguments differ, and a kind
# converts them.


class _Kind:
    """How one operator takes a selector and its branches."""

    qualname: str
    selector_name: str  # the selector's name in error messages
    op: Callable[..., list]  # the OpOverloadPacket, which traced code calls
    overload: Callable[..., list]  # its .default, which is cheaper to call eagerly
    below_autograd: Callable[..., list]  # the operator below the Autograd key (C++)
    check: Callable[..., None]  # the operator's argument checks (C++)

    def values(self, *args) -> list:
        """Return every value, branch-major, from the operator's arguments after the selector."""
        raise NotImplementedError

    def branches(self, selector, *args) -> list:
        """Split the operator's arguments into branches, or raise the operator's error."""
        raise NotImplementedError

    def args(self, branches: list) -> tuple:
        """Return the operator's arguments after the selector for ``branches``."""
        raise NotImplementedError

    def labelled(self, *args) -> list:
        """Return ``(name, value)`` for every value, named after the public arguments."""
        raise NotImplementedError

    def picks_at_most(self, selector: torch.Tensor, k: int) -> torch.Tensor:
        """Return a mask of where the selector takes one of branches ``0..k``."""
        raise NotImplementedError


class _Pred(_Kind):
    """The kind of ``select(pred, true_values, false_values)``. Branch 0 is where ``pred`` holds."""

    qualname = "torchcond::select"
    selector_name = "pred"
    op = _OPS.select
    overload = _OPS.select.default
    below_autograd = staticmethod(_C.select_below_autograd)
    check = staticmethod(_C._check_select)

    def values(self, true_values, false_values):
        return [*true_values, *false_values]

    def branches(self, pred, true_values, false_values):
        if len(true_values) != len(false_values):
            _C._check_select(pred, true_values, false_values)  # raises, since they must pair up
        return [true_values, false_values]

    def args(self, branches):
        return branches[0], branches[1]

    def labelled(self, true_values, false_values):
        return _named("true_values", true_values) + _named("false_values", false_values)

    def picks_at_most(self, selector, k):
        return selector  # k is always 0, the true values


class _Index(_Kind):
    """The kind of ``select_n(index, cases, num_branches)``. ``cases`` is flat and branch-major."""

    qualname = "torchcond::select_n"
    selector_name = "index"
    op = _OPS.select_n
    overload = _OPS.select_n.default
    below_autograd = staticmethod(_C.select_n_below_autograd)
    check = staticmethod(_C._check_select_n)

    def values(self, cases, num_branches):
        return cases

    def branches(self, index, cases, num_branches):
        if num_branches < 1 or len(cases) % num_branches:
            _C._check_select_n(index, cases, num_branches)  # raises, since they cannot split
        return _split(cases, num_branches)

    def args(self, branches):
        return _flat(branches), len(branches)

    def labelled(self, cases, num_branches):
        split = _split(cases, num_branches)
        return [pair for k, c in enumerate(split) for pair in _named(f"cases[{k}]", c)]

    def picks_at_most(self, selector, k):
        return selector <= k  # this also clamps the index


_PRED = _Pred()
_INDEX = _Index()


def _flat(branches: list) -> list:
    return [v for b in branches for v in b]


def _split(flat: Sequence, num_branches: int) -> list:
    """Split ``flat`` (branch-major) into ``num_branches`` lists of equal length."""
    n = len(flat) // num_branches
    return [list(flat[k * n : (k + 1) * n]) for k in range(num_branches)]


def _named(label: str, values) -> list:
    return [(f"{label}[{i}]", v) for i, v in enumerate(values)]


# --- public functions ------------------------------------------------------------------
#
# A plain eager call has no tracing, no torch.func transform and no forward AD. It goes
# straight to the operator's kernel. Other calls go through the dispatcher and the rules
# below. The operator checks the arguments either way. What it raises for them becomes
# a CondArgumentError with the same message.


def select(
    pred: torch.Tensor, true_values: Sequence[torch.Tensor], false_values: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``[where(pred, t, f) for t, f in zip(true_values, false_values)]``, fused.

    One kernel launch covers every output, and each element reads only the value it
    selects. The outputs are fresh contiguous tensors. Gradients flow only to the
    selected side. The other side gets zeros, never ``NaN``. ``torch.vmap`` is
    supported.

    Args:
        pred: a ``torch.bool`` tensor on the values' device. A 0-d ``pred`` makes one
            choice for everything. A ``pred`` whose shape is a prefix of every value's
            shape makes one choice per leading index.
        true_values: the tensors to take where ``pred`` is true.
        false_values: as many tensors, each with the shape, dtype and device of the
            matching ``true_values`` entry, to take where ``pred`` is false.

    Returns:
        One new tensor per pair, ``torch.where(pred, t, f)`` with ``pred`` broadcast
        over the trailing dimensions.

    Raises:
        CondArgumentError: ``pred`` is not a bool tensor or its shape is not a prefix
            of the values' shapes, the two lists differ in length, or a pair differs
            in shape, dtype or device.

    Examples:
        >>> pred = torch.tensor([True, False, True])
        >>> a, b = torchcond.select(
        ...     pred, [torch.ones(3), torch.ones(3, 2)], [torch.zeros(3), -torch.ones(3, 2)]
        ... )
        >>> a
        tensor([1., 0., 1.])
        >>> b
        tensor([[ 1.,  1.],
                [-1., -1.],
                [ 1.,  1.]])
        >>> torchcond.select(torch.tensor(True), [torch.ones(2)], [torch.zeros(3)])
        Traceback (most recent call last):
        ...
        torchcond.errors.CondArgumentError: false_values[0]: expected shape (2,), ...
    """
    true_values = _as_list(true_values, "select", "true_values", _TENSORS, _ONE_OUTPUT)
    false_values = _as_list(false_values, "select", "false_values", _TENSORS, _ONE_OUTPUT)
    return select_lists(pred, true_values, false_values)


def select_lists(pred: torch.Tensor, true_values: list, false_values: list) -> list:
    """Run ``select`` on two lists of tensors, for torchcond's own callers."""
    return _run(_PRED, pred, true_values, false_values)


def select_n(index: torch.Tensor, cases: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Output ``i`` is ``cases[clamp(index, 0, len(cases) - 1)][i]``, elementwise, fused.

    This is the N-way :func:`select`, and ``switch(..., strategy="select")`` uses it.
    One kernel launch covers every output, and each element reads only the case it
    selects.

    Args:
        index: an integer tensor on the values' device, 0-d or with a shape that is a
            prefix of every value's shape. Out-of-range entries are clamped, as in
            :func:`torchcond.switch`.
        cases: one list of tensors per branch; every list has the same length, and
            its ``i``-th tensors agree in shape, dtype and device.

    Returns:
        One new tensor per output position.

    Raises:
        CondArgumentError: ``index`` is not an integer tensor or its shape is not a
            prefix of the values' shapes, ``cases`` is empty, or the cases disagree in
            length, shape, dtype or device.

    Examples:
        >>> cases = [[torch.zeros(4)], [torch.ones(4)], [torch.full((4,), 2.0)]]
        >>> torchcond.select_n(torch.tensor([0, 2, 1, 5]), cases)  # 5 is clamped to 2
        [tensor([0., 2., 1., 2.])]
    """
    cases = _as_list(cases, "select_n", "cases", "a list with one list of tensors per branch")
    cases = [
        _as_list(c, "select_n", f"cases[{k}]", _TENSORS, _ONE_OUTPUT) for k, c in enumerate(cases)
    ]
    _check_nesting(cases)
    return _run(_INDEX, index, _flat(cases), len(cases))


def _run(kind: _Kind, selector, *args) -> list:
    """Call ``kind``'s operator on its own arguments by the cheapest correct path."""
    try:
        if _compat.tracing_active() or _compat.transforms_active():
            return _differentiable(kind, selector, *args)
        if torch.is_grad_enabled() and any(v.requires_grad for v in kind.values(*args)):
            return kind.overload(selector, *args)  # the operator's autograd rule
        # What that rule does when no input needs a gradient (the common case).
        return kind.below_autograd(selector, *args)
    except _OP_ERRORS as error:
        _raise_argument_error(error, kind, selector, args)
        raise


# --- what the operators cannot check ---------------------------------------------------


_TENSORS = "a list or tuple of tensors (one per output)"
_ONE_OUTPUT = ". Pass [tensor] for one output"


def _as_list(values, fn: str, label: str, expected: str, lone_tensor_hint: str = "") -> list:
    """Return a sequence argument as a list. Refuse a lone tensor, because iterating it
    would select between its rows."""
    kind = type(values)
    if kind is list or kind is tuple:  # the common case, without an abstract class check
        return values if kind is list else list(values)
    if isinstance(values, torch.Tensor):
        found = f"a tensor of shape {tuple(values.shape)}{lone_tensor_hint}"
    elif not isinstance(values, Sequence) or isinstance(values, str):
        found = type(values).__name__
    else:
        return list(values)
    raise CondArgumentError(f"{fn}: argument '{label}' must be {expected}; found {found}")


def _check_nesting(cases: list) -> None:
    """Check the nesting of select_n's cases, which the operator gets as one flat list."""
    if not cases:
        raise CondArgumentError(
            "select_n: cases: expected at least one branch's outputs, found an empty sequence"
        )
    for k, c in enumerate(cases[1:], 1):
        if len(c) != len(cases[0]):
            raise CondArgumentError(
                f"select_n: cases[{k}] has {len(c)} tensors, cases[0] has {len(cases[0])}; "
                "every branch must give the same number of outputs"
            )


# What the operator raises for bad arguments: ValueError and TypeError from its checks
# (TORCH_CHECK_VALUE/TYPE), TypeError or RuntimeError from the schema parser for a
# non-tensor, and NotImplementedError for a layout it has no kernel for.
_OP_ERRORS = (RuntimeError, TypeError, ValueError, AttributeError, IndexError, NotImplementedError)
_OP_PREFIXES = ("torchcond::select: ", "torchcond::select_n: ")


def _raise_argument_error(error: Exception, kind: _Kind, selector, args: tuple) -> None:
    """Raise a CondArgumentError when the arguments caused the operator's ``error``.

    The operator's C++ checks describe the problem in the public functions' words.
    Their message is kept without the operator's name. Before those checks run,
    torch's schema parser refuses a non-tensor, and its dispatcher refuses a layout
    with no kernel. Their messages talk about the operator's schema, so this function
    writes its own message for those two cases.
    """
    message = str(error)
    if isinstance(error, (ValueError, TypeError)) and message.startswith(_OP_PREFIXES):
        raise CondArgumentError(message.split(": ", 1)[1]) from None
    for label, value in [(kind.selector_name, selector), *kind.labelled(*args)]:
        if not isinstance(value, torch.Tensor):
            raise CondArgumentError(
                f"{label}: expected a tensor, found {type(value).__name__}"
            ) from None
        if value.layout != torch.strided:
            raise CondArgumentError(
                f"{label}: expected a dense (torch.strided) tensor, found layout {value.layout}; "
                "convert it with .to_dense() first"
            ) from None


# --- fake kernel -----------------------------------------------------------------------
#
# The fake kernel gives fresh contiguous outputs shaped like the values, for tracing,
# export, torch.compile and meta tensors. The kernels' C++ argument checks run first, on
# the fake tensors' metadata, and symbolic shapes get guards. So a traced call raises
# what an eager one does.


def _fake(kind: _Kind, selector, *args):
    kind.check(selector, *args)
    return [v.new_empty(v.shape) for v in kind.branches(selector, *args)[0]]


# --- autograd --------------------------------------------------------------------------


def _zeros(like: torch.Tensor) -> torch.Tensor:
    """A zero shaped like ``like`` that costs one element (stride 0)."""
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)


def _grads(kind: _Kind, selector, grads, num_branches: int, need) -> list:
    """Return the gradients of every branch's values, flat and branch-major. Each is the
    cotangent where the selector takes its branch, and zero elsewhere."""
    n = len(grads)
    pairs = [
        (k, i)
        for k in range(num_branches)
        for i in range(n)
        if grads[i] is not None and need[k * n + i]
    ]
    result: list = [None] * (num_branches * n)
    if pairs:
        zeros = {i: _zeros(grads[i]) for _, i in pairs}
        # One select computes them all. Its output (k, i) is branch k's gradient for
        # output i. Branch j of that select is the cotangent when j == k, and the zero
        # otherwise.
        branches = [
            [grads[i] if j == k else zeros[i] for k, i in pairs] for j in range(num_branches)
        ]
        outs = _differentiable(kind, selector, *kind.args(branches))
        for m, (k, i) in enumerate(pairs):
            result[k * n + i] = outs[m]
    return result


# The operators' Autograd kernel. torch.library.register_autograd would give a
# C++-defined operator an old-style autograd.Function. torch.func.grad refuses that
# Function, and forward-mode AD (torch.func.jvp included) passes through it with a zero
# tangent. So where a derivative is needed, this kernel uses:
#
# * outside torch.func transforms, the new-style Function below. Its backward and jvp
#   are each one fused select.
# * inside a transform, torch.where, which every transform and backend differentiates.
#   A Function applied here would have no kernel to run, because the transform's
#   interpreter has already unwrapped the inputs. Eager code under a transform does
#   not reach this case, because the public functions apply the Function before
#   dispatch (``_needs_function``). Compiled code does reach it, because dynamo
#   records the operator itself.


def _autograd(kind: _Kind, selector, *args):
    values = kind.values(*args)
    if not _C._needs_derivative(values):
        with _compat.below_autograd():
            return kind.overload(selector, *args)
    branches = kind.branches(selector, *args)
    if _compat.torch_func_level_active():
        return _where(kind, selector, branches)
    return list(_SelectFunction.apply(kind, selector, len(branches), *values))


def _spread(selector: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Return ``selector`` on ``value``'s device, with trailing dims of size 1 to broadcast."""
    if selector.device != value.device:  # a 0-d CPU selector beside values elsewhere
        selector = selector.to(value.device)
    return selector.reshape((*selector.shape, *([1] * (value.dim() - selector.dim()))))


def _where(kind: _Kind, selector, branches: list) -> list[torch.Tensor]:
    """Compute the operator with differentiable aten ops, with the same checks and
    values. A chain of torch.where starts from the last branch. Step k takes branch k
    where the selector takes one of branches 0..k."""
    kind.check(selector, *kind.args(branches))
    if len(branches) == 1:  # fresh tensors, as the operator gives
        return [v.clone(memory_format=torch.contiguous_format) for v in branches[0]]
    outputs = list(branches[-1])
    for k in reversed(range(len(branches) - 1)):
        taken = kind.picks_at_most(selector, k)
        for i, v in enumerate(branches[k]):
            out = torch.where(_spread(taken, outputs[i]), v, outputs[i])
            outputs[i] = out.contiguous() if k == 0 else out
    return outputs


# --- vmap ------------------------------------------------------------------------------


def _to_front(value: torch.Tensor, bdim, batch_size: int) -> torch.Tensor:
    if bdim is None:
        return value.expand(batch_size, *value.shape)
    return value.movedim(bdim, 0)


def _vmap_calls(sel, sel_bdim, groups, batch_size):
    """Return the op calls that compute a vmapped select.

    ``groups`` holds, per output, the ``(value, bdim)`` of each branch. Each call is a
    tuple ``(selector, outputs, values, batched)``. It names the outputs it computes,
    their per-branch values in a layout the op accepts, and whether those outputs carry
    the batch dim at 0.

    * A batched selector moves its batch dim to the front. Every value gets a front
      batch dim, expanded without a copy when the value is unbatched.
    * An unbatched 0-d selector applies to every example, so one call is enough.
      Outputs whose values are all unbatched stay unbatched.
    * An unbatched shaped selector gets a front batch dim for the outputs with a
      batched value, so its shape stays a prefix of theirs. The other outputs use it
      as is. This takes up to two calls.
    """
    if sel_bdim is not None:
        sel = sel.movedim(sel_bdim, 0)
        values = [[_to_front(v, d, batch_size) for v, d in g] for g in groups]
        return [(sel, list(range(len(groups))), values, True)]
    is_batched = [any(d is not None for _, d in g) for g in groups]
    batched = [i for i, b in enumerate(is_batched) if b]
    plain = [i for i, b in enumerate(is_batched) if not b]
    fronted = {i: [_to_front(v, d, batch_size) for v, d in groups[i]] for i in batched}
    if sel.dim() == 0:
        values = [
            fronted[i] if is_batched[i] else [v for v, _ in groups[i]] for i in range(len(groups))
        ]
        return [(sel, list(range(len(groups))), values, is_batched)]
    calls = []
    if batched:
        sel_b = sel.expand(batch_size, *sel.shape)
        calls.append((sel_b, batched, [fronted[i] for i in batched], True))
    if plain:
        calls.append((sel, plain, [[v for v, _ in groups[i]] for i in plain], False))
    return calls


def _run_vmap_calls(op_call, sel, sel_bdim, groups, batch_size):
    n = len(groups)
    outputs: list = [None] * n
    out_dims: list = [None] * n
    for s, which, values, batched in _vmap_calls(sel, sel_bdim, groups, batch_size):
        outs = op_call(s, values)
        for m, (i, out) in enumerate(zip(which, outs)):
            outputs[i] = out
            flag = batched if isinstance(batched, bool) else batched[m]
            out_dims[i] = 0 if flag else None
    return outputs, out_dims


def _vmap(kind: _Kind, info, in_dims, selector, *args):
    sel_bdim, *arg_bdims = in_dims
    branches = kind.branches(selector, *args)
    bdims = _split(kind.values(*arg_bdims), len(branches))
    groups = [[(b[i], d[i]) for b, d in zip(branches, bdims)] for i in range(len(branches[0]))]

    def call(sel, values):
        return kind.op(sel, *kind.args([[v[k] for v in values] for k in range(len(branches))]))

    return _run_vmap_calls(call, selector, sel_bdim, groups, info.batch_size)


for _kind in (_PRED, _INDEX):
    torch.library.register_fake(_kind.qualname)(functools.partial(_fake, _kind))
    torch.library.impl(_kind.qualname, "Autograd")(functools.partial(_autograd, _kind))
    torch.library.register_vmap(_kind.qualname, functools.partial(_vmap, _kind))


# --- torch.func transforms and forward-mode AD -----------------------------------------
#
# The autograd.Function that the Autograd kernel applies. When an input is wrapped by
# a torch.func transform or carries a forward-mode tangent, the public functions apply
# it before dispatch, where the transforms can see it. It runs the same op with the
# same backward and jvp. Its vmap rule is generated from the op's own.


def _needs_function(sel, values) -> bool:
    # Dynamo records the operator itself, with its registered autograd and vmap rules.
    # Dynamo also cannot trace functorch's wrapper queries.
    if _compat.is_dynamo_compiling() or not _compat.transforms_active():
        return False
    if _compat.pre_dispatch_tracing():
        # torch.export traces no autograd.Function under a transform (2.11-2.15). The
        # operator is recorded instead and replays the graph's transforms with its own
        # rules.
        return False
    # A vmap level alone needs no Function, because the op's own vmap rule batches it.
    wrapped = _compat.is_differentiated_by_transform
    if wrapped(sel) or any(wrapped(v) for v in values):
        return True
    has = _compat.has_tangent  # returns at once when no forward-AD level is active
    return has(sel) or any(has(v) for v in values)


# torch.func.functionalize has no rule for an autograd.Function (2.11-2.15). Without
# the Function, the select would run, but the write recorder sees no write through
# functionalize's wrappers, so a branch's writes would be lost.
_UNDER_FUNCTIONALIZE = (
    "torchcond's select cannot run under torch.func.functionalize. It runs where every "
    "branch of a conditional runs (strategy='select', or vmap with a per-example "
    "predicate) and in torchcond.select, and torchcond cannot see what a branch writes "
    "through functionalize's wrappers. Pick the branch on the host (strategy='auto' "
    "with a predicate the host can read), or let torch.export or torch.compile "
    "functionalize the program"
)


def _differentiable(kind: _Kind, selector, *args) -> list[torch.Tensor]:
    values = kind.values(*args)
    # Build the labels only where export may refuse. Dynamo cannot trace the
    # dispatch-key check, so it skips this.
    if not _compat.is_dynamo_compiling() and _compat.pre_dispatch_tracing():
        refuse_untraced(kind.qualname, kind.labelled(*args))
    if values and _needs_function(selector, values):
        if _compat.functionalize_level_active():
            raise UnsupportedCondError(_UNDER_FUNCTIONALIZE)
        num_branches = len(kind.branches(selector, *args))
        return list(_SelectFunction.apply(kind, selector, num_branches, *values))
    return kind.op(selector, *args)


def _meta(values):
    """Return what a zero tangent needs (shape, dtype, device) without keeping tensors alive."""
    return [(v.shape, v.dtype, v.device) for v in values]


def _tangent_or_zero(tangent, meta):
    if tangent is not None:
        return tangent
    shape, dtype, device = meta
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


class _SelectFunction(torch.autograd.Function):
    """``kind``'s operator over ``num_branches`` branches, with their values passed flat."""

    generate_vmap_rule = True

    @staticmethod
    def forward(kind, selector, num_branches, *values):
        return tuple(kind.op(selector, *kind.args(_split(values, num_branches))))

    @staticmethod
    def setup_context(ctx, inputs, output):
        kind, selector, num_branches, *values = inputs
        ctx.save_for_backward(selector)
        ctx.save_for_forward(selector)
        ctx.kind = kind
        ctx.num_branches = num_branches
        ctx.meta = _meta(values)  # for zero tangents (jvp)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):
        (selector,) = ctx.saved_tensors
        need = ctx.needs_input_grad[3:]
        return (None, None, None, *_grads(ctx.kind, selector, grads, ctx.num_branches, need))

    @staticmethod
    def jvp(ctx, kind_tangent, selector_tangent, count_tangent, *tangents):
        (selector,) = ctx.saved_tensors
        filled = [_tangent_or_zero(t, m) for t, m in zip(tangents, ctx.meta)]
        branches = _split(filled, ctx.num_branches)
        out = _differentiable(ctx.kind, selector, *ctx.kind.args(branches))
        # An integer output (a number a branch returned) has no tangent.
        return tuple(t if t.dtype.is_floating_point or t.dtype.is_complex else None for t in out)
