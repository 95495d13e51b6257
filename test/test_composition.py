"""The composition matrix: transforms x contexts x branch kinds x {cond, switch} x strategies.

torchcond is right when one transformation meets a conditional alone; the defects of
issue 26 appeared where two meet. Each case here builds a small program around
cond/switch (a branch *kind*), applies a chain of torch.func transforms to it (and
optionally torch.autograd outside), runs the result in a *context* (eager, make_fx,
torch.export, torch.compile) on inputs that take every branch, and compares with the
same program written with a Python `if`, run eagerly under the same transforms. There,
vmap becomes a loop over examples, so that each `if` reads one example's predicate.

Every case must end in one of:

* the Python `if`'s value: outputs, and the operands a branch writes in place;
* a torchcond error (a CondError somewhere in the exception chain) that does not blame
  what the program lacks (a custom autograd.Function, random draws, writes);
* any error, when torch cannot run the transforms in that context even without a
  conditional: found by running each branch alone (the `if` with a constant
  predicate) through the same transforms and context, not by a list of skips.

Never a wrong value (a NaN the `if` does not give included), never torch's internal
error, and torch's global state usable afterwards (an unrelated jacfwd still runs).

`make test` runs a fixed sample that covers every context, transform and branch kind,
plus each defect of issue 26. `TORCHCOND_COMPOSITION=full` (`make test-long`) runs the
whole product; `-k` selects from it by id (`-k "fx-symbolic and grad"`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import math
import os
import random
import re
import subprocess
import sys
import traceback
from collections.abc import Callable

import pytest
import torch
import torch.utils._pytree as pytree
from conftest import dispatch_keys, restore_dispatch_keys
from torch.fx.experimental.proxy_tensor import make_fx

import torchcond
from torchcond import BranchMutationError, CondArgumentError, CondError

FULL = os.environ.get("TORCHCOND_COMPOSITION", "") == "full"


# --- a custom pytree node -----------------------------------------------------------------


class Pair:
    """An operand and output type torch knows only through its pytree registration."""

    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(
    Pair,
    lambda p: ((p.a, p.b), None),
    lambda leaves, _: Pair(*leaves),
    serialized_type_name=f"{__name__}.Pair",
    flatten_with_keys_fn=lambda p: (
        ((pytree.GetAttrKey("a"), p.a), (pytree.GetAttrKey("b"), p.b)),
        None,
    ),
)


# --- the conditional, three ways ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Conditional:
    """What `c(selector, branches, operands)` means in a program.

    how="torchcond": torchcond.cond (the first two branches) or torchcond.switch.
    how="python_if": the reference, a Python `if` on the selector's value.
    how="fixed": branch `branch` alone, whatever the selector: what torch must be able
    to run for the case to be in scope.
    how="torch.cond": torch.cond (two branches only), for docs/composition.rst's table.
    how="by_hand": strategy="select" written with torch.where (``select_by_hand``).
    """

    op: str
    how: str
    strategy: str = "auto"
    branch: int = 0

    def selector(self, flag: torch.Tensor):
        """This op's selector from a bool tensor: the predicate, or index 0 or 2."""
        return flag if self.op == "cond" else flag.long() * 2

    def __call__(self, selector, branches, operands, closed=()):
        """``branches`` is a list, or, with ``closed``, a function of the closed-over
        tensors that returns it: by hand, each branch then reads them masked."""
        if self.how == "by_hand" and closed:
            return select_by_hand(self.op, selector, branches, operands, closed)
        branches = branches(*closed) if closed else branches
        branches = branches[:2] if self.op == "cond" else branches
        if self.how == "torchcond":
            if self.op == "cond":
                return torchcond.cond(
                    selector, branches[0], branches[1], operands, strategy=self.strategy
                )
            return torchcond.switch(selector, branches, operands, strategy=self.strategy)
        if self.how == "torch.cond":
            return torch.cond(selector, branches[0], branches[1], tuple(operands))
        if self.how == "by_hand":
            return select_by_hand(self.op, selector, branches, operands)
        if self.how == "python_if":
            if self.op == "cond":
                k = 0 if bool(selector) else 1
            else:
                k = min(max(int(selector), 0), len(branches) - 1)
        else:
            k = min(self.branch, len(branches) - 1)
        return branches[k](*operands)


def select_by_hand(op: str, selector, branches, operands, closed=()):
    """What strategy="select" does, written with torch.where. Every branch runs on the
    operands and the ``closed`` tensors it closes over, whose gradient each branch
    feeds only where it is taken, and a where picks each output."""
    count = 2 if op == "cond" else len(branches(*closed) if closed else branches)
    if op == "cond":
        masks = [selector, ~selector]
    else:
        index = selector.clamp(0, count - 1)
        masks = [index == k for k in range(count)]

    def masked(mask, v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return torch.where(mask, v, v.detach())
        return v

    outs = []
    for k, m in enumerate(masks):
        mask = functools.partial(masked, m)
        branch = (branches(*map(mask, closed)) if closed else branches)[k]
        outs.append(branch(*pytree.tree_map(mask, tuple(operands))))
    picked = outs[-1]
    for mask, out in zip(masks[-2::-1], outs[-2::-1]):
        picked = pytree.tree_map(functools.partial(torch.where, mask), out, picked)
    return picked


# --- branch kinds: programs fun(c, x, y, s) -------------------------------------------------
# x is differentiated, y is a second tensor (closed over, a buffer, or unused), s selects.
# A program that closes over tensors names them after the operands, and its branches
# come from a function of them: so the select by hand can mask them as torchcond does.


def ordinary(c, x, y, s):
    return c(s, [torch.sin, torch.cos, torch.tanh], (x,))


def identity(c, x, y, s):
    return c(s, [lambda x: x, lambda x: 2 * x, torch.sin], (x,))


def closure(c, x, y, s):
    return c(s, lambda y: [lambda x: x * y, lambda x: 2 * x, lambda x: x + y.sin()], (x,), (y,))


def constant(c, x, y, s):
    # sqrt's derivative is infinite where the constant branches are taken (x = 0):
    # a select that multiplies it by zero gives NaN.
    return c(s, [lambda x: torch.tensor(2.0), torch.sqrt, lambda x: torch.full_like(x, 3.0)], (x,))


def no_operands(c, x, y, s):
    # Issue 26's `safe` sqrt: every tensor is closed over.
    return c(
        s,
        lambda x, y: [lambda: torch.tensor(2.0), lambda: torch.sqrt(x), lambda: x * y],
        (),
        (x, y),
    )


def twice(c, x, y, s):
    return c(
        s,
        [lambda a, b: (a, b), lambda a, b: (2 * a, 4 * b), lambda a, b: (a * b, a + b)],
        (x, x),
    )


def custom_pytree(c, x, y, s):
    return c(
        s,
        [
            lambda p: Pair(p.a.sin(), p.b),
            lambda p: Pair(p.b * p.a, p.a),
            lambda p: Pair(p.a.cos(), p.b.cos()),
        ],
        (Pair(x, y),),
    )


def write(c, x, y, s):
    def add_one(x, buffer):
        buffer.add_(1.0)
        return x * buffer

    def double(x, buffer):
        buffer.mul_(2.0)
        return x + buffer

    return c(s, [add_one, lambda x, buffer: x.cos(), double], (x, y))


def passthrough(c, x, y, s):
    # Every branch returns y unchanged: under vmap it stays unbatched (out_dims=None).
    return c(
        s, [lambda x, y: (x.sin(), y), lambda x, y: (x.cos(), y), lambda x, y: (2 * x, y)], (x, y)
    )


def nested(c, x, y, s):
    # The inner selector is computed outside and closed over, never differentiated.
    inner = c.selector(y > 1.6)
    return c(
        s,
        [lambda x: c(inner, [torch.sin, torch.cos, torch.tanh], (x,)), lambda x: 2 * x, torch.exp],
        (x,),
    )


def unbacked(c, x, y, s):
    # A size made inside the branch from data: an unbacked SymInt when traced.
    def rows(x):
        return (x > 1).nonzero().size(0) + 1

    return c(
        s,
        [
            lambda x: x * torch.ones(rows(x)).cos(),
            lambda x: x * torch.ones(rows(x)).sin(),
            lambda x: x * torch.ones(rows(x)).tanh(),
        ],
        (x,),
    )


def closure_view(c, x, y, s):
    # A closed-over view whose size is symbolic under dynamic shapes.
    v = x.view(-1, 4)
    return c(
        s,
        lambda v, y: [lambda: (v @ y).sin(), lambda: (v @ y).cos(), lambda: (v @ y).tanh()],
        (),
        (v, y),
    )


def number(c, x, y, s):
    # A Python number beside the tensor: the same in cond's branches, another in
    # switch's third (an unbacked SymInt when traced with symbolic shapes).
    return c(s, [lambda x: (x.sin(), 2), lambda x: (x.cos(), 2), lambda x: (2 * x, 5)], (x,))


def rows(c, x, y, s):
    # A dimension per example (symbolic under dynamic shapes), and y both an operand
    # and reduced across it.
    return c(
        s,
        [
            lambda x, y: (x * y).sin(),
            lambda x, y: x.cos() + y.sum(),
            lambda x, y: x.tanh() * y.mean(),
        ],
        (x, y),
    )


def checked(c, x, y, s):
    # Each branch checks sizes (issue 46): the checks hold for every input here, stay
    # in their branch when traced, and a transform maps them per example.
    def first(x, y):
        torch._check(x.shape[-1] == y.shape[-1], lambda: "x and y must match")
        return (x * y).sin()

    def second(x, y):
        torch._check(x.shape[-1] > 0)
        return x.cos() + y.sum()

    def third(x, y):
        torch._check_is_size(x.shape[-1])
        return x.tanh() * y.mean()

    return c(s, [first, second, third], (x, y))


@dataclasses.dataclass(frozen=True)
class Kind:
    program: Callable
    wrt: tuple[int, ...] = (0,)  # the arguments transforms differentiate: x, or x and y
    zero_branches: frozenset[int] = frozenset()  # branches whose examples get x = 0
    y_batched: bool = False  # under vmap: y per example (a buffer) or shared (a weight)
    out_dims: object = 0  # of the innermost vmap
    x_shape: tuple[int, ...] = ()
    y_shape: tuple[int, ...] = ()

    def x(self, branch: int, j: int) -> torch.Tensor:
        base = 0.0 if branch in self.zero_branches else 0.5 + 0.3 * branch + 0.1 * j
        return base + _ramp(self.x_shape, 0.01)

    def y(self, j: int) -> torch.Tensor:
        return 1.5 + 0.2 * j + _ramp(self.y_shape, -0.02)


def _ramp(shape, step):
    return step * torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)


KINDS = {
    "ordinary": Kind(ordinary),
    "identity": Kind(identity),
    "closure_diff": Kind(closure, wrt=(0, 1)),
    "closure_nodiff": Kind(closure),
    "constant": Kind(constant, zero_branches=frozenset({0, 2})),
    "no_operands": Kind(no_operands, wrt=(0, 1), zero_branches=frozenset({0})),
    "twice": Kind(twice),
    "pytree": Kind(custom_pytree, wrt=(0, 1)),
    "write": Kind(write, y_batched=True),
    "passthrough": Kind(passthrough, wrt=(0, 1), out_dims=(0, None)),
    "nested": Kind(nested),
    "unbacked": Kind(unbacked),
    "closure_view": Kind(closure_view, wrt=(0, 1), x_shape=(2, 2, 4), y_shape=(4, 4)),
    "number": Kind(number),
    "rows": Kind(rows, wrt=(0, 1), y_batched=True, x_shape=(4,), y_shape=(4,)),
    "checked": Kind(checked, wrt=(0, 1), y_batched=True, x_shape=(4,), y_shape=(4,)),
}


# --- transforms ---------------------------------------------------------------------------
# A transform name is a chain, outermost first: "grad.vmap" is grad(sum of vmap(fun)).
# "autograd"/"autograd2" (torch.autograd.grad outside the context, first or second
# order) may only come first.


def total(out):
    """One scalar from any output pytree: what grad, hessian and autograd differentiate."""
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return sum(t.sum() for t in leaves if t.is_floating_point())


def _of_wrt(fun, wrt, args):
    """fun as a function of the arguments numbered wrt, the others fixed to args."""

    def f(*diff):
        full = list(args)
        for i, d in zip(wrt, diff):
            full[i] = d
        return fun(*full)

    return f, tuple(args[i] for i in wrt)


def _vjp(fun, wrt):
    def g(*args):
        f, primals = _of_wrt(fun, wrt, args)
        out, pullback = torch.func.vjp(f, *primals)
        return out, pullback(pytree.tree_map(torch.ones_like, out))

    return g


def _jvp(fun, wrt):
    def g(*args):
        f, primals = _of_wrt(fun, wrt, args)
        return torch.func.jvp(f, primals, tuple(torch.ones_like(p) for p in primals))

    return g


def loop_map(fun, in_dims, out_dims):
    """vmap as a Python loop over examples, so a Python `if` can read each predicate."""

    def g(*args):
        n = next(a.shape[0] for a, d in zip(args, in_dims) if d == 0)
        outs = [fun(*[a[i] if d == 0 else a for a, d in zip(args, in_dims)]) for i in range(n)]
        _, spec = pytree.tree_flatten(outs[0])
        dims = out_dims if isinstance(out_dims, tuple) else (out_dims,) * spec.num_leaves
        columns = zip(*[pytree.tree_leaves(o) for o in outs])
        stacked = [col[0] if d is None else torch.stack(col) for col, d in zip(columns, dims)]
        return pytree.tree_unflatten(stacked, spec)

    return g


def transformed(fun, kind: Kind, names: list[str], vmap):
    """fun(x, y, s) under the chain `names` (outermost first, no autograd)."""
    for depth, name in enumerate(reversed(names)):
        wrt = kind.wrt
        if name == "grad":
            fun = torch.func.grad(lambda *a, f=fun: total(f(*a)), argnums=wrt)
        elif name == "hessian":
            fun = torch.func.hessian(lambda *a, f=fun: total(f(*a)), argnums=wrt)
        elif name == "jacrev":
            fun = torch.func.jacrev(fun, argnums=wrt)
        elif name == "jacfwd":
            fun = torch.func.jacfwd(fun, argnums=wrt)
        elif name == "vjp":
            fun = _vjp(fun, wrt)
        elif name == "jvp":
            fun = _jvp(fun, wrt)
        elif name == "functionalize":
            fun = torch.func.functionalize(fun)
        elif name in ("vmap", "vmap_shared"):
            in_dims = (0, 0 if kind.y_batched else None, 0 if name == "vmap" else None)
            fun = vmap(fun, in_dims=in_dims, out_dims=kind.out_dims if depth == 0 else 0)
        else:
            assert name == "none", name
    return fun


def _grad_or_none(out, inputs, create_graph=False):
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return (None,) * len(inputs)
    return torch.autograd.grad(out, inputs, allow_unused=True, create_graph=create_graph)


def with_autograd(run, kind: Kind, order: int):
    """torch.autograd.grad of the sum of run's outputs, outside whatever run is."""

    def g(*args):
        args = list(args)
        leaves = [args[i].detach().requires_grad_() for i in kind.wrt]
        for i, leaf in zip(kind.wrt, leaves):
            args[i] = leaf
        out = run(*args)
        grads = _grad_or_none(total(out), leaves, create_graph=order == 2)
        if order == 2:
            grads = _grad_or_none(total(grads), leaves)
        return pytree.tree_map(torch.Tensor.detach, out), grads

    return g


# --- contexts -------------------------------------------------------------------------------

CONTEXTS = [
    "eager",
    "fx-real",
    "fx-fake",
    "fx-symbolic",
    "export-strict",
    "export-nonstrict",
    "compile-eager",
    "compile-aot_eager",
    "compile-inductor",
    "compile-inductor-dynamic",
]


class Program(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y, s):
        return self.fn(x, y, s)


def in_context(context: str, fn, trace_args):
    """fn made runnable in `context`: traced or exported on trace_args, or compiled."""
    if context == "eager":
        return fn
    if context.startswith("fx-"):
        return make_fx(fn, tracing_mode=context[3:])(*_clone(trace_args))
    if context.startswith("export-"):
        strict = context == "export-strict"
        return torch.export.export(Program(fn), _clone(trace_args), strict=strict).module()
    backend, _, dynamic = context.removeprefix("compile-").partition("-")
    # Every case's function shares its code with other cases' (the same wrappers),
    # and dynamo caches per code: a reset keeps earlier cases' guards and recompile
    # count out of this one.
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=True if dynamic else None)


# --- cases ------------------------------------------------------------------------------------

SINGLES = ["none", "grad", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "vmap", "vmap_shared"]
PAIRS = [
    "vmap.grad",
    "grad.vmap",
    "vmap_shared.grad",
    "grad.vmap_shared",
    "jacrev.vmap",
    "vmap.jacfwd",
    "vmap.jvp",
    "jvp.vmap",
    "jvp.grad",
    "grad.jvp",
    "grad.grad",
    "jvp.jvp",
    "vjp.vjp",
    "vmap.vmap",
]
OUTSIDE = ["autograd", "autograd2", "autograd.vmap", "autograd.vmap_shared", "autograd.grad"]
# Transforms added after the sample was first drawn. The sample draws its other cases
# from DRAWN alone, so that they stay the same, and gives these cases of their own.
LATER_TRANSFORMS = [
    "functionalize",
    "functionalize.grad",
    "grad.functionalize",
    "functionalize.vmap",
]
DRAWN = SINGLES + PAIRS + OUTSIDE
TRANSFORMS = DRAWN + LATER_TRANSFORMS
OPS = ["cond", "switch"]
STRATEGIES = ["auto", "select"]


@dataclasses.dataclass(frozen=True)
class Case:
    context: str
    transform: str
    kind: str
    op: str
    strategy: str

    def __str__(self):
        return "|".join(dataclasses.astuple(self))

    @property
    def names(self):
        return self.transform.split(".")

    @property
    def inner(self):
        """The transforms applied inside the context (without an outside autograd)."""
        return self.names[1:] if self.names[0].startswith("autograd") else self.names


ALL = [Case(*c) for c in itertools.product(CONTEXTS, TRANSFORMS, KINDS, OPS, STRATEGIES)]

# One case per defect of issue 26 (defect 4 is test_invalid_selector_is_refused below),
# each the shortest reproducer's combination; the sample always holds them.
KNOWN_DEFECTS = [
    "compile-eager|none|identity|cond|select",  # 1: identity output under select doubled
    "compile-eager|none|twice|switch|select",  # 1: (x, x) against (2x, 4x)
    "fx-real|grad|closure_diff|cond|auto",  # 2: zero gradient for the closed-over y
    "fx-fake|jvp|closure_diff|cond|auto",  # 2: zero tangent for y
    "fx-symbolic|grad|closure_nodiff|cond|auto",  # 2: "derivative graph closed over 1 values"
    "fx-real|grad|nested|switch|auto",  # 2: a closed-over index read by a nested switch
    "eager|grad.vmap|no_operands|cond|auto",  # 3: NaN from the untaken sqrt
    "eager|autograd.vmap|constant|cond|auto",  # 3: NaN through .backward()
    "fx-symbolic|grad|constant|cond|auto",  # 5: a constant-creating branch
    "compile-aot_eager|autograd|constant|cond|auto",  # 5: the same, compiled for training
    "fx-fake|vjp|ordinary|cond|auto",  # 6: no FuncTorchGradWrapper kernel
    "fx-fake|jvp.jvp|ordinary|cond|auto",  # 7: forward over forward, misattributed error
    "compile-aot_eager|jvp.jvp|ordinary|switch|auto",  # 7: the same, compiled
    "export-nonstrict|none|twice|cond|auto",  # 8: duplicate argument 'x'
    "compile-aot_eager|none|unbacked|cond|auto",  # 9: unbacked size not tracked
    "compile-inductor|none|unbacked|cond|auto",  # 9
    "compile-inductor-dynamic|autograd|closure_view|cond|auto",  # 10: s77 not codegen-ed
    "compile-eager|none|pytree|cond|auto",  # 11: custom pytree operands refused
    "eager|vmap|passthrough|cond|auto",  # 12: an unchanged operand comes back batched
    "compile-aot_eager|autograd|closure_diff|cond|auto",  # 13: zeros compiled, None eager
]

# One case per kind of failure this matrix found beyond issue 26's list, so that the
# sample keeps meeting each of them.
FOUND_BY_THE_MATRIX = [
    "export-strict|vmap|ordinary|cond|auto",  # BatchedTensorImpl storage; a functorch level left on
    "export-nonstrict|jvp|ordinary|cond|auto",  # TensorWrapper storage
    "export-nonstrict|vmap_shared|ordinary|cond|select",  # "mode not registered"
    "fx-fake|vmap_shared|no_operands|cond|auto",  # vmap of a branch without operands
    "fx-real|grad.vmap_shared|closure_nodiff|cond|auto",  # functorch "wrapper == nullptr"
    "compile-eager|jvp|ordinary|cond|select",  # zero tangent from select compiled
    "compile-eager|grad|ordinary|cond|select",  # select's Function lacks setup_context
    "compile-eager|vmap.grad|identity|cond|auto",  # identity's gradient under select compiled
    "eager|autograd|write|cond|select",  # a selected write breaks the backward
    "eager|grad|no_operands|cond|select",  # NaN from a closure under select, no vmap
    "fx-fake|none|unbacked|cond|select",  # guard on two branches' unbacked sizes
    "fx-fake|none|unbacked|cond|auto",  # unbacked size not tracked, make_fx alone
    "fx-fake|jacrev|unbacked|cond|auto",  # no batching rule for sym_size
    "fx-fake|grad|no_operands|cond|auto",  # wrong gradient of a closed-over input
    "compile-eager|jvp|constant|cond|auto",  # TypeError, then forward AD broken for good
    "compile-eager|none|nested|cond|select",  # data-dependent assertion in dynamo
    "compile-eager|none|write|cond|select",  # dynamo's input-mutation error
    "export-nonstrict|none|write|cond|select",  # a fake tensor among the constants
    "compile-eager|vmap_shared|write|cond|select",  # written twice, and where untaken
    "compile-aot_eager|autograd2|ordinary|cond|select",  # double backward gives None
    "compile-aot_eager|autograd2|identity|switch|select",  # the same None as torch.where by hand
    "compile-aot_eager|autograd2|closure_diff|cond|select",  # the same, closed-over y masked by hand
    "export-nonstrict|vmap|nested|cond|select",  # an inner select's own check read as a closure
    "compile-inductor|none|constant|cond|auto",  # torch.tensor(2.0) in a branch fails to lower
    "export-strict|none|identity|cond|select",  # issue 26's defect 1 through strict export
    "compile-eager|grad|identity|cond|auto",  # an identity branch's gradient, compiled
    "fx-real|autograd2|constant|cond|select",  # NaN: traced without a gradient, then differentiated
    "export-strict|autograd2|no_operands|switch|select",  # the same through strict export
    "compile-aot_eager|hessian|constant|cond|select",  # AOTAutograd traced the select's checks
    "eager|jvp.grad|number|cond|select",  # a tangent for a number's 0-d tensor
    "compile-eager|jvp.grad|number|switch|auto",  # .item() under a transform, forward AD broken
    "export-nonstrict|grad|unbacked|cond|auto",  # grad's inputs exported as fake constants
    "export-strict|grad|ordinary|cond|auto",  # the same, and a torch.func level left active
    "export-strict|grad.vmap|closure_view|cond|auto",  # the same, a vmap level inside grad's
    "export-nonstrict|jvp|ordinary|cond|select",  # select's Function under jvp: not registered
    "export-nonstrict|jvp|constant|switch|select",  # a tangentless full_like as a constant
    "compile-eager|autograd.vmap|constant|cond|select",  # NaN: dynamo's batched x needs no grad
    "compile-aot_eager|jacfwd|constant|cond|auto",  # refused under AOTAutograd, forward AD left on
    "compile-aot_eager|jacfwd|write|cond|auto",  # a refusal in AOTAutograd's trace, the same
    "compile-eager|jvp.jvp|identity|cond|auto",  # no tangent of a constant tangent, then TypeError
    "compile-eager|hessian|constant|switch|auto",  # the same through jacfwd of jacrev
    "fx-fake|vmap.grad|nested|cond|auto",  # a stand-in made in a sibling trace, refused as a buffer
    "fx-real|vmap.grad|nested|switch|auto",  # zero gradient: a sibling branch's stand-in
    "compile-inductor|autograd|write|cond|auto",  # the written value read by the backward
    "compile-inductor|autograd|passthrough|switch|auto",  # a donated gradient reused in place
    "compile-inductor|grad|identity|cond|auto",  # a graph value wrapped by the grad level
    "compile-inductor-dynamic|grad.vmap_shared|passthrough|cond|auto",  # batch size closed over
]

# Cases per context in the sample: eager and make_fx on fake tensors run fast and get
# every transform; strict export and compiling take seconds a case, Inductor the most.
SAMPLE_SIZE = {
    "eager": len(TRANSFORMS),
    "fx-real": 14,
    "fx-fake": len(TRANSFORMS),
    "fx-symbolic": 14,
    "export-strict": 6,
    "export-nonstrict": 14,
    "compile-eager": 10,
    "compile-aot_eager": 10,
    "compile-inductor": 3,
    "compile-inductor-dynamic": 2,
}


# Kinds added after the sample was first drawn: each gets its own cases per context
# from a generator of its own, so the cases drawn for the other kinds stay the same.
LATER_KINDS = ["number", "rows", "checked"]


def sample(seed: int = 26) -> list[Case]:
    """A fixed choice: the known failures, then per context SAMPLE_SIZE cases that walk
    the transforms and the kinds side by side, each in its own shuffled order, with
    the op and strategy drawn. So every context meets every kind (and, in eager and
    fx-fake, every transform), in different pairings from one context to the next."""
    rng = random.Random(seed)
    chosen = [Case(*i.split("|")) for i in KNOWN_DEFECTS + FOUND_BY_THE_MATRIX]
    first_kinds = [k for k in KINDS if k not in LATER_KINDS]
    for context in CONTEXTS:
        transforms, kinds = (
            rng.sample(DRAWN, len(DRAWN)),
            rng.sample(first_kinds, len(first_kinds)),
        )
        for i in range(SAMPLE_SIZE[context]):
            case = Case(
                context,
                transforms[i % len(transforms)],
                kinds[i % len(kinds)],
                rng.choice(OPS),
                rng.choice(STRATEGIES),
            )
            if case not in chosen:
                chosen.append(case)
    for k, kind in enumerate(LATER_KINDS):
        later = random.Random(seed + 1 + k)
        for context in CONTEXTS:
            case = Case(
                context, later.choice(DRAWN), kind, later.choice(OPS), later.choice(STRATEGIES)
            )
            if case not in chosen:
                chosen.append(case)
    for k, transform in enumerate(LATER_TRANSFORMS):
        later = random.Random(seed + 100 + k)
        for context, strategy in LATER_TRANSFORM_CONTEXTS:
            case = Case(
                context,
                transform,
                later.choice(first_kinds),
                later.choice(OPS),
                strategy or later.choice(STRATEGIES),
            )
            if case not in chosen:
                chosen.append(case)
    return chosen


# Where the sample meets each of LATER_TRANSFORMS, with the strategy where it is set.
LATER_TRANSFORM_CONTEXTS = [
    ("eager", "auto"),
    ("eager", "select"),
    ("fx-fake", None),
    ("fx-real", None),
    ("export-nonstrict", None),
    ("compile-eager", None),
]


CASES = ALL if FULL else sample()


# --- inputs -----------------------------------------------------------------------------------

LAYER_SIZES = (3, 2)  # examples of the outer vmap, then of an inner one


def _selector_value(op: str, branch: int, variant: int):
    if op == "cond":
        return branch == 0
    # switch clamps: -1 takes branch 0 and 7 takes branch 2, as 0 and 2 do.
    return {0: (0, -1), 1: (1, 1), 2: (2, 7)}[branch][variant % 2]


def make_args(kind: Kind, op: str, inner: list[str], branch_of, offset: int):
    """(x, y, s) with a leading dim per vmap in `inner`. branch_of(j) is the branch of
    the j-th selector entry; x and y values move with `offset`, so a traced program
    meets values other than those it was traced with."""
    vmaps = [n for n in inner if n.startswith("vmap")]
    sizes = LAYER_SIZES[: len(vmaps)]
    s_dims = [i for i, n in enumerate(vmaps) if n == "vmap"]  # a batched predicate
    s_shape = tuple(sizes[i] for i in s_dims)
    branches = [branch_of(j) for j in range(math.prod(s_shape))]
    s = torch.tensor([_selector_value(op, b, j + offset) for j, b in enumerate(branches)]).reshape(
        s_shape
    )
    xs = []
    for j, index in enumerate(itertools.product(*map(range, sizes))):
        s_index = sum(index[i] * math.prod(s_shape[k + 1 :]) for k, i in enumerate(s_dims))
        xs.append(kind.x(branches[s_index], j + 3 * offset))
    x = torch.stack(xs).reshape((*sizes, *kind.x_shape))
    if kind.y_batched:
        ys = [kind.y(j + offset) for j in range(math.prod(sizes))]
        y = torch.stack(ys).reshape((*sizes, *kind.y_shape))
    else:
        y = kind.y(offset)
    return x, y, s


def input_sets(kind: Kind, op: str, inner: list[str]):
    """The inputs to trace with, and the calls: between them every branch, taken by
    whole calls and, under a batched predicate, by examples side by side."""
    n = 2 if op == "cond" else 3
    if "vmap" in inner:
        trace = make_args(kind, op, inner, lambda j: j % n, 0)
        calls = [
            make_args(kind, op, inner, lambda j: (j + 1) % n, 1),
            make_args(kind, op, inner, lambda j: n - 1, 2),
        ]
    else:
        trace = make_args(kind, op, inner, lambda j: 0, 0)
        calls = [make_args(kind, op, inner, lambda j, b=b: b, b + 1) for b in range(n)]
    return trace, calls


def _clone(args):
    return tuple(a.clone() for a in args)


# --- running a case -----------------------------------------------------------------------


def build(case: Case, how: str, branch: int = 0, context: str | None = None):
    """The callable for `case` with its conditional run `how`, in its context.
    The Python-`if` reference always runs eagerly, with vmap as a loop."""
    kind = KINDS[case.kind]
    c = Conditional(case.op, how, case.strategy, branch)
    fun = functools.partial(kind.program, c)
    reference = how == "python_if"
    fn = transformed(fun, kind, case.inner, loop_map if reference else torch.vmap)
    trace, _ = input_sets(kind, case.op, case.inner)
    run = in_context("eager" if reference else (context or case.context), fn, trace)
    if case.names[0].startswith("autograd"):
        run = with_autograd(run, kind, 2 if case.names[0] == "autograd2" else 1)
    return run


@dataclasses.dataclass
class Outcome:
    results: list | None  # per call: (output, the arguments after the call)
    error: Exception | None
    broken_state: str | None  # what the run left broken in torch (repaired since)


def run_calls(make_run, calls) -> Outcome:
    """Builds the callable, then calls it on a copy of each call's arguments."""
    keys = dispatch_keys()
    gc.disable()  # no collection mid-run (see _free_stale_guards)
    try:
        run = make_run()
        results = []
        for args in calls:
            args = _clone(args)
            results.append((run(*args), args))
        error = None
    except Exception as e:
        results, error = None, e
    finally:
        gc.enable()
    _free_stale_guards(error, keys)
    return Outcome(results, error, repair_torch_state())


def _free_stale_guards(error: BaseException | None, keys) -> None:
    """Frees, now, the frames a run left behind, and puts back the dispatch keys.

    torch's ``Tensor.__repr__`` holds a ``_DisableFuncTorch`` guard in a local. A
    frame kept by an error, or left in a reference cycle, keeps the guard; when it is
    freed, the guard puts back the dispatch keys of its own time, in whatever then
    runs. Freed by a later collection, inside another case, that broke the case (a
    BatchedTensor reached fake tensors) or crashed Inductor's code."""
    for e in _chain(error) if error is not None else ():
        traceback.clear_frames(e.__traceback__)
    gc.collect()
    restore_dispatch_keys(keys)


def torch_state_problem() -> str | None:
    """What is left broken in torch's global state, if anything."""
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    if depth:
        return f"{depth} torch.func transform level(s) left active"
    if not torch.is_grad_enabled():
        return "grad mode left off"
    if torch._C._len_torch_dispatch_stack():
        return "a dispatch mode left active"
    try:
        torch.testing.assert_close(torch.func.jacfwd(torch.sin)(torch.zeros(3)), torch.eye(3))
    except Exception as error:
        return f"torch.func.jacfwd(torch.sin) then raises {_short(error)}"
    return None


def repair_torch_state() -> str | None:
    """Reports what a run left broken, then undoes it, so that one case's failure does
    not fail every later case in the process."""
    problem = torch_state_problem()
    if problem:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(0)
        while torch._C._len_torch_dispatch_stack():
            torch._C._pop_torch_dispatch_stack()
        torch.set_grad_enabled(True)
        with contextlib.suppress(RuntimeError):  # no forward-AD level was left open
            torch._C._exit_dual_level(level=0)
    return problem


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _short(error: BaseException) -> str:
    """The error's first line, and the first line of the error that caused it."""
    root = list(_chain(error))[-1]
    if root is error:
        return _first_line(error)
    return f"{_first_line(error)} [from {_first_line(root)}]"


def _leaf_pairs(actual, expected):
    a_leaves, a_spec = pytree.tree_flatten(actual, is_leaf=lambda t: t is None)
    e_leaves, e_spec = pytree.tree_flatten(expected, is_leaf=lambda t: t is None)
    assert a_spec == e_spec, f"output structure {a_spec}, expected {e_spec}"
    return zip(a_leaves, e_leaves)


def assert_same(actual, expected, numbers_as_tensors=False):
    """assert_close leaf by leaf, a NaN the expected value lacks included. A None
    gradient counts as zeros here; test_unused_gradients_agree_with_eager compares
    None with eager torchcond. ``numbers_as_tensors``: where every branch runs, a
    number the branches differ in comes back as a 0-d tensor (docs/semantics.rst),
    compared by value."""
    for i, (a, e) in enumerate(_leaf_pairs(actual, expected)):
        if a is None and e is None:
            continue
        a = torch.zeros_like(e) if a is None else a
        e = torch.zeros_like(a) if e is None else e
        if numbers_as_tensors and isinstance(a, torch.Tensor) != isinstance(e, torch.Tensor):
            a, e = torch.as_tensor(a), torch.as_tensor(e)
        torch.testing.assert_close(a, e, equal_nan=False, msg=lambda m, i=i: f"leaf {i}: {m}")


def mismatch(got: list, want: list, calls, numbers_as_tensors=False) -> str | None:
    """The first difference between two runs' results (None where `want` has no
    value for a call), or None."""
    for args, (out, after), w in zip(calls, got, want):
        if w is None:
            continue
        what = f"selector {args[2].tolist()}"
        for name, a, b in (("output", out, w[0]), ("operands after the call", after, w[1])):
            try:
                assert_same(a, b, numbers_as_tensors)
            except AssertionError as error:
                return f"{what}: {name} {error}"
            except Exception as error:  # a leaked FakeTensor or functorch wrapper
                return f"{what}: {name} cannot be compared: {_short(error)}"
    return None


def _compile_config():
    # The unbacked kind makes a size from data inside a branch (nonzero).
    return torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)


@functools.cache
def torch_limit(context: str, transform: str, kind: str, op: str) -> dict[str, str]:
    """How torch fails this case with each branch alone, a Python `if` on a constant
    (no conditional at all): "raises", "wrong" (a value other than eagerly) or
    "state" (leaves its global state broken). Empty when torch runs it."""
    case = Case(context, transform, kind, op, "auto")
    _, calls = input_sets(KINDS[kind], op, case.inner)
    limit = {}
    for k in range(2 if op == "cond" else 3):
        with _compile_config():
            here = run_calls(lambda k=k: build(case, "fixed", k), calls)
        eager = run_calls(lambda k=k: build(case, "fixed", k, context="eager"), calls)
        if here.broken_state:
            limit.setdefault("state", here.broken_state)
        if here.error is not None or eager.error is not None:
            limit.setdefault("raises", _short(here.error or eager.error))
        elif diff := mismatch(here.results, eager.results, calls):
            limit.setdefault("wrong", diff)
    return limit


def torch_wrong_by_hand(case: Case, got: list, calls) -> bool:
    """Whether torch gives the value torchcond gave, ``got``, on strategy="select"
    written by hand, and another value on that program eagerly. Then the wrong value is
    torch's, on the same program. An example is the None of a second-order gradient
    through a compiled backward (docs/compile.rst)."""
    if case.strategy != "select" or case.context == "eager":
        return False
    with _compile_config():
        here = run_calls(lambda: build(case, "by_hand"), calls)
    eager = run_calls(lambda: build(case, "by_hand", context="eager"), calls)
    if here.error is not None or eager.error is not None:
        return False
    return (
        mismatch(here.results, eager.results, calls) is not None
        and mismatch(got, here.results, calls) is None
    )


def _misattribution(case: Case, error: CondError):
    """What a torchcond error blames that this program does not do, if anything."""
    # The message alone: dynamo and AOTAutograd append the user's stack, whose
    # torch.func frames pass `randomness` around.
    text = re.split(r"\n\n(?:from user code:|While executing)", str(error))[0]
    if "autograd.Function" in text:
        return "it blames a custom autograd.Function; the program has none"
    if "random" in text:
        return "it blames random draws; the program draws none"
    if isinstance(error, BranchMutationError) and case.kind != "write":
        return "it blames a write; the program writes nothing"
    return None


def _ours_as_text(error: Exception) -> CondError | None:
    """A torchcond error that dynamo passed on as text only. torch 2.15 turns an
    exception raised under a torch.func transform it traces (the transform's own
    try/finally) into "Observed exception", keeping the original as its message."""
    for e in _chain(error):
        found = re.search(r"got (\w+)\((.*)\)", str(e), re.S)
        kind = getattr(torchcond.errors, found.group(1), None) if found else None
        if isinstance(kind, type) and issubclass(kind, CondError):
            return kind(found.group(2))
    return None


# torch.compile refuses a double backward through a compiled backward, in one of two
# words, depending on what the program saves for its backward: not only where the
# branch alone would be refused.
COMPILED_DOUBLE_BACKWARD = (
    "torch.compile with aot_autograd does not currently support double backward",
    "compiled with non-empty donated buffers which requires create_graph=False",
)


def judge_error(case: Case, error: Exception) -> str | None:
    """None when the error is an acceptable outcome, else what is wrong with it."""
    if case.context.startswith("compile-") and any(
        words in str(e) for e in _chain(error) for words in COMPILED_DOUBLE_BACKWARD
    ):
        return None
    ours = next((e for e in _chain(error) if isinstance(e, CondError)), None)
    ours = ours if ours is not None else _ours_as_text(error)
    if ours is not None:
        blame = _misattribution(case, ours)
        return f"MISATTRIBUTED torchcond error: {blame}: {_short(ours)}" if blame else None
    if torch_limit(case.context, case.transform, case.kind, case.op):
        return None  # torch cannot run it even without a conditional
    return f"TORCH ERROR where torch runs each branch: {_short(error)}"


def unused_gradients_differ(case: Case, got: list, calls) -> str | None:
    """Whether an input gets a None gradient here where eager torchcond gives a tensor.

    The documented rule (docs/autograd.rst): eagerly a conditional is a Python `if`,
    so what the taken branch did not read gets None; a traced or compiled one gives
    zeros, since its backward cannot make a gradient's presence depend on data. So
    None eagerly and zeros here is the rule; a tensor eagerly and None here is not.
    """
    eager = run_calls(lambda: build(case, "torchcond", context="eager"), calls)
    if eager.error is not None:
        return None
    for args, (out, _), (want, _) in zip(calls, got, eager.results):
        for k, (g, w) in enumerate(zip(out[1], want[1])):
            if g is None and w is not None:
                return f"selector {args[2].tolist()}: gradient {k} is None here, a tensor eagerly"
            if w is None and g is not None and bool(g.ne(0).any()):
                return f"selector {args[2].tolist()}: gradient {k} is None eagerly, nonzero here"
    return None


# Programs on which torch itself crashes the process (a segfault in generated code),
# with the select written by hand. A case of that context, transform and kind cannot
# run in the test's process. check() first runs the program in a subprocess, and
# skips the case only while torch still crashes on it.
# torch 2.11 and 2.13 (fixed in 2.14): Inductor writes a zero tangent into an
# _efficientzerotensor, which has no storage. With or without dynamic shapes.
_JVP_OF_JVP_OF_WHERE = """
import torch
torch._dynamo.config.capture_dynamic_output_shape_ops = True
def g(x, y, s):
    f = lambda x: torch.where(s, x * y, 2 * x)
    inner = lambda x: torch.func.jvp(f, (x,), (torch.ones_like(x),))
    return torch.func.jvp(inner, (x,), (torch.ones_like(x),))
compiled = torch.compile(g, fullgraph=True{dynamic})
for taken in (True, False):
    compiled(torch.tensor(0.5), torch.tensor(1.5), torch.tensor(taken))
"""
TORCH_CRASHES = {
    ("compile-inductor", "jvp.jvp", "closure_nodiff"): _JVP_OF_JVP_OF_WHERE.format(dynamic=""),
    ("compile-inductor-dynamic", "jvp.jvp", "closure_nodiff"): _JVP_OF_JVP_OF_WHERE.format(
        dynamic=", dynamic=True"
    ),
}


@functools.cache
def torch_crashes(context: str, transform: str, kind: str) -> bool:
    program = TORCH_CRASHES.get((context, transform, kind))
    if program is None:
        return False
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=600)
    return run.returncode < 0  # killed by a signal


def check(case: Case):
    if torch_crashes(case.context, case.transform, case.kind):
        pytest.skip("torch crashes the process on this program with torch.where by hand")
    _, calls = input_sets(KINDS[case.kind], case.op, case.inner)
    references = [run_calls(lambda: build(case, "python_if"), [args]) for args in calls]
    expected = [None if r.error else r.results[0] for r in references]
    with _compile_config():
        got = run_calls(lambda: build(case, "torchcond"), calls)
    limit = lambda: torch_limit(case.context, case.transform, case.kind, case.op)  # noqa: E731
    problems = []
    every_branch_runs = case.strategy == "select" or "vmap" in case.inner
    if got.error is not None:
        problems.append(judge_error(case, got.error))
    elif diff := mismatch(got.results, expected, calls, every_branch_runs):
        if "wrong" not in limit() and not torch_wrong_by_hand(case, got.results, calls):
            problems.append(f"WRONG VALUE: {diff}")
    elif case.names[0].startswith("autograd") and case.context != "eager":
        if diff := unused_gradients_differ(case, got.results, calls):
            problems.append(f"UNUSED GRADIENT differs from eager: {diff}")
    if got.broken_state and "state" not in limit():
        problems.append(f"GLOBAL STATE broken after the case: {got.broken_state}")
    problems = [p for p in problems if p]
    if problems:
        pytest.fail("\n".join(problems))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_python_if(case):
    check(case)


def test_sample_meets_every_context_transform_kind_op_and_strategy():
    for axis, values in enumerate([CONTEXTS, TRANSFORMS, list(KINDS), OPS, STRATEGIES]):
        assert {dataclasses.astuple(c)[axis] for c in CASES} == set(values)
    assert {str(c) for c in CASES} >= set(KNOWN_DEFECTS + FOUND_BY_THE_MATRIX)


# --- invalid selectors are refused in every context (issue 26, defect 4) ----------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("selector", [None, "two"], ids=["None", "two_elements"])
@pytest.mark.parametrize("context", CONTEXTS if FULL else CONTEXTS[:7])
def test_invalid_selector_is_refused(context, selector, op):
    # Made outside the traced function: dynamo 2.11 loses the attributes of a frozen
    # dataclass built inside the function it traces.
    c = Conditional(op, "torchcond")

    def fn(x, y, s):
        sel = torch.tensor([True, False]) if selector == "two" else None
        return c(sel, [lambda x: x + 1, lambda x: x + 2], (x,))

    args = (torch.tensor(1.0), torch.tensor(0.0), torch.tensor(True))
    got = run_calls(lambda: in_context(context, fn, args), [args])
    assert got.error is not None, f"returned {got.results[0][0]}"
    assert any(isinstance(e, CondArgumentError) for e in _chain(got.error)), _short(got.error)
    assert got.broken_state is None, got.broken_state


# --- vmap without a gradient: one C call where it can (csrc/batching.cpp) -------------------


# The loop that stands for vmap in the reference cannot stack these kinds' outputs (sizes
# that differ per example, numbers); the matrix judges them through check().
STACKABLE = [k for k in KINDS if k not in ("unbacked", "number")]


@pytest.mark.parametrize(
    "mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference"]
)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", STACKABLE)
def test_vmap_without_a_gradient_matches_python_if(kind, op, mode):
    # check() puts grad mode back after each run, so the runs here are made directly.
    case = Case("eager", "vmap", kind, op, "auto")
    _, calls = input_sets(KINDS[kind], op, case.inner)
    with mode():
        expected = []
        for args in calls:
            args = _clone(args)
            expected.append((build(case, "python_if")(*args), args))
        run = build(case, "torchcond")
        got = []
        for args in calls:
            args = _clone(args)
            got.append((run(*args), args))
    assert not torch_state_problem()
    assert not mismatch(got, expected, calls, True)
