"""torch.onnx's exporter (``dynamo=True``): where torchcond's translations register.

The exporter builds its registry afresh for each export from torchlib's list of
translations, the list torch's own ``torch.ops.higher_order.cond`` translation is in.
torchcond appends its own to that list once the module holding it is imported (by
the first ``torch.onnx.export``), so importing torchcond does not import onnxscript.
A translation registered this way receives each subgraph as an ONNX function, as
torch's translation for ``cond`` does, and builds nodes with torch's ``call_op``.

Checked on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0 (onnxscript 0.7.2, onnx-ir 1.1.0).
"""

from __future__ import annotations

from collections.abc import Callable

from .after_import import when_imported

# The module defining a registry entry; it imports the list (which imports it back).
_REGISTRATION = "torch.onnx._internal.exporter._registration"


def install(translations: dict) -> None:
    """Register ``translations`` ({operator: translation}) with the exporter."""
    when_imported(_REGISTRATION, lambda registration: _register(registration, translations))


def _register(registration, translations: dict) -> None:
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    for op, translation in translations.items():
        _torchlib_registry._registry.append(
            registration.OnnxDecompMeta(
                onnx_function=translation,
                fx_target=op,
                signature=None,
                # Its arguments include subgraphs, which have no ONNX type.
                skip_signature_inference=True,
            )
        )


def call_op() -> Callable:
    """``call_op(op_type, *inputs, _num_outputs=1, **attributes)``: a node in the
    graph being translated, for an op with several outputs or graph attributes."""
    from torch.onnx._internal.exporter._torchlib.ops.hop import call_op

    return call_op
