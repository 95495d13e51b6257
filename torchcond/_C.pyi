# Loading torchcond._C registers the torchcond operator library
# (torch.ops.torchcond.*) with the dispatcher; torchcond/_src/select_ops.py holds the typed
# Python entry points. Two of its functions are the operators' argument checks, which
# the fake kernels in _src/select_ops.py call; they raise ValueError or TypeError. The
# third tells the operators' Autograd kernels whether a derivative is needed.
import torch

def _check_select(
    pred: torch.Tensor, true_values: list[torch.Tensor], false_values: list[torch.Tensor]
) -> None: ...
def _check_select_n(index: torch.Tensor, cases: list[torch.Tensor], num_branches: int) -> None: ...
def _needs_derivative(values: list[torch.Tensor]) -> bool: ...
