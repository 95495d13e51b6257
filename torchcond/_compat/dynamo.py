"""Dynamo support for torchcond's operators (torch.compile, strict torch.export).

Dynamo picks a variable class for a higher-order operator by the operator's name,
from ``torch._dynamo.variables.higher_order_ops._hop_name_to_variable_class``; an
unknown name is a hard "unsupported HigherOrderOperator". We add two classes:

* cond: dynamo's ``CondHigherOrderVariable`` already speculates both branches, lifts
  closures and merges their inputs, but emits ``torch.ops.higher_order.cond``. We
  let it run and retarget the one node it appended to our operator.
* switch: dynamo has no N-way conditional, so the class below speculates every
  branch with ``speculate_subgraph`` and merges their lifted inputs itself.

Checked on torch 2.11.0 and 2.13.0 (identical internals for everything used here).
Importing dynamo costs most of a second, so nothing here runs until dynamo itself is
imported (see ``install``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

_HOP_VARIABLES = "torch._dynamo.variables.higher_order_ops"


def install(cond_op, switch_op) -> None:
    """Register the variable classes now if dynamo is loaded, else right after it loads."""
    module = sys.modules.get(_HOP_VARIABLES)
    if module is not None:
        _register(module, cond_op, switch_op)
    else:
        sys.meta_path.insert(0, _AfterImport(_HOP_VARIABLES, lambda m: _register(m, cond_op, switch_op)))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` once ``name`` has been imported, then steps aside."""

    def __init__(self, name, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_register(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_register
        return spec


def _register(hop, cond_op, switch_op) -> None:
    registry = hop.TorchHigherOrderOperatorVariable.make.__globals__["_hop_name_to_variable_class"]
    registry[cond_op.name()] = _cond_variable_class(hop)
    registry[switch_op.name()] = _switch_variable_class(hop)


# A branch that returns an operand (or a view of one) is fine: when the captured
# graph is traced again, tracing.py clones such outputs. Input mutation stays refused.
# 2.13 assigns both flags on every call (from grad mode), hence properties whose
# setters ignore the assignment.
_ALIASING_ALLOWED = property(lambda self: True, lambda self, value: None)
_MUTATION_REFUSED = property(lambda self: False, lambda self, value: None)


def _cond_variable_class(hop):
    class TorchcondCondVariable(hop.CondHigherOrderVariable):
        """Dynamo's cond capture, emitting ``torchcond_cond`` instead of torch's cond."""

        _HOP_NAME = "torchcond_cond"
        supports_aliasing = _ALIASING_ALLOWED
        supports_input_mutation = _MUTATION_REFUSED

        def _call_function(self, tx, args, kwargs):
            graph = tx.output.current_tracer.graph  # the subtracer's when nested
            tail = next(iter(reversed(graph.nodes)), None)
            result = super()._call_function(tx, args, kwargs)
            for node in reversed(graph.nodes):  # new nodes were appended after tail
                if node is tail:
                    break
                if node.op == "call_function" and node.target is torch.ops.higher_order.cond:
                    node.target = self.value
            return result

    return TorchcondCondVariable


def _switch_variable_class(hop):
    # Dynamo's package is still being imported when this runs: its names are
    # looked up when a switch is traced, not now.
    def variables():
        from torch._dynamo import variables

        return variables

    def refuse(what: str, context) -> None:
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type=f"torchcond_switch: {what}",
            context=str(context),
            explanation="torchcond_switch(index, branch_0, ..., branch_n, operands) "
            "needs a tensor/SymInt index, callables, and a tuple of tensor operands",
            hints=[],
        )

    def lift_key(proxy):
        node = proxy.node
        return ("attr", node.target) if node.op == "get_attr" else ("node", node)

    class TorchcondSwitchVariable(hop.TorchHigherOrderOperatorVariable):
        """N-way speculation: every branch becomes a subgraph taking the same inputs."""

        _HOP_NAME = "torchcond_switch"
        _ALLOW_FALLBACK_TO_EAGER = False

        def _call_function(self, tx, args, kwargs):
            v = variables()
            args, kwargs = v.lazy.LazyVariableTracker.realize_all((args, kwargs))
            if kwargs or len(args) < 3:
                refuse("bad arguments", args)
            index, branch_vts, operands = args[0], list(args[1:-1]), args[-1]
            if not isinstance(operands, (v.ListVariable, v.TupleVariable)):
                refuse("operands must be a tuple or list", operands)
            operand_vts = operands.unpack_var_sequence(tx)
            if not hop.only_consist_of(operands, (v.TensorVariable, v.ConstantVariable, v.SymNodeVariable)):
                refuse("operands must be tensors", operands)
            if index.is_python_constant():
                i = min(max(int(index.as_python_constant()), 0), len(branch_vts) - 1)
                return branch_vts[i].call_function(tx, list(operand_vts), {})
            if not isinstance(index, (v.TensorVariable, v.SymNodeVariable)):
                refuse("index must be an integer tensor or SymInt", index)

            speculated = [self._speculate(tx, j, b, operand_vts) for j, b in enumerate(branch_vts)]
            first_spec = speculated[0][1]
            for _, spec, *_ in speculated[1:]:
                if spec.treespec != first_spec.treespec:
                    refuse("branches return different structures", (first_spec.treespec, spec.treespec))
            shared = self._merge_lifted_inputs(speculated)
            graph_nodes = [
                hop.make_attr(tx, tx.output.install_subgraph(f"switch_branch_{j}", torch.fx.GraphModule(mods, g)))
                for j, (_, _, g, _, mods) in enumerate(speculated)
            ]
            proxy_args = (index.as_proxy(), *graph_nodes, tuple(shared))
            return hop._call_function_and_unflatten_output(
                tx, self.value, proxy_args, {}, None, first_spec, speculated[0][0]
            )

        def _speculate(self, tx, j, branch, operand_vts):
            hop._check_supported_callable_arg(tx, branch, f"branches[{j}]")
            (ret_val, ret_spec), graph, lifted = hop.speculate_subgraph(
                tx,
                branch,
                operand_vts,
                {},
                self._HOP_NAME,
                source_target=self.value,
                should_flatten_outputs=True,
                remove_consts_from_outputs=False,
                supports_input_mutation=False,
                supports_aliasing=True,
            )
            tx.fake_mode.epoch += 1
            if not hop.only_consist_of(ret_val, (variables().TensorVariable,)):
                refuse("branches must return tensors", ret_val)
            return ret_val, ret_spec, graph, lifted, dict(tx.output.nn_modules)

        @staticmethod
        def _merge_lifted_inputs(speculated):
            """Every branch graph takes the union of all branches' lifted inputs, one order."""
            union = {}
            for _, _, _, lifted, _ in speculated:
                for outer in lifted:
                    union.setdefault(lift_key(outer), outer)
            shared = sorted(union.values(), key=lambda p: p.node.name)
            for _, _, graph, lifted, _ in speculated:
                inner_by_key = {lift_key(o): inner for o, inner in lifted.items()}
                first = next(n for n in graph.nodes if n.op != "placeholder")
                with graph.inserting_before(first):
                    for outer in shared:
                        placeholder = graph.placeholder(outer.node.name)
                        placeholder.meta = outer.node.meta
                        old = inner_by_key.get(lift_key(outer))
                        if old is not None:
                            old.node.replace_all_uses_with(placeholder)
                            graph.erase_node(old.node)
            return shared

    return TorchcondSwitchVariable
