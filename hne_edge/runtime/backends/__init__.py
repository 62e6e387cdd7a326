"""Backends for the anytime runtime, imported only when chosen (see :mod:`.base`)."""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from ...errors import BackendUnavailable, InputError
from .base import Backend, Handle, LoadedPlan, Runner, Unit, device_name, parse_device

__all__ = ["BACKENDS", "BACKEND_NAMES", "Backend", "backend_class", "Handle", "LoadedPlan", "Runner", "Unit", "create_backend"]

log = logging.getLogger("hne_edge.runtime.gpu")

# (name, device kind) -> "module:class"; modules are imported on first use so torch / TensorRT
# are never imported unless that backend is chosen.
BACKENDS: dict[tuple[str, str], str] = {
    ("onnxruntime", "cpu"): "hne_edge.runtime.backends.onnxruntime:OnnxRuntimeBackend",
    ("torch", "cpu"): "hne_edge.runtime.backends.torch:TorchBackend",
    ("onnxruntime", "cuda"): "hne_edge.runtime.backends.onnxruntime_cuda:OnnxRuntimeCudaBackend",
    ("torch", "cuda"): "hne_edge.runtime.backends.torch_cuda:TorchCudaBackend",
    ("tensorrt", "cuda"): "hne_edge.runtime.backends.tensorrt:TensorRTBackend",
}
#: the names a user picks (the device picks the implementation), in registry order
BACKEND_NAMES: tuple[str, ...] = tuple(dict.fromkeys(name for name, _ in BACKENDS))


def backend_class(name: str, kind: str) -> type[Backend]:
    """The class registered for ``(name, device kind)`` (imports its module; KeyError when none is)."""
    module, attr = BACKENDS[(name, kind)].split(":")
    return getattr(importlib.import_module(module), attr)


def _canonical_device(device: str) -> str:
    """"cuda:0" -> "cuda", as :class:`Backend` names its device; a name it cannot parse is returned as is."""
    kind, _, index = str(device).partition(":")
    return device_name(kind, int(index)) if index.isdigit() else str(device)


def create_backend(name: str | Backend, device: str | None = None, *, fallback_to_cpu: bool = False,
                   **options: Any) -> Backend:
    """The backend ``name`` for ``device`` (None: "cpu"), or an already built :class:`Backend`, returned as is;
    ``options`` with it are refused (they are its constructor's), and so is a ``device`` other than its own.

    ``fallback_to_cpu``: when the GPU backend is unusable here (:class:`BackendUnavailable`), log the
    reason (warning) and return the same backend on the CPU, with ``fallback_reason`` set. Off by
    default: asking for CUDA and getting the CPU silently would break every latency budget.
    """
    if isinstance(name, Backend):
        if options:  # a built backend's options were its constructor's: dropping these silently runs another setup
            cls, names = type(name).__name__, sorted(options)
            raise InputError(f"{', '.join(names)}: received with a built backend ({cls}); expected them set on it: "
                             f"{cls}({', '.join(f'{k}=...' for k in names)})")
        if device is not None and _canonical_device(device) != name.device:  # nor run it on another device
            raise InputError(f"device: received {device!r}; expected the built backend's device {name.device!r}",
                             hint="build the backend for that device, or leave device out")
        return name
    device = "cpu" if device is None else device
    kinds = [k for n, k in BACKENDS if n == name]
    if not kinds:
        raise BackendUnavailable(f"received backend {name!r}; expected one of {sorted(BACKEND_NAMES)}")
    kind = str(device).partition(":")[0]
    if kind not in kinds:
        parse_device(name, device, tuple(kinds))  # raises: names the devices this backend runs on
    cls = backend_class(name, kind)
    accepted = [p for p in inspect.signature(cls).parameters if p != "device"]
    if "cuda_graph" not in accepted and options.get("cuda_graph") is False:  # no graph is what a CPU backend does
        options = {k: v for k, v in options.items() if k != "cuda_graph"}
    unknown = sorted(k for k in options if k not in accepted)
    if unknown:
        raise InputError(
            f"backend {name!r} on device {device!r}: received option(s) {unknown}; expected some of {accepted}"
            + (" (cuda_graph needs a GPU backend)" if "cuda_graph" in unknown else ""),
            hint="pass device='cuda'" if "cuda_graph" in unknown else None,
            cli_hint="pass --device cuda" if "cuda_graph" in unknown else None,
        )
    try:
        return cls(device=device, **options)
    except BackendUnavailable as exc:
        if kind == "cpu" or (name, "cpu") not in BACKENDS:
            raise
        if not fallback_to_cpu:
            hint = "or pass fallback_to_cpu=True to run on the CPU"
            raise BackendUnavailable(
                exc.args[0] if exc.args else str(exc), hint=f"{exc.hint}; {hint}" if exc.hint else hint,
                cli_hint=exc.cli_hint if exc.cli_hint is not None else "or pass --device cpu to run on the CPU",
            ) from None
        cpu = backend_class(name, "cpu")
        cpu_options = {k: v for k, v in options.items() if k in inspect.signature(cpu).parameters}
        log.warning("%s: %s requested but unusable, falling back to the CPU: %s", name, device, exc)
        backend = cpu(device="cpu", **cpu_options)
        backend.fallback_reason = str(exc)
        return backend
