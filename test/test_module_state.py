"""What a branch may change outside itself, in every mode (docs/semantics.rst).

A branch that assigns a registered buffer (``self.steps += 1``, ``self.ema = ...``)
updates it as a Python ``if`` would: only the taken branch's value lands, on every
call, eagerly, under ``make_fx``, ``torch.export`` (strict and not) and
``torch.compile`` with every backend, in inference and in training. Traced, the
assignment is a write of the new value into the buffer. What a traced program
cannot replay (Python state, a tensor attribute that is no buffer, a new parameter)
is refused with a ``BranchMutationError`` naming the attribute and the branch, and
leaves the module as it was. The reference is the eager call.
"""

from __future__ import annotations

import copy
import functools
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import BranchMutationError, cond, switch


@pytest.fixture(autouse=True)
def _no_leaked_buffer_hooks():
    """torch 2.11's non-strict export leaves its buffer assignment hook registered when
    the export fails (2.13 on removes it in a ``finally``); dynamo then meets it in every
    later buffer assignment and graph-breaks. Each test here runs without one (even
    one an earlier test file leaked) and leaves none."""
    import torch.nn.modules.module as module

    hooks = module._global_buffer_registration_hooks
    before = dict(hooks)
    hooks.clear()
    yield
    hooks.clear()
    hooks.update(before)


BACKENDS = pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
STRICTNESS = pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])


class Tracker(torch.nn.Module):
    """The issue's idioms, in the branches of a conditional."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        with torch.no_grad():  # h = x: the predicate is the sign of the input
            self.lin.weight.copy_(torch.eye(4))
            self.lin.bias.zero_()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(4))
        self.register_buffer("low", torch.zeros(4))

    def forward(self, x):
        h = self.lin(x)

        def seen(h):
            self.steps += 1
            self.ema = self.ema * 0.9 + h.detach().mean(0) * 0.1
            return h.relu() + self.ema  # reads the value just assigned

        def skipped(h):
            self.low = torch.minimum(self.low, h.detach().amin(0))
            return h * 0.5

        return cond(h.sum() > 0, seen, skipped, (h,))


def _inputs():
    torch.manual_seed(0)
    return [torch.rand(3, 4) + s for s in (1.0, -3.0, 2.0, 1.0, -1.5)]


def _check_against_eager(model, run, holder=None, training=False) -> None:
    """``run(x)`` gives the eager model's outputs, leaves ``holder`` (the model by
    default) with its buffers, and, ``training``, its parameters' gradients."""
    reference = copy.deepcopy(model)
    holder = model if holder is None else holder
    for x in _inputs():
        out, expected = run(x), reference(x)
        torch.testing.assert_close(out, expected)
        if training:
            out.square().sum().backward()
            expected.square().sum().backward()
            for (name, got), (_, want) in zip(
                model.named_parameters(), reference.named_parameters()
            ):
                torch.testing.assert_close(got.grad, want.grad, msg=name)
        for (name, got), (_, want) in zip(holder.named_buffers(), reference.named_buffers()):
            torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")


def test_eager_is_a_python_if():
    model = Tracker()
    ema = model.ema
    model(torch.ones(2, 4))
    assert model.ema is not ema  # rebound, as Python does
    assert model.steps.item() == 1 and torch.equal(model.low, torch.zeros(4))


@BACKENDS
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_compile_updates_assigned_buffers_as_eager(backend, training):
    torch._dynamo.reset()
    model = Tracker()
    buffers = dict(model.named_buffers())
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.set_grad_enabled(training), torch._dynamo.config.patch(error_on_recompile=True):
        _check_against_eager(model, compiled, training=training)
    # Traced, an assignment is a write into the buffer: its binding stays.
    assert all(model.get_buffer(name) is b for name, b in buffers.items())


@STRICTNESS
def test_export_lists_assigned_buffers_as_mutations(strict):
    model = Tracker()
    ep = torch.export.export(model, (torch.ones(3, 4),), strict=strict)
    decomposed = ep.run_decompositions()
    mutated = set(decomposed.graph_signature.buffers_to_mutate.values())
    assert mutated == {"steps", "ema", "low"}
    assert dict(model.named_buffers()).keys() == {"steps", "ema", "low"}
    assert model.steps.item() == 0  # the export wrote nothing
    for program in (ep, decomposed):
        module = program.module()
        _check_against_eager(copy.deepcopy(model), module, holder=module)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_writes_assigned_buffers(mode):
    model = Tracker()
    names = [name for name, _ in model.named_buffers()]
    weight, bias = (p.detach() for p in model.parameters())

    def run(x, weight, bias, *buffers):
        state = {"lin.weight": weight, "lin.bias": bias, **dict(zip(names, buffers))}
        return torch.func.functional_call(model, state, (x,))

    state = [b.clone() for b in model.buffers()]
    gm = make_fx(run, tracing_mode=mode)(torch.ones(3, 4), weight, bias, *state)
    # The graph writes the buffers it was given; its branches write nothing.
    written = {n.args[0].name for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default}
    assert len(written) == 3
    state = [b.clone() for b in model.buffers()]
    holder = copy.deepcopy(model)

    def traced(x):
        out = gm(x, weight, bias, *state)
        for b, value in zip(holder.buffers(), state):
            b.copy_(value)
        return out

    _check_against_eager(model, traced, holder=holder)


class Nested(torch.nn.Module):
    """A submodule's buffer assigned in a conditional nested in another's branch, and
    a switch whose branches assign different buffers."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Module()
        self.inner.register_buffer("total", torch.zeros(2))
        self.register_buffer("hits", torch.zeros(3))

    def forward(self, i, x):
        def outer(x):
            def add(x):
                self.inner.total = self.inner.total + x
                return x * 2

            return cond(x.mean() > 1, add, lambda x: x.clone(), (x,)) + 1

        def count(k):
            def branch(x):
                hits = self.hits.clone()
                hits[k] += 1
                self.hits = hits
                return x - k

            return branch

        y = cond(x.sum() > 0, outer, lambda x: x - 1, (x,))
        return switch(i, [count(0), count(1), count(2)], (y,))


def _nested_inputs():
    return [
        (torch.tensor(i), torch.tensor(v))
        for i, v in [(0, [2.0, 3.0]), (1, [0.2, 0.3]), (2, [-1.0, 0.5]), (5, [4.0, 1.0])]
    ]


@pytest.mark.parametrize("mode", ["compile", "strict", "non_strict"])
def test_nested_conditionals_and_switch(mode):
    model = Nested()
    reference = copy.deepcopy(model)
    if mode == "compile":
        torch._dynamo.reset()
        run = holder = torch.compile(model, backend="aot_eager", fullgraph=True)
        holder = model
    else:
        ep = torch.export.export(model, _nested_inputs()[0], strict=mode == "strict")
        signature = ep.run_decompositions().graph_signature
        assert set(signature.buffers_to_mutate.values()) == {"inner.total", "hits"}
        run = holder = ep.module()
    for i, x in _nested_inputs():
        torch.testing.assert_close(run(i, x), reference(i, x))
        torch.testing.assert_close(holder.inner.total, reference.inner.total)
        torch.testing.assert_close(holder.hits, reference.hits)


class ReadsAfter(torch.nn.Module):
    """A value computed with gradient assigned (or copied) to a buffer, read after the
    conditional: gradients reach the parameters through it, as eagerly."""

    def __init__(self, assign: bool):
        super().__init__()
        self.assign = assign
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        h = self.lin(x)

        def update(h):
            new = self.ema * 0.9 + h.mean(0) * 0.1
            if self.assign:
                self.ema = new
            else:
                self.ema.copy_(new)
            return h.sum()

        return cond(h.sum() > -100, update, lambda h: h.sum() * 2, (h,)) + self.ema.sum()


@pytest.mark.parametrize("assign", [True, False], ids=["assigned", "copied"])
def test_gradient_through_a_buffer_written_with_gradient(assign):
    torch.manual_seed(0)
    model = ReadsAfter(assign)
    reference = copy.deepcopy(model)
    torch._dynamo.reset()
    x = torch.randn(2, 3)
    torch.compile(model, backend="aot_eager", fullgraph=True)(x).backward()
    reference(x).backward()
    torch.testing.assert_close(model.lin.weight.grad, reference.lin.weight.grad)
    torch.testing.assert_close(model.ema, reference.ema.detach())


# --- what a branch may not change ------------------------------------------------------

LOG: list = []


class Stateful(torch.nn.Module):
    """``true_fn`` runs ``idiom``; the false branch changes nothing."""

    def __init__(self, idiom: str):
        super().__init__()
        self.idiom = idiom
        self.register_buffer("ema", torch.zeros(3))
        self.plain = torch.zeros(3)
        self.log: list = []
        self.table: dict = {}
        self.n = 0
        self.flag = False
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        def true_fn(x):
            idiom = self.idiom
            if idiom == "append":
                self.log.append(1)
            elif idiom == "setitem":
                self.table["k"] = 1
            elif idiom == "int":
                self.n += 1
            elif idiom == "global":
                LOG.append(1)
            elif idiom == "tensor attribute":
                self.plain = x * 2
            elif idiom == "new attribute":
                self.extra = x * 2
            elif idiom == "shape":
                self.ema = torch.zeros(4)
            elif idiom == "dtype":
                self.ema = self.ema.double()
            elif idiom == "None":
                self.ema = None
            elif idiom == "new buffer":
                self.register_buffer("fresh", x * 1)
            elif idiom == "flag":  # set and set back: no change
                self.flag = True
                self.flag = False
            return x + 1

        return cond(x.sum() > 0, true_fn, lambda x: x - 1, (x,))


def _tensor_found(shape, dtype="torch.float32"):
    return re.escape(f"a tensor of shape {shape}, {dtype}, on cpu")


REFUSED = {
    "append": re.escape("true_fn changes self.log (a list): every branch runs here"),
    "setitem": re.escape("true_fn changes self.table (a dict)"),
    "int": re.escape("true_fn sets self.n to int (1)"),
    "global": re.escape("true_fn changes LOG (a list)"),
    "tensor attribute": _tensor_found("(3,)")
    + re.escape(" to self.plain, which is not a registered buffer or parameter"),
    "new attribute": _tensor_found("(3,)")
    + re.escape(" to self.extra, which is not a registered buffer or parameter"),
    "shape": "true_fn assigns "
    + _tensor_found("(4,)")
    + " to the buffer self.ema, which is "
    + _tensor_found("(3,)"),
    "dtype": "true_fn assigns "
    + _tensor_found("(3,)", "torch.float64")
    + " to the buffer self.ema",
    "None": re.escape("true_fn assigns None to the buffer self.ema"),
    "new buffer": re.escape("true_fn registers a new buffer self.fresh"),
}


def _trace(mode: str, model, x):
    if mode == "compile":
        torch._dynamo.reset()
        return torch.compile(model, backend="eager", fullgraph=True)(x)
    return torch.export.export(model, (x,), strict=mode == "strict")


def _state(model) -> tuple:
    return (
        dict(model.named_buffers()),
        dict(model.named_parameters()),
        {k: v for k, v in vars(model).items() if not k.startswith("_")},
        list(model.log),
        dict(model.table),
        list(LOG),
    )


def _same_state(model, before) -> None:
    buffers, parameters, attributes, log, table, global_log = before
    assert dict(model.named_buffers()) == buffers  # same objects, none added
    assert all(torch.equal(b, torch.zeros(3)) for b in buffers.values())
    assert dict(model.named_parameters()) == parameters
    assert {k: v for k, v in vars(model).items() if not k.startswith("_")} == attributes
    assert (model.log, model.table, LOG) == (log, table, global_log)


@pytest.mark.parametrize("mode", ["compile", "strict", "non_strict"])
@pytest.mark.parametrize("idiom", list(REFUSED))
def test_what_no_program_replays_is_refused_by_name(mode, idiom):
    model = Stateful(idiom)
    model(-torch.ones(3))  # eagerly a Python if: the false branch changes nothing
    before = _state(model)
    with pytest.raises(BranchMutationError, match=REFUSED[idiom]) as caught:
        _trace(mode, model, torch.ones(3))
    assert "captured completely" not in str(caught.value)
    _same_state(model, before)


@pytest.mark.parametrize("mode", ["compile", "strict", "non_strict"])
def test_an_attribute_set_back_is_no_change(mode):
    model = Stateful("flag")
    _trace(mode, model, torch.ones(3))
    assert model.flag is False


def test_python_state_a_branch_closes_over_is_refused_under_make_fx():
    calls: list = []

    def f(x):
        def t(x):
            calls.append("t")
            return x + 1

        return cond(x.sum() > 0, t, lambda x: x - 1, (x,))

    with pytest.raises(BranchMutationError, match=re.escape("true_fn changes calls (a list)")):
        make_fx(f, tracing_mode="fake")(torch.ones(3))
    assert calls == []
    f(torch.ones(3))  # eagerly a Python if
    assert calls == ["t"]


def test_a_branch_may_not_assign_a_parameter():
    model = Stateful("")

    def assign_parameter(x):
        model.w = torch.nn.Parameter(x.clone())
        return x + 1

    def f(x):
        return cond(x.sum() > 0, assign_parameter, lambda x: x - 1, (x,))

    w = model.w
    with pytest.raises(
        BranchMutationError,
        match=re.escape("true_fn assigns the parameter model.w"),
    ):
        make_fx(f, tracing_mode="fake")(torch.ones(3))
    assert model.w is w


def test_select_strategy_refuses_an_assigned_buffer():
    class Select(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(3))

        def forward(self, x):
            def t(x):
                self.ema = self.ema + x
                return x + 1

            return cond(x.sum() > 0, t, lambda x: x - 1, (x,), strategy="select")

    model = Select()
    ema = model.ema
    match = re.escape("true_fn assigns the buffer self.ema in a branch that runs whether or")
    for run in (model, torch.compile(model, backend="eager", fullgraph=True)):
        torch._dynamo.reset()
        with pytest.raises(BranchMutationError, match=match):
            run(torch.ones(3))
        assert model.ema is ema and torch.equal(ema, torch.zeros(3))


def test_vmap_with_a_per_example_predicate_refuses_an_assigned_buffer():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            def t(x):
                self.seen = self.seen + 1
                return x + 1

            return cond(x.sum() > 0, t, lambda x: x - 1, (x,))

    model = Counter()
    seen = model.seen
    with pytest.raises(BranchMutationError, match=re.escape("or vmap with a per-example")):
        torch.vmap(model)(torch.tensor([[1.0, 2.0], [-1.0, -2.0]]))
    assert model.seen is seen and seen.item() == 0


def test_a_real_tensor_a_fake_trace_cannot_write_is_left_as_it_was():
    steps = torch.zeros((), dtype=torch.long)

    def f(x):
        def t(x):
            steps.add_(1)
            return x + 1

        return cond(x.sum() > 0, t, lambda x: x - 1, (x,))

    with pytest.raises(BranchMutationError, match="a real tensor in a trace on fake tensors"):
        make_fx(f, tracing_mode="fake")(torch.ones(3))
    assert steps.item() == 0


# --- what a branch reaches, found anew on every call -----------------------------------


class Logger(torch.nn.Module):
    """Appends to its own ``log`` when ``active``."""

    def __init__(self, active: bool = False):
        super().__init__()
        self.active = active
        self.log: list = []

    def note(self) -> None:
        if self.active:
            self.log.append(1)


GLOBAL_LOGGER = Logger()

CHANGED_BETWEEN_CALLS = {
    "closure": "true_fn changes target.log (a list)",
    "global": "true_fn changes GLOBAL_LOGGER.log (a list)",
    "submodule": "true_fn changes holder.sub.log (a list)",
    "attribute": "true_fn changes holder.log (a list)",
    # What a branch reaches is kept between calls while nothing it was found from
    # changes (state._Found): a default rebound, a keyword default replaced in place,
    # a global the code names defined only after the first call.
    "default": "true_fn changes a default argument.log (a list)",
    "keyword default": "true_fn changes a default argument.log (a list)",
    "late global": "true_fn changes LATE_LOGGER.log (a list)",
}


DELETED = [1.0]


@pytest.mark.parametrize("strategy", ["select", "trace"])
@pytest.mark.parametrize("what", ["global", "closure"])
def test_a_variable_deleted_by_a_branch_is_refused_and_put_back(what, strategy):
    """A branch that deletes a global it names, or a variable it closes over, is refused
    by name, and the variable is there again afterwards."""
    held = [2.0]

    def true_fn(x):
        nonlocal held
        global DELETED
        if what == "global":
            y = x + DELETED[0]
            del DELETED
        else:
            y = x + held[0]
            del held
        return y

    def call(x):
        how = "select" if strategy == "select" else "auto"
        return cond(x.sum() > 0, true_fn, lambda x: x - 1, (x,), strategy=how)

    x = torch.ones(2)
    name = "DELETED" if what == "global" else "held"
    with pytest.raises(BranchMutationError, match=f"true_fn deletes {name}: "):
        call(x) if strategy == "select" else make_fx(call)(x)
    assert DELETED == [1.0] and held == [2.0]


@pytest.mark.parametrize("how", ["select", "vmap"])
@pytest.mark.parametrize("change", list(CHANGED_BETWEEN_CALLS))
def test_state_a_branch_reaches_is_found_anew_on_every_call(change, how, monkeypatch):
    """A call whose branches change nothing, then, between calls, a variable rebound,
    a submodule or an attribute added: the next call's change to the new state is
    refused and put back, as on a first call. Nothing the first call found about
    what the branch reaches may hide it."""
    noisy = Logger(active=True)
    holder = torch.nn.Module()
    target = Logger()
    monkeypatch.setitem(globals(), "GLOBAL_LOGGER", Logger())

    def true_fn(x, logger=target, *, klog=target):
        if change == "closure":
            target.note()
        elif change == "global":
            GLOBAL_LOGGER.note()
        elif change == "submodule":
            for child in holder.children():
                child.note()
        elif change == "default":
            logger.note()
        elif change == "keyword default":
            klog.note()
        elif change == "late global":
            if "LATE_LOGGER" in globals():
                LATE_LOGGER.note()  # noqa: F821 (defined between the calls)
        elif hasattr(holder, "log"):
            holder.log.append(1)
        return x + 1

    def call(x):
        if how == "select":
            return cond(torch.tensor(True), true_fn, lambda x: x - 1, (x,), strategy="select")
        preds = torch.tensor([True, False])
        return torch.vmap(lambda p, x: cond(p, true_fn, lambda x: x - 1, (x,)))(preds, x)

    x = torch.ones(2, 3)
    call(x)  # changes nothing
    if change == "closure":
        target = noisy
    elif change == "global":
        monkeypatch.setitem(globals(), "GLOBAL_LOGGER", noisy)
    elif change == "submodule":
        holder.sub = noisy
    elif change == "default":
        true_fn.__defaults__ = (noisy,)
    elif change == "keyword default":
        true_fn.__kwdefaults__["klog"] = noisy
    elif change == "late global":
        monkeypatch.setitem(globals(), "LATE_LOGGER", noisy)
    else:
        holder.log = []
    with pytest.raises(BranchMutationError, match=re.escape(CHANGED_BETWEEN_CALLS[change])):
        call(x)
    assert noisy.log == [] and getattr(holder, "log", []) == []


def test_what_a_branch_reaches_is_found_again_only_after_a_change(monkeypatch):
    """While nothing a branch was found to reach changes, the next call reuses what
    was found; a change between calls (an attribute set) makes it find again, and a
    call that changed something finds again too (names are noted: a note holding a
    branch would keep it from being kept, state._found)."""
    from torchcond._src import state

    found = []
    reachable = state._reachable
    monkeypatch.setattr(
        state, "_reachable", lambda fn, probes: found.append(fn.__name__) or reachable(fn, probes)
    )
    model = Logger()

    def true_fn(x):
        model.note()
        return x + 1

    def false_fn(x):
        return x - 1

    def call():
        return cond(torch.tensor(True), true_fn, false_fn, (torch.ones(2),), strategy="select")

    for _ in range(3):
        call()
    assert found == ["true_fn", "false_fn"]
    model.flag = 1
    call()
    assert found == ["true_fn", "false_fn", "true_fn"]
    model.active = True
    with pytest.raises(BranchMutationError, match=re.escape("true_fn changes model.log")):
        call()
    assert model.log == []
    with pytest.raises(BranchMutationError, match=re.escape("true_fn changes model.log")):
        call()
    assert found == ["true_fn", "false_fn", "true_fn", "true_fn", "true_fn"]


def test_what_a_branch_reaches_is_not_kept_alive_by_the_watch():
    """What is kept about a branch between calls lives as long as the branch, and
    never holds it: dropping the branch and its module frees both, without the cycle
    collector."""
    import gc
    import weakref

    def branch_and_module():
        model = Logger()

        def true_fn(x):
            model.note()
            return x + 1

        cond(torch.tensor(True), true_fn, torch.neg, (torch.ones(2),), strategy="select")
        return weakref.ref(model), weakref.ref(true_fn)

    gc.disable()
    try:
        assert [r() for r in branch_and_module()] == [None, None]
    finally:
        gc.enable()


def test_what_is_kept_about_a_branch_is_not_stuck_on_it():
    """The record of what a branch reaches is kept beside the function, not on it:
    the function gains no attribute (vars(fn), functools.wraps, pickling see none)."""
    model = Logger()

    def true_fn(x):
        model.note()
        return x + 1

    def false_fn(x):
        return x - 1

    for _ in range(2):
        cond(torch.tensor(True), true_fn, false_fn, (torch.ones(2),), strategy="select")
    assert vars(true_fn) == {} and vars(false_fn) == {}


def test_a_branch_that_reaches_itself_is_watched_and_freed():
    """A branch reaching itself (recursion through a cell, or through a partial) is
    watched on every call, and its record does not keep it alive."""
    import gc
    import weakref

    def branch_and_module(through_partial):
        model = Logger()

        def true_fn(x, depth=0):
            model.note()
            return x + 1 if depth else again(x, depth=1) - 1

        again = functools.partial(true_fn) if through_partial else true_fn
        for _ in range(2):
            cond(torch.tensor(True), true_fn, torch.neg, (torch.ones(2),), strategy="select")
        model.active = True
        with pytest.raises(BranchMutationError, match=re.escape("true_fn changes model.log")):
            cond(torch.tensor(True), true_fn, torch.neg, (torch.ones(2),), strategy="select")
        return weakref.ref(model), weakref.ref(true_fn)

    for through_partial in (False, True):
        refs = branch_and_module(through_partial)
        gc.collect()  # true_fn holds itself (a cycle): only the collector frees it
        assert [r() for r in refs] == [None, None]


# --- torch.cond on the same idioms ------------------------------------------------------


class TorchCond(torch.nn.Module):
    def __init__(self, idiom: str):
        super().__init__()
        self.idiom = idiom
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(3))
        self.log: list = []

    def forward(self, x):
        def true_fn(x):
            if self.idiom == "augmented assignment":
                self.steps += 1
            elif self.idiom == "rebinding":
                self.ema = self.ema * 0.9 + x * 0.1
            else:
                self.log.append(1)
            return x + 1

        return torch.cond(x.sum() > 0, true_fn, lambda x: x - 1, (x,))


@pytest.mark.parametrize("mode", ["compile", "strict", "non_strict"])
@pytest.mark.parametrize("idiom", ["augmented assignment", "rebinding", "append"])
def test_torch_cond_refuses_the_same_idioms(idiom, mode):
    """torch.cond fails on each idiom (checked on torch 2.11, 2.13, 2.14 and 2.15) with
    dynamo's generic error ("Unsafe side effect" under torch.compile); torchcond
    traces the first two and names the third."""
    model = TorchCond(idiom)
    with pytest.raises(torch._dynamo.exc.UncapturedHigherOrderOpError) as caught:
        _trace(mode, model, torch.ones(3))
    if mode == "compile":
        assert "side effect" in str(caught.value)
    assert model.steps.item() == 0 and model.log == []
