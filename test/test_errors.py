"""Every mistake a user can make gets a CondError naming the argument or output path."""

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import (
    BranchMismatchError,
    BranchMutationError,
    CondArgumentError,
    CondError,
    UnsupportedCondError,
    cond,
    cond_op,
    switch,
    switch_op,
)

x = torch.ones(3)


def ident(*a):
    return a[0] if a else torch.zeros(())


@pytest.mark.parametrize("pred", [torch.ones(2) > 0, torch.ones(0) > 0])
def test_pred_with_several_or_no_elements(pred):
    with pytest.raises(
        CondArgumentError, match=r"'pred' must have exactly one element; found a tensor of shape"
    ):
        cond(pred, ident, ident, (x,))


@pytest.mark.parametrize("pred", ["yes", None, [True], torch.tensor(1 + 2j)])
def test_pred_of_the_wrong_type(pred):
    with pytest.raises(CondArgumentError, match=r"'pred' must"):
        cond(pred, ident, ident, (x,))


def test_pred_errors_inside_tracing_too():
    def f(x):
        return cond(x > 0, ident, ident, (x,))

    with pytest.raises(CondArgumentError, match=r"shape \(3,\)"):
        make_fx(f, tracing_mode="fake")(x)


@pytest.mark.parametrize("which", ["true_fn", "false_fn"])
def test_branch_not_callable(which):
    fns = {"true_fn": ident, "false_fn": ident, which: 3}
    with pytest.raises(CondArgumentError, match=rf"'{which}' must be callable; found int"):
        cond(torch.tensor(True), fns["true_fn"], fns["false_fn"], (x,))


def test_switch_branch_not_callable_names_its_index():
    with pytest.raises(CondArgumentError, match=r"'branches\[1\]' must be callable"):
        switch(0, [ident, "nope"], (x,))


@pytest.mark.parametrize("branches", [[], ()])
def test_switch_without_branches(branches):
    with pytest.raises(CondArgumentError, match="at least one callable; found an empty sequence"):
        switch(torch.tensor(0), branches, (x,))


@pytest.mark.parametrize("index", [torch.tensor(1.0), torch.tensor(True), torch.tensor([0, 1])])
def test_switch_index_of_the_wrong_dtype_or_shape(index):
    with pytest.raises(CondArgumentError, match=r"'index' must"):
        switch(index, [ident, ident], (x,))


@pytest.mark.parametrize("operands", [x, {"x": x}, None])
def test_operands_not_a_tuple_or_list(operands):
    with pytest.raises(CondArgumentError, match=r"'operands' must be a tuple or list"):
        cond(torch.tensor(True), ident, ident, operands)


def test_operands_with_a_non_tensor_leaf_names_the_path():
    with pytest.raises(CondArgumentError, match=re.escape("operands[1]['k'] is int (3)")):
        cond(torch.tensor(True), ident, ident, (x, {"k": 3}))


# One mistake each, as ``x -> output``: every one is refused with the same error, word
# for word, eagerly, under make_fx and under torch.compile(fullgraph=True).
BAD_CALLS = {
    "pred None": lambda x: cond(None, ident, ident, (x,)),
    "pred str": lambda x: cond("yes", ident, ident, (x,)),
    "pred list": lambda x: cond([True], ident, ident, (x,)),
    "pred complex number": lambda x: cond(1j, ident, ident, (x,)),
    "pred complex tensor": lambda x: cond(x.sum() * 1j, ident, ident, (x,)),
    "pred several elements": lambda x: cond(x, ident, ident, (x,)),
    "pred no element": lambda x: cond(x[:0] > 0, ident, ident, (x,)),
    "pred None, select": lambda x: cond(None, ident, ident, (x,), strategy="select"),
    "pred several elements, select": lambda x: cond(x > 0, ident, ident, (x,), strategy="select"),
    "true_fn": lambda x: cond(x.sum() > 0, 3, ident, (x,)),
    "operands": lambda x: cond(x.sum() > 0, ident, ident, [x, {"k": 3}]),
    "strategy": lambda x: cond(x.sum() > 0, ident, ident, (x,), strategy="fast"),
    "index None": lambda x: switch(None, [ident, ident], (x,)),
    "index float": lambda x: switch(1.0, [ident, ident], (x,)),
    "index bool": lambda x: switch(True, [ident, ident], (x,)),
    "index str": lambda x: switch("1", [ident, ident], (x,)),
    "index float tensor": lambda x: switch(x.sum(), [ident, ident], (x,)),
    "index bool tensor": lambda x: switch(x.sum() > 0, [ident, ident], (x,)),
    "index several elements": lambda x: switch(x.long(), [ident, ident], (x,)),
    "index None, select": lambda x: switch(None, [ident, ident], (x,), strategy="select"),
    "no branches": lambda x: switch(x.sum().long(), [], (x,)),
    "branches not a list": lambda x: switch(x.sum().long(), ident, (x,)),
    "branches[1]": lambda x: switch(x.sum().long(), [ident, None], (x,)),
    # The operators themselves, as an exported program calls them.
    "operator pred None": lambda x: cond_op(None, lambda x: (x,), lambda x: (-x,), (x,)),
    "operator index float": lambda x: switch_op(1.5, lambda x: (x,), lambda x: (-x,), (x,)),
}


@pytest.mark.parametrize("mistake", BAD_CALLS)
def test_every_mode_raises_the_eager_error(mistake):
    fn = BAD_CALLS[mistake]
    with pytest.raises(CondArgumentError) as eager:
        fn(x)
    with pytest.raises(CondArgumentError) as traced:
        make_fx(fn)(x)
    assert str(traced.value) == str(eager.value)
    torch._dynamo.reset()
    with pytest.raises(CondArgumentError) as compiled:
        torch.compile(fn, backend="eager", fullgraph=True)(x)
    # Dynamo adds the user's frames after the message.
    assert str(compiled.value).split("\n\nfrom user code:")[0] == str(eager.value)


def trace(fn, *args):
    return make_fx(fn, tracing_mode="symbolic")(*args)


def test_branches_with_different_structure():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, x), lambda x: {"a": x}, (x,))

    with pytest.raises(
        BranchMismatchError,
        match=re.escape("true_fn returns (Tensor, Tensor), false_fn returns {'a': Tensor}"),
    ):
        trace(f, x)


def test_branches_with_different_dtype_name_the_output_path():
    def f(x):
        return cond(
            x.sum() > 0,
            lambda x: (x, {"h": x}),
            lambda x: (x, {"h": x.long()}),
            (x,),
        )

    with pytest.raises(
        BranchMismatchError,
        match=re.escape(
            "output[1]['h']: branches must agree on dtype; true_fn gives torch.float32, false_fn gives torch.int64"
        ),
    ):
        trace(f, x)


def test_branches_with_different_ndim():
    def f(x):
        return cond(x.sum() > 0, lambda x: x, lambda x: x[None], (x,))

    with pytest.raises(
        BranchMismatchError,
        match=r"output: branches must agree on ndim; true_fn gives 1, false_fn gives 2",
    ):
        trace(f, x)


def test_switch_mismatch_names_the_branch():
    def f(i, x):
        return switch(i, [lambda x: x, lambda x: x, lambda x: x.double()], (x,))

    with pytest.raises(BranchMismatchError, match=r"branches\[2\] gives torch.float64"):
        trace(f, torch.tensor(0), x)


@pytest.mark.parametrize(
    "other, message",
    [
        (
            lambda x: torch.zeros(10, 10),
            r"output: branches must agree on ndim; true_fn gives 1, false_fn gives 2",
        ),
        (
            lambda x: torch.zeros(5),
            r"output dim 0: branches must agree on sizes .* true_fn gives 4, false_fn gives 5",
        ),
        (
            lambda x: x.double(),
            r"output: branches must agree on dtype; true_fn gives torch.float32, false_fn gives torch.float64",
        ),
    ],
)
@pytest.mark.parametrize("taken", [True, False])
def test_real_mode_make_fx_checks_every_branch(other, message, taken):
    # Real tensors run only the taken branch; the node must still describe both.
    x = torch.full((4,), 1.0 if taken else -1.0)
    with pytest.raises(BranchMismatchError, match=message):
        make_fx(lambda x: cond(x.sum() > 0, lambda x: x.sin(), other, [x]))(x)
    with pytest.raises(
        BranchMismatchError,
        match=message.replace("true_fn", r"branches\[0\]").replace("false_fn", r"branches\[1\]"),
    ):
        make_fx(lambda i, x: switch(i, [lambda x: x.sin(), other], [x]))(
            torch.tensor(0 if taken else 1), x
        )


def test_branch_returning_a_non_tensor():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, "a"), lambda x: (x, "b"), (x,))

    with pytest.raises(
        BranchMismatchError,
        match=re.escape(
            "true_fn output: every leaf must be a torch.Tensor or a number (int, bool, float "
            "or their Sym kinds); output[1] is str ('a')"
        ),
    ):
        trace(f, x)


def test_branches_returning_different_kinds_of_numbers():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, {"k": True}), lambda x: (x, {"k": 1}), (x,))

    with pytest.raises(
        BranchMismatchError,
        match=re.escape(
            "output[1]['k']: branches must return the same kind of value; "
            "true_fn returns a bool, false_fn returns an int"
        ),
    ):
        trace(f, x)


def test_sizes_may_only_differ_with_a_shape_env():
    m = torch.empty(3, device="meta")
    pred = torch.empty((), dtype=torch.bool, device="meta")
    with pytest.raises(
        BranchMismatchError,
        match=r"output dim 0: branches must agree on sizes when tracing without symbolic shapes .*true_fn gives 2, false_fn gives 3",
    ):
        cond(pred, lambda x: x[:2], lambda x: x, (m,))


def test_user_exception_reaches_the_user_unchanged():
    class Boom(Exception):
        pass

    def bad(x):
        raise Boom("from the branch")

    with pytest.raises(Boom, match="from the branch"):
        cond(torch.tensor(True), bad, ident, (x,))
    with pytest.raises(Boom, match="from the branch"):
        trace(lambda x: cond(x.sum() > 0, ident, bad, (x,)), x)
    with pytest.raises(Boom, match="from the branch"):
        switch(torch.tensor(1), [ident, bad], (x,))


def test_per_example_predicate_needs_selectable_outputs():
    xs = torch.randn(4, 3)
    # Shapes as each example's branch returns them (under vmap, not the batch's).
    with pytest.raises(
        BranchMismatchError,
        match=r"output\['h'\]: every branch runs .* agree on shape; true_fn gives \(3,\), false_fn gives \(2,\)",
    ):
        torch.vmap(lambda x: cond(x.sum() > 0, lambda a: {"h": a}, lambda a: {"h": a[:2]}, (x,)))(
            xs
        )
    with pytest.raises(BranchMismatchError, match=r"output: every branch runs .* agree on dtype"):
        cond(xs.sum() > 0, lambda a: a, lambda a: a.double(), (xs,), strategy="select")


def test_unknown_strategy_is_refused():
    with pytest.raises(
        CondArgumentError, match="argument 'strategy' must be one of 'auto', 'select'; found 'fast'"
    ):
        cond(torch.tensor(True), torch.sin, torch.cos, (torch.ones(2),), strategy="fast")


def test_bad_input_leaves_inputs_untouched():
    a = torch.arange(3.0)
    before = a.clone()
    version = a._version

    def t(a, d):
        a.add_(1)
        return a

    with pytest.raises(CondArgumentError):
        cond(torch.tensor(True), t, t, (a, {"k": "not a tensor"}))
    with pytest.raises(BranchMutationError):  # a write through two aliasing operands
        make_fx(
            lambda a: cond(a.sum() > 0, lambda a, b: a.add_(1), lambda a, b: a, (a, a)),
            tracing_mode="fake",
        )(a)
    torch.testing.assert_close(a, before)
    assert a._version == version


def test_every_error_is_a_cond_error():
    for cls in (CondArgumentError, BranchMismatchError, BranchMutationError, UnsupportedCondError):
        assert issubclass(cls, CondError)


def test_a_mismatch_is_caught_as_torch_cond_mismatches_are():
    # torch.cond raises RuntimeError for branches that disagree; code catching that
    # catches ours too.
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match="true_fn"):
        make_fx(
            lambda x: cond(x.sum() > 0, lambda x: x, lambda x: x.double(), (x,)),
            tracing_mode="fake",
        )(x)
    with pytest.raises(RuntimeError):
        make_fx(
            lambda x: torch.cond(x.sum() > 0, lambda x: x, lambda x: x.double(), (x,)),
            tracing_mode="fake",
        )(x)


def test_writes_to_a_plain_tensor_attribute_are_refused_in_export():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.zeros(3)  # not a buffer: a constant of the program

        def forward(self, x):
            def t(a):
                self.c.add_(1)
                return a + self.c

            return cond(x.sum() > 0, t, lambda a: a * 2, (x,))

    with pytest.raises(BranchMutationError, match="a tensor it closes over"):
        torch.export.export(M(), (torch.ones(3),), strict=False)


def test_meta_selector_with_real_operands():
    pred = torch.tensor(False, device="meta")
    with pytest.raises(
        CondArgumentError, match=r"selector is a meta tensor.*operands are real tensors \(on cpu\)"
    ):
        cond(pred, lambda a: a * 2, lambda a: a, (x,))
    with pytest.raises(CondArgumentError, match="selector is a meta tensor"):
        switch(torch.tensor(0, device="meta"), [ident, ident], (x,))


def test_switch_checks_every_branch_even_when_another_is_taken():
    with pytest.raises(
        CondArgumentError, match=r"'branches\[1\]' must be callable; found NoneType"
    ):
        switch(torch.tensor(0), [ident, None], (x,))


@pytest.mark.parametrize("mode", ["eager", "eager python bool", "make_fx", "symbolic"])
def test_a_branch_that_cannot_take_the_operands_is_named(mode):
    def run(fn):
        if mode == "eager":
            return fn(torch.tensor(True), x)
        if mode == "eager python bool":
            return fn(True, x)
        return make_fx(fn, tracing_mode="real" if mode == "make_fx" else "symbolic")(
            torch.tensor(True), x
        )

    with pytest.raises(
        CondArgumentError,
        match=re.escape(
            "true_fn is called with the 1 operand (as true_fn(*operands)), but its signature () does not take them"
        ),
    ):
        run(lambda p, x: cond(p, lambda: x, lambda x: x, (x,)))
    with pytest.raises(
        CondArgumentError,
        match=re.escape(
            "branches[1] is called with the 2 operands (as branches[1](*operands)), but its signature (a) does not take them"
        ),
    ):
        run(
            lambda p, x: switch(
                p.long() if isinstance(p, torch.Tensor) else int(p),
                [lambda a, b: a, lambda a: a],
                (x, x),
            )
        )


def test_a_type_error_inside_a_branch_is_not_mistaken_for_arity():
    def bad(x):
        return len(3)

    with pytest.raises(TypeError, match="has no len") as info:
        cond(torch.tensor(True), bad, ident, (x,))
    assert not isinstance(info.value, CondError)


def test_check_branches_catches_in_eager_what_export_would_refuse():
    w = torch.nn.Parameter(torch.ones(3))
    to_double = lambda x: x.double()  # noqa: E731
    # Without the check only the taken branch runs, as a Python `if`.
    torch.testing.assert_close(cond(torch.tensor(True), lambda x: x * w, to_double, (x,)), x * w)
    for pred in (torch.tensor(True), True):
        with pytest.raises(
            BranchMismatchError,
            match=r"true_fn gives torch\.float32, false_fn gives torch\.float64",
        ):
            cond(pred, lambda x: x * w, to_double, (x,), check_branches=True)
    with pytest.raises(
        BranchMismatchError,
        match=r"branches\[0\] returns Tensor, branches\[1\] returns \(Tensor,\)",
    ):
        switch(torch.tensor(0), [lambda x: x, lambda x: (x,)], (x,), check_branches=True)
    # The check traces every branch on fake tensors: the untaken branch's write is
    # traced (export accepts it), not made.
    a = torch.ones(3)
    cond(torch.tensor(True), lambda a: a + 1, lambda a: a.add_(5), (a,), check_branches=True)
    torch.testing.assert_close(a, torch.ones(3))
    # What export accepts passes, and the call then runs the taken branch for real.
    out = cond(torch.tensor(True), lambda x: x * w, lambda x: x[:2], (x,), check_branches=True)
    torch.testing.assert_close(out, x * w)
    out.sum().backward()
    torch.testing.assert_close(w.grad, x)


def test_under_dynamo_an_untraceable_branch_is_named_with_the_operator():
    def data_dependent(x):
        if x.sum() > 0:
            return x
        return -x

    calls = [
        (lambda x: cond(x.sum() > 0, data_dependent, ident, (x,)), "torchcond_cond", "true_fn: "),
        (
            lambda x: switch(x.sum().long(), [ident, data_dependent], (x,)),
            "torchcond_switch",
            r"branches\[1\]: ",
        ),
    ]
    for fn, op, branch in calls:
        torch._dynamo.reset()
        with pytest.raises(
            torch._dynamo.exc.UncapturedHigherOrderOpError,
            match=f"(?s){branch}Data-dependent branching.*Higher Order Operator: {op}",
        ):
            torch.compile(fn, backend="eager", fullgraph=True)(x)


def test_compiled_mismatch_names_the_output_path():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, {"h": x}), lambda x: (x, {"h": x.long()}), (x,))

    with pytest.raises(
        BranchMismatchError,
        match=re.escape(
            "output[1]['h']: branches must agree on dtype; true_fn gives torch.float32, "
            "false_fn gives torch.int64"
        ),
    ):
        torch.compile(f, fullgraph=True, backend="eager")(x)


def test_an_inner_conditional_names_its_own_output_paths():
    def inner(a):
        return cond(a.sum() > 1, lambda a: {"k": a}, lambda a: {"k": a.long()}, (a,))

    def f(x):
        return cond(x.sum() > 0, lambda x: [inner(x)], lambda x: [inner(x * 2)], (x,))

    with pytest.raises(
        BranchMismatchError, match=re.escape("output['k']: branches must agree on dtype")
    ):
        trace(f, x)


def test_aot_autograd_refuses_a_branch_that_transposes_an_operand_in_place():
    from functorch.compile import aot_function, nop

    def f(x, y):
        return cond(x.sum() > 0, lambda a, b: a + b.t_().sum(), lambda a, b: a, (x, y))

    with pytest.raises(
        BranchMutationError,
        match=re.escape("changes the sizes or strides of its input operands[1]"),
    ):
        aot_function(f, nop)(torch.ones(3), torch.zeros(2, 3))


def test_a_select_write_names_the_operand_path():
    a, b = torch.ones(3), torch.ones(3, requires_grad=True)

    def writes(ops):
        ops["k"][1].add_(1)
        return ops["k"][0]

    with pytest.raises(
        BranchMutationError,
        match=re.escape(
            "true_fn writes in place (aten.add_.Tensor) to its input operands[0]['k'][1], "
            "which needs a gradient"
        ),
    ):
        cond(
            torch.tensor(True),
            writes,
            lambda ops: ops["k"][0],
            ({"k": [a, b * 1]},),
            strategy="select",
        )


@pytest.mark.parametrize("keyword", ["may_write", "speculate_only", "closures_read_as"])
def test_the_operators_refuse_dynamos_keywords_outside_dynamo(keyword):
    x = torch.ones(2)
    with pytest.raises(TypeError, match=f"torchcond_cond: the keywords {keyword} are read only"):
        cond_op(torch.tensor(True), torch.sin, torch.cos, (x,), **{keyword: False})
    with pytest.raises(TypeError, match=f"torchcond_switch: the keywords {keyword} are read only"):
        switch_op(torch.tensor(0), torch.sin, torch.cos, (x,), **{keyword: False})
