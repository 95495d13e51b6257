"""Every private torch API that torchcond touches, in one place.

Each name below was checked on torch 2.11.0 (the GPU machines), 2.13.0, 2.14.1 and
2.15.0. CI runs the suite on all four. Where a name differs between them, a comment
says how. When torch moves one of these names, this module is the only file that changes.
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch

MIN_TORCH = (2, 11)
CHECKED_TORCH = ((2, 11), (2, 13), (2, 14), (2, 15))


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


TORCH_VERSION = _torch_version()
# From torch 2.14 on, make_fx records ``detach`` as a differentiable ``alias``. It
# records detach on 2.11 and 2.13, and alias on 2.14 and 2.15.
DETACH_TRACED_AS_ALIAS = TORCH_VERSION >= (2, 14)
# Before 2.13, torch.export records no torch.func.jvp. Its tensors become constants.
EXPORT_TRACES_JVP = TORCH_VERSION >= (2, 13)
if TORCH_VERSION < MIN_TORCH:
    raise ImportError(
        f"torchcond needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}; found torch {torch.__version__}"
    )
if TORCH_VERSION > max(CHECKED_TORCH):
    import warnings

    warnings.warn(
        f"torchcond was checked on torch {', '.join(f'{a}.{b}' for a, b in CHECKED_TORCH)}; "
        f"found torch {torch.__version__}. The private torch APIs it uses (all in "
        "torchcond/_compat) may have moved.",
        RuntimeWarning,
        stacklevel=2,
    )

# --- operators and dispatch ------------------------------------------------------

import torch.utils._pytree as pytree  # noqa: E402  (no public pytree module on 2.11-2.15)
from torch._C import DispatchKey  # noqa: E402
from torch._higher_order_ops.utils import (  # noqa: E402
    _maybe_run_with_interpreter as run_with_interpreter,
)
from torch._ops import HigherOrderOperator, OpOverload  # noqa: E402
from torch._subclasses import fake_tensor as _fake_tensor  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402
from torch.fx.experimental import proxy_tensor as _proxy_tensor  # noqa: E402
from torch.fx.experimental.proxy_tensor import (  # noqa: E402
    ProxyTorchDispatchMode,
    disable_proxy_modes_tracing,
    get_proxy_slot,
    track_tensor_tree,
)
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from .branch_facts import assuming as assuming  # noqa: E402
from .branch_facts import cond_facts as cond_facts  # noqa: E402
from .branch_facts import insert_checks as insert_checks  # noqa: E402
from .branch_facts import switch_facts as switch_facts  # noqa: E402

__all__ = [
    "DispatchKey",
    "FakeTensor",
    "FakeTensorMode",
    "HigherOrderOperator",
    "OpOverload",
    "ProxyTorchDispatchMode",
    "StorageWeakRef",
    "TorchDispatchMode",
    "below_autograd",
    "disable_proxy_modes_tracing",
    "get_proxy_slot",
    "pytree",
    "run_with_interpreter",
    "track_tensor_tree",
]


@contextlib.contextmanager
def outside_trace_and_transforms():
    """A context for making a value that a graph records. No trace sees it, and no
    torch.func level wraps it (2.11-2.15)."""
    with disable_proxy_modes_tracing(), torch._C._DisableFuncTorch():
        yield


# These count the active dispatch and torch-function modes. They are C functions, so the
# eager fast path can test "maybe tracing" without a Python frame (2.11-2.15).
len_dispatch_stack = torch._C._len_torch_dispatch_stack
len_function_stack = torch._C._len_torch_function_stack
# In this context no torch-function mode or subclass sees a call. Dynamo traces it
# (2.11-2.15).
torch_function_disabled = torch._C.DisableTorchFunction
_tls_key_included = torch._C._dispatch_tls_is_dispatch_key_included
_PRE_DISPATCH = DispatchKey.PreDispatch
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_batched = torch._C._functorch.is_batchedtensor
_functorch_unwrap = torch._C._functorch.get_unwrapped


_BUILT_IN_NAMESPACES = frozenset({"aten", "prims", "torchcond"})


def has_own_derivative(target) -> bool:
    """Return whether ``target`` is an op outside torch's own whose derivative is a kernel
    registered for it with ``torch.library``'s ``register_autograd`` (2.11-2.15)."""
    return (
        isinstance(target, OpOverload)
        and target.namespace not in _BUILT_IN_NAMESPACES
        and torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "Autograd")
    )


def hop_name(op: HigherOrderOperator) -> str:
    """Return ``op.name()`` by reading its attribute, since dynamo cannot call it (2.11-2.15)."""
    return op._name


def below_autograd():
    """Dispatch below the Autograd key, because the operator's own autograd rule already ran."""
    return torch._C._AutoDispatchBelowAutograd()


def tracing_active() -> bool:
    """Return whether a dispatch mode (fake, proxy, functional, pre-dispatch) or dynamo is active.

    Every eager cond calls this, so it makes three C-level checks and runs no Python loops.
    A pre-dispatch mode (export) shows as the PreDispatch key in the TLS include set.
    """
    return bool(
        torch.compiler.is_dynamo_compiling()  # first, so dynamo folds it and skips the rest
        or len_dispatch_stack()
        or _tls_key_included(_PRE_DISPATCH)
    )


is_functorch_wrapped = _is_functorch_wrapped


FUNCTORCH_TRANSFORMS = (
    torch._C._functorch.TransformType.Grad,
    torch._C._functorch.TransformType.Jvp,
    torch._C._functorch.TransformType.Vmap,
)
DIFFERENTIATING_TRANSFORMS = FUNCTORCH_TRANSFORMS[:2]
GRAD_TRANSFORM = torch._C._functorch.TransformType.Grad
JVP_TRANSFORM = torch._C._functorch.TransformType.Jvp
VMAP_TRANSFORM = torch._C._functorch.TransformType.Vmap
FUNCTIONALIZE_TRANSFORM = torch._C._functorch.TransformType.Functionalize


def functorch_base(t: torch.Tensor) -> torch.Tensor:
    """Return the tensor under every functorch wrapper (grad, jvp, vmap levels)."""
    while _is_functorch_wrapped(t):
        t = _functorch_unwrap(t)
    return t


# A grad or jvp wrapper whose torch.func level has ended dispatches to this key, and no
# interpreter takes it. This happens when a vjp_fn is called after torch.func.vjp
# returned. Aten ops unwrap such wrappers in a C++ fallback. A higher-order operator
# unwraps them by hand (``unwrap_if_dead``). Checked on 2.11-2.15.
DEAD_WRAPPER_KEY = DispatchKey.FuncTorchGradWrapper


def unwrap_if_dead(value):
    if isinstance(value, torch.Tensor):
        return torch._C._functorch.unwrap_if_dead(value)
    return value


def transform_inner(value):
    """Return what a torch.func level's wrapper (grad, jvp, vmap) wraps, or None."""
    if isinstance(value, torch.Tensor) and _is_functorch_wrapped(value):
        return functorch_base(value)
    return None


def is_vmapped(t: torch.Tensor) -> bool:
    """Return whether ``t`` is batched at any functorch level (vmap, vmap of grad, ...)."""
    while _is_functorch_wrapped(t):
        if _is_batched(t):
            return True
        t = _functorch_unwrap(t)
    return False


def is_differentiated_by_transform(t: torch.Tensor) -> bool:
    """Return whether a grad or jvp level wraps ``t``. A vmap level alone does not count."""
    while _is_functorch_wrapped(t):
        if not _is_batched(t):
            return True
        t = _functorch_unwrap(t)
    return False


def batched_at(t: torch.Tensor, level: int) -> bool:
    """Return whether ``t`` carries a vmap batch dimension for ``level``."""
    return _is_batched(t) and torch._C._functorch.maybe_get_level(t) == level


def unbatch(value, level: int):
    """Return ``value`` without ``level``'s batch dim, and that dim or None."""
    if isinstance(value, torch.Tensor) and batched_at(value, level):
        return _functorch_unwrap(value), torch._C._functorch.maybe_get_bdim(value)
    return value, None


def batch(t: torch.Tensor, dim: int, level: int) -> torch.Tensor:
    return torch._C._functorch._add_batch_dim(t, dim, level)


def vmap_level(batch_size: int, randomness: str):
    """Return a context with a new vmap level, which yields the level's number.
    ``torch.vmap`` enters the same context, but also checks its inputs (2.11-2.15)."""
    from torch._functorch.vmap import vmap_increment_nesting

    return vmap_increment_nesting(batch_size, randomness)


def remove_batch_dim(t: torch.Tensor, level: int, batch_size: int, dim: int) -> torch.Tensor:
    """Remove ``level``'s batching from ``t`` and put the batch at ``dim``, as ``torch.vmap``
    returns an output. A ``t`` not batched at ``level`` is expanded (2.11-2.15)."""
    return torch._C._functorch._remove_batch_dim(t, level, batch_size, dim)


def has_tangent(value) -> bool:
    """Return whether ``value`` is a dual tensor of the active forward-AD level."""
    import torch.autograd.forward_ad as fwAD

    if fwAD._current_level < 0 or not isinstance(value, torch.Tensor):
        return False
    # This query is not part of the program. A fake tensor answers through its own mode.
    # A real one (a constant in a fake trace) must not meet the active fake mode.
    with disable_proxy_modes_tracing(), _fake_tensor.unset_fake_temporarily():
        return fwAD.unpack_dual(value).tangent is not None


def capturing_cuda_graph(t: torch.Tensor) -> bool:
    """Return whether a CUDA graph is being captured on the current stream of ``t``'s device."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def cuda_graph_if_body():
    """Return ``if_body(pred)``, which captures into an IF node of the CUDA graph being captured.

    PyTorch's own API for this is ``torch.cuda.CUDAGraph.begin_capture_to_if_node``,
    which its cudagraph conditional nodes use. It exists from torch 2.13, not on 2.11.
    Conditional nodes with captured bodies need a CUDA 12.4 runtime. Without both, this
    returns None.
    """
    graph_cls = getattr(torch._C, "_CUDAGraph", None)
    if not all(
        hasattr(graph_cls, name)
        for name in (
            "get_currently_capturing_graph",
            "begin_capture_to_if_node",
            "end_capture_to_conditional_node",
        )
    ):
        return None
    version = torch.version.cuda
    if version is None or tuple(int(p) for p in version.split(".")[:2]) < (12, 4):
        return None
    return _if_body


@contextlib.contextmanager
def _if_body(pred: torch.Tensor):
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_if_node(pred)
    try:
        yield
    finally:
        graph.end_capture_to_conditional_node()


def is_exporting() -> bool:
    return torch.compiler.is_exporting()


# An alias, not a wrapper, because the select path asks it about twenty times a call.
is_dynamo_compiling = torch.compiler.is_dynamo_compiling


# --- shapes ------------------------------------------------------------------------


def ignore_fresh_unbacked(mode: FakeTensorMode):
    """Ignore fresh unbacked symbols in branch outputs. They belong to the subgraph."""
    if mode.shape_env is None:
        return contextlib.nullcontext()
    return mode.shape_env.ignore_fresh_unbacked_symbols()


def sym_range(shape_env, size) -> tuple[Any, Any]:
    """Return the value range that the shape env knows for ``size`` (an int or a SymInt)."""
    if isinstance(size, int):
        return size, size
    r = shape_env.bound_sympy(size.node.expr)
    return r.lower, r.upper


def new_unbacked_size(shape_env, lower, upper) -> torch.SymInt:
    size = shape_env.create_unbacked_symint()
    shape_env.constrain_symbol_range(size.node.expr, lower, upper)
    return size


def finite_bound(bound) -> int | None:
    """Return a range bound as an int, or None for an infinite one. ``int_oo`` needs its
    own test, because its sympy ``is_finite`` is True. ``int_oo`` exists on 2.11-2.15."""
    from torch.utils._sympy.numbers import int_oo

    if bound == int_oo or bound == -int_oo:
        return None
    return int(bound)


def check_in_range(value: torch.SymInt | int | float, lower: int | None, upper: int | None) -> None:
    """Assert ``lower <= value <= upper`` for the shape env, and at run time where the trace
    records its assertions. A None bound is unbounded. ``torch._check`` exists on 2.11-2.15."""
    if lower is not None:
        torch._check(value >= lower)
    if upper is not None:
        torch._check(value <= upper)


def local_scalar(t: torch.Tensor):
    """Return ``t.item()`` through an operator that dynamo records without
    ``capture_scalar_outputs``. Where ``t`` is traced, it is an unbacked symbol (2.11-2.15)."""
    return torch.ops.aten._local_scalar_dense.default(t)


def same_size(a, b, outside: frozenset = frozenset()) -> bool:
    """Return whether two sizes are the same expression, checked without a guard. A size
    made from data equals another only if its symbols are bound ``outside`` the branches,
    such as the batch size that vmap maps every branch over. A branch's own symbols
    belong to its subgraph, and the graph around it does not know them."""
    from torch.fx.experimental.symbolic_shapes import SymIntEqByExpr, free_unbacked_symbols

    if SymIntEqByExpr(a) != SymIntEqByExpr(b):
        return False
    return a is b or isinstance(a, int) or free_unbacked_symbols(a) <= outside


def unbacked_symbols(tensors) -> frozenset:
    """Return the data-dependent size symbols in ``tensors``' sizes and strides. 2.11-2.15."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    values = [t for t in tensors if isinstance(t, torch.Tensor)]
    return frozenset().union(*(free_unbacked_symbols((*t.shape, *t.stride())) for t in values))


def assume_same_size(a, b) -> bool:
    """Return whether sizes ``a`` and ``b`` may be equal. If they may, assert from here on
    that they are equal. The assertion holds for the shape env, and at run time where a
    trace records its assertions. It covers two sizes made from data, which no trace can
    compare. ``guard_or_true`` and ``torch._check`` exist on 2.11-2.15."""
    from torch.fx.experimental.symbolic_shapes import guard_or_true, statically_known_true

    if statically_known_true(a == b):
        return True
    if not guard_or_true(a == b):
        return False
    torch._check(a == b)
    return True


def definitely_contiguous(t: torch.Tensor) -> bool:
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    return guard_or_false(t.is_contiguous())


# --- graph analysis ----------------------------------------------------------------


def schema_of(op: OpOverload) -> torch.FunctionSchema:
    return op._schema


# nn.Module's own dicts of its parameters, buffers and submodules, by the private field
# that holds each (2.11-2.15). state.py watches them and puts them back.
MODULE_REGISTRIES = ("_parameters", "_buffers", "_modules")


def module_parameters(module: torch.nn.Module) -> dict:
    return module._parameters


def module_buffers(module: torch.nn.Module) -> dict:
    return module._buffers


def module_children(module: torch.nn.Module) -> dict:
    return module._modules


def tensor_version(t: torch.Tensor) -> int:
    """The count of in-place writes to ``t``'s storage (2.11-2.15)."""
    return t._version


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two strided tensors have one storage (2.11-2.15)."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def storage_key(t: torch.Tensor) -> StorageWeakRef:
    """Return the identity of ``t``'s storage, real or fake. Views of one tensor share it.

    A torch.func wrapper (vmap, grad, jvp) has no storage of its own. A write to it writes
    to the tensor it wraps, so that tensor's storage is the key. Export's pre-dispatch
    trace meets such wrappers as the values of its placeholders.
    """
    return StorageWeakRef(functorch_base(t).untyped_storage())


# ``is_fake_tensor`` exists from torch 2.14. torch's own HOP code uses it from 2.15 on,
# ahead of a C++ FakeTensor that is not a Python subclass. 2.11 and 2.13 have only the
# isinstance test.
_is_fake = getattr(_fake_tensor, "is_fake_tensor", None) or (lambda t: isinstance(t, FakeTensor))


def is_cpp_functional(value) -> bool:
    """Return whether ``value`` is a C++ FunctionalTensorWrapper
    (``torch._to_functional_tensor``). Checked on 2.11-2.15."""
    return isinstance(value, torch.Tensor) and torch._is_functional_tensor(value)


def _keeping_detach(table) -> dict:
    """Return ``table`` without make_fx's default ``detach -> alias`` rewrite.

    From torch 2.14, make_fx without a decomposition table records ``detach`` as
    ``alias``. 2.11 and 2.13 keep ``detach``. Branch graphs are differentiated again,
    because their vjp and jvp graphs are traced from them. There an alias would let
    gradients through the branch's stop-gradient. Any explicit table, even an empty
    one, keeps ``detach`` on 2.14.
    """
    from torch._decomp import decompositions

    table = dict(table or {})
    nop = getattr(decompositions, "nop_decomposition", None)
    if table.get(torch.ops.aten.detach.default) is nop:
        del table[torch.ops.aten.detach.default]
    return table


def new_sub_tracer(parent):
    """Return a make_fx tracer configured like ``parent``, as ``trace_subgraph`` makes one."""
    if hasattr(parent, "_make_sub_tracer"):  # torch 2.13, 2.14
        return parent._make_sub_tracer(_keeping_detach(parent.decomposition_table))
    return type(parent)(  # torch 2.11 builds it inline in trace_subgraph
        _keeping_detach(parent.decomposition_table),
        "real",
        parent._allow_non_fake_inputs,
        parent.pre_dispatch,
        parent.record_module_stack,
        parent._allow_fake_constant,
        parent._error_on_data_dependent_ops,
        parent_tracer=parent,
    )


def in_make_fx_session() -> bool:
    return _proxy_tensor._CURRENT_MAKE_FX_TRACER is not None


def current_make_fx_tracer():
    tracer = _proxy_tensor._CURRENT_MAKE_FX_TRACER
    if tracer is None:
        raise RuntimeError("torchcond: a branch can only be traced inside a make_fx/export session")
    return tracer


# --- derivative graphs -------------------------------------------------------------

# ``torch.no_grad()``, ``enable_grad()`` and ``set_grad_enabled`` call this. It is a torch
# function, so a TorchFunctionMode sees the traced code's own switches (checked on 2.11-2.15).
set_grad_enabled = torch._C._set_grad_enabled


def active_fx_tracer():
    """Return the fx tracer of the innermost active make_fx proxy mode, or None."""
    mode = _proxy_tensor.get_proxy_mode()
    return None if mode is None else mode.tracer


def fake_mode_of(args):
    """Return the fake mode of the current trace or of ``args``, or None for real tensors."""
    from torch._guards import detect_fake_mode

    # Another thread's session may be current, and tracing.py refuses it. Read it safely.
    mode = getattr(_proxy_tensor._CURRENT_MAKE_FX_TRACER, "fake_tensor_mode", None)
    return mode if mode is not None else detect_fake_mode(args)


def trace_as_export_would(fn: Callable, args: tuple) -> torch.fx.GraphModule:
    """Trace ``fn`` with ``make_fx`` and symbolic shapes. Tensors that ``fn`` closes over,
    such as parameters, are made fake as they are met. ``_allow_non_fake_inputs`` is
    checked on 2.11-2.15."""
    return _proxy_tensor.make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*args)


def traced_node(t: torch.Tensor):
    """Return the node that the innermost make_fx tracer recorded for ``t``, or None."""
    tracer = active_fx_tracer()
    if tracer is None or not isinstance(t, torch.Tensor):
        return None
    slot = get_proxy_slot(t, tracer, None)
    return None if slot is None else slot.proxy.node


# --- make_fx internals that branch tracing (tracing.py) builds on --------------------
# Checked on 2.11, 2.13, 2.14 and 2.15. A sub-tracer shares its parent's modes through
# ``_init_modes_from_parent`` and traces with ``_trace_inner``. Its proxy-slot tables
# are ``tensor_tracker`` and ``symnode_tracker``. ``_filter_traceback_frames`` is the
# tracer's override point for the frames that a node's stack trace keeps.


def is_real_tensor(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not _is_fake(value)
        and not is_cpp_functional(value)
        and value.device.type != "meta"
    )


def thunkify(tracer, fn):
    return _proxy_tensor.thunkify(tracer, fn)


def wrap_proxy_slots(fx_tracer, wrap) -> None:
    """Replace ``fx_tracer``'s tensor and SymInt slot tables by ``wrap(table)``."""
    fx_tracer.tensor_tracker = wrap(fx_tracer.tensor_tracker)
    fx_tracer.symnode_tracker = wrap(fx_tracer.symnode_tracker)


def sub_tracer_modes(sub, parent):
    """Return the context in which ``sub`` traces with ``parent``'s fake and proxy modes."""
    return sub._init_modes_from_parent(parent)


def trace_inner(sub, fn: Callable, args: tuple) -> torch.fx.GraphModule:
    # Set the caller's proxy mode aside, as a mode's rule does when it traces a HOP's
    # branches. After tracing the branch, _trace_inner inserts runtime asserts for the
    # sizes it made (``u0 >= 0`` of a nonzero). The caller's mode would record them, but
    # those sizes are unknown there.
    with disable_proxy_modes_tracing():
        return sub._trace_inner(run_with_interpreter(fn), *args)


# --- stack traces: the user's frames ---------------------------------------------
# A node's stack trace should point at the user's lines, such as a branch's code or the
# call of cond. It should not point at the libraries in between. make_fx hands over
# frames (keep_stack_frames), and dynamo hands over formatted text (user_stack_trace).
# Both keep the frames that is_user_file accepts.

_LIBRARY_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # torchcond
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,  # torch
)
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)"', re.MULTILINE)


def is_user_file(filename: str) -> bool:
    """Return whether a frame in ``filename`` is user code. Code from torch, torchcond or
    fx (a GraphModule's generated forward) is not."""
    if filename.startswith("<eval_with_key>"):  # fx's generated forward
        return False
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def _user_frames(stack) -> traceback.StackSummary:
    return traceback.StackSummary.from_list([f for f in stack if is_user_file(f.filename)])


def keep_stack_frames(fx_tracer) -> None:
    """Make nodes record stack traces that hold only the user's frames."""
    fx_tracer.record_stack_traces = True
    fx_tracer._filter_traceback_frames = _user_frames


def user_stack_trace(stack_trace: str) -> str:
    """Return ``stack_trace``, as ``traceback`` formats it, with only the user's frames."""
    frames = list(_FRAME.finditer(stack_trace))
    if not frames:
        return stack_trace
    ends = [m.start() for m in frames[1:]] + [len(stack_trace)]
    kept = [stack_trace[m.start() : end] for m, end in zip(frames, ends) if is_user_file(m["file"])]
    return stack_trace[: frames[0].start()] + "".join(kept)


def make_fx_keeping_detach(fn: Callable, args: tuple) -> torch.fx.GraphModule:
    """Trace ``fn`` afresh with make_fx, keeping ``detach`` (see ``_keeping_detach``)."""
    return _proxy_tensor.make_fx(run_with_interpreter(fn), _keeping_detach(None))(*args)


@contextlib.contextmanager
def every_mode_set_aside():
    """Set aside every torch.func level, functionalization and dispatch mode, as a HOP's
    branch tracing does. The caller re-enters the fake mode it needs."""
    from torch._dispatch.python import suspend_functionalization
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
    from torch._subclasses.functional_tensor import disable_functional_mode
    from torch.utils._python_dispatch import _disable_current_modes

    with (
        temporarily_clear_interpreter_stack(),
        suspend_functionalization(),
        disable_functional_mode(),
        _disable_current_modes(),
    ):
        yield


def transform_levels_set_aside():
    """Set aside every torch.func level. A level's wrappers then act as the tensors they
    wrap, as in a HOP's branch tracing (checked on 2.11-2.15)."""
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    return temporarily_clear_interpreter_stack()


def functional_inner(value):
    """Return what a FunctionalTensor (Python functionalization's wrapper) holds, below its
    C++ wrapper too. Return None for anything else."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    if not isinstance(value, FunctionalTensor):
        return None
    return torch._from_functional_tensor(value.elem)


# --- functionalization seen from the Autograd key ------------------------------------


def functional_mode():
    """Return the active FunctionalTensorMode (AOTAutograd, export's decompositions), or None."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)


def new_functional_mode():
    """Return a new Python functionalization mode for one branch's trace in the current
    make_fx session. In a pre-dispatch trace it works at the pre-dispatch level, as
    export's training IR does. Checked on 2.11-2.15."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return FunctionalTensorMode(pre_dispatch=current_make_fx_tracer().pre_dispatch)


def outside_functional_mode():
    """Set aside the active FunctionalTensorMode, if there is one."""
    from torch.utils._python_dispatch import _pop_mode_temporarily

    if functional_mode() is None:
        return contextlib.nullcontext()
    return _pop_mode_temporarily(torch._C._TorchDispatchModeKey.FUNCTIONAL)


def unwrap_functional(values):
    from torch._subclasses.functional_tensor import FunctionalTensor

    return pytree.tree_map_only(FunctionalTensor, FunctionalTensor.from_functional, values)


# These handle Python functionalization's wrappers as torch's dispatch_functionalize
# does (checked on 2.11-2.15).


def functionalize_key_excluded():
    """Turn off the C++ Functionalize key, so that only the Python mode functionalizes."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(DispatchKey.Functionalize))


def to_functional(t: torch.Tensor) -> torch.Tensor:
    from torch._subclasses.functional_tensor import FunctionalTensor

    return FunctionalTensor.to_functional(t)


def from_functional(value):
    """Return the current value under a FunctionalTensor, or anything else as it is."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    if not isinstance(value, FunctionalTensor):
        return value
    torch._sync(value)
    return torch._from_functional_tensor(value.elem)


def mutated_in_place(value) -> tuple[bool, bool]:
    """Return whether the FunctionalTensor ``value`` was written in place, for its data and
    for its metadata. The metadata is sizes and strides, as ``t_()`` and ``resize_()``
    change them."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    if not isinstance(value, FunctionalTensor):
        return False, False
    # Both are in torch._C._VariableFunctions on 2.11-2.15. The stubs list only the
    # metadata one.
    functions: Any = torch
    return (
        functions._functionalize_has_data_mutation(value.elem),
        functions._functionalize_has_metadata_mutation(value.elem),
    )


def storage_changed(value) -> bool:
    """Return whether the FunctionalTensor ``value`` was given new storage in place, as
    ``x.data = y`` and ``x.set_(y)`` do (``torch._functionalize_was_storage_changed``,
    2.11-2.15)."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    functions: Any = torch
    return isinstance(value, FunctionalTensor) and functions._functionalize_was_storage_changed(
        value.elem
    )


# --- fused select fast path ------------------------------------------------------------


import torch.autograd.forward_ad as _forward_ad  # noqa: E402

_peek_interpreter_stack = torch._C._functorch.peek_interpreter_stack


def transforms_active() -> bool:
    """Return whether a torch.func transform (grad, jvp, vmap) or forward-AD level is active.

    This costs one C call and one attribute read. The select fast path asks it once per
    call instead of inspecting every tensor. Checked on 2.11, 2.13, 2.14 and 2.15
    (``peek_interpreter_stack`` exists since 2.0, ``forward_ad._current_level`` since 1.9).
    Dynamo reads any interpreter stack as an object, so under dynamo this asks the stack
    itself.
    """
    if _peek_interpreter_stack() is not None:  # dynamo always sees an object, so ask below
        return not torch.compiler.is_dynamo_compiling() or _traced_under_a_transform()
    return _forward_ad._current_level >= 0


def _traced_under_a_transform() -> bool:
    """Return whether a torch.func level is active under dynamo, from the transforms it
    traces or those around the compiled call. Dynamo calls this while it traces (marked
    below)."""
    return _peek_interpreter_stack() is not None


_traced_under_a_transform._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _traced_under_a_differentiating_transform() -> bool:
    """Return whether a torch.func grad or jvp level is active under dynamo (marked below).
    Dynamo shows no functorch wrappers. A tensor that ``torch.func.grad`` differentiates
    does not read as requiring grad there."""
    stack = _peek_interpreter_stack() and _interpreter_stack()
    return any(level.key() in DIFFERENTIATING_TRANSFORMS for level in stack or ())


_traced_under_a_differentiating_transform._dynamo_marked_constant = True  # type: ignore[attr-defined]


def differentiated_inside_jvp() -> bool:
    """Return whether a torch.func grad or jvp level is active inside a jvp level (jvp of
    jvp, jvp of grad, hessian). Dynamo calls this while it traces (marked below). 2.11-2.15."""
    stack = _peek_interpreter_stack() and _interpreter_stack()
    keys = [level.key() for level in stack or () if level.key() in DIFFERENTIATING_TRANSFORMS]
    return JVP_TRANSFORM in keys[:-1]


differentiated_inside_jvp._dynamo_marked_constant = True  # type: ignore[attr-defined]


def torch_func_level_active() -> bool:
    """Return whether a torch.func transform's level is active. Forward AD alone does not count.

    Under such a level, an ``autograd.Function`` applied from inside an operator's
    Autograd kernel has no kernel to run. ``custom_function_call`` dispatches on the
    transform's interpreter, which the call has already left. Checked on 2.11, 2.13,
    2.14 and 2.15.
    """
    return _peek_interpreter_stack() is not None


_interpreter_stack = torch._C._functorch.get_interpreter_stack


from torch._functorch.pyfunctorch import (  # noqa: E402
    retrieve_current_functorch_interpreter as _current_interpreter,
)


def eager_functorch_interpreter():
    """Return the innermost torch.func level's interpreter if a higher-order operator
    called now would go straight to it, else None. That needs an active transform and no
    dispatch mode, torch-function mode, pre-dispatch tracing or dynamo. 2.11-2.15
    (``retrieve_current_functorch_interpreter`` since 2.1)."""
    if _peek_interpreter_stack() is None or tracing_active() or len_function_stack():
        return None
    return _current_interpreter()


_VmapInterpreterPtr = torch._C._functorch.CVmapInterpreterPtr


def eager_vmap_level(selector) -> tuple[int, int] | None:
    """Return ``(level, batch size)`` of the innermost torch.func level, or None. It
    returns them if that level is a vmap that batches ``selector``, and a higher-order
    operator called now would go straight to its rule (as in ``eager_functorch_interpreter``).
    2.11-2.15 (the C interpreter's ``key`` and ``level``, ``CVmapInterpreterPtr.batchSize``)."""
    top = _peek_interpreter_stack()
    if top is None or not isinstance(selector, torch.Tensor):
        return None
    # Only a vmap level batches tensors. So a selector batched at the innermost level
    # shows that the level is a vmap, without a slow pybind enum compare of its kind.
    level = top.level()
    if not batched_at(selector, level) or tracing_active() or len_function_stack():
        return None
    return level, _VmapInterpreterPtr(top).batchSize()


# These set a vmap level aside and put it back. VmapInterpreter.lower() does the same
# with a generator context manager around them. The vmap rule uses them for its select
# on the batch's own tensors. 2.11-2.15.
pop_vmap_level = torch._C._functorch.pop_dynamic_layer_stack
push_vmap_level = torch._C._functorch.push_dynamic_layer_stack
unwrap_dead_tensor = torch._C._functorch.unwrap_if_dead


_UNEXPORTED_LEVELS = (GRAD_TRANSFORM,) if EXPORT_TRACES_JVP else (GRAD_TRANSFORM, JVP_TRANSFORM)


def transform_level_active(*keys) -> bool:
    """Return whether a torch.func level of one of ``keys`` (``TransformType``) is active.
    2.11-2.15."""
    stack = _interpreter_stack() if _peek_interpreter_stack() is not None else None
    return any(i.key() in keys for i in stack or ())


def functionalize_level_active() -> bool:
    """Return whether a torch.func.functionalize level is active. 2.11-2.15."""
    return transform_level_active(FUNCTIONALIZE_TRANSFORM)


def unexported_level_active() -> bool:
    """Return whether a torch.func level is active whose tensors torch.export does not
    record. These are grad levels (grad, vjp, jacrev, hessian), and jvp levels before 2.13."""
    return transform_level_active(*_UNEXPORTED_LEVELS)


def exporting_under_unexported_level() -> bool:
    """Return whether torch.export traces under such a level. Dynamo calls this while it
    traces (marked below), and there it shows no functorch wrappers."""
    return torch.compiler.is_exporting() and unexported_level_active()


exporting_under_unexported_level._dynamo_marked_constant = True  # type: ignore[attr-defined]


def differentiating_transforms_active() -> bool:
    """Return whether a differentiating torch.func transform (grad, jvp) or a forward-AD
    level is active. vmap alone differentiates nothing. 2.11-2.15
    (``get_interpreter_stack`` lists the levels, outermost first, or is None)."""
    if is_dynamo_compiling():  # dynamo cannot call the stack's C functions
        return _traced_under_a_differentiating_transform()
    if _forward_ad._current_level >= 0:
        return True
    if _peek_interpreter_stack() is None:
        return False
    return any(i.key().value in _DIFFERENTIATING_VALUES for i in _interpreter_stack())


# The transform kinds' values. Comparing pybind enums costs a microsecond each, on every
# per-example call.
_DIFFERENTIATING_VALUES = frozenset(kind.value for kind in DIFFERENTIATING_TRANSFORMS)


# --- dispatch modes that trace nothing (modes.py) --------------------------------------
# At the Python key, HigherOrderOperator.dispatch looks up a mode's rule by the mode's
# exact type (``python_key_table``). A mode without a rule gets the operator in its
# ``__torch_dispatch__`` if it sets ``supports_higher_order_operators``. Otherwise
# dispatch raises. Checked on 2.11, 2.13, 2.14 and 2.15, with the same code on all four.

from torch.utils._python_dispatch import (  # noqa: E402
    _get_current_dispatch_mode as current_dispatch_mode,
)
from torch.utils._python_dispatch import (  # noqa: E402
    _get_current_dispatch_mode_stack as dispatch_mode_stack,  # infra modes included
)
from torch.utils._python_dispatch import (  # noqa: E402
    _pop_mode_temporarily as pop_dispatch_mode,  # yields the popped mode; no __exit__
)

__all__ += ["current_dispatch_mode", "dispatch_mode_stack", "pop_dispatch_mode"]


def pre_dispatch_tracing() -> bool:
    """Return whether a pre-dispatch trace (export's) is active.
    It shows as the PreDispatch key in the TLS include set."""
    return _tls_key_included(_PRE_DISPATCH)


def pre_dispatch_tracer():
    """Return the fx tracer of the pre-dispatch trace (export's) on its mode stack, or None.
    Checked on 2.11-2.15."""
    mode = torch._ops._get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    return None if mode is None else mode.tracer


# FlopCounterMode counts through a dispatch mode of its own private class. That class
# sets supports_higher_order_operators (2.11-2.15).
from torch.utils.flop_counter import _FlopCounterMode as FlopCounterDispatchMode  # noqa: E402

__all__ += ["FlopCounterDispatchMode"]


def count_cond_flops(mode, true_fn: Callable, false_fn: Callable, operands: tuple):
    """Count flops as FlopCounterMode does for ``torch.cond(_, true_fn, false_fn, operands)``.

    ``mode`` is a popped ``FlopCounterDispatchMode``. It counts each function apart and
    keeps the larger count for each module and op, as an upper bound. If the counter
    already held that op for that module, its shallow copies share the count, which then
    takes both functions' flops. ``_handle_higher_order_ops``' branch for
    ``higher_order.cond`` is identical on 2.11-2.15. It reads no predicate and returns
    ``true_fn``'s output.
    """
    args = (None, true_fn, false_fn, operands)
    return mode._handle_higher_order_ops(torch.ops.higher_order.cond, [], args, {})


# torch sets this flag while a Python-level profiler runs (torch.profiler.profile,
# torch.autograd.profiler.profile, emit_nvtx, emit_itt). torch reads it before it adds
# record_function ranges (dynamo, AOTAutograd, inductor). 2.11-2.15.
import torch.autograd.profiler as _autograd_profiler  # noqa: E402


def profiler_enabled() -> bool:
    return _autograd_profiler._is_profiler_enabled


# The same flag for C++ (the eager context of api._EAGER), as the module and the attribute's name.
PROFILER_FLAG = (_autograd_profiler, "_is_profiler_enabled")


@contextlib.contextmanager
def modules_untracked(mode):
    """Hide module calls from FlopCounterMode's module tracker while active.

    The tracker belongs to the counter behind ``mode``, a ``FlopCounterDispatchMode``.
    Its forward hooks are removed, then registered again. Its forward pre-hook fails on a
    module called below the Autograd key with inputs that require grad, because
    ``register_multi_grad_hook`` finds no grad_fn. The rules that run a conditional call
    a branch graph that way, and torch.cond fails the same way.
    ``FlopCounterMode.mod_tracker`` and ModuleTracker's ``_fw_pre_handle``,
    ``_fw_post_handle``, ``_fw_pre_hook`` and ``_fw_post_hook`` are the same on 2.11-2.15.
    """
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    tracker = mode.counter.mod_tracker
    tracker._fw_pre_handle.remove()
    tracker._fw_post_handle.remove()
    try:
        yield
    finally:
        tracker._fw_pre_handle = register_module_forward_pre_hook(tracker._fw_pre_hook)
        tracker._fw_post_handle = register_module_forward_hook(tracker._fw_post_hook)


# torch's global buffer registration hooks, an OrderedDict of hooks by handle id. torch
# keeps this one dict for the whole process (2.11-2.15), so it is bound once. The
# branch runner makes its own hook the only one while a branch runs
# (csrc/write_recorder.cpp).
BUFFER_REGISTRATION_HOOKS = torch.nn.modules.module._global_buffer_registration_hooks


def let_higher_order_ops_pass(key_number: int) -> None:
    """Let every higher-order operator, made now or later, pass over the dispatch key
    numbered ``key_number`` to the next one, as each passes over PythonTLSSnapshot. The write
    recorder puts its key in the thread's set while a branch runs
    (csrc/write_recorder.cpp), where a HOP (torch.cond, flex_attention, a nested
    conditional) would otherwise find no kernel for it. 2.11-2.15
    (``_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS``, ``_higher_order_ops``)."""
    key = DispatchKey(key_number)  # torch binds no name for the recorder's key
    defaults = torch._ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS
    if key not in defaults:
        defaults.append(key)
    for op in torch._ops._higher_order_ops.values():
        op.fallthrough(key)


# The innermost torch.func level's id, one more than the levels below it; it raises
# with no level (2.11-2.15). The eager per-example cond in C++ reads it (batching.cpp).
current_functorch_level = torch._C._functorch.current_level
