"""Backends for the anytime runtime, imported only when chosen (see :mod:`.base`)."""

from __future__ import annotations

import importlib
from typing import Any

from ...errors import BackendUnavailable
from .base import Backend, Handle, Runner, Unit

__all__ = ["BACKENDS", "Backend", "Handle", "Runner", "Unit", "create_backend"]

# name -> "module:class"; modules are imported on first use so torch / TensorRT
# are never imported unless that backend is chosen.
BACKENDS: dict[str, str] = {
    "onnxruntime": "hne_edge.runtime.backends.onnxruntime:OnnxRuntimeBackend",
    "torch": "hne_edge.runtime.backends.torch:TorchBackend",
}


def create_backend(name: str | Backend, device: str = "cpu", **options: Any) -> Backend:
    """The backend ``name`` (or an already built :class:`Backend`, returned as is)."""
    if isinstance(name, Backend):
        return name
    if name not in BACKENDS:
        raise BackendUnavailable(f"received backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, attr = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    return cls(device=device, **options)
