"""What GPU software and hardware this machine has, for the skip conditions of the GPU tests."""

from __future__ import annotations

from hne_edge.runtime.backends.cuda import probe_cuda


def _torch_cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


# A CUDA device seen by torch or by cuda-python: the ONNX Runtime CUDA and TensorRT tests need only the
# device (their stream may come from cuda-python); the torch CUDA tests need torch's CUDA.
HAS_TORCH_CUDA = _torch_cuda_devices() > 0
HAS_CUDA = HAS_TORCH_CUDA or probe_cuda().available
try:
    import tensorrt  # noqa: F401  (installed or not is all we ask)

    HAS_TRT = True
except ImportError:
    HAS_TRT = False
try:
    import onnxruntime as _ort

    HAS_ORT_CUDA = "CUDAExecutionProvider" in _ort.get_available_providers()
except ImportError:
    HAS_ORT_CUDA = False
