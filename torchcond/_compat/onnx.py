"""Registers torchcond's translations with torch.onnx's exporter (``dynamo=True``).

The exporter builds a fresh registry for each export from torchlib's list of
translations. Torch's own translation for ``torch.ops.higher_order.cond`` is in that
list. torchcond appends its translations to the list when the exporter's registration
module is imported. The first ``torch.onnx.export`` imports it, so importing torchcond
does not import onnxscript. A translation registered this way receives each subgraph
as an ONNX function, like torch's translation for ``cond``. It builds nodes with
torch's ``call_op``.

Checked on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0 (onnxscript 0.7.2, onnx-ir 1.1.0).
"""

from __future__ import annotations

from collections.abc import Callable

from .after_import import when_imported

# This module defines a registry entry. It imports the list, and the list imports it back.
_REGISTRATION = "torch.onnx._internal.exporter._registration"


def install(translations: dict) -> None:
    """Register ``translations``, a dict from operator to translation, with the exporter."""
    when_imported(_REGISTRATION, lambda registration: _register(registration, translations))


def _register(registration, translations: dict) -> None:
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    for op, translation in translations.items():
        _torchlib_registry._registry.append(
            registration.OnnxDecompMeta(
                onnx_function=translation,
                fx_target=op,
                signature=None,
                # The operator's arguments include subgraphs, which have no ONNX type.
                skip_signature_inference=True,
            )
        )


def call_op() -> Callable:
    """Return torch's ``call_op(op_type, *inputs, _num_outputs=1, **attributes)``,
    which adds a node with several outputs or graph attributes to the graph being translated."""
    from torch.onnx._internal.exporter._torchlib.ops.hop import call_op

    return call_op
