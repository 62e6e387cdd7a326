"""PyTorch on CUDA: ``AnytimeRunner(bundle, backend="torch", device="cuda")``.

The CPU torch backend's units (``segment_module`` / ``node_module`` views of
the bundle's fused weights) moved to the GPU:

* **channels-last** weights and image (``channels_last=True``, the default):
  cuDNN's NHWC kernels, which tensor cores prefer.
* **fp16** with ``precision="fp16"``: the bundle's fp16 torch weights if it
  has them, else its fp32 weights converted with ``.half()``. Expected
  deviation from the fp32 fused model: |logits| error below ~1e-2 for
  O(1) logits (tests/test_gpu_backends.py uses atol 3e-2, rtol 1e-2).
* everything on **one stream** (a torch ``Stream`` of the backend); no
  synchronization until ``to_host`` (the leaf's logits).
* ``cuda_graph=True``: per runner, one CUDA graph per input shape
  (shape, dtype, strides), captured after ``graph_warmup`` eager runs and
  **re-captured when a new shape arrives** (at most ``max_graphs`` kept, least
  recently used dropped). Replay copies the input into the graph's static
  input and returns the graph's static outputs; if a paused session still
  holds those outputs, that call runs eagerly instead (see
  :class:`~.cuda.SlotPool`).

Not run on real hardware in the session that wrote it (no GPU was available);
tests/test_gpu_backends.py holds the GPU tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...bundle import Manifest
from ...errors import BackendUnavailable, BundleError
from .base import Handle, Runner, Unit
from .cuda import CudaTimingMixin, GraphCache, Slot, TorchCuda, _refcounts, parse_device
from .torch import TorchBackend, TorchRunner, _import_torch

__all__ = ["TorchCudaBackend", "TorchCudaRunner", "require_torch_cuda"]


def require_torch_cuda(torch: Any, device_id: int) -> None:
    """BackendUnavailable naming what torch lacks, unless CUDA device ``device_id`` is usable."""
    build = torch.version.cuda
    if build is None:
        found = f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    elif not torch.cuda.is_available():
        found = f"torch {torch.__version__} (CUDA {build}) sees no CUDA device (torch.cuda.is_available() is False)"
    elif torch.cuda.device_count() <= device_id:
        found = f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s)"
    else:
        return
    raise BackendUnavailable(
        f"backend 'torch' on device 'cuda{'' if device_id == 0 else f':{device_id}'}': {found}; expected a CUDA "
        f"build of torch and an NVIDIA GPU {device_id} with a working driver (or use device='cpu')"
    )


class _Graph:
    """One captured graph of a unit: static input, replay, and its outputs as a pool slot."""

    def __init__(self, static_in: Any, replay: Any, outputs: tuple[Any, ...]) -> None:
        self.static_in = static_in
        self.replay = replay
        self.slot = Slot(outputs)
        self.slot.baseline = _refcounts(self.slot.handles)


class TorchCudaRunner(TorchRunner):
    def activate_impl(self) -> None:
        super().activate_impl()
        b = self._backend
        self._stream = b.cuda.stream
        self._graphs = GraphCache(self._capture, max_graphs=b.max_graphs) if b.cuda_graph else None
        self._pending: Any = None

    def _call(self, x: Any) -> tuple[Any, ...]:
        out = self.module(x)
        return out if self._tuple else (out,)

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        torch = self._torch
        x = inputs[0]
        with torch.inference_mode(), torch.cuda.stream(self._stream):
            if self._graphs is None:
                return self._call(x)
            graph = self._graph_for(x)
            if graph.slot.in_use():  # a paused session still holds the static outputs
                return self._call(x)
            graph.static_in.copy_(x)
            graph.replay()
            return graph.slot.handles

    def _graph_for(self, x: Any) -> _Graph:
        self._pending = x
        try:
            return self._graphs.get((tuple(x.shape), x.dtype, tuple(x.stride())))
        finally:
            self._pending = None

    def _capture(self, key: Any) -> _Graph:
        """Warm up, then capture this unit for the pending input's shape (torch's documented recipe)."""
        x = self._pending
        static_in = x.clone()  # keeps the memory format (channels-last strides)
        for _ in range(self._backend.graph_warmup):
            self._call(static_in)
        held: dict[str, tuple] = {}

        def launch() -> None:
            held["out"] = self._call(static_in)

        replay = self._backend.cuda.capture(launch)
        return _Graph(static_in, replay, held["out"])

    def release_impl(self) -> None:
        if getattr(self, "_graphs", None) is not None:
            self._graphs.clear()
        super().release_impl()


class TorchCudaBackend(CudaTimingMixin, TorchBackend):
    """Args:
    device: "cuda" or "cuda:N".
    channels_last: NHWC memory format for weights and activations (default True).
    cuda_graph: capture a CUDA graph per unit and input shape (re-captured on a new shape).
    max_graphs: graphs kept per unit; the least recently used is dropped.
    graph_warmup: eager runs before each capture (cuDNN autotuning, lazy allocations).
    cudnn_benchmark: set ``torch.backends.cudnn.benchmark`` (process-wide; None: leave as is).
    threads: torch intra-op CPU threads (as the CPU backend).
    """

    name = "torch"
    format = "torch"
    devices = ("cuda",)

    def __init__(
        self,
        device: str = "cuda",
        *,
        channels_last: bool = True,
        cuda_graph: bool = False,
        max_graphs: int = 4,
        graph_warmup: int = 3,
        cudnn_benchmark: bool | None = True,
        threads: int | None = None,
    ) -> None:
        device_id = parse_device(self.name, device, self.devices)
        torch = _import_torch()
        require_torch_cuda(torch, device_id)
        TorchBackend.__init__(self, "cuda", threads=threads)
        self.device_id = device_id
        self.device = "cuda" if device_id == 0 else f"cuda:{device_id}"
        self.cuda = TorchCuda(device_id)
        self.channels_last = bool(channels_last)
        self.cuda_graph = bool(cuda_graph)
        self.max_graphs = int(max_graphs)
        self.graph_warmup = int(graph_warmup)
        if cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = bool(cudnn_benchmark)
        self.half = False

    def units(self, manifest: Manifest, bundle_dir: Path, plan: str, precision: str) -> list[Unit]:
        self.half = precision == "fp16"
        try:
            return super().units(manifest, bundle_dir, plan, precision)
        except BundleError:
            if precision != "fp16":
                raise
        # no fp16 weights file: convert the fp32 weights on the device
        units = super().units(manifest, bundle_dir, plan, "fp32")
        return [_retype(u, "float16") for u in units]

    def _load(self, manifest: Manifest) -> None:
        super()._load(manifest)
        torch = self.torch
        model = self.model.to(self.cuda.device)
        if self.half:
            model = model.half()
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model.eval()

    def create_runner(self, unit: Unit, manifest: Manifest, bundle_dir: Path) -> Runner:
        base = super().create_runner(unit, manifest, bundle_dir)
        return TorchCudaRunner(unit, self, base._kind, base._key)

    def from_host(self, array: np.ndarray) -> Handle:
        torch = self.torch
        with torch.cuda.stream(self.cuda.stream):
            x = torch.from_numpy(np.ascontiguousarray(array)).to(self.cuda.device)
            if self.half:
                x = x.half()
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
        return x

    def to_host(self, handle: Handle) -> np.ndarray:
        torch = self.torch
        with torch.cuda.stream(self.cuda.stream):
            out = handle.float().cpu()  # synchronous on our stream: the leaf's work is done when it returns
        return out.numpy()

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "backend": self.name,
            "device": self.device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(self.device_id),
            "channels_last": self.channels_last,
            "fp16": self.half,
            "cuda_graph": self.cuda_graph,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
        }


def _retype(unit: Unit, dtype: str) -> Unit:
    from dataclasses import replace

    def spec(t):
        return t if t.node is None else replace(t, dtype=dtype)

    return replace(unit, inputs=tuple(spec(t) for t in unit.inputs), outputs=tuple(spec(t) for t in unit.outputs))
