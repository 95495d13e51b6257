"""Each branch runs once per call where every branch runs (strategy="select", vmap with a
per-example predicate), whatever the one-call path in C++ hands on to the general path.

Runs are counted from outside the branches, with a profile hook, so that counting
changes nothing a branch can reach.
"""

import collections
import itertools
import logging
import re
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import BranchMismatchError, BranchMutationError, cond


class Runs:
    """Counts the calls of the given functions' code while active."""

    def __init__(self, **fns):
        self.names = {fn.__code__: name for name, fn in fns.items()}
        self.counts: dict[str, int] = {}

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.names:
            name = self.names[frame.f_code]
            self.counts[name] = self.counts.get(name, 0) + 1

    def __enter__(self):
        self.counts = {}
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def select(pred, t, f, x):
    return cond(torch.tensor(pred), t, f, (x,), strategy="select")


def per_example(pred, t, f, x):
    flags = torch.tensor([pred, not pred, pred])
    return torch.vmap(lambda p, x: cond(p, t, f, (x,)))(flags, x)


def python_if(how, pred, t, f, x):
    if how is select:
        return (t if pred else f)(x)
    rows = [(t if p else f)(row) for p, row in zip([pred, not pred, pred], x)]
    return torch.utils._pytree.tree_map(
        lambda *r: torch.stack([torch.as_tensor(v) for v in r]), *rows
    )


HOWS = [pytest.param(select, id="select"), pytest.param(per_example, id="vmap")]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("pred", [True, False])
@pytest.mark.parametrize(
    "case",
    [
        "tensors",  # settled in C++
        "dict",  # outputs C++ does not select
        "number",  # a Python number per branch
        "t_writes",
        "f_writes",
        "both_write",
    ],
)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_each_branch_runs_once_and_gives_the_python_if_value(how, pred, case, grad):
    """Under grad mode every branch writes its own copy of an operand (write_guard's
    run_owning), from the start, so no branch runs again."""

    def t(x):
        if case in ("t_writes", "both_write"):
            x.mul_(2)
        y = x.sin()
        return {"y": y} if case == "dict" else (y, 1.5) if case == "number" else y

    def f(x):
        if case in ("f_writes", "both_write"):
            x.add_(1)
        y = x.cos()
        return {"y": y} if case == "dict" else (y, 2.5) if case == "number" else y

    x = torch.randn(3, 4)
    ref = x.clone()
    expected = python_if(how, pred, t, f, ref)
    for _ in range(2):  # the first call and a later one
        got_x = x.clone()
        with torch.set_grad_enabled(grad), Runs(t=t, f=f) as runs:
            out = how(pred, t, f, got_x)
        assert runs.counts == {"t": 1, "f": 1}
        for a, b in zip(
            torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(expected)
        ):
            torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype).expand_as(a))
        torch.testing.assert_close(got_x, ref)


def test_a_random_draw_is_drawn_once_as_a_python_if_draws_it():
    """The issue's reproducer: the untaken branch writes, so the call is handed on."""

    def t(x):
        return x + torch.rand(())

    def f(x):
        x.add_(1)
        return x

    torch.manual_seed(0)
    want = t(torch.zeros(())).item()
    for _ in range(3):
        torch.manual_seed(0)
        with torch.no_grad():
            got = cond(torch.tensor(True), t, f, (torch.zeros(()),), strategy="select")
        assert got.item() == want


@pytest.mark.parametrize("how", HOWS)
def test_branches_that_disagree_run_once_before_the_error(how):
    def t(x):
        return x

    def f(x):
        return x[:1]

    for _ in range(2):
        with torch.no_grad(), Runs(t=t, f=f) as runs, pytest.raises(BranchMismatchError):
            how(True, t, f, torch.randn(3, 4))
        assert runs.counts == {"t": 1, "f": 1}


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("failing", ["t", "f"])
def test_a_branch_that_raises_runs_once_and_its_writes_are_undone(how, failing):
    def t(x):
        x.add_(1)
        if failing == "t":
            raise ValueError("t failed")
        return x.sin()

    def f(x):
        x.mul_(3)
        if failing == "f":
            raise ValueError("f failed")
        return x.cos()

    x = torch.randn(3, 4)
    ref = x.clone()
    with (
        torch.no_grad(),
        Runs(t=t, f=f) as runs,
        pytest.raises(ValueError, match=f"{failing} failed"),
    ):
        how(True, t, f, x)
    # The branches run in order and stop at the error.
    assert runs.counts == ({"t": 1} if failing == "t" else {"t": 1, "f": 1})
    torch.testing.assert_close(x, ref)


class _Held:
    """What a branch closes over, to see that it is freed."""


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda t, f, x: select(True, t, f, x), id="select"),
        pytest.param(lambda t, f, x: per_example(True, t, f, x), id="vmap"),
        pytest.param(lambda t, f, x: select(True, t, torch.neg, x), id="select-general"),
        pytest.param(
            lambda t, f, x: make_fx(lambda p, x: cond(p, t, f, (x,)))(torch.tensor(True), x),
            id="make_fx",
        ),
    ],
)
def test_what_a_branch_that_raised_closes_over_is_freed(run):
    """The runner hands a branch's error on (_C.Handoff). Its traceback holds the
    branch's frame, and so what the branch closes over: the cycle collector frees it."""
    import gc
    import weakref

    def call():
        held = _Held()

        def t(x):
            assert held is not None
            raise ValueError("t failed")

        with torch.no_grad(), pytest.raises(ValueError, match="t failed"):
            run(t, torch.cos, torch.ones(3))
        return weakref.ref(held)

    ref = call()
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("how", HOWS)
def test_a_refused_write_runs_once_and_names_what_it_wrote(how):
    w = torch.zeros(4)

    def t(x):
        w.add_(1)
        return x

    def f(x):
        return x * 2

    with torch.no_grad(), Runs(t=t, f=f) as runs:
        with pytest.raises(
            BranchMutationError,
            match=r"true_fn writes in place \(aten.add_.Tensor\) to a tensor from outside it",
        ):
            how(True, t, f, torch.randn(3, 4))
    assert runs.counts == {"t": 1}
    assert not w.any()


@pytest.mark.parametrize("how", HOWS)
def test_a_change_of_python_state_runs_once_and_is_put_back(how):
    log = []

    def t(x):
        return x + 1

    def f(x):
        log.append(1)
        return x - 1

    with torch.no_grad(), Runs(t=t, f=f) as runs:
        with pytest.raises(BranchMutationError, match=r"false_fn changes log \(a list\)"):
            how(True, t, f, torch.randn(3, 4))
    assert runs.counts == {"t": 1, "f": 1}
    assert log == []


class _Counter:
    def __init__(self):
        self.n = 0


class _Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = _Counter()
        self.handlers = [_Counter()]
        self.nested = {"log": [[]]}
        self.ordered = collections.OrderedDict(a=1)
        self.logger = logging.getLogger("torchcond.test")


def _default_log(x, log=[]):  # noqa: B006 (the default is the state)
    log.append(1)
    return x + 1


# State held deeper than a name the branch reads: an object a module holds, an object
# in a list, a list in a list in a dict. Each with what the refusal names.
HELD = {
    "attribute of an attribute": "false_fn sets self.counter.n to int (1)",
    "object in a list": "false_fn sets self.handlers[0].n to int (1)",
    "list in a list": "false_fn changes self.nested['log'][0] (a list)",
    "ordered dict": "false_fn changes self.ordered (a OrderedDict)",
}


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("held", list(HELD))
def test_state_held_in_attributes_and_items_is_put_back_and_refused(how, held):
    """docs/select.rst: what a module or user object holds in its attributes, and what
    lists, dicts and sets hold, is watched in turn, and left as a Python ``if`` leaves
    it when the branch is not taken."""
    self = _Holder()

    def t(x):
        return x + 1

    def f(x):
        if held == "attribute of an attribute":
            self.counter.n += 1
        elif held == "object in a list":
            self.handlers[0].n += 1
        elif held == "ordered dict":
            self.ordered["b"] = 2
        else:
            self.nested["log"][0].append(1)
        return x - 1

    with torch.no_grad(), Runs(t=t, f=f) as runs:
        with pytest.raises(BranchMutationError, match=re.escape(HELD[held])):
            how(True, t, f, torch.randn(3, 4))
    assert runs.counts == {"t": 1, "f": 1}
    assert (self.counter.n, self.handlers[0].n, self.nested) == (0, 0, {"log": [[]]})
    assert dict(self.ordered) == {"a": 1}


@pytest.mark.parametrize("how", HOWS)
def test_objects_of_pythons_own_classes_keep_their_state_to_themselves(how):
    """docs/select.rst: the attributes of objects of Python's and torch's classes are not
    watched. A logger's call in an untaken branch runs, as ``print`` does; the walk
    does not follow the logger into the logging module's streams."""
    self = _Holder()

    def t(x):
        self.logger.debug("taken or not")
        return x + 1

    with torch.no_grad():
        torch.testing.assert_close(
            how(False, t, _scaling, torch.ones(3, 2)), torch.full((3, 2), 2.0)
        )


@pytest.mark.parametrize("how", HOWS)
def test_a_default_argument_the_untaken_branch_changes_is_put_back_and_refused(how):
    log = _default_log.__defaults__[0]
    log.clear()
    with torch.no_grad():
        with pytest.raises(BranchMutationError, match="true_fn changes a default argument"):
            how(False, _default_log, _scaling, torch.zeros(3, 2))
    assert log == []


COUNTER = itertools.count(1)


def _counting(x):
    return x + next(COUNTER)


def _scaling(x):
    return x * 2.0


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda x: select(False, _counting, _scaling, x), id="select"),
        pytest.param(lambda x: per_example(False, _counting, _scaling, x), id="vmap"),
        pytest.param(
            lambda x: make_fx(lambda p, x: cond(p, _counting, _scaling, (x,)))(
                torch.tensor(False), x
            ),
            id="make_fx",
        ),
    ],
)
def test_an_iterator_the_untaken_branch_advances_is_refused_before_it_runs(run):
    """A Python ``if`` leaves the counter alone. Where every branch runs, the branch is
    refused before it advances it."""
    global COUNTER
    COUNTER = itertools.count(1)
    with (
        torch.no_grad(),
        pytest.raises(BranchMutationError, match="true_fn reaches COUNTER, an iterator"),
    ):
        run(torch.zeros(3, 2))
    assert next(COUNTER) == 1


def test_an_iterator_in_a_branch_is_a_python_if_in_eager_mode():
    global COUNTER
    COUNTER = itertools.count(1)
    x = torch.zeros(2)
    cond(torch.tensor(False), _counting, _scaling, (x,))
    torch.testing.assert_close(cond(torch.tensor(True), _counting, _scaling, (x,)), x + 1)
    assert next(COUNTER) == 2


LOG: list = []


def _log_1():
    LOG.append(1)


def _log_2():
    _log_1()


def _log_3():
    _log_2()


def _log_4():
    _log_3()


def _log_5():
    _log_4()


@pytest.mark.parametrize(
    "helper, watched",
    [(_log_1, True), (_log_2, True), (_log_3, True), (_log_4, True), (_log_5, False)],
    ids=["1 step", "2 steps", "3 steps", "4 steps", "5 steps"],
)
def test_the_watch_follows_functions_4_steps_as_docs_select_says(helper, watched):
    """docs/select.rst: a function the branch names is 1 step away. What the functions
    within 4 steps name is put back and refused; a function further away is not
    followed."""

    def t(x):
        helper()
        return x + 1

    LOG.clear()
    with torch.no_grad():
        if watched:
            with pytest.raises(BranchMutationError, match="LOG"):
                select(False, t, _scaling, torch.zeros(2))
            assert LOG == []
        else:
            select(False, t, _scaling, torch.zeros(2))
            assert LOG == [1]


def _chain(length: int) -> _Counter:
    """A counter ``length`` attributes deep: ``root.next.next...``."""
    root = node = _Counter()
    for _ in range(length):
        node.next = _Counter()
        node = node.next
    return root


@pytest.mark.parametrize("length, watched", [(8, True), (9, False)], ids=["8 deep", "9 deep"])
def test_the_watch_follows_attributes_8_deep_as_docs_select_says(length, watched):
    """docs/select.rst: the objects that the attributes and items of a value the branch
    reads hold are watched to 8 attributes or items deep; deeper ones are not."""
    root = _chain(length)
    last = root
    for _ in range(length):
        last = last.next

    def t(x):
        last_of(root).n += 1
        return x + 1

    def last_of(node):
        while hasattr(node, "next"):
            node = node.next
        return node

    with torch.no_grad():
        if watched:
            with pytest.raises(BranchMutationError, match=r"\.next\.n to int \(1\)"):
                select(False, t, _scaling, torch.zeros(2))
            assert last.n == 0
        else:
            select(False, t, _scaling, torch.zeros(2))
            assert last.n == 1


@pytest.mark.parametrize("pre_dispatch", [False, True], ids=["make_fx", "pre_dispatch"])
@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_a_writing_branch_is_traced_once_where_a_gradient_may_be_taken(tracing_mode, pre_dispatch):
    """A trace may be differentiated later, so every branch writes its own copy of an
    operand that needs no gradient from the start: the writing branch is traced once
    (before, make_fx traced it up to the write, then again on a copy), and the program
    writes the taken branch's value."""

    def t(x, y):
        z = x * 2
        y.add_(1)
        return z + 1

    def f(x, y):
        return x - 1

    def program(p, x, y):
        return cond(p, t, f, (x, y), strategy="select")

    for pred in (True, False):
        x = torch.randn(3, requires_grad=True)
        with Runs(t=t, f=f) as runs:
            gm = make_fx(program, tracing_mode=tracing_mode, pre_dispatch=pre_dispatch)(
                torch.tensor(pred), x, torch.zeros(3)
            )
        assert runs.counts == {"t": 1, "f": 1}
        muls = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
        assert len(muls) == 1  # no partial first run left in the graph
        y, expected_y = torch.zeros(3), torch.zeros(3)
        out = gm(torch.tensor(pred), x, y)
        expected = (t if pred else f)(x, expected_y)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(y, expected_y)
