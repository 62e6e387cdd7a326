"""``device="auto"``: the GPU when the chosen backend can use one here, else the CPU (torch-free).

The CLI's ``--device`` defaults to ``auto`` for every command (train and eval
resolve it in torch); the runtime resolves it here, per backend, before the
runner opens anything.
"""

from __future__ import annotations

__all__ = ["DEVICE_HELP", "resolve_device"]

DEVICE_HELP = "auto (a GPU when the backend can use one here, else the CPU) | cpu | cuda[:N]"


def resolve_device(backend: str, device: str) -> str:
    """``device`` itself unless it is ``"auto"``: then ``"cuda"`` when ``backend`` can run on a GPU here, else ``"cpu"``."""
    if device != "auto":
        return device
    if backend == "tensorrt":
        return "cuda"  # TensorRT runs on a GPU only; without one it fails with its own clear message
    if backend == "onnxruntime":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "cpu"  # the CPU package: no probe, no torch import
    from .backends.cuda import probe_cuda

    return "cuda" if probe_cuda().device_count else "cpu"
