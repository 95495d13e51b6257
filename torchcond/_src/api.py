"""The public ``cond`` and ``switch`` functions.

A plain eager call runs as a Python ``if``. It reads the predicate on the host and
calls the taken branch. Such a call has real tensors, no mode, no dynamo, and a
predicate the host can read. Every other call flattens the operand pytree and calls
the higher-order operator. The operator's rules live in ``ops.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from .. import _C, _compat
from .._compat import pytree
from .._compat.dynamo import raise_at_compile_time as _raise_compiled
from .._compat.dynamo import tracing_a_subgraph as _in_subgraph
from ..errors import CondArgumentError, CondError
from . import strategies
from .handoff import Handoff as _Handoff
from .handoff import Ran, taken_over
from .host import host_readable
from .kinds import (
    ConditionalKind,
    check_branch_list,
    check_callables,
    normalize_index,
    normalize_pred,
    python_scalar,
    switch_labels,
)
from .numbers import restored_under_dynamo
from .ops import call, cond_op, kind_of, switch_op
from .pytrees import check_operand_leaves, raise_if_arity_error, run_flat, speculated
from .state import ONE_CALL
from .strategies import Strategy

# The conditional returns what its branches return, so they must agree on the type.
_Out = TypeVar("_Out")

_Tensor = torch.Tensor
_dynamo_compiling = torch.compiler.is_dynamo_compiling
# The eager fast path is one C call (csrc/eager.cpp). It checks that a Python `if`
# gives what the conditional would. That needs a plain tensor selector the host can
# read, plain tensor operands, no dispatch or torch-function mode, no CUDA graph
# capturing on the selector's device, no profiler, and no torch.jit trace. The call
# then reads the selector and returns the branch to call. It returns None to leave
# the call to the slow path, which decides precisely.
# The readability checks mirror host.host_readable(selector, PLAIN), inlined in C for
# speed. test/test_host_readable.py checks that the two agree.
# What the C call reads of Python (EagerContext in csrc/write_recorder.h).
_EAGER = (*_compat.PROFILER_FLAG, torch.cuda.is_current_stream_capturing)
_taken_branch = _C.taken_branch
_taken_case = _C.taken_case
# Under vmap with a per-example predicate and no gradient, one C call runs both
# branches and selects (csrc/batching.cpp). It returns None to leave the call to the
# general path, where the vmap rule (batching.per_example) does the same and the rest.
# Once a branch has run, it returns a Handoff instead, and the general path goes on
# from there without running that branch again (handoff.py).
_per_example_cond = _C.per_example_cond
# The same for strategy="select" outside any torch.func transform.
_select_cond = _C.select_cond
# What these two read and call of Python (OneCall in csrc/batching.cpp).
_ONE_CALL = (*ONE_CALL, _EAGER)
# Under a profiler, the slow path records the conditional's ranges (``_general_path``).
_profiling = _compat.profiler_enabled
# The dynamo path reads only module-level names such as these. A compiled function
# guards on every global that its trace touched. Reaching ``torch`` through this module
# as well as through the user's would add an alias guard, a Python lambda, to every call.
_BOOL = torch.bool
_COND, _SWITCH = kind_of(cond_op), kind_of(switch_op)


def cond(
    pred: bool | torch.SymBool | torch.Tensor,
    true_fn: Callable[..., _Out],
    false_fn: Callable[..., _Out],
    operands: tuple | list = (),
    *,
    strategy: Strategy = "auto",
    check_branches: bool = False,
) -> _Out:
    """Return ``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``.

    Args:
        pred: a Python bool or number, a ``SymBool``, or a tensor with exactly one
            element of any real dtype (read with Python truthiness).
        true_fn: called as ``true_fn(*operands)`` when ``pred`` is true. It returns a
            pytree (tuple/list/dict) of tensors and may close over tensors,
            parameters and buffers.
        false_fn: called as ``false_fn(*operands)`` otherwise. Its output must match
            ``true_fn``'s in structure, dtypes, devices, layouts and ranks; sizes
            may differ (they become unbacked sizes when traced).
        operands: a tuple or list of pytrees whose leaves are tensors.
        strategy: ``"auto"`` (default) or ``"select"``; see below.
        check_branches: in eager mode, first trace every branch as ``torch.export``
            would, on fake tensors with symbolic shapes. No real data is read or
            written. Raise what the trace raises, such as a
            :class:`BranchMismatchError` from a branch this call does not take. It is
            off by default because it costs a trace per call.

    With ``strategy="auto"``, eager mode runs only the taken branch, exactly as a
    Python ``if`` does. Under tracing (``make_fx``, ``torch.export``, fake tensors),
    both branches are traced into a single ``torch.ops.higher_order.torchcond_cond``
    node. Under ``torch.vmap`` with a predicate that differs per example, and while
    a CUDA graph is being captured, both branches run and the device selects.

    With ``strategy="select"``, both branches always run. One fused select picks
    every output element on the device. The host never reads the predicate, so
    there is no device sync. Both branches must then return the same shapes. They
    may not write in place to anything they did not create (``BranchMutationError``).

    Returns:
        What the taken branch returns, in the same pytree structure. In eager mode
        this is the branch's own result, so an identity branch returns the operand
        itself. When traced, every output is a fresh tensor.

    Raises:
        CondArgumentError: an argument has the wrong type, shape or value, such as a
            predicate with several elements or a branch that is not callable. This is
            checked in every mode, eager included.
        BranchMismatchError: the branches return different pytree structures,
            dtypes, devices, layouts or ranks. This is checked when traced, or eagerly
            with ``check_branches=True``. With ``strategy="select"``, the shapes must
            match too.
        BranchMutationError: a traced branch, or one that runs whether or not it is
            taken (``strategy="select"``), writes in place to an operand or to a
            tensor it closes over.

    Examples:
        In eager mode ``cond`` is a Python ``if``, and only the taken branch runs.

        >>> x = torch.tensor([1.0, -2.0, 3.0])
        >>> torchcond.cond(x.sum() > 0, torch.cos, torch.sin, (x,))
        tensor([ 0.5403, -0.4161, -0.9900])

        Operands and outputs may be pytrees, and branches may close over tensors:

        >>> w = torch.tensor(10.0)
        >>> out = torchcond.cond(
        ...     x.max() > 5,
        ...     lambda d: {"y": d["a"] + w},
        ...     lambda d: {"y": d["a"] - w},
        ...     ({"a": x},),
        ... )
        >>> out["y"]
        tensor([ -9., -12.,  -7.])

        With ``strategy="select"``, both branches run and the device picks each
        element, so the host never reads the predicate:

        >>> torchcond.cond(x.sum() > 0, torch.cos, torch.sin, (x,), strategy="select")
        tensor([ 0.5403, -0.4161, -0.9900])

        Branches that would not trace together fail even if the other one is taken:

        >>> to_double = lambda x: x.double()
        >>> torchcond.cond(x.sum() > 0, torch.cos, to_double, (x,), check_branches=True)
        Traceback (most recent call last):
        ...
        torchcond.errors.BranchMismatchError: output: branches must agree on dtype; ...
    """
    if _dynamo_compiling():
        return _cond_under_dynamo(pred, true_fn, false_fn, operands, strategy)
    if strategy == "auto" and not check_branches:
        fn = _taken_branch(_EAGER, pred, true_fn, false_fn, operands)
        if fn is not None:
            try:
                return fn(*operands)
            except TypeError as error:  # costs nothing when nothing is raised
                label = "true_fn" if bool(pred) else "false_fn"
                raise_if_arity_error(error, fn, label, operands)
                raise
        out = _per_example_cond(_ONE_CALL, pred, true_fn, false_fn, operands)
        if type(out) is _Handoff:
            return _go_on(out, pred, true_fn, false_fn, operands, strategy)
        if out is not None:
            return out
    elif strategy == "select" and not check_branches:
        out = _select_cond(_ONE_CALL, pred, true_fn, false_fn, operands)
        if type(out) is _Handoff:
            return _go_on(out, pred, true_fn, false_fn, operands, strategy)
        if out is not None:
            return out
    return _general_path(_COND, pred, (true_fn, false_fn), operands, strategy, check_branches)


def _go_on(handoff, pred, true_fn, false_fn, operands, strategy):
    """Finish a call that a one-call path started: the general path takes the branch
    calls that already happened (handoff.py) and runs only the rest."""
    ran = taken_over(handoff, ("true_fn", "false_fn"), operands)
    return _general_path(_COND, pred, (true_fn, false_fn), operands, strategy, ran=ran)


def switch(
    index: int | torch.SymInt | torch.Tensor,
    branches: Sequence[Callable[..., _Out]],
    operands: tuple | list = (),
    *,
    strategy: Strategy = "auto",
    check_branches: bool = False,
) -> _Out:
    """Return ``branches[clamp(index, 0, len(branches) - 1)](*operands)``.

    As in ``jax.lax.switch``, an out-of-range index is clamped in every mode. A
    negative index takes ``branches[0]``, and a too-large one takes ``branches[-1]``.

    Args:
        index: a Python int, a ``SymInt``, or a one-element tensor of integer dtype.
        branches: a non-empty sequence of callables taking ``*operands``, under the
            same output rules as :func:`cond`.
        operands: a tuple or list of pytrees whose leaves are tensors.
        strategy: ``"auto"`` or ``"select"``, as for :func:`cond`.
        check_branches: as for :func:`cond`.

    Returns:
        What the selected branch returns, as for :func:`cond`.

    Raises:
        CondArgumentError: an argument has the wrong type, shape or value, such as an
            index of a non-integer dtype or an empty ``branches``. This is checked in
            every mode, eager included.
        BranchMismatchError: the branches disagree on their outputs, as for
            :func:`cond`. This is checked when traced, or eagerly with
            ``check_branches=True``.
        BranchMutationError: as for :func:`cond`.

    Examples:
        >>> x = torch.tensor([1.0, -2.0])
        >>> branches = [lambda x: x + 1, lambda x: x * 10, torch.neg]
        >>> torchcond.switch(torch.tensor(1), branches, (x,))
        tensor([ 10., -20.])

        An out-of-range index is clamped. It is not an error:

        >>> torchcond.switch(torch.tensor(7), branches, (x,))  # branches[2]
        tensor([-1.,  2.])
        >>> torchcond.switch(torch.tensor(-1), branches, (x,))  # branches[0]
        tensor([ 2., -1.])

        A boolean index is refused (use :func:`cond`):

        >>> torchcond.switch(torch.tensor(True), branches, (x,))
        Traceback (most recent call last):
        ...
        torchcond.errors.CondArgumentError: switch: argument 'index' must have an integer dtype; ...
    """
    if _dynamo_compiling():
        return _switch_under_dynamo(index, branches, operands, strategy)
    if strategy == "auto" and not check_branches:
        fn = _taken_case(_EAGER, index, branches, operands)
        if fn is not None:
            try:
                return fn(*operands)
            except TypeError as error:
                i = min(max(int(index), 0), len(branches) - 1)
                raise_if_arity_error(error, fn, f"branches[{i}]", operands)
                raise
    return _general_path(_SWITCH, index, branches, operands, strategy, check_branches)


# --- the traced path ------------------------------------------------------------------


def _cond_under_dynamo(pred, true_fn, false_fn, operands, strategy):
    """Run ``cond`` while dynamo traces it.

    Dynamo speculates the branches itself and inlines constant predicates
    (_compat/dynamo.py). It sees a SymBool as a bool, so this path is separate. Every
    global this function reads becomes a guard on each call, so it reads only
    module-level names.
    """
    try:
        strategy = _inline_inside_jvp(strategy)
        if strategy != "auto":  # the shared path checks "select" and bad values
            return _general_path(_COND, pred, (true_fn, false_fn), operands, strategy)
        check_callables((true_fn, false_fn), ("true_fn", "false_fn"))
        _check_operands(operands)
        # A Python number picks the branch. Anything else gets the eager checks.
        # Dynamo's isinstance takes a SymBool for a bool and a SymInt for an int.
        pred = python_scalar(pred)
        if isinstance(pred, _Tensor) or not isinstance(pred, (bool, int, float)):
            pred = normalize_pred(pred)
        labelled = ((true_fn, "true_fn"), (false_fn, "false_fn"))
        return _operator_under_dynamo(cond_op, pred, labelled, operands)
    except CondError as error:
        _raise_compiled(type(error), error.args[0])


def _switch_under_dynamo(index, branches, operands, strategy):
    """Run ``switch`` while dynamo traces it. The graph holds the index as given (clamped if symbolic)."""
    try:
        strategy = _inline_inside_jvp(strategy)
        if strategy != "auto":
            return _general_path(_SWITCH, index, branches, operands, strategy)
        branches = check_branch_list(branches)
        _check_operands(operands)
        # Dynamo's isinstance takes a SymInt for an int. normalize_index clamps it.
        index = normalize_index(python_scalar(index), len(branches))
        labelled = tuple(zip(branches, switch_labels(len(branches))))
        return _operator_under_dynamo(switch_op, index, labelled, operands)
    except CondError as error:
        _raise_compiled(type(error), error.args[0])


def _inline_inside_jvp(strategy):
    """Use ``"select"`` for ``"auto"`` under a grad or jvp level inside a jvp (hessian).
    There the operator's node lacks the outer tangent of a constant derivative, such as
    that of ``2 * x``. Inlined branches and a select are plain code and give it."""
    if strategy == "auto" and _compat.differentiated_inside_jvp():
        return "select"
    return strategy


def _operator_under_dynamo(
    op,
    selector,
    labelled_branches,
    operands,
    leaves_only=False,
    may_write=True,
    speculate_only=False,
):
    """Call ``op`` as dynamo speculates it, with flat operands.

    Each branch takes the operands flat (``pytrees.speculated``), and dynamo rebuilds
    the output. Dynamo's hook for the operator (_compat/dynamo.py) runs in place of
    ``op``. Pass ``may_write=False`` when every branch runs, as on the select path.
    The hook then refuses branch writes to anything from outside them. With
    ``speculate_only``, the hook checks the branches and emits no node. Both are
    keywords that only the hook reads (ops.CondOp.__call__), so each is passed only
    when set.
    """
    kw: dict = {} if may_write else {"may_write": False}
    if speculate_only:
        kw["speculate_only"] = True
    spec = None
    # Flat tensor operands skip the flattening, which keeps pytree code out of the trace.
    if not _tensor_sequence(operands):
        flat, spec = pytree.tree_flatten(operands)
        operands = tuple(flat)
    branches = [speculated(fn, label, spec, leaves_only) for fn, label in labelled_branches]
    out = op(selector, *branches, operands, **kw)
    return out if leaves_only else restored_under_dynamo(out)


def _general_path(
    kind: ConditionalKind,
    selector,
    branches,
    operands,
    strategy="auto",
    check_branches=False,
    ran: Sequence[Ran] = (),
):
    """Check the arguments and route the call, in a profiler range when a profiler runs.
    The eager fast path in ``cond`` and ``switch`` has already taken the common case.
    ``ran`` holds the branch calls that a one-call path already made (handoff.py)."""
    if not _dynamo_compiling() and _profiling():
        with torch.autograd.profiler.record_function(f"torchcond.{kind.name}"):
            return _check_and_route(
                kind, selector, branches, operands, strategy, check_branches, ran
            )
    return _check_and_route(kind, selector, branches, operands, strategy, check_branches, ran)


def _check_and_route(
    kind: ConditionalKind, selector, branches, operands, strategy, check_branches, ran=()
):
    """Check the arguments, then route the call. It goes to the select path, to the
    taken branch when the selector is a constant or the host can read it, or else to
    the operator. Only the select path and the operator take ``ran``: the one-call
    paths run branches only where the call goes there."""
    branches = kind.check_branches(branches)
    _check_operands(operands)
    n = len(branches)
    labelled = list(zip(branches, kind.labels(n)))
    if strategies.chooses_select(strategy, selector):
        return _select_path(kind, kind.normalize(selector, n), labelled, operands, strategy, ran)
    selector = python_scalar(selector)
    if kind.is_constant(selector):
        kind.warn_if_exporting(selector, stacklevel=4)
        return _run_concrete(
            kind, labelled, kind.taken_index(selector, n), operands, check_branches
        )
    if isinstance(selector, torch.Tensor):
        kind.check_tensor(selector)
        if host_readable(selector):
            taken = kind.taken_index(selector, n)
            return _run_concrete(kind, labelled, taken, operands, check_branches)
    else:  # symbolic, or a bad type that normalize reports
        selector = kind.normalize(selector, n)
    return _call_operator(kind.op, selector, labelled, operands, ran)


def _run_concrete(
    kind: ConditionalKind, labelled_branches, taken: int, operands, check_branches: bool
):
    """Run the taken branch as a Python ``if`` would. With ``check_branches``, first
    check every branch on fake tensors, as tracing would."""
    if check_branches:
        _check_every_branch(kind, labelled_branches, operands)
    fn, label = labelled_branches[taken]
    if not _dynamo_compiling() and _profiling():
        # The taken branch gets its own range inside the call's range, such as
        # ``torchcond.cond/true_fn`` or ``torchcond.switch/branches[2]``.
        with torch.autograd.profiler.record_function(f"torchcond.{kind.name}/{label}"):
            return _run_taken(fn, label, operands)
    return _run_taken(fn, label, operands)


def _check_every_branch(kind: ConditionalKind, labelled_branches, operands) -> None:
    """Trace the conditional as ``torch.export`` would, with fake tensors and symbolic
    shapes. What the trace refuses in any branch raises now. The trace is dropped."""
    flat, spec = pytree.tree_flatten(operands)
    # A selector the trace cannot read, so that every branch is traced.
    selector = torch.zeros((), dtype=kind.selector_dtype)

    def call(selector, *flat):
        return _call_operator(
            kind.op, selector, labelled_branches, pytree.tree_unflatten(list(flat), spec)
        )

    _compat.trace_as_export_would(call, (selector, *flat))


def _run_taken(fn, label: str, operands):
    """Run the taken branch as a Python ``if`` would."""
    try:
        return fn(*operands)
    except TypeError as error:
        raise_if_arity_error(error, fn, label, operands)
        raise


def _call_operator(op, selector, labelled_branches, operands, ran: Sequence[Ran] = ()):
    """Call ``op(selector, *branches, operands)`` on flat operands and rebuild the pytree."""
    kind = kind_of(op)
    return run_flat(
        labelled_branches,
        operands,
        lambda branches, flat, labels: call(kind, selector, branches, flat),
        selector=selector,
        ran=ran,
    )


def _select_path(
    kind: ConditionalKind, selector, labelled_branches, operands, strategy, ran: Sequence[Ran] = ()
):
    """Run the branches on flat operands as ``strategies.runner`` says."""
    if not isinstance(selector, torch.Tensor):  # a SymBool or a SymInt
        selector = torch.scalar_tensor(selector, dtype=kind.selector_dtype)
    if _dynamo_compiling():
        # Dynamo inlines the branches below, where no dispatch mode can refuse a write
        # from a branch that is not taken. Calling the operator makes dynamo speculate
        # each branch as a subgraph. With ``may_write=False``, dynamo refuses writes to
        # anything from outside the branch.
        if _in_subgraph():
            # Inside a branch that dynamo speculates, such as another conditional's,
            # the run below cannot enter the mode that reads closed-over tensors. So
            # the operator stands in for the select there. It gives the same values as
            # a Python ``if``, and Inductor picks its branch on the host.
            return _operator_under_dynamo(
                kind.op, selector, labelled_branches, operands, may_write=False
            )
        # Only the checks are wanted, so dynamo emits no node. AOTAutograd would trace
        # a node before dropping it. Some rules would also refuse what the inline run
        # below handles, such as a torch.func transform over it under
        # functionalization. The checks run with torch-function modes off. In an
        # enclosing select's run, the mode that reads closures (closures.StandIns)
        # would otherwise change its own state from inside the branches, and dynamo
        # refuses that.
        with _compat.torch_function_disabled():
            _operator_under_dynamo(
                kind.op,
                selector,
                labelled_branches,
                operands,
                leaves_only=True,
                may_write=False,
                speculate_only=True,
            )
    return run_flat(
        labelled_branches,
        operands,
        strategies.runner(kind, selector, strategy),
        selected=True,
        selector=selector,
        ran=ran,
    )


# --- validation -----------------------------------------------------------------------


def _tensor_sequence(operands) -> bool:
    # The leaves use isinstance, not an exact type test. Under dynamo, ``type(o)`` is
    # reached through torch's own module and would cost an alias guard per call.
    return type(operands) in (tuple, list) and all(isinstance(o, _Tensor) for o in operands)


def _check_operands(operands) -> None:
    if _tensor_sequence(operands):
        return
    if not isinstance(operands, (tuple, list)):
        raise CondArgumentError(
            "argument 'operands' must be a tuple or list of pytrees of tensors; "
            f"found {type(operands).__name__}"
        )
    check_operand_leaves(operands)
