"""PyTorch on CUDA: ``AnytimeRunner(bundle, backend="torch", device="cuda")``.

The CPU torch backend's units (``segment_module`` / ``node_module`` views of
the bundle's fused weights, BatchNorm folded, see :meth:`TorchBackend.prepare`)
moved to the GPU:

* **channels-last** weights and image (``channels_last=True``, the default):
  cuDNN's NHWC kernels, which tensor cores prefer.
* **fp16** with ``precision="fp16"``: the bundle's fp32 weights folded, then
  converted with ``.half()``, per unit module. Expected deviation from the fp32
  fused model: |logits| error below ~1e-2 for O(1) logits
  (tests/runtime/test_gpu_fakes.py uses atol 3e-2, rtol 1e-2).
* **fp32 means fp32**: cuDNN runs fp32 convolutions in TF32 unless told not
  to, which moved logits by 1.5e-4 on an H200. Each eager call and each
  capture runs under :class:`Fp32Policy`: TF32 off for cuDNN convolutions
  (``allow_tf32=True`` turns it on) and ``torch.backends.cudnn.benchmark``
  as ``cudnn_benchmark`` says, set on entry and put back exactly on exit, so
  the process's own torch settings are left alone outside the backend's calls.
* everything on **one stream** (a torch ``Stream`` of the backend); no
  synchronization until ``to_host`` (the leaf's logits).
* ``cuda_graph=True`` (the default): per runner, one CUDA graph per input
  shape (shape, dtype, strides). The first call of a shape runs eagerly (that
  run is the warm-up: cuDNN autotuning, lazy allocations) and the graph is
  captured right after it, so no call computes a unit twice; later calls copy
  the input into the graph's static input and replay. The capture replays
  the new graph once (off any frame: a graph's first launch also uploads it
  to the device, so it is slower than the later ones; issue 26). ``AnytimeRunner``'s
  construction warm-up is such a first call at the bundle's optimal batch
  size, so real frames of that size replay from the first one. At most
  ``max_graphs`` shapes are kept (least recently used dropped). If a paused
  session still holds a graph's outputs, that call runs eagerly instead (see
  :class:`~.cuda.SlotPool`). ``cuda_graph=False`` runs every call eagerly.

Hardware: ran on an NVIDIA H200 with torch 2.11 (issue 12: fp32 then failed
on TF32 and fp16 on unconverted weights, both fixed here without a GPU; the
fixes are tested on the CPU through a fake device, tests/runtime/test_gpu_fakes.py).
Uses no torch API newer than 2.11; the TF32 flags go through the
``fp32_precision`` API where torch has it and the ``allow_tf32`` flags before.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .base import Handle, LoadedPlan, Runner, Unit
from .cuda import CudaTimingMixin, GraphCache, Slot, TorchCuda, require_cuda
from .torch import TorchBackend, TorchRunner

__all__ = ["Fp32Policy", "TorchCudaBackend", "TorchCudaRunner"]


class Fp32Policy:
    """Context manager: torch's TF32 and cuDNN autotuning flags as the backend wants them, inside its calls only.

    On entry it reads the flags it is about to set and sets them; on exit it
    writes back exactly what it read. Only cuDNN's convolution flag is touched:
    every layer of the zoo's models is a convolution (classifier heads are 1x1
    convolutions), and matmul / RNN settings stay the user's. torch >= 2.9 has
    the ``fp32_precision`` API (``torch.backends.cudnn.conv.fp32_precision``,
    "ieee" or "tf32"); there, reading the legacy ``allow_tf32`` flag raises once
    conv and RNN differ, so the legacy flag is used only on a torch without the
    new API.

    Args:
        torch: the torch module (tests pass a stand-in).
        allow_tf32: False: fp32 convolutions in full fp32; True: in TF32.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` inside the calls; None: leave it alone.
    """

    def __init__(self, torch: Any, allow_tf32: bool = False, cudnn_benchmark: bool | None = True) -> None:
        backends = torch.backends
        conv = getattr(backends.cudnn, "conv", None)
        if conv is not None and hasattr(conv, "fp32_precision"):
            flags = [(conv, "fp32_precision", "tf32" if allow_tf32 else "ieee")]
        else:  # torch < 2.9
            flags = [(backends.cudnn, "allow_tf32", bool(allow_tf32))]
        if cudnn_benchmark is not None:
            flags.append((backends.cudnn, "benchmark", bool(cudnn_benchmark)))
        self.flags = flags
        self._saved: list[list[Any]] = []  # a stack: entered again from inside a call stays correct

    def __enter__(self) -> "Fp32Policy":
        self._saved.append([getattr(obj, name) for obj, name, _ in self.flags])
        for obj, name, value in self.flags:
            setattr(obj, name, value)
        return self

    def __exit__(self, *exc: object) -> None:
        for (obj, name, _), value in zip(self.flags, self._saved.pop()):
            setattr(obj, name, value)


class _Graph:
    """One captured graph of a unit: static input, replay, and its outputs as a pool slot."""

    def __init__(self, static_in: Any, replay: Any, outputs: tuple[Any, ...]) -> None:
        self.static_in = static_in
        self.replay = replay
        self.slot = Slot(outputs)
        self.slot.mark_baseline()


class TorchCudaRunner(TorchRunner):
    def activate_impl(self) -> None:
        super().activate_impl()
        b = self._backend
        self._policy = b.policy
        self._stream_context = b.cuda.stream_context
        self._graphs = GraphCache(self._capture, max_graphs=b.max_graphs) if b.cuda_graph else None
        self._pending: Any = None

    def _call(self, x: Any) -> tuple[Any, ...]:
        with self._policy:
            return self._call_unscoped(x)

    def _call_unscoped(self, x: Any) -> tuple[Any, ...]:
        out = self.module(x)
        return out if self._tuple else (out,)

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        x = inputs[0]
        with self._torch.inference_mode(), self._stream_context():
            if self._graphs is None:
                return self._call(x)
            key = (tuple(x.shape), x.dtype, tuple(x.stride()))
            graph = self._graphs.find(key)
            if graph is None:  # first call of this shape: computed once, eagerly; captured after it
                outs = self._call(x)
                self._pending = x
                try:
                    self._graphs.get(key)
                finally:
                    self._pending = None
                return outs
            if graph.slot.in_use():  # a paused session still holds the static outputs
                return self._call(x)
            graph.static_in.copy_(x)
            graph.replay()
            return graph.slot.handles

    def _capture(self, key: Any) -> _Graph:
        """Capture this unit for the pending input's shape; the caller's eager run was the first warm-up."""
        static_in = self._pending.clone()  # keeps the memory format (channels-last strides)
        for _ in range(self._backend.graph_warmup - 1):
            self._call(static_in)
        with self._policy:  # the kernels captured are chosen under the same flags as the eager runs
            replay, outputs = self._backend.cuda.capture_outputs(lambda: self._call_unscoped(static_in))
        replay()  # a graph's first launch also uploads it to the device: paid here, not by a frame's deadline
        return _Graph(static_in, replay, outputs)

    def release_impl(self) -> None:
        if getattr(self, "_graphs", None) is not None:
            self._graphs.clear()
        super().release_impl()


class TorchCudaBackend(CudaTimingMixin, TorchBackend):
    """Args:
    device: "cuda" or "cuda:N".
    channels_last: NHWC memory format for weights and activations (default True).
    cuda_graph: capture a CUDA graph per unit and input shape after its first (eager) call (default True).
    max_graphs: graphs kept per unit; the least recently used is dropped.
    graph_warmup: eager runs of a new shape before its capture, the call's own run included (>= 1).
    allow_tf32: TF32 for fp32 convolutions (default False: fp32 computes in fp32), inside the backend's
        calls only.
    cudnn_benchmark: ``torch.backends.cudnn.benchmark`` inside the backend's calls (None: the process's).
    fold_batchnorm: fold BatchNorm into the convolutions (as the CPU backend).
    threads: torch intra-op CPU threads (as the CPU backend).
    compile: ``torch.compile`` each unit's module (as the CPU backend; off by default). The compiled kernels are
        captured in the unit's CUDA graph like the eager ones (the first call of a batch size compiles, then
        captures). Not yet measured on a GPU: benchmarks/bench_kernels.py compares it with the eager graphs.
    """

    name = "torch"
    format = "torch"
    devices = ("cuda",)

    def __init__(
        self,
        device: str = "cuda",
        *,
        channels_last: bool = True,
        cuda_graph: bool = True,
        max_graphs: int = 4,
        graph_warmup: int = 1,
        allow_tf32: bool = False,
        cudnn_benchmark: bool | None = True,
        fold_batchnorm: bool = True,
        threads: int | None = None,
        compile: bool | str = False,
    ) -> None:
        if int(graph_warmup) < 1:
            raise ValueError(f"graph_warmup: received {graph_warmup}; expected >= 1 (the first call of a shape is one)")
        TorchBackend.__init__(self, device, threads=threads, fold_batchnorm=fold_batchnorm, compile=compile)  # the device; torch
        require_cuda(self.name, self.device_id, torch=True)
        self.cuda = TorchCuda(self.device_id)
        self.channels_last = bool(channels_last)
        self.cuda_graph = bool(cuda_graph)
        self.max_graphs = int(max_graphs)
        self.graph_warmup = int(graph_warmup)
        self.allow_tf32 = bool(allow_tf32)
        self.cudnn_benchmark = cudnn_benchmark
        self.policy = Fp32Policy(self.torch, self.allow_tf32, cudnn_benchmark)

    def place(self, module: Any) -> Any:
        module = module.to(self.cuda.device)
        if self.channels_last:
            module = module.to(memory_format=self.torch.channels_last)
        return module

    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        return TorchCudaRunner(unit, self, loaded)

    def from_host(self, array: np.ndarray) -> Handle:
        torch = self.torch
        with self.cuda.stream_context():
            x = torch.from_numpy(np.ascontiguousarray(array)).to(self.cuda.device)  # in the units' dtype already
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
        return x

    def to_host(self, handle: Handle) -> np.ndarray:
        with self.cuda.stream_context():
            out = handle.float().cpu()  # synchronous on our stream: the leaf's work is done when it returns
        return out.numpy()

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "backend": self.name,
            "device": self.device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": self.cuda.gpu_name(),
            "channels_last": self.channels_last,
            "fold_batchnorm": self.fold_batchnorm,
            "cuda_graph": self.cuda_graph,
            "allow_tf32": self.allow_tf32,
            "cudnn_benchmark": self.cudnn_benchmark,
            "compile": self.compile,
        }
