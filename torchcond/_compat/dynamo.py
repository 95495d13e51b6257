"""Dynamo support for torchcond's operators (torch.compile, strict torch.export).

Dynamo picks a variable class for a higher-order operator by the operator's name. It
looks the name up in ``torch._dynamo.variables.higher_order_ops._hop_name_to_variable_class``.
An unknown name is a hard "unsupported HigherOrderOperator" error. We register a class
for each of our operators.

Both operators have the form ``op(selector, branch_0, ..., branch_n, operands)``. So
both classes share the methods of ``_ConditionalVariable``. These methods speculate
every branch with ``speculate_subgraph``, which lifts closures. They give every branch
graph the same lifted inputs and emit our operator. We do not reuse dynamo's own
``CondHigherOrderVariable``. It emits torch's cond, whose fake rule and errors differ
from ours.

Checked on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0. The internals used here are the
same on all of them. A proposed split of ``higher_order_ops.py`` into a package keeps
the registry among the globals of ``TorchHigherOrderOperatorVariable.make``, which is
where we read it.

``raise_at_compile_time`` passes a torchcond error that dynamo finds while tracing to
the caller, as eager mode raises it. It relies on
``torch.compiler.assume_constant_result`` and on ``torch._dynamo.exc.TorchRuntimeError``,
which dynamo re-raises unchanged. Both behave the same on those releases.

A branch can change things outside itself, such as a buffer it assigns or Python
state. These changes are recorded while the branch is speculated and settled when it
returns (see ``_settle``). Importing dynamo takes most of a second, so nothing here
runs until dynamo itself is imported (see ``install``).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

import torch
import torch.utils._pytree as pytree

from ..errors import BranchMutationError, CondError, UnsupportedCondError
from . import JVP_TRANSFORM, VMAP_TRANSFORM, transform_level_active, user_stack_trace
from .after_import import when_imported
from .branch_facts import assuming, insert_checks

_HOP_VARIABLES = "torch._dynamo.variables.higher_order_ops"


def raise_at_compile_time(error_type: type[CondError], message: str) -> NoReturn:
    """Raise ``error_type(message)`` to the caller of the compiled function, as eager does.

    An exception raised by traced code reaches a ``fullgraph=True`` caller as dynamo's
    ``Unsupported``. But dynamo calls a function marked ``assume_constant_result``, as
    this one is below, while it traces. It passes on a ``TorchRuntimeError`` raised there
    unchanged. The error raised here is both (see ``compile_time_error``).
    """
    raise compile_time_error(error_type, message)


# This does what torch.compiler.assume_constant_result(raise_at_compile_time) does on
# 2.11-2.15. Calling that would import dynamo now, which takes most of a second, and it
# fails while dynamo is importing.
raise_at_compile_time._dynamo_marked_constant = True  # type: ignore[attr-defined]


def tracing_a_subgraph() -> bool:
    """Return whether dynamo is tracing code into a subgraph of a higher-order operator.

    Such a subgraph is a branch that dynamo speculates. There, dynamo refuses a pushed
    mode or a change to an outside object as a side effect. This function is marked
    below, so dynamo calls it while it traces and puts the answer in place of the call,
    with no guard. The current tracer's ``parent`` is set only for a subgraph's tracer
    (2.11-2.15).
    """
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    return tx is not None and tx.output.current_tracer.parent is not None


tracing_a_subgraph._dynamo_marked_constant = True  # type: ignore[attr-defined]


_COMPILE_TIME_ERRORS: dict[type, type] = {}


def compile_time_error(error_type: type[CondError], message: str) -> CondError:
    """Return ``error_type(message)`` in a form that dynamo passes on to the caller unchanged.
    It is also a ``TorchRuntimeError``, like torch's own errors found while tracing."""
    from torch._dynamo.exc import TorchRuntimeError

    both = _COMPILE_TIME_ERRORS.get(error_type)
    if both is None:
        both = type(
            error_type.__name__,
            (error_type, TorchRuntimeError),
            {"__module__": error_type.__module__, "__qualname__": error_type.__qualname__},
        )
        _COMPILE_TIME_ERRORS[error_type] = both
    return both(message)


class StateRules(NamedTuple):
    """The rules of ``_src/state.py`` that ``_settle`` asks: each raises the
    ``BranchMutationError`` for a change that a branch may not make. This module only
    reads dynamo's records of what a branch changed."""

    refuse_autograd_state: Callable
    refuse_python_state: Callable
    refuse_attribute: Callable
    # check_registry_change(label, attr, registry, old, new, under_select), with
    # ``absent`` for a value that is not there.
    check_registry_change: Callable
    absent: object


class NumberRules(NamedTuple):
    """The rules of ``_src/numbers.py`` for a number that a branch returns."""

    # ``value_positions(treespec)`` maps each number leaf's position to its tensor's.
    value_positions: Callable
    # ``check_kinds_in_specs(labels, specs)`` raises for numbers of different kinds.
    check_kinds_in_specs: Callable
    # ``dynamo_info(per_branch, shape_env)`` records what every branch returns there.
    dynamo_info: Callable


def install(
    kinds: dict,
    check_outputs: Callable,
    refuse_writes: Callable,
    state_rules: StateRules,
    number_rules: NumberRules,
) -> None:
    """Register a variable class per operator, now if dynamo is loaded, else once it loads.

    ``kinds`` maps each operator to ``(taken_index, labels, warn_if_exporting,
    known_index, branch_facts)``. The fields of ``_Operator`` describe these callables and the rules.
    """
    rules = (check_outputs, refuse_writes, state_rules, number_rules)
    when_imported(_HOP_VARIABLES, lambda module: _register(module, kinds, *rules))


class _Operator(NamedTuple):
    """What dynamo's view of one of our operators needs from torchcond (see ``install``)."""

    name: str
    # ``taken_index(constant_selector, n)`` returns the index of the branch that a
    # constant selector takes, which dynamo then inlines. It raises a ``CondError`` for
    # a constant that is not a selector.
    taken_index: Callable
    # ``labels(n)`` returns the branches' names for messages.
    labels: Callable
    # ``warn_if_exporting(constant_selector)`` warns that export keeps only that branch.
    warn_if_exporting: Callable
    # ``known_index(symbolic_selector, n)`` returns the branch that a SymBool or SymInt
    # takes for every input the shape environment admits, or None.
    known_index: Callable
    # ``branch_facts(symbolic_selector, n)`` returns what each branch may assume while
    # it is speculated: one list of sympy facts per branch.
    branch_facts: Callable
    # ``check_outputs(per_branch_outputs, labels, out_spec)`` raises when the speculated
    # branches' outputs cannot be one operator's outputs. Its error names the output path.
    check_outputs: Callable
    # ``refuse_writes(written_positions, n_operands, labels)`` raises the ``CondError``
    # for branches that write to their inputs under a transform that differentiates.
    refuse_writes: Callable
    # The rules of ``_src/state.py``. They say what a branch may change outside itself,
    # and give the errors for what it may not (see ``_settle``).
    state_rules: StateRules
    # The rules of ``_src/numbers.py`` for a number that a branch returns.
    # ``pytrees.speculated`` makes such a number a ``Carried`` (see ``_number_values``).
    number_rules: NumberRules


def _register(hop, kinds: dict, *rules) -> None:
    registry = hop.TorchHigherOrderOperatorVariable.make.__globals__["_hop_name_to_variable_class"]
    for op, (taken_index, labels, warn_if_exporting, known_index, facts) in kinds.items():
        spec = _Operator(
            op.name(), taken_index, labels, warn_if_exporting, known_index, facts, *rules
        )
        registry[op.name()] = _make_variable_class(hop, spec)


def _make_variable_class(hop, spec: _Operator) -> type:
    """Return dynamo's variable class for the operator that ``spec`` describes.

    Dynamo's base class runs ``add_hop_context`` on each subclass as it is made
    (2.11-2.15). That needs the subclass's ``_HOP_NAME``, the operator's name in dynamo's
    errors. So a class shared by both operators cannot derive from dynamo's base. The
    shared methods live in ``_ConditionalVariable``, and each operator gets a subclass here.
    """

    class TorchcondConditionalVariable(_ConditionalVariable, hop.TorchHigherOrderOperatorVariable):
        _HOP_NAME = spec.name
        _ALLOW_FALLBACK_TO_EAGER = False
        _op = spec

    return TorchcondConditionalVariable


class _Call(NamedTuple):
    """One call of an operator as dynamo sees it, with its arguments checked."""

    selector: Any
    branches: list
    operands: list  # the operands' variables
    may_write: bool
    read_as: Any  # ``closures_read_as``, or None
    speculate_only: bool
    labels: list[str]  # the branches' names in messages


class _Branch(NamedTuple):
    """One branch as dynamo speculated it."""

    ret_val: Any  # the variables it returns
    spec: Any  # dynamo's output spec, with the treespec and the constants left out of the graph
    graph: torch.fx.Graph
    lifted: dict  # maps each proxy it reads from outside to its placeholder in the graph
    modules: dict  # the modules the graph calls


def _selector_value(selector):
    """The SymBool or SymInt behind a symbolic selector's variable, or None."""
    if isinstance(selector, _variables().SymNodeVariable):
        return selector.sym_num
    return None


def _selector_node(selector):
    """The node of dynamo's graph that computed a symbolic selector, or None."""
    if isinstance(selector, _variables().SymNodeVariable):
        return selector.as_proxy().node
    return None


class _ConditionalVariable:
    """Dynamo's view of ``op(selector, branch_0, ..., branch_n, operands)``.

    Every branch is speculated into a subgraph. All subgraphs get the union of all
    branches' lifted inputs, in one order. The emitted node is our operator, so its
    example value comes from torchcond's own fake rule (merge.py). The branches' outputs
    are checked here first, because here their pytree structure is known.

    ``_make_variable_class`` puts these methods on dynamo's base class, once per operator.
    """

    _HOP_NAME: str  # the operator's name (set per operator)
    _op: _Operator  # the operator's data (set per operator)
    value: Any  # the operator (set by dynamo's base class)

    def _call_function(self, tx, args, kwargs):
        call = self._arguments(tx, args, kwargs)
        if call.selector.is_python_constant():
            return self._taken_branch(tx, call)
        known = self._known_index(call)
        if known is not None:
            return call.branches[known].call_function(tx, list(call.operands), {})
        facts = self._op.branch_facts(
            _selector_value(call.selector), len(call.branches), _selector_node(call.selector)
        )
        branches = [
            self._speculate(tx, label, branch, call.operands, call.may_write, f)
            for label, branch, f in zip(call.labels, call.branches, facts)
        ]
        self._check_branch_outputs(tx, call.labels, branches)
        self._refuse_writes_under_jvp(call, branches)
        if call.speculate_only:
            _refuse_tangentless_in_exported_jvp(self._op.name, call.labels, branches)
            return _variables().ConstantVariable.create(None)
        return self._emit(tx, call, branches)

    def _arguments(self, tx, args, kwargs) -> _Call:
        """Return the call's arguments, checked. A bad argument raises dynamo's ``Unsupported``."""
        v = _variables()
        args, kwargs = v.lazy.LazyVariableTracker.realize_all((args, kwargs))
        # ``may_write=False`` is a keyword that only this hook reads (the operator's
        # __call__ refuses it outside dynamo; api._operator_under_dynamo). The caller
        # passes it when all branches run, taken or not. Then no branch may write
        # outside itself.
        may_write = kwargs.pop("may_write", v.ConstantVariable.create(True))
        # ``closures_read_as`` is how a mode that stands in for closed-over tensors
        # (closures.StandIns) reads them. That mode cannot be entered inside the branches.
        read_as = kwargs.pop("closures_read_as", None)
        # ``speculate_only=True`` checks the branches and emits nothing. api's select
        # path then runs them inline.
        speculate_only = kwargs.pop("speculate_only", None) is not None
        if kwargs or len(args) < 3 or not may_write.is_python_constant():
            self._refuse("bad arguments", (args, kwargs))
        may_write = bool(may_write.as_python_constant())
        selector, branches, operands = args[0], list(args[1:-1]), args[-1]
        if not isinstance(operands, (v.ListVariable, v.TupleVariable)):
            self._refuse("operands must be a tuple or list", operands)
        operand_vts = operands.unpack_var_sequence(tx)
        if not _hop().only_consist_of(
            operands, (v.TensorVariable, v.ConstantVariable, v.SymNodeVariable)
        ):
            self._refuse("operands must be tensors", operands)
        # A constant selector is checked when its branch is taken (_taken_branch).
        if not selector.is_python_constant() and not isinstance(
            selector, (v.TensorVariable, v.SymNodeVariable)
        ):
            self._refuse("the selector must be a tensor or a SymBool/SymInt", selector)
        labels = self._op.labels(len(branches))
        return _Call(selector, branches, operand_vts, may_write, read_as, speculate_only, labels)

    def _known_index(self, call: _Call) -> int | None:
        """The branch a SymBool or SymInt selector takes for every input that the
        compiled graph's guards admit, or None. Only torch.compile folds it: dynamo's
        guards check the sizes' ranges on every call. An exported program has no such
        guards, and export traces a dynamic size as at least 2 while the program admits
        0 and 1, so there every branch stays."""
        if (
            not isinstance(call.selector, _variables().SymNodeVariable)
            or torch.compiler.is_exporting()
        ):
            return None
        return self._op.known_index(call.selector.sym_num, len(call.branches))

    def _taken_branch(self, tx, call: _Call):
        """Inline the branch that a constant selector takes."""
        constant = call.selector.as_python_constant()
        with _as_eager_raises():  # refuses a non-selector constant, e.g. None
            index = self._op.taken_index(constant, len(call.branches))
        self._op.warn_if_exporting(constant)
        return call.branches[index].call_function(tx, list(call.operands), {})

    def _refuse_writes_under_jvp(self, call: _Call, branches: list[_Branch]) -> None:
        """Refuse branches that write to their inputs under torch.func.jvp (jacfwd,
        hessian), as the functorch rule does. The refusal happens here because AOTAutograd
        runs that rule inside the forward-AD level of dynamo's graph. A refusal there
        leaves the level on (2.11-2.15)."""
        if not transform_level_active(JVP_TRANSFORM):
            return
        written = sorted({i for b in branches for i in _written_operands(b, call.operands)})
        with _as_eager_raises():
            self._op.refuse_writes(written, len(call.operands), call.labels)

    def _speculate(self, tx, name, branch, operand_vts, may_write: bool, facts=()) -> _Branch:
        """Trace one branch into a subgraph, and check what it writes and returns.

        The branch is traced assuming ``facts``; its checks that they do not settle
        become checks in its graph (``branch_facts.assuming``)."""
        with assuming(tx.output.shape_env, facts, name) as assumed:
            (ret_val, ret_spec), graph, lifted = self._subgraph(
                tx, name, branch, operand_vts, may_write
            )
        insert_checks(graph, assumed.checks, name)
        if not may_write and _writes_an_input(graph):
            # Under vmap, dynamo's own check compares the versions of the batched
            # wrappers, which a write to the tensor inside them leaves unchanged.
            raise _select_write_error(name)
        if (
            torch.compiler.is_exporting()
            and transform_level_active(VMAP_TRANSFORM)
            and _writes_an_input(graph)
        ):
            # Strict export traces dynamo's graph again, and a refusal there would
            # leave the vmap level on (2.11-2.15). So the refusal happens here.
            raise _vmapped_write_error(name)
        tx.fake_mode.epoch += 1  # so that branches share no memo of unbacked bindings
        ret_val = self._branch_outputs(graph, ret_val, ret_spec)
        return _Branch(ret_val, ret_spec, graph, lifted, dict(tx.output.nn_modules))

    def _subgraph(self, tx, name, branch, operand_vts, may_write: bool):
        """Return ``speculate_subgraph``'s result for one branch. Its errors name the branch."""
        from torch._dynamo.exc import Unsupported

        hop = _hop()
        hop._check_supported_callable_arg(tx, branch, name)
        try:
            return hop.speculate_subgraph(
                tx,
                _settling_branch(branch, name, may_write, self._op.state_rules),
                operand_vts,
                {},
                self._HOP_NAME,
                source_target=self.value,
                should_flatten_outputs=True,
                # None outputs leave the graph and come back when the output is
                # rebuilt, as in eager mode. _branch_outputs later refuses the other
                # constants, except numbers.
                remove_consts_from_outputs=True,
                # A write to an input (an operand, a buffer, a lifted tensor) stays
                # in the branch graph. tracing.py makes it an output, and the rule
                # that records the conditional writes it back. An output that is an
                # input, or a view of one, is also copied there.
                supports_input_mutation=may_write,
                supports_aliasing=True,
            )
        except Unsupported as error:  # name the branch dynamo could not trace
            if not may_write and "input mutation" in str(error):
                # These are dynamo's words for a write to a subgraph input
                # (checked on 2.11-2.15).
                raise _select_write_error(name) from None
            error.msg = f"{name}: {error.msg}"
            error.args = (error.msg, *error.args[1:])
            raise

    def _branch_outputs(self, graph, ret_val, ret_spec):
        """Return the variables a branch returns. Each symbol it returns as a number is
        kept out of its graph. Anything other than tensors and numbers is refused."""
        v = _variables()
        numbers = self._op.number_rules.value_positions(_python_treespec(ret_spec))
        ret_val = _symbols_out_of_graph(graph, ret_val, ret_spec, numbers, v)
        if not _hop().only_consist_of(ret_val, (v.TensorVariable, v.ConstantVariable)) or any(
            value is not None and k not in numbers
            for k, value in enumerate(ret_spec.const_values or ())
        ):
            self._refuse("branches must return pytrees of tensors and numbers", ret_val)
        return ret_val

    def _check_branch_outputs(self, tx, labels: list[str], branches: list[_Branch]) -> None:
        """Refuse branches whose outputs cannot be one operator's outputs, as eager does.
        This covers outputs of different structures and outputs that ``check_outputs`` refuses."""
        first = branches[0]
        for other in branches[1:]:
            if _different_structures(tx, first.spec, other.spec):
                specs = [_python_treespec(first.spec), _python_treespec(other.spec)]
                # A number against a tensor, or against another kind of number, gets
                # eager's error.
                with _as_eager_raises():
                    self._op.number_rules.check_kinds_in_specs(labels, specs)
                self._refuse(
                    "branches return different pytree structures",
                    (first.spec.treespec, other.spec.treespec),
                )
        _number_values(tx, branches, self._op.number_rules)
        outputs = [_example_outputs(branch.graph) for branch in branches]
        with _as_eager_raises():
            self._op.check_outputs(outputs, labels, _python_treespec(first.spec))

    def _emit(self, tx, call: _Call, branches: list[_Branch]):
        """Emit our operator's node, with the branch graphs installed as attributes.
        Return its outputs as variables."""
        hop = _hop()
        shared = self._merge_lifted_inputs(branches, call.operands)
        if call.read_as is not None:
            shared = _read_closures_as(tx, call.read_as, shared, call.operands)
        graph_nodes = []
        for j, branch in enumerate(branches):
            gm = torch.fx.GraphModule(branch.modules, branch.graph)
            name = tx.output.install_subgraph(f"{self._HOP_NAME}_branch_{j}", gm)
            graph_nodes.append(hop.make_attr(tx, name))
        proxy_args = (call.selector.as_proxy(), *graph_nodes, tuple(shared))
        last = next(iter(reversed(tx.output.graph.nodes)))
        first = branches[0]
        made_inside = _made_inside(first.ret_val, first.graph)
        result = hop._call_function_and_unflatten_output(
            tx, self.value, proxy_args, {}, None, first.spec, made_inside
        )
        _user_stack_traces(last)
        return result

    @staticmethod
    def _merge_lifted_inputs(branches: list[_Branch], operand_vts) -> list:
        """Give every branch graph the union of all branches' lifted inputs, and return it.
        Size symbols come first (``_symbols_first``). The operands that a branch reads
        follow, in their order, then what the branches close over, by first use."""
        union: dict = {}
        for branch in branches:
            for outer in branch.lifted:
                union.setdefault(_lift_key(outer), outer)
        traced = (_variables().TensorVariable, _variables().SymNodeVariable)
        operand_keys = [_lift_key(vt.as_proxy()) for vt in operand_vts if isinstance(vt, traced)]
        first = {k: union[k] for k in operand_keys if k in union}
        shared = _symbols_first([*first.values(), *(p for k, p in union.items() if k not in first)])
        for branch in branches:
            _take_shared_inputs(branch, shared)
        return shared

    def _refuse(self, what: str, context) -> None:
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type=f"{self._HOP_NAME}: {what}",
            context=str(context),
            explanation=f"{self._HOP_NAME}(selector, branch_0, ..., branch_n, operands) "
            "needs a tensor or symbolic selector, callables returning pytrees of tensors "
            "with one structure, and a tuple of tensor operands",
            hints=[],
        )


# These look up dynamo's names when a conditional is traced, not at import. This module
# is imported before dynamo, and the classes are made while dynamo's package is still
# being imported.
def _variables():
    from torch._dynamo import variables

    return variables


def _hop():
    from torch._dynamo.variables import higher_order_ops

    return higher_order_ops


@contextlib.contextmanager
def _as_eager_raises():
    """Pass a ``CondError`` raised in the block to the caller, as the same call raises it
    eagerly (see ``compile_time_error``)."""
    try:
        yield
    except CondError as error:
        raise compile_time_error(type(error), str(error)) from None


def _different_structures(tx, spec, other) -> bool:
    """Return whether two branches' output specs differ in pytree structure, or in the
    positions of the constants left out of the graph."""
    same = _hop()._make_inlined(tx, pytree.TreeSpec.__eq__)(spec.treespec, other.treespec)
    return (
        not same.as_python_constant()
        or other.masks_to_filter_const_values != spec.masks_to_filter_const_values
    )


def _lift_key(proxy):
    node = proxy.node
    return ("attr", node.target) if node.op == "get_attr" else ("node", node)


def _symbols_first(inputs: list) -> list:
    """Put the symbolic sizes first, as dynamo lifts them. Dynamo's runtime-assert pass
    binds each size symbol at the first input that has it. A tensor batched by vmap
    cannot be asked its size there, so the symbol must come before it."""
    return sorted(
        inputs, key=lambda p: not isinstance(p.node.meta.get("example_value"), torch.SymInt)
    )


def _take_shared_inputs(branch: _Branch, shared: list) -> None:
    """Give ``branch``'s graph a placeholder for each of the ``shared`` lifted inputs,
    in their order, in place of the placeholders it lifted itself."""
    graph = branch.graph
    inner_by_key = {_lift_key(o): inner for o, inner in branch.lifted.items()}
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first):
        for outer in shared:
            placeholder = graph.placeholder(outer.node.name)
            placeholder.meta = outer.node.meta
            old = inner_by_key.get(_lift_key(outer))
            if old is not None:
                old.node.replace_all_uses_with(placeholder)
                graph.erase_node(old.node)


def _made_inside(ret_val, graph):
    """Return the first branch's outputs that dynamo may re-point at the node's outputs.

    Dynamo sets the node's outputs as the values of the variables a branch returned.
    Code after the call then sees the conditional's result. A variable that the branch
    returned unchanged, such as an operand or a tensor it closes over, belongs to the
    caller. It must keep meaning the input. If it were re-pointed, ``x`` after
    ``cond(p, lambda x: x, g, (x,))`` would be the conditional's output.
    """
    v = _variables()
    return v.TupleVariable(
        [
            vt
            if getattr(getattr(vt, "proxy", None), "node", None) is not None
            and vt.proxy.node.graph is graph
            else v.ConstantVariable.create(None)
            for vt in ret_val.items
        ]
    )


def _user_stack_traces(last) -> None:
    """Keep the user's frames only, in the stack traces of the nodes emitted after ``last``."""
    node = last.next
    while node is not last and node.op != "root":  # the nodes just emitted
        if node.stack_trace:
            node.stack_trace = user_stack_trace(node.stack_trace)
        node = node.next


# --- what a branch changes outside itself ---------------------------------------------
#
# Dynamo refuses a branch's side effect on anything made outside the branch ("HOP:
# Unsafe side effect") when it sees one. But a branch runs as the branch of a
# conditional, so only the taken branch's effects may land. A buffer that the branch
# assigns is carried as a write into the buffer (``buffer.copy_(new)``). The
# conditional handles that like any write to what it closes over. Everything else is
# refused by name, with the rules of ``_src/state.py``. So while a branch is
# speculated, dynamo's check (``SideEffects.check_allowed_side_effect``), wrapped by
# ``_recording``, records what the branch changes and lets it happen. When the branch
# returns, ``_settle`` puts the state back and emits the writes.
#
# These were checked on torch 2.11, 2.13, 2.14 and 2.15: the check, the
# ``allow_side_effects_in_hop`` flag of a subgraph tracer, ``store_attr_mutations``,
# ``ConstDictVariable.items`` (keys wrap a ``.vt``) and ``ListVariable.items``. From
# 2.13 on, the flag also stops dynamo from deferring a constant's store to a check of
# its own.
#
# Dynamo traces ``nn.Module.__setattr__``. A buffer or parameter that a branch assigns
# shows as a change to the module's ``_buffers`` or ``_parameters`` dict.
# ``__setattr__`` calls ``inspect.signature``, whose result ``OutputGraph.signature_cache``
# keeps.


class _Seen:
    """An object a branch changed, as it was before the branch changed it."""

    items: Any  # the variable's own dict or list of variables, copied
    __slots__ = ("attrs", "item", "items", "modified", "reconstruct_all")

    def __init__(self, side_effects, item):
        self.item = item
        attrs = side_effects.store_attr_mutations.get(item) if _attribute_mutation(item) else None
        self.attrs = dict(attrs or {})
        items = getattr(item, "items", None)
        self.items = items.copy() if isinstance(items, (dict, list)) else None
        self.modified = getattr(item.mutation_type, "is_modified", None)
        self.reconstruct_all = getattr(item, "should_reconstruct_all", None)

    def restore_items(self) -> None:
        items = self.item.items
        if isinstance(items, dict):
            items.clear()
            items.update(self.items)
        else:
            items[:] = self.items
        if self.modified is not None:
            self.item.mutation_type.is_modified = self.modified
        if self.reconstruct_all is not None:
            self.item.should_reconstruct_all = self.reconstruct_all


class _BranchEffects:
    """What one branch, speculated in ``tracer``, changes that it did not make."""

    def __init__(self, tracer):
        self.tracer = tracer
        self.seen: dict[int, _Seen] = {}

    def see(self, side_effects, item) -> None:
        if id(item) not in self.seen:
            self.seen[id(item)] = _Seen(side_effects, item)


def _attribute_mutation(item) -> bool:
    from torch._dynamo.variables.base import AttributeMutation

    return isinstance(item.mutation_type, AttributeMutation)


def _outside(item) -> bool:
    """Return whether ``item`` was made outside the branch being traced (dynamo's own test)."""
    from torch._dynamo.variables.base import is_side_effect_safe

    return item.mutation_type is not None and not is_side_effect_safe(item.mutation_type)


@contextlib.contextmanager
def _recording(tx, effects: _BranchEffects):
    """Record in ``effects``, and allow, a speculated branch's side effects on what it
    did not make. ``_settle`` decides on them when the branch returns."""
    from torch._dynamo.side_effects import SideEffects

    previous = SideEffects.__dict__["check_allowed_side_effect"]

    def check_allowed_side_effect(side_effects, item):
        output = side_effects.output_graph_weakref()
        tracer = output.current_tx.output.current_tracer if output is not None else None
        if tracer is effects.tracer and _outside(item):
            effects.see(side_effects, item)
            return True
        return previous(side_effects, item)

    tracer = tx.output.current_tracer
    allowed = tracer.allow_side_effects_in_hop
    SideEffects.check_allowed_side_effect = check_allowed_side_effect  # type: ignore[method-assign]
    tracer.allow_side_effects_in_hop = True
    try:
        yield
    finally:
        tracer.allow_side_effects_in_hop = allowed
        SideEffects.check_allowed_side_effect = previous  # type: ignore[method-assign]


def _select_write_error(name: str):
    return compile_time_error(
        BranchMutationError,
        f"{name}: input mutation (a write in place to an input), and every branch "
        "runs here, taken or not (strategy='select'). Under torch.compile "
        "such a write cannot be selected per branch: use strategy='auto', "
        "or return the new value instead (x + 1 rather than x.add_(1))",
    )


def _refuse_tangentless_in_exported_jvp(name: str, labels, branches) -> None:
    """Refuse a branch output without a tangent under torch.func.jvp in strict export,
    where every branch runs (strategy="select"). torch.export holds such a tensor as a
    constant (2.11-2.15), so the program would ignore its inputs."""
    if not (torch.compiler.is_exporting() and transform_level_active(JVP_TRANSFORM)):
        return
    for label, branch in zip(labels, branches):
        for j, value in enumerate(_example_outputs(branch.graph)):
            if not isinstance(value, torch.Tensor):
                continue
            try:
                unpacked = torch.autograd.forward_ad.unpack_dual(value, level=0)
            except RuntimeError:  # under vmap, torch 2.14 has no batching rule for it
                continue
            if unpacked.tangent is None:
                what = name.removeprefix("torchcond_")
                raise compile_time_error(
                    UnsupportedCondError,
                    f"{what}: output {j} of {label} carries no tangent under torch.func.jvp, "
                    "and torch.export holds such a tensor as a constant when every branch "
                    "runs (strategy='select'); use strategy='auto'",
                )


def _vmapped_write_error(name: str):
    return compile_time_error(
        BranchMutationError,
        f"{name}: a write in place to an input under torch.vmap, which torch.export "
        "cannot write back; return the new value instead (x + 1 rather than x.add_(1))",
    )


# Tensor methods that return a view of self. A write to the view is a write to self.
_VIEW_METHODS = frozenset(
    "view view_as reshape reshape_as __getitem__ t transpose permute unsqueeze squeeze "
    "expand expand_as narrow select as_strided flatten unflatten diagonal movedim "
    "swapaxes unfold split chunk unbind real imag detach".split()
)
_IN_PLACE = "iadd isub imul itruediv ifloordiv imod ipow iand ior ixor setitem".split()
_IN_PLACE_OPERATORS = frozenset(getattr(operator, n) for n in _IN_PLACE)
_IN_PLACE_DUNDERS = frozenset(f"__{n}__" for n in _IN_PLACE)


def _writes_an_input(graph: torch.fx.Graph) -> bool:
    """Return whether a branch graph that dynamo traced writes in place to an input."""
    return bool(_written_inputs(graph))


def _written_operands(branch: _Branch, operand_vts) -> set[int]:
    """Return the positions of the operands that ``branch`` writes to. The position
    ``len(operand_vts)`` stands for the tensors it closes over."""
    traced = (_variables().TensorVariable, _variables().SymNodeVariable)
    keys = [_lift_key(vt.as_proxy()) if isinstance(vt, traced) else None for vt in operand_vts]
    outer = {inner.node: _lift_key(o) for o, inner in branch.lifted.items()}
    found = (outer.get(node) for node in _written_inputs(branch.graph))
    return {keys.index(k) if k in keys else len(keys) for k in found}


def _written_inputs(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Return the inputs that a traced branch graph writes in place, directly or through
    a view. A write is a Tensor method ending in ``_``, an in-place operator, or ``out=``."""
    aliases = {n: n for n in graph.nodes if n.op == "placeholder"}
    written = set()
    for node in graph.nodes:
        if node.op not in ("call_method", "call_function"):
            continue
        first = node.args[0] if node.args else None
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if first in aliases and (name in _VIEW_METHODS or node.target is operator.getitem):
            aliases[node] = aliases[first]
        in_place = (
            (name.endswith("_") and not name.startswith("_"))
            or name in _IN_PLACE_DUNDERS
            or node.target in _IN_PLACE_OPERATORS
        )
        if in_place and first in aliases:
            written.add(aliases[first])
        written.update(
            aliases[a] for a in pytree.tree_leaves(node.kwargs.get("out")) if a in aliases
        )
    return written


def _settling_branch(branch, label: str, may_write: bool, state_rules):
    """Wrap ``branch`` so that its effects outside itself are settled when it returns."""
    from torch._dynamo.variables.base import VariableTracker

    class SettlingBranch(VariableTracker):
        _nonvar_fields = {"label", "may_write", *VariableTracker._nonvar_fields}  # noqa: RUF012

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.branch = branch
            self.label = label
            self.may_write = may_write

        def get_function(self):  # names the graph's placeholders after its arguments
            return self.branch.get_function()

        def call_function(self, tx, args, kwargs):
            effects = _BranchEffects(tx.output.current_tracer)
            # Dynamo memoizes inspect.signature's result. Its attributes are side
            # effects of the branch that made it, and the next branch would read it
            # without them. So the entries that a branch adds are dropped after it.
            signatures = tx.output.signature_cache
            known = dict(signatures)
            hooks = set(tx.output.side_effects.tensor_hooks)
            try:
                with _recording(tx, effects):
                    out = self.branch.call_function(tx, args, kwargs)
            finally:
                signatures.clear()
                signatures.update(known)
            _refuse_hooks(tx, hooks, self.label, state_rules)
            _settle(tx, effects, self.label, self.may_write, state_rules)
            return out

    return SettlingBranch()


_REGISTRY_DICTS = ("_buffers", "_parameters", "_modules")


def _refuse_hooks(tx, known: set, label: str, state_rules) -> None:
    """Refuse a hook that the branch registered. Dynamo keeps a subgraph's hook on a
    tensor from outside it nowhere, so it would be lost, taken or not. ``known`` holds
    the keys of ``SideEffects.tensor_hooks`` (torch 2.11-2.15) before the branch."""
    for key, (tensor, _hook, _handle, what) in tx.output.side_effects.tensor_hooks.items():
        if key in known:
            continue
        try:
            state_rules.refuse_autograd_state(label, what, _example(tensor), _describe(tensor))
        except CondError as error:
            raise compile_time_error(type(error), str(error)) from None


def _settle(tx, effects: _BranchEffects, label: str, may_write: bool, state_rules) -> None:
    """Turn the branch's buffer assignments into writes, and put back the state it
    changed. Refuse the rest with eager's ``BranchMutationError``, raised through dynamo."""
    try:
        writes = []
        for seen in effects.seen.values():
            if not _outside(seen.item):
                continue
            registry = _registry(seen.item.source)
            if registry is not None and isinstance(seen.items, dict):
                writes += _registry_changes(seen, registry, label, may_write, state_rules)
            elif _attribute_mutation(seen.item):
                _attribute_changes(tx, seen, label, state_rules)
            elif seen.items is not None and _same_items(seen.item.items, seen.items):
                continue
            else:
                kind = _python_type_name(seen.item)
                state_rules.refuse_python_state(label, _describe(seen.item), kind)
    except CondError as error:
        raise compile_time_error(type(error), str(error)) from None
    for buffer, new in writes:
        buffer.call_method(tx, "copy_", [new], {})


def _registry_changes(seen: _Seen, member: str, label: str, may_write: bool, state_rules):
    """Return ``(buffer, new value)`` for each buffer the branch assigned, and restore the
    module's ``member`` dict. Refuse an assigned parameter or submodule."""
    owner = _source_text(seen.item.source)
    now = seen.item.items
    writes = []
    for key in [*seen.items, *(k for k in now if k not in seen.items)]:
        old, new = seen.items.get(key), now.get(key)
        if old is new:
            continue
        attr = f"{owner}.{key.vt.as_python_constant()}"
        old = None if old is None else old.realize()
        new = None if new is None else new.realize()
        state_rules.check_registry_change(
            label,
            attr,
            member,
            state_rules.absent if old is None else _example(old),
            state_rules.absent if new is None else _example(new, python=True),
            under_select=not may_write,
        )
        writes.append((old, new))
    seen.restore_items()
    return writes


def _attribute_changes(tx, seen: _Seen, label: str, state_rules) -> None:
    """Refuse an attribute the branch set, unless the branch set it back as it was. A
    flag that a context manager flips and restores is an example."""
    now = tx.output.side_effects.store_attr_mutations.get(seen.item, {})
    for name, value in now.items():
        before = seen.attrs.get(name)
        if value is before:
            continue
        if value.is_python_constant():
            if before is not None and before.is_python_constant():
                original = before.as_python_constant()
            else:
                original = getattr(getattr(seen.item, "value", None), name, _MISSING)
            if original is not _MISSING and _same_constant(value.as_python_constant(), original):
                continue
        owner = _describe(seen.item)
        what = name if owner is None else f"{owner}.{name}"
        if name == "cell_contents":
            what = "a variable it closes over" if owner is None else owner
        state_rules.refuse_attribute(label, what, _example(value.realize(), python=True))


_MISSING = object()


def _same_constant(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # a comparison that raises is no proof of sameness
        return False


def _same_items(now, before) -> bool:
    if isinstance(now, dict):
        return now.keys() == before.keys() and all(now[k] is before[k] for k in now)
    return len(now) == len(before) and all(a is b for a, b in zip(now, before))


def _example(vt, python: bool = False):
    """Return the fake tensor that a tensor variable stands for. With ``python``, return a
    constant's Python value, or an ``_Unnamed`` stand-in for anything else."""
    from torch._dynamo.variables import TensorVariable

    if isinstance(vt, TensorVariable):
        return vt.as_proxy().node.meta["example_value"]
    if python and vt.is_python_constant():
        return vt.as_python_constant()
    return _Unnamed(_python_type_name(vt)) if python else None


class _Unnamed:
    """Stands for a value in a message, by its type."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return self.kind


def _python_type_name(vt) -> str:
    try:
        return vt.python_type().__name__
    except Exception:  # a variable that does not say
        return type(vt).__name__


def _describe(vt) -> str | None:
    source = getattr(vt, "source", None)
    return None if source is None else _source_text(source)


def _registry(source) -> str | None:
    """Return ``_buffers``, ``_parameters`` or ``_modules`` if ``source`` is that dict of a
    module, else None. Both ``self._buffers`` and ``self.__dict__['_buffers']`` count."""
    member = getattr(source, "member", None)
    if member in _REGISTRY_DICTS:
        return member
    index = getattr(source, "index", None)
    if index in _REGISTRY_DICTS and getattr(source.base, "member", None) == "__dict__":
        return index
    return None


def _source_text(source) -> str:
    """Return a source as the user wrote it, such as ``self.log`` or ``CACHE['k']``.
    A module's registry dicts and its ``__dict__`` read as the module, since their items
    are its attributes."""
    for name in ("local_name", "global_name"):
        if hasattr(source, name):
            return getattr(source, name)
    if getattr(source, "freevar_name", ""):  # a cell's variable (2.11-2.15)
        return source.freevar_name
    base = getattr(source, "base", None)
    if base is None:
        return str(source)
    text = _source_text(base)
    if _registry(source) is not None:
        return text
    member = getattr(source, "member", None)
    if "_export_root" in (member, getattr(source, "index", None)):
        return "self"  # the user's module, as strict export's wrapper holds it
    if member is not None and text.startswith("__import_"):  # a global of a module
        return member
    if member is not None:
        return text if member in ("__dict__", "cell_contents") else f"{text}.{member}"
    index = getattr(source, "index", None)
    if isinstance(index, (str, int)):
        attribute = getattr(base, "member", None) == "__dict__" or _registry(base) is not None
        return f"{text}.{index}" if attribute else f"{text}[{index!r}]"
    return text  # a module, a cell, or an item named by a key's own source


def _read_closures_as(tx, read_as, shared: list, operand_vts) -> list:
    """Return the lifted inputs with each closed-over tensor replaced by
    ``read_as(tensor)``. Dynamo traces that call here, outside the branches."""
    from torch._dynamo.variables.builder import wrap_fx_proxy

    operands = {vt.as_proxy().node for vt in operand_vts if vt.is_tensor()}
    read = []
    for proxy in shared:
        value = proxy.node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and proxy.node not in operands:
            closure = wrap_fx_proxy(tx, proxy, example_value=value)
            proxy = read_as.call_function(tx, [closure], {}).as_proxy()
        read.append(proxy)
    return read


def _number_values(tx, speculated, number_rules) -> None:
    """Record what every branch returns for each number output (``number_rules.dynamo_info``).
    The record goes into the first branch's constants, which dynamo puts back into the output."""
    first = speculated[0][1]
    numbers = number_rules.value_positions(_python_treespec(first))
    if not numbers:
        return
    values = list(first.const_values)
    for value_at, tensor_at in numbers.items():
        per_branch = [
            _made_of(graph, spec, value_at, tensor_at) for _, spec, graph, _, _ in speculated
        ]
        values[value_at] = number_rules.dynamo_info(per_branch, tx.output.shape_env)
    first.const_values = type(first.const_values)(values)


def _made_of(graph, spec, value_at: int, tensor_at: int):
    """Return a number that a branch returns, as its constant if it has one. Dynamo does
    not let a branch return a float. For a float, return the constant or symbol that the
    graph made its 0-d tensor from (``torch.scalar_tensor(value)``, ``numbers.carried``)."""
    value = spec.const_values[value_at]
    if value is not None:
        return value
    (outputs,) = graph.find_nodes(op="output")[0].args
    graph_index = sum(1 for m in spec.masks_to_filter_const_values[:tensor_at] if not m)
    made_from = outputs[graph_index].args[0]
    if isinstance(made_from, torch.fx.Node):
        return made_from.meta.get("example_value")
    return made_from


def _symbols_out_of_graph(graph, ret_val, ret_spec, numbers: dict, variables):
    """Take each symbol that a branch returns as a number out of the graph's outputs.
    ``numbers`` holds their positions. ``ret_spec`` keeps each symbol as a constant, its
    example value, as dynamo keeps a Python number. The 0-d tensor beside it is what the
    conditional returns. Return ``ret_val`` without the symbols."""
    masks = list(ret_spec.masks_to_filter_const_values or ())
    if not any(not masks[k] for k in numbers):
        return ret_val
    consts = list(ret_spec.const_values)
    output = graph.find_nodes(op="output")[0]
    (outputs,) = output.args
    graph_at = [i for i, (m) in enumerate(masks) if not m]  # flat position per graph output
    dropped = set()
    for k in numbers:
        if not masks[k]:
            index = graph_at.index(k)
            consts[k] = outputs[index].meta["example_value"]
            masks[k] = True
            dropped.add(index)
    output.args = (tuple(n for i, n in enumerate(outputs) if i not in dropped),)
    ret_spec.masks_to_filter_const_values = type(ret_spec.masks_to_filter_const_values)(masks)
    ret_spec.const_values = type(ret_spec.const_values)(consts)
    items = [vt for i, vt in enumerate(ret_val.items) if i not in dropped]
    return variables.TupleVariable(items)


def _example_outputs(graph) -> list:
    """The fake values a speculated branch graph returns."""
    (outputs,) = graph.find_nodes(op="output")[0].args
    return [node.meta["example_value"] for node in outputs]


def _python_treespec(spec):
    """The output TreeSpec as a Python object (a variable tracker on some versions)."""
    treespec = spec.treespec
    if isinstance(treespec, pytree.TreeSpec) or treespec is None:
        return treespec
    try:
        return treespec.as_python_constant()
    except Exception:  # only used to name output paths in error messages
        return None
