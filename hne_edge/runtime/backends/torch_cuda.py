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
  as ``cudnn_benchmark`` says, set on entry and put back when the last call
  holding them leaves (runners in several threads included), so the
  process's own torch settings are left alone outside the backend's calls.
* everything on **one stream** (a torch ``Stream`` of the backend); no
  synchronization until ``to_host`` (the leaf's logits).
* ``cuda_graph=True`` (the default): per runner, one CUDA graph per **capture
  size** (vLLM's rule: 1, 2, 4, then multiples of 8 up to the bundle's max batch,
  and the max itself; ``capture_sizes`` chooses others). A call of ``r`` rows
  replays the graph of the smallest capture size ``>= r``: its rows are copied
  into the graph's static input (the rows beyond them keep what they held:
  every layer is per row), and the first ``r`` rows of each output are copied
  out, device to device, into tensors of the call's own - so a paused session
  holds its own outputs, never the graph's, and no call ever runs eagerly
  because one is paused (an eager call costs ~4 replays on an H200). The runner
  captures every capture size when it opens (``AnytimeRunner.warmup``: one eager
  call at the size - cuDNN autotuning, lazy allocations - the capture, and one
  replay, since a graph's first launch also uploads it: issue 26), and
  those graphs are kept for the runner's life: nothing is captured or evicted
  while serving (a capture cost 100-1,500 ms on an H200, and the stream scheduler
  took one for the cost of a step: issue 39). A shape never warmed is captured
  at its first call, after running it eagerly, and at most ``max_graphs`` such
  shapes are kept (least recently used dropped). ``cuda_graph=False`` runs every
  call eagerly.

Hardware: ran on an NVIDIA H200 with torch 2.11 (issue 12: fp32 then failed
on TF32 and fp16 on unconverted weights, both fixed here without a GPU; the
fixes are tested on the CPU through a fake device, tests/runtime/test_gpu_fakes.py).
Uses no torch API newer than 2.11; the TF32 flags go through the
``fp32_precision`` API where torch has it and the ``allow_tf32`` flags before.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ...errors import InputError
from .base import Handle, LoadedPlan, Runner, Unit, check_flag, check_positive
from .cuda import CudaTimingMixin, GraphCache, TorchCuda, WarmGraphsMixin, require_cuda
from .torch import TorchBackend, TorchRunner

__all__ = ["Fp32Policy", "TorchCudaBackend", "TorchCudaRunner", "capture_sizes"]


class Fp32Policy:
    """Context manager: torch's TF32 and cuDNN autotuning flags as the backend wants them, inside its calls only.

    On entry it sets the flags; when the last call holding them leaves, it
    writes back what they were before the first came. The flags are the
    process's (torch keeps one global context), so the holds are counted
    process-wide: runners serving in several threads enter and leave in any
    order, and a call never runs with another's restored flags (an earlier
    version saved and restored per entry, so thread B could run on with the
    user's TF32 that thread A put back). Where calls that hold them at once ask
    differently, fp32 wins over TF32 (a call that promised fp32 keeps it; a
    TF32 call then runs in fp32, never less precise) and cuDNN autotuning is on
    if one asks for it. cuDNN's convolution flag is touched:
    every layer of the zoo's models is a convolution (classifier heads are 1x1
    convolutions); matmul's too only when the units run matmuls (``matmul``:
    the ``pointwise="bmm"`` lever), else matmul / RNN settings stay the user's.
    torch >= 2.9 has the ``fp32_precision`` API
    (``torch.backends.cudnn.conv.fp32_precision``, "ieee" or "tf32"); there,
    reading the legacy ``allow_tf32`` flag raises once conv and RNN differ, so
    the legacy flags are used only on a torch without the new API.

    Args:
        torch: the torch module (tests pass a stand-in).
        allow_tf32: False: fp32 convolutions (and matmuls, with ``matmul``) in full fp32; True: in TF32.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` inside the calls; None: leave it alone.
        matmul: the units run matmuls (``torch.bmm``): their TF32 flag is set as the convolutions'.
    """

    def __init__(self, torch: Any, allow_tf32: bool = False, cudnn_benchmark: bool | None = True,
                 matmul: bool = False) -> None:  # fmt: skip
        backends = torch.backends
        conv = getattr(backends.cudnn, "conv", None)
        mm = getattr(getattr(backends, "cuda", None), "matmul", None)
        # (object, flag, the value asked, the value that wins when holders ask differently)
        if conv is not None and hasattr(conv, "fp32_precision"):
            mode = "tf32" if allow_tf32 else "ieee"
            flags = [(conv, "fp32_precision", mode, "ieee")]
            flags += [(mm, "fp32_precision", mode, "ieee")] if matmul else []
        else:  # torch < 2.9
            flags = [(backends.cudnn, "allow_tf32", bool(allow_tf32), False)]
            flags += [(mm, "allow_tf32", bool(allow_tf32), False)] if matmul else []
        if cudnn_benchmark is not None:
            flags.append((backends.cudnn, "benchmark", bool(cudnn_benchmark), True))
        self.flags = flags

    def __enter__(self) -> "Fp32Policy":
        with _FLAG_LOCK:
            for obj, name, value, wins in self.flags:
                hold = _FLAG_HOLDS.setdefault((id(obj), name), _FlagHold(obj, name, getattr(obj, name)))
                hold.asks.append(value)
                hold.apply(wins)
        return self

    def __exit__(self, *exc: object) -> None:
        with _FLAG_LOCK:
            for obj, name, value, wins in self.flags:
                hold = _FLAG_HOLDS[(id(obj), name)]
                hold.asks.remove(value)
                if hold.asks:
                    hold.apply(wins)
                else:
                    setattr(obj, name, hold.before)
                    del _FLAG_HOLDS[(id(obj), name)]


class _FlagHold:
    """One torch flag while calls hold it: its value before the first, and what each holder asked."""

    def __init__(self, obj: Any, name: str, before: Any) -> None:
        self.obj, self.name, self.before = obj, name, before
        self.asks: list[Any] = []

    def apply(self, wins: Any) -> None:
        value = wins if wins in self.asks else self.asks[-1]
        if getattr(self.obj, self.name) != value:
            setattr(self.obj, self.name, value)


_FLAG_LOCK = threading.Lock()
_FLAG_HOLDS: dict[tuple[int, str], _FlagHold] = {}


class _Graph:
    """One captured graph of a unit: its static input (``rows`` rows), replay, and its static outputs."""

    def __init__(self, static_in: Any, replay: Any, outputs: tuple[Any, ...]) -> None:
        self.static_in = static_in
        self.rows = static_in.shape[0]
        self.replay = replay
        self.outputs = outputs


def capture_sizes(lo: int, hi: int) -> list[int]:
    """The batch sizes graphs are captured for, in ``[lo, hi]``: 1, 2, 4, then multiples of 8, and ``hi`` (vLLM's
    ``cudagraph_capture_sizes``): a call is padded to the next one, so a few graphs serve every row count."""
    sizes = {b for b in (1, 2, 4, *range(8, hi + 1, 8)) if lo <= b <= hi}
    return sorted(sizes | {hi})


class TorchCudaRunner(TorchRunner):
    def activate_impl(self) -> None:
        super().activate_impl()
        b = self._backend
        self._policy = b.policy
        self._stream_context = b.cuda.stream_context
        self._graphs = (GraphCache(self._capture, max_graphs=b.max_graphs, on_capture=b.count_cold_call)
                        if b.cuda_graph else None)  # fmt: skip
        self._pending: Any = None
        self._shapes: set = set()  # the shapes run eagerly so far (without graphs): a new one is a cold call

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
                if (tuple(x.shape), x.dtype) not in self._shapes:
                    self._shapes.add((tuple(x.shape), x.dtype))
                    self._backend.count_cold_call()
                return self._call(x)
            rows = x.shape[0]
            size = self._backend.padded(rows)
            key = (size, tuple(x.shape[1:]), x.dtype, x.is_contiguous(memory_format=self._torch.channels_last))
            graph = self._graphs.find(key)
            if graph is None:  # first call of this shape: computed once, eagerly; captured after it
                outs = self._call(x)
                self._pending = x
                try:
                    self._graphs.get(key)
                finally:
                    self._pending = None
                return outs
            graph.static_in[:rows].copy_(x)
            graph.replay()
            return tuple(o[:rows].clone() for o in graph.outputs)  # the call's own: the next replay overwrites them

    def _capture(self, key: Any) -> _Graph:
        """Capture this unit at the key's size from the pending input (its rows, the rest zeros); the caller's eager
        run was the first warm-up when it had that size, else one runs here first."""
        x, size = self._pending, key[0]
        static_in = x.new_zeros((size, *x.shape[1:]))
        if x.dim() == 4 and key[3]:
            static_in = static_in.contiguous(memory_format=self._torch.channels_last)
        static_in[: x.shape[0]].copy_(x)
        for _ in range(self._backend.graph_warmup - (1 if size == x.shape[0] else 0)):
            self._call(static_in)
        with self._policy:  # the kernels captured are chosen under the same flags as the eager runs
            replay, outputs = self._backend.cuda.capture_outputs(lambda: self._call_unscoped(static_in))
        replay()  # a graph's first launch also uploads it to the device: paid here, not by a frame's deadline
        return _Graph(static_in, replay, outputs)

    def release_impl(self) -> None:
        if getattr(self, "_graphs", None) is not None:
            self._graphs.clear()
        super().release_impl()


class TorchCudaBackend(WarmGraphsMixin, CudaTimingMixin, TorchBackend):
    """Args:
    device: "cuda" or "cuda:N".
    channels_last: NHWC memory format for weights and activations (default True).
    cuda_graph: a CUDA graph per unit and capture size, captured when the runner opens (default True).
    capture_sizes: the batch sizes graphs are captured for (default :func:`capture_sizes` of the bundle's range);
        a call is padded to the smallest that holds its rows.
    max_graphs: graphs kept per unit beyond those captured when the runner opened (shapes never warmed); the
        least recently used is dropped.
    graph_warmup: eager runs of a new shape before its capture, the call's own run included (>= 1).
    allow_tf32: TF32 for fp32 convolutions (default False: fp32 computes in fp32), inside the backend's
        calls only.
    cudnn_benchmark: ``torch.backends.cudnn.benchmark`` inside the backend's calls (None: the process's).
    fold_batchnorm: fold BatchNorm into the convolutions (as the CPU backend).
    threads: torch intra-op CPU threads (as the CPU backend).
    compile: ``torch.compile`` each unit's module (as the CPU backend; off by default). The compiled kernels are
        captured in the unit's CUDA graph like the eager ones (the first call of a batch size compiles, then
        captures). Not yet measured on a GPU: benchmarks/bench_kernels.py compares it with the eager graphs.
    compile_mode, pointwise, dense_groups, bfloat16: the levers of the CPU backend (:class:`~.torch.TorchBackend`),
        captured in the unit's graphs like the rest; none yet measured on a GPU (``bench_kernels.py --levers``).
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
        capture_sizes: Sequence[int] | None = None,
        max_graphs: int = 4,
        graph_warmup: int = 1,
        allow_tf32: bool = False,
        cudnn_benchmark: bool | None = True,
        fold_batchnorm: bool = True,
        threads: int | None = None,
        compile: bool | str = False,
        compile_mode: str | None = None,
        pointwise: str = "conv",
        dense_groups: int = 1,
        bfloat16: bool = False,
    ) -> None:
        graph_warmup = check_positive(graph_warmup, "graph_warmup", " (the first call of a shape is one)")
        max_graphs = check_positive(max_graphs, "max_graphs")
        for name, flag in (("channels_last", channels_last), ("cuda_graph", cuda_graph), ("allow_tf32", allow_tf32)):
            check_flag(flag, name)
        if capture_sizes is not None and not (capture_sizes and all(type(b) is int and b >= 1 for b in capture_sizes)):
            raise InputError(f"capture_sizes: received {capture_sizes!r}; expected batch sizes (ints >= 1)")
        TorchBackend.__init__(self, device, threads=threads, fold_batchnorm=fold_batchnorm, compile=compile,
                              compile_mode=compile_mode, pointwise=pointwise, dense_groups=dense_groups,
                              bfloat16=bfloat16)  # the device, torch and the levers, checked  # fmt: skip
        require_cuda(self.name, self.device_id, torch=True)
        self.cuda = TorchCuda(self.device_id)
        self.channels_last = channels_last
        self.cuda_graph = cuda_graph
        self.capture_sizes = None if capture_sizes is None else sorted(set(capture_sizes))
        self._runners: list[TorchCudaRunner] = []
        self.max_graphs = max_graphs
        self.graph_warmup = graph_warmup
        self.allow_tf32 = allow_tf32
        self.cudnn_benchmark = cudnn_benchmark
        self.policy = Fp32Policy(self.torch, self.allow_tf32, cudnn_benchmark, matmul=self.pointwise == "bmm")

    def place(self, module: Any) -> Any:
        module = module.to(self.cuda.device)
        if self.channels_last:
            module = module.to(memory_format=self.torch.channels_last)
        return module

    def load(self, manifest: Any, bundle_dir: Any, plan: str, precision: str) -> LoadedPlan:
        if self.capture_sizes is None:
            lo, _, hi = manifest.input.batch
            self.capture_sizes = capture_sizes(lo, hi)
        return super().load(manifest, bundle_dir, plan, precision)

    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        runner = TorchCudaRunner(unit, self, loaded)
        self._runners.append(runner)
        return runner

    def padded(self, rows: int) -> int:
        """The capture size a call of ``rows`` rows replays (``rows`` itself beyond the largest)."""
        for size in self.capture_sizes or ():
            if size >= rows:
                return size
        return rows

    def warm_batch_sizes(self, lo: int, opt: int, hi: int) -> list[int]:
        """With graphs, every capture size in the range: the runner captures them all when it opens."""
        if not self.cuda_graph:
            return [opt]
        return [b for b in (self.capture_sizes or capture_sizes(lo, hi)) if lo <= b <= hi] or [opt]

    def device_bytes(self) -> int | None:
        return self.cuda.memory_reserved()

    def from_host(self, array: np.ndarray) -> Handle:
        torch = self.torch
        with self.cuda.stream_context():
            host, device = np.ascontiguousarray(array), self.cuda.device  # in the units' dtype already
            # a read-only array (np.load(mmap_mode="r")) goes straight to the device: torch warns at a tensor over it
            x = torch.from_numpy(host).to(device) if host.flags.writeable else torch.tensor(host, device=device)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
        return x

    def to_host(self, handle: Handle) -> np.ndarray:
        with self.cuda.stream_context():
            out = handle.float().cpu()  # synchronous on our stream: the leaf's work is done when it returns
        return out.numpy()

    def concat_rows(self, handles: Sequence[Handle]) -> Handle:
        with self.cuda.stream_context():
            x = self.torch.cat(list(handles), dim=0)
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=self.torch.channels_last)
        return x

    def split_rows(self, handle: Handle, rows: Sequence[int]) -> list[Handle]:
        # copies: ``handle`` may be a CUDA graph's static output, which the graph's next replay overwrites (a view
        # of it would not hold the graph's slot: Slot.in_use counts references to the output tensors themselves)
        with self.cuda.stream_context():
            return [part.clone() for part in self.torch.split(handle, list(rows), dim=0)]

    def timing_options(self) -> dict[str, Any]:
        return {**super().timing_options(), "channels_last": self.channels_last, "cuda_graph": self.cuda_graph,
                "allow_tf32": self.allow_tf32, "cudnn_benchmark": self.cudnn_benchmark}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "backend": self.name,
            "device": self.device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": self.cuda.gpu_name(),
            "threads": self.threads,
            "channels_last": self.channels_last,
            "fold_batchnorm": self.fold_batchnorm,
            "cuda_graph": self.cuda_graph,
            "capture_sizes": self.capture_sizes,
            "allow_tf32": self.allow_tf32,
            "cudnn_benchmark": self.cudnn_benchmark,
            **self.levers(),
        }
