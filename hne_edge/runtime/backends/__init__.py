"""Backends for the anytime runtime, imported only when chosen (see :mod:`.base`)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ...errors import BackendUnavailable, InputError
from .base import Backend, Handle, Runner, Unit

__all__ = ["BACKENDS", "Backend", "Handle", "Runner", "Unit", "create_backend"]

# name -> "module:class"; modules are imported on first use so torch / TensorRT
# are never imported unless that backend is chosen.
BACKENDS: dict[str, str] = {
    "onnxruntime": "hne_edge.runtime.backends.onnxruntime:OnnxRuntimeBackend",
    "torch": "hne_edge.runtime.backends.torch:TorchBackend",
    # GPU backends: create_backend("onnxruntime", device="cuda") picks "onnxruntime-cuda" (see below)
    "onnxruntime-cuda": "hne_edge.runtime.backends.onnxruntime_cuda:OnnxRuntimeCudaBackend",
    "torch-cuda": "hne_edge.runtime.backends.torch_cuda:TorchCudaBackend",
    "tensorrt": "hne_edge.runtime.backends.tensorrt:TensorRTBackend",
}


def create_backend(name: str | Backend, device: str = "cpu", **options: Any) -> Backend:
    """The backend ``name`` (or an already built :class:`Backend`, returned as is)."""
    if isinstance(name, Backend):
        return name
    gpu = f"{name}-{str(device).split(':')[0]}"  # ("onnxruntime", "cuda:1") -> "onnxruntime-cuda"
    if device != "cpu" and gpu in BACKENDS:
        name = gpu
    if name not in BACKENDS:
        raise BackendUnavailable(f"received backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, attr = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    accepted = [p for p in inspect.signature(cls).parameters if p != "device"]
    unknown = sorted(k for k in options if k not in accepted)
    if unknown:
        raise InputError(
            f"backend {name!r} on device {device!r}: received option(s) {unknown}; expected some of {accepted}"
            + (" (cuda_graph needs a GPU backend: device='cuda')" if "cuda_graph" in unknown else "")
        )
    return cls(device=device, **options)
