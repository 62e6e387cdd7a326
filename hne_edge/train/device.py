"""Where training runs: the torch device a ``--device`` names, the CPU threads torch gets, the autocast dtype."""

from __future__ import annotations

import torch

from ..errors import InputError
from ..limits import free_cpus_threads
from .config import TrainConfig

__all__ = ["torch_device", "use_free_cpus", "amp_dtype_for"]


def torch_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu`` or ``cuda[:i]`` as a torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device: received {name!r}; no CUDA device is available (use cpu or auto)")
    return torch.device(name)


_TORCH_THREADS = torch.get_num_threads()  # torch's own default (one per physical core), before anyone changes it


def use_free_cpus() -> str | None:
    """Give torch its default threads, or fewer when other processes keep the CPUs busy
    (:func:`hne_edge.limits.free_cpus_threads`); when fewer, say so (``"1 torch thread (load average 16.8 on 2
    CPUs; --threads N to choose)"``), else None."""
    threads, why = free_cpus_threads(_TORCH_THREADS)
    torch.set_num_threads(threads)
    return f"{threads} torch thread{'s' if threads > 1 else ''} ({why}; --threads N to choose)" if why else None


def _amp_dtype(config: TrainConfig) -> torch.dtype | None:
    """The CUDA autocast dtype: ``auto`` is bfloat16 where the GPU supports it (no loss scaling), else float16."""
    if not config.amp:
        return None
    if config.amp_dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return getattr(torch, config.amp_dtype)


def amp_dtype_for(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the run trains in on ``device`` (None: float32; autocast is for CUDA only)."""
    return _amp_dtype(config) if device.type == "cuda" else None
