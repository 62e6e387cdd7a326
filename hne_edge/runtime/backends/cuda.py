"""CUDA plumbing shared by the GPU backends (ONNX Runtime CUDA, TensorRT, PyTorch CUDA).

Nothing here imports torch, cuda-python or TensorRT at module import time:
the GPU libraries are imported when a GPU backend is constructed.

* :func:`probe_cuda` / :func:`require_cuda` - the one place that asks torch
  and cuda-python for CUDA devices, and if there is none, a
  :class:`~hne_edge.errors.BackendUnavailable` that names what is missing and
  what was expected.
* :class:`CudaDevice` - the few device operations the backends need (one
  stream, allocations, copies, CUDA events, graph capture), implemented on
  **torch** when it is installed with CUDA (:class:`TorchCuda`) and on
  **cuda-python** (``cuda.bindings.runtime``) otherwise (:class:`CudaPython`).
* :class:`DeviceArray` - a raw device tensor (pointer, shape, dtype) used as
  the TensorRT backend's handle.
* :class:`SlotPool` - output buffers reused across frames, but never while
  some session still holds them (see below).
* :class:`GraphCache` - CUDA graphs keyed by input shape, re-captured when the
  shape changes, bounded in number; :class:`WarmGraphsMixin` - a backend
  whose runners keep every graph their warm-up captured.
* :class:`CudaTimingMixin` - ``synchronize()`` on the backend's stream and
  ``timed_run()``: CUDA events around one unit (device time, never a host
  timer around an asynchronous launch).

**Buffer reuse and sessions.** A runner that writes into fixed buffers
(TensorRT outputs, CUDA-graph static outputs) returns the same handle objects
every frame. The scheduler caches handles in a session until no later leaf
needs them, and an :class:`~hne_edge.runtime.AnytimeSession` may be paused
while another frame runs on the same runner. So before overwriting a buffer
the pool checks (with the CPython reference count) that nobody but the pool
holds its handles; if a paused session still does, another slot is used
(allocated once, then reused too). In the steady state (one frame at a time)
every runner writes into its first slot, whose addresses never change, which
is also what makes CUDA-graph replay possible.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np

from ...errors import BackendUnavailable, DeviceError, InputError, ResourceExhausted, install_hint
from ...tensorrt_compat import import_cudart
from .base import check_positive, device_name, parse_device  # noqa: F401 - parse_device: the GPU backends' name for it

__all__ = [
    "CAPTURE_LOCK",
    "CudaProbe",
    "probe_cuda",
    "no_gpu_here",
    "require_cuda",
    "CudaDevice",
    "TorchCuda",
    "CudaPython",
    "open_device",
    "DeviceArray",
    "SlotPool",
    "GraphCache",
    "WarmGraphsMixin",
    "CudaTimingMixin",
    "CudaIO",
    "parse_device",
]

log = logging.getLogger("hne_edge.runtime.gpu")

# One capture at a time in this process (torch's CUDA notes: "only one capture may be underway at a time"). Ours are
# in CUDA's thread-local mode: torch's default, "global", makes every other thread's potentially unsafe call (a
# cudaMalloc: another runner serving, a done-callback's torch work) fail while it runs, so a runner opened, or a shape
# captured, beside runners serving in other threads would break them. ONNX Runtime's CUDA provider captures in global
# mode (its cuda_graph.cc: "for now cuda graph can only work with a single thread"), so its capturing runs hold this
# lock too, and so do the unsafe calls of ours that may come while another thread captures: an allocation while
# serving, ONNX Runtime's upload and device-wide wait. Captures happen when a runner opens (its warm-up) and for shapes
# never warmed; never per frame.
CAPTURE_LOCK = threading.RLock()


# -- detection ------------------------------------------------------------------------------------


@dataclass
class CudaProbe:
    """What this machine offers for CUDA (filled without failing; see :func:`probe_cuda`)."""

    torch: str | None = None  # torch version, when importable
    torch_cuda_build: str | None = None  # torch.version.cuda (None: CPU-only build)
    torch_devices: int = 0  # CUDA devices torch sees
    cuda_python: bool = False
    device_count: int = 0  # CUDA devices torch or cuda-python sees
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.device_count > 0

    @property
    def driver_error(self) -> str | None:
        """The note of a CUDA query refused for the driver (cudaErrorInsufficientDriver: where a driver is installed,
        it is older than the CUDA libraries here; installing those cannot help), else None."""
        return next((note for note in self.notes if "InsufficientDriver" in note), None)

    def explain(self) -> str:
        parts = []
        if self.torch is None:
            parts.append("torch is not installed")
        elif self.torch_cuda_build is None:
            parts.append(f"torch {self.torch} is a CPU-only build")
        else:
            parts.append(f"torch {self.torch} (CUDA {self.torch_cuda_build}) sees {self.device_count} CUDA device(s)")
        if not self.cuda_python:
            parts.append("cuda-python is not installed")
        parts.extend(self.notes)
        return "; ".join(parts)


def probe_cuda() -> CudaProbe:
    """Look for CUDA devices through torch, then cuda-python (neither is required to be installed); never raises:
    a library that is installed but fails (an OSError from a shared library) is a note."""
    p = CudaProbe()
    try:
        import torch

        p.torch = torch.__version__
        p.torch_cuda_build = torch.version.cuda
        if p.torch_cuda_build is not None:
            p.torch_devices = p.device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torch"):
            p.notes.append(f"torch does not import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    except Exception as exc:  # installed but broken (OSError: a shared library), or its CUDA query failed
        p.notes.append(f"torch failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    try:
        cudart = import_cudart()
        p.cuda_python = True
        if not p.device_count:
            err, n = cudart.cudaGetDeviceCount()
            if int(err) == 0:
                p.device_count = int(n)
            else:
                p.notes.append(f"cudaGetDeviceCount failed: {err}")
    except ImportError:
        pass
    except Exception as exc:  # cuda-python installed but broken, or its driver query failed
        p.notes.append(f"cuda-python failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return p


# what an NVIDIA driver creates on Linux: desktop/server GPUs (/dev/nvidia*, /proc/driver/nvidia) and Jetson's
# integrated GPU (/dev/nvhost-ctrl-gpu, /dev/nvgpu); with none of them no CUDA library can find a device
_NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu")
CPU_HINT, CPU_CLI_HINT = "run on the CPU: device='cpu' (or 'auto')", "run on the CPU: --device cpu (or auto)"


def no_gpu_here() -> str | None:
    """Why this machine has no NVIDIA GPU at all (no driver device node), or None when it may have one.

    Installing a GPU build of a library cannot help such a machine, so its errors say "run on the CPU"
    instead of naming packages. Linux only; elsewhere None (unknown).
    """
    if not sys.platform.startswith("linux") or any(Path(p).exists() for p in _NVIDIA_DEVICE_NODES):
        return None
    return "this machine has no NVIDIA GPU (no NVIDIA driver device: /dev/nvidia*, /dev/nvhost-ctrl-gpu)"


def require_cuda(backend: str, device_id: int, what: str = "", *, torch: bool = False) -> CudaProbe:
    """The probe, or BackendUnavailable saying what is missing and what was expected.

    ``torch=True``: the device must be seen by torch itself (the torch CUDA backend runs torch kernels).
    """
    p = probe_cuda()
    device = device_name("cuda", device_id)
    if not p.device_count and (absent := no_gpu_here()):
        raise BackendUnavailable(f"backend {backend!r} on device {device!r}: {absent}{what}", hint=CPU_HINT,
                                 cli_hint=CPU_CLI_HINT)  # fmt: skip
    if torch:
        if p.torch is None:
            found = "torch is not installed"
        elif p.torch_cuda_build is None:
            found = f"torch {p.torch} is a CPU-only build (torch.version.cuda is None)"
        elif p.torch_devices == 0:
            found = f"torch {p.torch} (CUDA {p.torch_cuda_build}) sees no CUDA device (torch.cuda.is_available() is False)"
        elif p.torch_devices <= device_id:
            found = f"torch {p.torch} sees {p.torch_devices} CUDA device(s)"
        else:
            return p
        raise BackendUnavailable(
            f"backend {backend!r} on device {device!r}: {found}; expected a CUDA build of torch and an NVIDIA GPU "
            f"{device_id} with a working driver{what}", hint="or use device='cpu'", cli_hint="or use --device cpu"
        )
    if p.device_count <= device_id:
        expected = (
            f"an NVIDIA GPU with a working driver (CUDA device {device_id}), seen through torch with CUDA "
            f"or cuda-python ({install_hint('gpu')})"
        )
        raise BackendUnavailable(
            f"backend {backend!r} on device {device!r}: no CUDA device {device_id} found ({p.explain()}); "
            f"expected {expected}{what}"
        )
    return p


# -- device operations ----------------------------------------------------------------------------


class CudaDevice:
    """One device and one stream: allocations, copies, events, graphs (see the two implementations)."""

    kind = "?"
    device_id: int
    stream_handle: int  # cudaStream_t as an int (what ORT, TensorRT and cuda-python take)

    def malloc(self, nbytes: int) -> tuple[int, Any]:
        """(device pointer, owner object keeping it alive)."""
        raise NotImplementedError

    def upload(self, dst: int, array: np.ndarray) -> None:
        raise NotImplementedError

    def download(self, src: int, out: np.ndarray) -> None:
        """Blocking copy device -> host (synchronizes the stream first)."""
        raise NotImplementedError

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device -> device, asynchronous on the stream."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for the stream."""
        raise NotImplementedError

    def device_synchronize(self) -> None:
        """Wait for the whole device (after copies other libraries queued on their own streams)."""
        raise NotImplementedError

    def timer(self) -> "tuple[Callable[[], None], Callable[[], float]]":
        """(start, stop): CUDA events recorded on the stream; stop() waits for the end event, returns seconds."""
        raise NotImplementedError

    def capture(self, launch: Callable[[], None]) -> Callable[[], None]:
        """Capture ``launch`` (work queued on the stream) as a CUDA graph; returns its replay."""
        raise NotImplementedError

    def used_bytes(self) -> int | None:
        """Bytes in use on the whole device (``cudaMemGetInfo``: total - free, every allocator's and context's, this
        process's and others'); None where the device does not say."""
        return None

    def current(self) -> Any:
        """A context in which this device is the calling thread's current one, restored after. CUDA keeps the
        current device per host thread, and a thread starts on device 0: a runner of ``cuda:1`` served by the
        stream scheduler's worker would otherwise allocate, synchronize and run its engines on device 0."""
        return contextlib.nullcontext()


class TorchCuda(CudaDevice):
    kind = "torch"

    def __init__(self, device_id: int = 0) -> None:
        import torch

        self.torch = torch
        self.device_id = device_id
        self.device = torch.device("cuda", device_id)
        self.stream = torch.cuda.Stream(device=self.device)  # a real (non-default) stream: ORT ignores stream 0
        self.stream_handle = int(self.stream.cuda_stream)
        self._pool: Any = None  # one memory pool for every graph captured (vLLM's practice): see capture()

    def current(self) -> Any:
        return self.torch.cuda.device(self.device_id)

    def memory_reserved(self) -> int:
        """Bytes torch's caching allocator holds on this device (graphs' pools included)."""
        return int(self.torch.cuda.memory_reserved(self.device))

    def used_bytes(self) -> int | None:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def malloc(self, nbytes: int) -> tuple[int, Any]:
        with CAPTURE_LOCK:
            t = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device=self.device)
        ptr = t.data_ptr()
        _TORCH_ALLOCS[ptr] = t
        return ptr, _Release(ptr, t)

    def upload(self, dst: int, array: np.ndarray) -> None:
        torch = self.torch
        src = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        with torch.cuda.stream(self.stream):  # ordered before the kernels that read it
            _owned_tensor(dst, src.numel(), self).copy_(src)

    def device_synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def download(self, src: int, out: np.ndarray) -> None:
        self.stream.synchronize()
        host = self.torch.from_numpy(out.reshape(-1).view(np.uint8))
        host.copy_(_owned_tensor(src, host.numel(), self))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        with self.torch.cuda.stream(self.stream):
            _owned_tensor(dst, nbytes, self).copy_(_owned_tensor(src, nbytes, self), non_blocking=True)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def timer(self):
        torch, stream = self.torch, self.stream
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop() -> float:
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return (lambda: start.record(stream)), stop

    def stream_context(self):
        """Make the backend's stream current (torch ops queue on it)."""
        return self.torch.cuda.stream(self.stream)

    def gpu_name(self) -> str:
        return self.torch.cuda.get_device_name(self.device_id)

    def capture_outputs(self, fn: Callable[[], tuple]) -> tuple[Callable[[], None], tuple]:
        """Capture ``fn`` (torch ops on the stream) as a CUDA graph: (replay, the graph's output tensors).

        The outputs are allocated by the capture and hold valid values only after a replay.
        """
        held: dict[str, tuple] = {}

        def launch() -> None:
            held["out"] = fn()

        replay = self.capture(launch)
        return replay, held["out"]

    def capture(self, launch: Callable[[], None]) -> Callable[[], None]:
        """Capture ``launch`` as a CUDA graph on the backend's stream. Every graph shares one memory pool: a graph's
        temporaries are dead once it ends, so the next graph's may reuse them (all replays are on one stream, one at
        a time), and what a graph returns stays held by its owner. Not yet run on hardware with the shared pool
        (issue 39: the GPU acceptance stage owes it)."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        with CAPTURE_LOCK:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            self.stream.synchronize()
            with torch.cuda.graph(graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
                launch()
            self.stream.synchronize()

        def replay() -> None:
            with torch.cuda.stream(self.stream):
                graph.replay()

        replay.graph = graph  # keep it alive with the replay
        return replay


# Allocations made by TorchCuda.malloc, by base pointer: torch cannot wrap a raw pointer, so copies
# between raw pointers (TensorRT bindings) go through uint8 views of the owning tensor.
_TORCH_ALLOCS: dict[int, Any] = {}


def _owned_tensor(ptr: int, nbytes: int, dev: TorchCuda):
    """A uint8 torch view of ``nbytes`` at ``ptr``, inside an allocation made by ``dev.malloc``."""
    for base, t in _TORCH_ALLOCS.items():
        if base <= ptr and ptr + nbytes <= base + t.numel():
            return t[ptr - base : ptr - base + nbytes]
    raise ValueError(f"device pointer {ptr:#x} (+{nbytes} bytes) is not inside an allocation made by this backend")


class _Release:
    """Owner of a TorchCuda allocation: dropping the last reference forgets it (torch frees it)."""

    def __init__(self, ptr: int, tensor: Any) -> None:
        self.ptr, self.tensor = ptr, tensor

    def __del__(self) -> None:
        _TORCH_ALLOCS.pop(self.ptr, None)



def _check(result: Any, what: str) -> Any:
    """cuda-python calls return (err, *values); raise on error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise DeviceError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


class CudaPython(CudaDevice):
    kind = "cuda-python"

    def __init__(self, device_id: int = 0) -> None:
        self.rt = rt = import_cudart()
        self.device_id = device_id
        _check(rt.cudaSetDevice(device_id), "cudaSetDevice")
        self.stream = _check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self.stream_handle = int(self.stream)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        before = int(_check(self.rt.cudaGetDevice(), "cudaGetDevice"))
        if before != self.device_id:
            _check(self.rt.cudaSetDevice(self.device_id), "cudaSetDevice")
        try:
            yield
        finally:
            if before != self.device_id:
                self.rt.cudaSetDevice(before)

    def malloc(self, nbytes: int) -> tuple[int, Any]:
        with CAPTURE_LOCK, self.current():
            ptr = int(_check(self.rt.cudaMalloc(max(int(nbytes), 1)), "cudaMalloc"))
        return ptr, _CudaFree(self.rt, ptr)

    def used_bytes(self) -> int | None:
        with self.current():
            free, total = _check(self.rt.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(total) - int(free)

    def upload(self, dst: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)  # pageable: staged before the call returns, ordered on the stream
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        _check(self.rt.cudaMemcpyAsync(dst, a.ctypes.data, a.nbytes, kind, self.stream), "cudaMemcpyAsync H2D")

    def device_synchronize(self) -> None:
        with self.current():
            _check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def download(self, src: int, out: np.ndarray) -> None:
        self.synchronize()
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        with self.current():
            _check(self.rt.cudaMemcpy(out.ctypes.data, src, out.nbytes, kind), "cudaMemcpy D2H")

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        _check(self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, self.stream), "cudaMemcpyAsync D2D")

    def synchronize(self) -> None:
        _check(self.rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def timer(self):
        rt, stream = self.rt, self.stream
        with self.current():  # an event belongs to the current device, and must be the stream's
            start = _check(rt.cudaEventCreate(), "cudaEventCreate")
            end = _check(rt.cudaEventCreate(), "cudaEventCreate")

        def stop() -> float:
            _check(rt.cudaEventRecord(end, stream), "cudaEventRecord")
            _check(rt.cudaEventSynchronize(end), "cudaEventSynchronize")
            ms = _check(rt.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")
            rt.cudaEventDestroy(start)
            rt.cudaEventDestroy(end)
            return float(ms) / 1e3

        return (lambda: _check(rt.cudaEventRecord(start, stream), "cudaEventRecord")), stop

    def capture(self, launch: Callable[[], None]) -> Callable[[], None]:
        rt, stream = self.rt, self.stream
        with CAPTURE_LOCK, self.current():
            self.synchronize()
            mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            _check(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
            try:
                launch()
            finally:
                graph = _check(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
            try:
                exe = _check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
            except BaseException:
                rt.cudaGraphDestroy(graph)
                raise
        return _CudaGraph(rt, stream, graph, exe)


class _CudaGraph:
    """A captured graph's replay. cuda-python's graph handles have no destructor: dropping the last reference (the
    GraphCache evicting or clearing it) destroys the executable graph and the graph, else each stayed on the
    device for the process's life. No stream sync first: an executable graph destroyed in flight is freed when
    its launch completes (cuGraphExecDestroy), and an eviction happens on the serving thread."""

    def __init__(self, rt: Any, stream: Any, graph: Any, exe: Any) -> None:
        self.rt, self.stream, self.graph, self.exe = rt, stream, graph, exe

    def __call__(self) -> None:
        _check(self.rt.cudaGraphLaunch(self.exe, self.stream), "cudaGraphLaunch")

    def __del__(self) -> None:
        try:
            self.rt.cudaGraphExecDestroy(self.exe)
            self.rt.cudaGraphDestroy(self.graph)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class _CudaFree:
    def __init__(self, rt: Any, ptr: int) -> None:
        self.rt, self.ptr = rt, ptr

    def __del__(self) -> None:
        try:
            self.rt.cudaFree(self.ptr)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def open_device(device_id: int, prefer: str = "auto") -> CudaDevice:
    """torch when it is installed with CUDA (``prefer="auto"`` or ``"torch"``), else cuda-python."""
    if prefer not in ("auto", "torch", "cuda-python"):
        raise InputError(f"memory: received {prefer!r}; expected 'auto', 'torch' or 'cuda-python'")
    errors = []
    if prefer in ("auto", "torch"):
        probe = probe_cuda()  # the one place that asks torch / cuda-python about devices
        if probe.torch_devices > device_id:
            return TorchCuda(device_id)
        errors.append("torch is not installed" if probe.torch is None else f"torch {probe.torch} has no CUDA device {device_id}")
    if prefer in ("auto", "cuda-python"):
        try:
            return CudaPython(device_id)
        except ImportError as exc:
            errors.append(f"cuda-python: {exc}")
    raise BackendUnavailable(
        f"device memory and streams need torch with CUDA or cuda-python ({install_hint('gpu')}); "
        + "; ".join(errors)
    )


# -- handles --------------------------------------------------------------------------------------


class DeviceArray:
    """A device tensor: ``ptr`` to ``shape`` elements of ``dtype`` (C order), kept alive by ``owner``."""

    __slots__ = ("ptr", "shape", "dtype", "owner", "__weakref__")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any = None) -> None:
        self.ptr, self.shape, self.dtype, self.owner = int(ptr), tuple(int(d) for d in shape), np.dtype(dtype), owner

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"DeviceArray(ptr={self.ptr:#x}, shape={self.shape}, dtype={self.dtype})"


# -- buffer reuse ---------------------------------------------------------------------------------


def _refcounts(handles: tuple[Any, ...]) -> list[int]:
    # Always measured through this one code path, so interpreter details (borrowed references,
    # loop variables) cancel out between the baseline and later checks.
    return [sys.getrefcount(h) for h in handles]


@dataclass
class Slot:
    handles: tuple[Any, ...]  # what the runner returns (the pool holds them here, once)
    state: Any = None  # whatever the runner keeps with them (addresses, inputs of a captured graph, ...)
    baseline: list[int] = field(default_factory=list)  # reference counts when only the pool held them

    def mark_baseline(self) -> None:
        """Record the reference counts while only the pool holds the handles (after making or re-binding them)."""
        self.baseline = _refcounts(self.handles)

    def in_use(self) -> bool:
        """True while something outside the pool (a session's cache) still holds one of the handles."""
        return any(now > base for now, base in zip(_refcounts(self.handles), self.baseline))


class SlotPool:
    """Buffers per key (e.g. batch size), reused once nobody outside the pool holds them.

    ``acquire(key, make)`` returns ``(index, slot)``: the first slot of ``key``
    whose handles are referenced only by the pool, or a new one from
    ``make()``. Slot 0 is the steady-state slot (fixed addresses).
    """

    def __init__(self, max_slots: int = 8) -> None:
        self.slots: dict[Hashable, list[Slot]] = {}
        self.max_slots = max_slots

    def acquire(self, key: Hashable, make: Callable[[], Slot]) -> tuple[int, Slot]:
        slots = self.slots.setdefault(key, [])
        for i, slot in enumerate(slots):
            if not slot.in_use():
                return i, slot
        if len(slots) >= self.max_slots:
            raise ResourceExhausted(
                f"{len(slots)} paused sessions hold this runner's buffers for {key!r}; expected at most "
                f"{self.max_slots} (close sessions you no longer need with session.close())"
            )
        slot = make()
        slots.append(slot)
        slot.mark_baseline()
        return len(slots) - 1, slot

    def first(self, key: Hashable) -> bool:
        """Whether the slot ``acquire(key, make)`` makes now is slot 0 (the steady state's, a graph's)."""
        return not self.slots.get(key)

    def clear(self) -> None:
        self.slots.clear()


# -- host <-> device staging ----------------------------------------------------------------------


class CudaIO:
    """The device buffers a GPU backend owns, shared by ONNX Runtime CUDA and TensorRT.

    ``alloc`` makes a buffer that stays put as long as the backend lives;
    ``is_fixed``: a CUDA graph may bind its address (a pool's first slot, not
    one made while a paused session held it: graphs are captured for first
    slots, so a frame run beside that session runs eagerly from the runner it
    met a held slot at to its end). ``stage`` returns the staging buffer for
    an image of this shape (one per batch size, another only while a paused
    session still holds the first). The handle
    type is the backend's (an ``OrtValue``, a :class:`DeviceArray`): it
    passes how to make one and how to read its address; copying the bytes
    in and out stays with the backend, whose handle knows how.
    """

    def __init__(self, allocate: Callable[[tuple[int, ...], np.dtype], Any], address: Callable[[Any], int]) -> None:
        self._allocate, self._address = allocate, address
        self._staging = SlotPool()
        self._fixed: set[int] = set()

    def alloc(self, shape: Sequence[int], dtype: Any, *, graph: bool = True) -> Any:
        """``graph=False``: a later slot's buffer, which no graph binds (captured for it, one would be captured
        mid-serving, by a frame beside a paused session, and seldom replayed)."""
        handle = self._allocate(tuple(int(s) for s in shape), np.dtype(dtype))
        if graph:
            self._fixed.add(self._address(handle))
        return handle

    def is_fixed(self, handle: Any) -> bool:
        return self._address(handle) in self._fixed

    def stage(self, array: np.ndarray) -> Any:
        """The staging buffer for ``array``'s shape and dtype (its contents are the caller's to write)."""
        key, pool = (array.shape, array.dtype.str), self._staging
        _, slot = pool.acquire(key, lambda: Slot((self.alloc(array.shape, array.dtype, graph=pool.first(key)),)))
        return slot.handles[0]

    def clear(self) -> None:
        self._staging.clear()
        self._fixed.clear()


# -- CUDA graphs ----------------------------------------------------------------------------------


class GraphCache:
    """Captured graphs per key (input shape / batch size); a new key captures, an old key replays.

    Bounded: beyond ``max_graphs`` keys not pinned (:meth:`pin`: the graphs a
    runner captured when it opened, kept for its life) the least recently
    used is dropped (re-captured if its shape comes back). Between :meth:`hold`
    and :meth:`pin` (a runner's warm-up) nothing is dropped: a warm-up of more
    sizes than ``max_graphs`` (1, 2, 4, 8, 16 for a batch range up to 16) once
    dropped its first, batch 1's, before they were pinned. ``capture(key)``
    returns a replay callable; tests pass fakes.
    """

    def __init__(self, capture: Callable[[Hashable], Callable[[], Any]], max_graphs: int = 4,
                 on_capture: Callable[[], None] | None = None) -> None:  # fmt: skip
        max_graphs = check_positive(max_graphs, "max_graphs")
        self._capture = capture
        self._on_capture = on_capture  # the backend's count of cold calls
        self.max_graphs = max_graphs
        self.graphs: dict[Hashable, Callable[[], Any]] = {}
        self.pinned: set[Hashable] = set()
        self.captures = 0
        self._holding = False

    def hold(self) -> None:
        """Drop nothing until :meth:`pin` (a warm-up's graphs are all to be pinned)."""
        self._holding = True

    def pin(self) -> None:
        """Keep every graph captured so far, whatever comes later."""
        self.pinned.update(self.graphs)
        self._holding = False

    def find(self, key: Hashable) -> Callable[[], Any] | None:
        """The graph of ``key`` if captured (now the most recently used), else None; never captures."""
        replay = self.graphs.pop(key, None)
        if replay is not None:
            self.graphs[key] = replay
        return replay

    def get(self, key: Hashable) -> Callable[[], Any]:
        replay = self.graphs.pop(key, None)
        if replay is None:
            replay = self._capture(key)
            self.captures += 1
            if self._on_capture is not None:
                self._on_capture()
            loose = [] if self._holding else [k for k in self.graphs if k not in self.pinned]  # least recent first
            for k in loose[: max(0, len(loose) - self.max_graphs + 1)]:
                del self.graphs[k]
        self.graphs[key] = replay  # most recently used last
        return replay

    def drop(self) -> None:
        """Drop every graph (they bind addresses that moved: TensorRT's scratch), each re-captured at its key's next
        call; which keys are pinned, and a warm-up's hold, stay (the first run of each TensorRT runner in its
        warm-up drops, and once ended the hold: that warm-up then kept only ``max_graphs`` of its graphs)."""
        self.graphs.clear()

    def clear(self) -> None:
        self.drop()
        self.pinned.clear()
        self._holding = False


# -- backend mixins -------------------------------------------------------------------------------


class WarmGraphsMixin:
    """A GPU backend whose runners (``_runners``) keep CUDA graphs in a :class:`GraphCache` (``_graphs``): every
    graph a runner's warm-up captures is kept, however many, and pinned for the runner's life."""

    _runners: list

    def _graph_caches(self) -> list[GraphCache]:
        return [r._graphs for r in self._runners if getattr(r, "_graphs", None) is not None]

    def warming(self) -> None:
        """Drop no graph until the warm-up ends: it may capture more sizes than ``max_graphs``."""
        for cache in self._graph_caches():
            cache.hold()

    def warmed(self) -> None:
        """Keep every graph captured so far for the runners' life (no eviction while serving)."""
        for cache in self._graph_caches():
            cache.pin()


class CudaTimingMixin:
    """Stream synchronization and CUDA-event unit timing for a backend with ``self.cuda: CudaDevice``."""

    cuda: CudaDevice

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def timed_run(self, run_impl: Callable[[Sequence[Any]], tuple], inputs: Sequence[Any]) -> tuple[tuple, float]:
        """Run one unit between two CUDA events on the backend's stream; (outputs, device seconds).

        The host waits for the end event only, so the time is what the GPU
        spent from the start event to the end of the unit's work (queueing
        delay before the first kernel included, host timers not involved).
        """
        start, stop = self.cuda.timer()
        start()
        outs = run_impl(inputs)
        return outs, stop()
