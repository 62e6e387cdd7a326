"""Exporters: a trained HNE -> a verified bundle (ONNX per node / per leaf segment, TensorRT engines).

One module per format, sharing :mod:`.base`; heavy imports (torch, onnx,
TensorRT) happen when a function is first used, so importing this package
is cheap and works without them.

    from hne_edge.exporters import export_checkpoint, export_onnx
    export_onnx(model, "bundle/", precisions=("fp32", "fp16"), plan="both", batch=(1, 1, 16))
    export_checkpoint("runs/digits/checkpoint.pt", "bundle/")   # what `hne-edge export` runs
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import DEFAULT_OPSET, OutputMismatchError, ShapeError, Tolerance, TOLERANCES, ToleranceError

__all__ = [
    "DEFAULT_OPSET",
    "ShapeError",
    "ToleranceError",
    "OutputMismatchError",
    "Tolerance",
    "TOLERANCES",
    "export_checkpoint",
    "export_onnx",
    "export_standalone_network",
    "fold_batchnorm",
    "verify_bundle",
    "VerifyReport",
    "build_engines",
    "engine_compatibility",
]

_LAZY = {
    "export_checkpoint": ".checkpoint",
    "export_onnx": ".onnx",
    "export_standalone_network": ".onnx",
    "fold_batchnorm": ".onnx",
    "verify_bundle": ".verify",
    "VerifyReport": ".verify",
    "build_engines": ".tensorrt",
    "engine_compatibility": ".tensorrt",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
