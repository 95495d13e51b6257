"""What a branch may assume while it is traced: its predicate, and its own checks.

torch's ShapeEnv holds one set of facts for the whole program. A branch runs only when
its predicate holds. So while one branch is traced, ``assuming`` answers the ShapeEnv's
questions from that branch's facts first: the predicate, and each check the branch made
so far. A check of the user's that these facts do not settle (``torch._check``, an
``assert``, ``aten._assert_scalar``) becomes a check of this branch alone. ``assuming``
records it, and ``insert_checks`` puts it in the branch's graph as
``aten._assert_scalar``. It never becomes a guard or a range of the whole program.
Checks inside operators stay guards, as outside a branch.

A Python ``if`` on sizes that the facts do not settle asks the ShapeEnv as usual, when
the example input satisfies the branch's facts. When it does not (the example takes
another branch), the branch is traced for the value nearest the example that the facts
allow, and a check that the value holds joins the branch's checks.

Export traces a size as at least 2 even when the program admits 0 and 1. A branch's
facts start from ranges that admit 0 and 1 again, so that a branch taken only for such
sizes is traced for them; ``Facts.specialized`` gives it inputs of the size its facts fix.

Checked on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0. For one branch's trace,
``assuming`` replaces three ShapeEnv methods on the instance (``evaluate_expr``,
``_maybe_evaluate_static``, ``guard_or_defer_runtime_assert``) and puts them back after.
It reads the frames of ``SymNode.expect_true`` and ``torch._check_with`` to tell a
check from a question, and the user's frame to tell an ``assert`` from an ``if``.
"""

from __future__ import annotations

import contextlib
import dis
import operator
import os
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

import sympy
import torch
import torch.fx
from sympy.logic.boolalg import Boolean
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.sym_node import SymNode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.reference import PythonReferenceAnalysis
from torch.utils._sympy.solve import try_solve
from torch.utils._sympy.symbol import SymT, symbol_is_type
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

_REPLACED = ("evaluate_expr", "_maybe_evaluate_static", "guard_or_defer_runtime_assert")
_EXPECT_TRUE = SymNode.expect_true.__code__
_CHECK_WITH = torch._check_with.__code__
_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCHCOND_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fact_of(value) -> sympy.Basic | None:
    """Return the sympy expression of a SymBool or SymInt, or None for anything else."""
    if isinstance(value, (torch.SymBool, torch.SymInt)):
        return value.node.expr
    return None


class Facts:
    """One branch's facts and checks, answering its ShapeEnv's questions while it is traced.

    ``checks`` holds ``(expression, message)`` for each check this branch made that its
    facts did not settle, in order."""

    def __init__(self, env: ShapeEnv, facts: Sequence[sympy.Basic], label: str, outer):
        self.env = env
        self.label = label
        self.checks: list[tuple[sympy.Basic, str]] = []
        self._facts: list[sympy.Basic] = list(outer._facts) if outer else []
        self._subst: dict = dict(outer._subst) if outer else {}
        self._ranges: dict = dict(outer._ranges) if outer else {}
        self._agree = outer._agree if outer else True
        self._asked = {name: getattr(env, name) for name in _REPLACED}
        for fact in facts:
            self._add(fact)

    # --- what the branch knows ---------------------------------------------------

    def _simplified(self, expr):
        expr = self.env.simplify(expr) if isinstance(expr, sympy.Basic) else sympy.sympify(expr)
        return expr.xreplace(self._subst) if self._subst else expr

    def _hints(self) -> dict:
        return getattr(self.env, "backed_var_to_val", None) or self.env.var_to_val

    def _range(self, s) -> ValueRanges:
        if s in self._ranges:
            return self._ranges[s]
        base = self.env.var_to_range.get(s, ValueRanges.unknown_int())
        if symbol_is_type(s, SymT.SIZE) and base.lower == 2:
            # Export traces sizes as at least 2; the program may still get 0 or 1.
            base = ValueRanges(0, base.upper)
        return base

    def _add(self, fact) -> None:
        if not _is_size_test(fact):
            # A size test stays as given: sympy would read it against the trace's ranges.
            fact = self._simplified(fact)
            if fact in (sympy.true, sympy.false):
                return
        self._facts.append(fact)
        hints = self._hints()
        if fact.free_symbols <= hints.keys():
            self._agree = self._agree and bool(fact.xreplace(hints))
        if _is_size_test(fact):
            self._narrow(fact.lhs, type(fact), fact.rhs)
        elif len(fact.free_symbols) == 1:
            (s,) = fact.free_symbols
            solved = try_solve(fact, s)
            if solved is not None and solved[1].is_number:
                self._narrow(s, type(solved[0]), solved[1])

    def _narrow(self, s, relation, value) -> None:
        """Narrow the range of ``s`` to where ``s relation value`` holds."""
        narrowed = _range_of(relation, value)
        if narrowed is None:
            return
        old = self._range(s)
        lower, upper = max(old.lower, narrowed.lower), min(old.upper, narrowed.upper)
        if lower > upper:
            return  # the facts contradict each other: this branch never runs
        self._ranges[s] = ValueRanges(lower, upper)
        if lower == upper:
            self._subst[s] = sympy.Integer(lower)

    def decide(self, expr):
        """Return what the facts say ``expr`` is, or None where they do not settle it."""
        try:
            e = self._simplified(expr)
        except (TypeError, ValueError):
            return None
        if e in (sympy.true, sympy.false) or getattr(e, "is_number", False):
            return e
        if e in self._facts:
            return sympy.true
        if any(e == _negated(f) for f in self._facts):
            return sympy.false
        try:
            r = bound_sympy(e, {s: self._range(s) for s in e.free_symbols})
        except Exception:  # a function the range analysis does not know
            return None
        if r.is_singleton() and (r.lower in (sympy.true, sympy.false) or r.lower.is_number):
            return r.lower
        return None

    def specialized(self, args: tuple) -> tuple:
        """``args`` with each size that the facts fix made that number.

        A branch taken only for 0 rows is then traced on 0 rows: a size symbol reads as
        positive while tracing, so ``x.shape[0] == 0`` could not hold on it."""
        if not self._subst:
            return args
        return tuple(self._specialized(a) for a in args)

    def _specialized(self, t):
        if not isinstance(t, FakeTensor) or type(t) is not FakeTensor:
            return t
        sizes = [self._fixed(d) for d in t.shape]
        strides = [self._fixed(d) for d in t.stride()]
        if list(sizes) == list(t.shape) and list(strides) == list(t.stride()):
            return t
        with _disable_current_modes(), t.fake_mode:
            out = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
        return out.requires_grad_(t.requires_grad)

    def _fixed(self, d):
        if not isinstance(d, torch.SymInt):
            return d
        value = d.node.expr.xreplace(self._subst)
        return int(value) if value.is_number else d

    # --- the three ShapeEnv methods, for this branch -------------------------------

    def evaluate_expr(
        self,
        orig_expr,
        hint=None,
        fx_node=None,
        size_oblivious=False,
        fallback_value=None,
        *,
        forcing_spec=False,
    ):
        decided = self.decide(orig_expr)
        if decided is not None:
            return decided
        message = _asked_to_check() if isinstance(orig_expr, Boolean) else None
        if message is not None:
            self._check(orig_expr, message)
            return sympy.true
        if self._agree or fallback_value is not None or not _asked_by_user():
            return self._asked["evaluate_expr"](
                orig_expr, hint, fx_node, size_oblivious, fallback_value, forcing_spec=forcing_spec
            )
        return self._traced_for(orig_expr)

    def _maybe_evaluate_static(self, expr, *, unbacked_only=False, compute_hint=False, **kwargs):
        if not (
            unbacked_only or compute_hint or kwargs.get("axioms") or kwargs.get("var_to_range")
        ):
            decided = self.decide(expr)
            if decided is not None:
                return decided
        return self._asked["_maybe_evaluate_static"](
            expr, unbacked_only=unbacked_only, compute_hint=compute_hint, **kwargs
        )

    def guard_or_defer_runtime_assert(self, orig_expr, msg, fx_node=None):
        decided = self.decide(orig_expr)
        if decided is sympy.true:
            return True
        message = _asked_to_check()
        if message is None:
            return self._asked["guard_or_defer_runtime_assert"](orig_expr, msg, fx_node)
        self._check(orig_expr, message)
        return True

    # --- checks ------------------------------------------------------------------

    def _check(self, expr, message: str | None = None) -> None:
        expr = self.env.simplify(expr)
        message = message or (
            f"{self.label}: a check in this branch failed: expected {expr} to be true"
        )
        self.checks.append((expr, message))
        self._add(expr)

    def _traced_for(self, expr):
        """Trace the branch for the value of ``expr`` nearest the example's that the
        facts allow, and check at run time that the value holds."""
        hints = self._hints()
        point = {}
        for s in self._simplified(expr).free_symbols:
            r = self._range(s)
            if s not in hints:
                raise RuntimeError(
                    f"{self.label}: the branch depends on {expr}, which its predicate does "
                    "not settle, and the example input takes another branch; use "
                    "torch._check to state what the branch needs"
                )
            point[s] = min(max(sympy.Integer(hints[s]), r.lower), r.upper)
        value = self._simplified(expr).xreplace(point)
        if not (value in (sympy.true, sympy.false) or value.is_number):
            raise RuntimeError(f"{self.label}: cannot trace {expr} for this branch")
        held = (
            expr
            if value is sympy.true
            else sympy.Not(expr)
            if value is sympy.false
            else sympy.Eq(expr, value)
        )
        self._check(
            held,
            f"{self.label} was traced for {held}, as the example input takes another "
            "branch; it does not hold for this input",
        )
        return value


def _is_size_test(fact) -> bool:
    return (
        isinstance(fact, sympy.core.relational.Relational)
        and fact.lhs.is_Symbol
        and fact.rhs.is_number
    )


def _negated(fact):
    try:
        return sympy.Not(fact)
    except TypeError:
        return None


def _range_of(relation, value) -> ValueRanges | None:
    """The integers ``s`` for which ``s relation value`` holds, or None for ``!=``."""
    if relation is sympy.Eq:
        return ValueRanges(value, value) if value.is_integer else None
    if relation is sympy.Le:
        return ValueRanges(-sympy.oo, sympy.floor(value))
    if relation is sympy.Lt:
        return ValueRanges(-sympy.oo, sympy.ceiling(value) - 1)
    if relation is sympy.Ge:
        return ValueRanges(sympy.ceiling(value), sympy.oo)
    if relation is sympy.Gt:
        return ValueRanges(sympy.floor(value) + 1, sympy.oo)
    return None


def _asked_to_check() -> str | None:
    """If the ShapeEnv is evaluating a check that the user wrote, return its message
    (``""`` if it has none); else None.

    The user's checks are ``torch._check`` (and ``_check_is_size``) called from user
    code or from a graph dynamo made of it, an ``assert`` in user code (dynamo's too),
    and ``aten._assert_scalar``. Checks inside operators stay guards: compile
    specializes on them (``mm``'s equal inner sizes, say), as it does outside a branch.
    """
    above: FrameType | None = sys._getframe(2)
    for _ in range(6):
        if above is None:
            break
        if above.f_code is _EXPECT_TRUE:
            return _check_of(above)
        above = above.f_back
    asking = _asking_frame()
    return _assert_message(asking) if asking is not None and asking is _user_frame() else None


_DYNAMO_DIR = os.path.join(_TORCH_DIR, "_dynamo")


def _check_of(expect_true_frame) -> str | None:
    """The message of the user's check that ``SymNode.expect_true`` evaluates, or None
    for a check inside an operator."""
    if str(expect_true_frame.f_locals.get("file", "")).endswith("TensorCompare.cpp"):
        return ""  # aten._assert_scalar: a check in a graph
    frame, message = expect_true_frame.f_back, None
    while frame is not None and frame.f_code.co_filename in _SYMBOLIC_FILES:
        if frame.f_code is _CHECK_WITH:
            message = _message_of(frame)
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_code.co_filename
    if name.startswith(_DYNAMO_DIR) or not name.startswith((_TORCH_DIR, _TORCHCOND_DIR)):
        return message or ""
    return None


def _message_of(check_with_frame) -> str | None:
    message = check_with_frame.f_locals.get("message")
    if message is None:
        return None
    try:
        return str(message() if callable(message) else message)
    except Exception:
        return None


_SYMBOLIC_FILES = (
    os.path.join(_TORCH_DIR, "fx", "experimental", "symbolic_shapes.py"),
    os.path.join(_TORCH_DIR, "fx", "experimental", "sym_node.py"),
    os.path.join(_TORCH_DIR, "__init__.py"),
    os.path.abspath(__file__),
)


def _asking_frame():
    """The frame that asked the ShapeEnv: the first outside the symbolic-shape code."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _SYMBOLIC_FILES:
        frame = frame.f_back
    return frame


def _asked_by_user() -> bool:
    """Whether the question comes straight from user code (``if x.shape[0] == 1``), or
    from dynamo tracing it, not from inside an operator."""
    frame = _asking_frame()
    if frame is None:
        return False
    return frame.f_code.co_filename.startswith(_DYNAMO_DIR) or frame is _user_frame()


def _user_frame():
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_TORCHCOND_DIR) or "sympy" in name):
            return frame
        frame = frame.f_back
    return None


def _assert_message(frame) -> str | None:
    """If ``frame`` is evaluating the condition of an ``assert`` statement, return its
    message: the given string constant, or ``""``. Otherwise None."""
    if frame is None:
        return None
    after = [i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti][:4]
    for k, inst in enumerate(after):
        if inst.opname == "LOAD_ASSERTION_ERROR":
            nxt = after[k + 1] if k + 1 < len(after) else None
            if nxt is not None and nxt.opname == "LOAD_CONST" and isinstance(nxt.argval, str):
                return nxt.argval
            return ""
        if not inst.opname.startswith(("POP_JUMP", "TO_BOOL", "CACHE")):
            return None
    return None


@contextlib.contextmanager
def assuming(
    env: ShapeEnv | None, facts: Sequence[sympy.Basic], label: str
) -> Iterator[Facts | _NoFacts]:
    """Trace one branch under ``facts``. Yields the ``Facts``, whose ``checks`` the
    branch made and whose ``specialized`` gives it its inputs. Without a ShapeEnv (no
    symbolic sizes to reason about) it yields one that knows nothing."""
    if env is None:
        yield _NoFacts()
        return
    outer = getattr(env.__dict__.get("evaluate_expr"), "facts", None)
    scope = Facts(env, facts, label, outer if isinstance(outer, Facts) else None)
    saved = {name: env.__dict__.get(name) for name in _REPLACED}
    for name in _REPLACED:
        setattr(env, name, _answering(getattr(scope, name), getattr(env, name)))
    try:
        yield scope
    finally:
        for name, value in saved.items():
            if value is None:
                del env.__dict__[name]
            else:
                env.__dict__[name] = value


class _NoFacts:
    """The facts of a branch traced without symbolic sizes: none."""

    checks: tuple = ()

    def specialized(self, args: tuple) -> tuple:
        return args


def _answering(method, asked):
    """``method`` in place of the ShapeEnv's ``asked``. It keeps ``asked``'s
    ``cache_clear``, which torch calls on some of these methods."""

    def answer(*args, **kwargs):
        return method(*args, **kwargs)

    answer.facts = method.__self__
    answer.cache_clear = getattr(asked, "cache_clear", lambda: None)
    return answer


# --- checks into graphs ----------------------------------------------------------


def _value(node: torch.fx.Node):
    return node.meta.get("val", node.meta.get("example_value"))


def insert_checks(gm, checks: Sequence[tuple[sympy.Basic, str]], label: str) -> None:
    """Put each ``(expression, message)`` check into ``gm`` as ``aten._assert_scalar``,
    where its sizes are known. A check the graph already makes is not repeated."""
    if not checks:
        return
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    where: dict = {}  # symbol -> (node that defines it, how to read it)
    made = set()
    for node in graph.nodes:
        value = _value(node)
        if isinstance(value, torch.Tensor):
            for i, d in enumerate(value.shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    where.setdefault(d.node.expr, (node, i, d))
        elif isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            where.setdefault(value.node.expr, (node, None, value))
        if node.target is torch.ops.aten._assert_scalar.default:
            cond = node.args[0]
            made.add(fact_of(_value(cond)) if isinstance(cond, torch.fx.Node) else cond)
    order = {node: i for i, node in enumerate(graph.nodes)}
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1:] or [None]
    for expr, message in checks:
        if expr in made:
            continue
        missing = expr.free_symbols - where.keys()
        if missing:
            raise RuntimeError(
                f"{label}: cannot check {expr} in the branch's graph: "
                f"{', '.join(map(str, sorted(missing, key=str)))} is not a size of its inputs"
            )
        anchor = max(
            (where[s][0] for s in expr.free_symbols),
            key=lambda node: order[node],
            default=last_input[0],
        )
        before = anchor.next if anchor is not None else next(iter(graph.nodes))
        with graph.inserting_before(before):
            cond = _reified(graph, expr, where)
            graph.call_function(torch.ops.aten._assert_scalar.default, (cond, message))
        made.add(expr)
    graph.lint()
    if isinstance(gm, torch.fx.GraphModule):
        gm.recompile()


def _reified(graph, expr, where) -> torch.fx.Node | bool:
    """Add nodes that compute ``expr`` from the graph's sizes; return the last. Each
    new node holds its value in its meta, under the key the graph's nodes use."""
    before = set(graph.nodes)
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    env = {}
    for s in expr.free_symbols:
        node, dim, _ = where[s]
        if dim is not None:
            node = graph.call_function(torch.ops.aten.sym_size.int, (node, dim))
        env[s] = torch.fx.Proxy(node, tracer)
    result = sympy_interp(PythonReferenceAnalysis, env, expr)
    if not isinstance(result, torch.fx.Proxy):
        return bool(result)  # the check is settled already
    key = "example_value" if any("example_value" in n.meta for n in before) else "val"
    for node in graph.nodes:
        if node not in before:
            args = torch.fx.node.map_arg(node.args, _value)
            node.meta[key] = node.target(*args)
    return result.node


# --- what each branch of a conditional assumes -----------------------------------


def cond_facts(pred, node: torch.fx.Node | None = None) -> list[list]:
    """What cond's two branches may assume: ``pred``, and ``not pred``.

    A size test can be constant to sympy while the program still takes both branches:
    export traces sizes as positive, so ``x.shape[0] > 0`` reads as true. ``node``, the
    graph node that computed ``pred``, then gives the test itself."""
    if isinstance(pred, (torch.SymInt, torch.SymFloat)):
        pred = pred != 0
    e = fact_of(pred)
    if e is None:
        return [[], []]
    if e.free_symbols:
        return [[e], [sympy.Not(e)]]
    test = _size_test(node if node is not None else _session_node(pred))
    if test is None:
        return [[], []]
    relation, s, c = test
    return [[relation(s, c, evaluate=False)], [_NEGATED[relation](s, c, evaluate=False)]]


def switch_facts(index, n: int, node: torch.fx.Node | None = None) -> list[list]:
    """What switch's ``n`` branches may assume: branch k, that the clamped index is k."""
    e = fact_of(index)
    if e is None or not e.free_symbols or n == 1:
        return [[] for _ in range(n)]
    e = _unclamped(e)
    middle = [[sympy.Eq(e, k)] for k in range(1, n - 1)]
    return [[sympy.Le(e, 0)], *middle, [sympy.Ge(e, n - 1)]]


_RELATIONS = {
    operator.gt: sympy.Gt,
    operator.ge: sympy.Ge,
    operator.lt: sympy.Lt,
    operator.le: sympy.Le,
    operator.eq: sympy.Eq,
    operator.ne: sympy.Ne,
}
_NEGATED = {
    sympy.Gt: sympy.Le,
    sympy.Ge: sympy.Lt,
    sympy.Lt: sympy.Ge,
    sympy.Le: sympy.Gt,
    sympy.Eq: sympy.Ne,
    sympy.Ne: sympy.Eq,
}
_FLIPPED = {sympy.Gt: sympy.Lt, sympy.Ge: sympy.Le, sympy.Lt: sympy.Gt, sympy.Le: sympy.Ge}


def _size_test(node) -> tuple | None:
    """``(relation, size_symbol, int)`` for a node that compares one size with an int
    (``x.shape[0] > 0``), or None."""
    if not isinstance(node, torch.fx.Node) or node.target not in _RELATIONS:
        return None
    relation = _RELATIONS[node.target]
    a, b = node.args[:2]
    if isinstance(a, int) and isinstance(b, torch.fx.Node):
        a, b = b, a
        relation = _FLIPPED.get(relation, relation)
    value = _value(a) if isinstance(a, torch.fx.Node) else None
    if not (isinstance(value, torch.SymInt) and value.node.expr.is_Symbol and isinstance(b, int)):
        return None
    return relation, value.node.expr, sympy.Integer(b)


def _session_node(selector) -> torch.fx.Node | None:
    """The node of the current make_fx session's graph that computed ``selector``."""
    from torch.fx.experimental import proxy_tensor

    session = proxy_tensor._CURRENT_MAKE_FX_TRACER
    tracer = getattr(session, "fx_tracer", None)
    if tracer is None:
        return None
    try:
        proxy = tracer.unwrap_proxy(selector)
    except Exception:  # not made in this session
        return None
    return getattr(proxy, "node", None)


def _unclamped(e):
    """``e`` without the clamp to ``[0, n - 1]`` that switch puts around an index."""
    while type(e).__name__ in ("Min", "Max") and len(e.args) == 2:
        inner = [a for a in e.args if not a.is_number]
        if len(inner) != 1:
            break
        e = inner[0]
    return e
