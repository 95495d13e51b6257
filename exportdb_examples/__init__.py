"""Export patterns for ``torchcond.cond`` and ``torchcond.switch``, one module each.

Every example module defines ``Model`` (an ``nn.Module`` whose ``forward`` uses
``cond`` or ``switch``), ``example_args``, ``dynamic_shapes`` (for
``torch.export.export``) and ``branch_inputs`` (inputs reaching every branch).
The cond examples mirror the cond entries of PyTorch's ExportDB; the rest are ours.
"""

from . import (
    cond_branch_class_method,
    cond_branch_nested_function,
    cond_branch_nonlocal_variables,
    cond_closed_over_variable,
    cond_operands,
    cond_predicate,
    cond_shape_predicate,
    different_output_sizes,
    nested_cond,
    parameters_and_buffers,
    pytree_operands_and_outputs,
    sibling_conds,
    switch_n_way,
)

_MODULES = (
    cond_branch_class_method,
    cond_branch_nested_function,
    cond_branch_nonlocal_variables,
    cond_closed_over_variable,
    cond_operands,
    cond_predicate,
    cond_shape_predicate,
    different_output_sizes,
    nested_cond,
    parameters_and_buffers,
    pytree_operands_and_outputs,
    sibling_conds,
    switch_n_way,
)

#: Example name (the module's short name) -> example module, sorted by name.
EXAMPLES = {m.__name__.rpartition(".")[2]: m for m in sorted(_MODULES, key=lambda m: m.__name__)}

__all__ = ["EXAMPLES"]
