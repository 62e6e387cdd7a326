"""ONNX Runtime on CUDA: ``AnytimeRunner(bundle, backend="onnxruntime", device="cuda")``.

* One ``InferenceSession`` per model file, all on **one CUDA stream** (the
  ``user_compute_stream`` provider option; the stream comes from torch or
  cuda-python, see :mod:`.cuda`), so the files of one leaf run back to back
  in stream order.
* **IOBinding with device OrtValues**: the image is uploaded once
  (``from_host``), every activation stays on the GPU as an ``OrtValue`` that
  the scheduler caches, and only a leaf's logits come back (``to_host``
  synchronizes the stream, then copies).
* No synchronization between the units of a leaf: runs use the run option
  ``disable_synchronize_execution_providers=1``.
* ``cudnn_conv_algo_search`` defaults to ``EXHAUSTIVE`` (best kernels; the
  search happens on the first run of each shape, i.e. during warm-up).
* **fp32 means fp32**: the CUDA provider runs fp32 convolutions and GEMMs in
  TF32 unless its ``use_tf32`` option says "0" (ONNX Runtime 1.18 and later;
  default on). Every session gets "0" unless ``allow_tf32=True``. With TF32 on,
  an H200 (2026-11-28, onnxruntime-gpu 1.31.1) put every prefix of hne_tiny's
  real-GPU tests up to 1.7e-4 off the fp32 model, over their 1e-4 tolerance
  (hne_resnet_small: within 1.9e-5 of float64). With TF32 off it has not yet
  run on a GPU (the acceptance run's ``ort-gpu`` stage owes it).
* ``cuda_graph=True``: ``enable_cuda_graph`` per session and one graph per
  (batch size, input address), selected with the run option ``gpu_graph_id``.
  A graph replays fixed addresses, so every buffer it binds stays put: the
  image is staged into a fixed OrtValue per batch size (``update_inplace``),
  and each runner writes into the fixed OrtValues of its pool's first slot
  (:class:`~.cuda.SlotPool`), which are the next runner's inputs - no
  device-to-device copies. When a paused session still holds slot 0, or the
  input is not a fixed buffer (another slot's: the rest of a frame that met a
  held slot), that run goes without the graph (``gpu_graph_id=-1``) - nothing
  is captured while serving - into the fixed buffers of a slot: an output
  ONNX Runtime allocated would come from the session's arena, whose blocks a
  captured graph may still write as its scratch. Every node must run on the
  CUDA EP for graphs.
* **Graphs belong to a thread.** The CUDA provider keeps its captured graphs
  per thread (its per-thread context), so a graph captured by the thread that
  warmed the runner would be captured again, mid-serving, by another thread's
  first frames. The runner captures on the threads that warmed it
  (``AnytimeRunner.warmup()`` on a serving thread captures that thread's) and
  runs eagerly, into fixed buffers, on any other (said once in the log).
* **Every row count is warmed** when the runner opens: neither graphs nor the
  exhaustive convolution search pad a call to a size already seen, so each
  count's first call (search, capture) is paid there, not in a frame.
* CPU fallback is not this class's business:
  ``create_backend("onnxruntime", "cuda", fallback_to_cpu=True)`` returns the
  CPU backend (with ``fallback_reason``) when this one is unusable.

The CPU-side logic (IOBinding, fixed buffers, graph selection) is tested on
CPU OrtValues (tests/runtime/test_gpu_fakes.py); the real GPU tests: tests/runtime/test_gpu_hardware.py.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Sequence

import numpy as np

from ...errors import BackendUnavailable, InputError, install_hint
from .base import Handle, LoadedPlan, Runner, Unit, check_flag, check_positive
from .cuda import (
    CAPTURE_LOCK, CPU_CLI_HINT, CPU_HINT, CudaIO, CudaTimingMixin, GraphCache, Slot, SlotPool, WarmGraphsMixin,
    no_gpu_here, open_device, require_cuda,
)
from .onnxruntime import OnnxRuntimeBackend, _batch, allocation_error, open_session

__all__ = ["OnnxRuntimeCudaBackend", "OnnxRuntimeCudaRunner", "CUDA_EP"]

CUDA_EP = "CUDAExecutionProvider"
CONV_SEARCH = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
#: the first onnxruntime whose CUDA provider takes ``use_tf32`` (pull requests 19357 and 19426; an older one
#: refuses options it does not know, and computes fp32 convolutions in TF32 on Ampere and later)
USE_TF32_SINCE = (1, 18)

log = logging.getLogger(__name__)
_THREAD = threading.local()
_THREAD_TOKENS = itertools.count(1)


def thread_token() -> int:
    """This thread's number for graph keys: unlike ``threading.get_ident()``, never the number of a thread that
    ended (whose graphs, in ONNX Runtime's per-thread context, went with it)."""
    token = getattr(_THREAD, "token", None)
    if token is None:
        token = _THREAD.token = next(_THREAD_TOKENS)
    return token


def _version(text: str) -> tuple[int, ...]:
    """``"1.31.1"`` -> (1, 31, 1); a suffix (``"1.18.0rc1"``, ``"+cu12"``) ends a part."""
    out = []
    for part in str(text).split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


class OnnxRuntimeCudaRunner(Runner):
    def __init__(self, unit: Unit, backend: "OnnxRuntimeCudaBackend") -> None:
        super().__init__(unit)
        self._backend = backend
        self.session = None

    def activate_impl(self) -> None:
        b = self._backend
        ort = b.ort
        # enable_fallback=0: onnxruntime's Python session would otherwise catch the CUDA provider's error (an option
        # refused, a graph capture refused, no memory), print it and open - or later re-run - on the CPU: its
        # message is then lost and the check below could only guess at missing libraries
        self.session = open_session(self, ort, b.session_options(), b.providers, where=" on CUDA", enable_fallback=0)
        got = self.session.get_providers()
        if not got or got[0] != b.execution_provider:
            raise BackendUnavailable(
                f"{self.name}: onnxruntime created the session with providers {got}; expected {b.execution_provider} first "
                f"(the CUDA provider could not load its libraries; see the onnxruntime log). {cuda_library_hint(b.ort)}"
            )
        _check_options_taken(self.name, self.session, b.execution_provider, b.provider_options)
        self._in_name = self.input_names[0]
        self._out_names = list(self.output_names)
        self._out_dtypes = [np.dtype(t.dtype) for t in self.unit.outputs]
        self._io = self.session.io_binding()
        self._run = self.session.run_with_iobinding
        self._pool = SlotPool()
        self._graphs = (GraphCache(self._capture, max_graphs=b.max_graphs, on_capture=b.count_cold_call)
                        if b.cuda_graph else None)  # fmt: skip
        self._capture_input = None

    # -- eager path: ORT allocates the outputs on the device --------------------------------------
    def _run_eager(self, x: Handle, run_options) -> tuple[Handle, ...]:
        io, b = self._io, self._backend
        io.bind_ortvalue_input(self._in_name, x)
        for name in self._out_names:
            io.bind_output(name, b.ort_device, b.device_id)
        self._run(io, run_options)
        outs = tuple(io.get_outputs())
        _unbind(io)
        return outs

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        try:
            if self._graphs is None:
                return self._run_eager(inputs[0], self._backend.run_options)
            return self._run_graph(inputs[0])
        except Exception as exc:  # free when nothing is raised
            error = allocation_error(exc, self.name, _batch(inputs[0]))
            if error is None:
                raise
            raise error from None

    # -- CUDA graph path: fixed output OrtValues per batch size, graphs per (batch, input address) ----
    def _make_slot(self, x: Handle) -> Slot:
        # one eager run tells the output shapes; the fixed outputs get those shapes
        self._backend.count_cold_call()  # a batch's first run: its allocations and kernel search
        shapes = [o.shape() for o in self._run_eager(x, self._backend.run_options_no_graph)]
        graph = self._pool.first(x.shape()[0])  # a later slot's buffers are no graph's (CudaIO)
        outs = tuple(self._backend.io.alloc(s, dt, graph=graph) for s, dt in zip(shapes, self._out_dtypes))
        return Slot(outs)

    def _capture(self, key: tuple[int, int, int]) -> Any:
        """A replay for graph ``key = (batch, input address, thread)``; ORT captures on its first run."""
        batch = key[0]
        b = self._backend
        graph_id = self._next_graph_id = getattr(self, "_next_graph_id", 0) + 1  # 0 is reserved by ORT
        ro = b.run_options_for({**b.run_config, "gpu_graph_id": str(graph_id)})
        io = self.session.io_binding()  # kept by the graph: it binds other wrappers of the same buffers (_rebound)
        io.bind_ortvalue_input(self._in_name, _rebound(self._capture_input))
        for name, value in zip(self._out_names, self._pool.slots[batch][0].handles):
            io.bind_ortvalue_output(name, _rebound(value))
        run = self._run
        return lambda: run(io, ro)

    def _run_graph(self, x: Handle) -> tuple[Handle, ...]:
        """Replay when the input sits at a captured address (the parent's, or the staged image's, fixed
        buffer), slot 0 is free and this thread may hold graphs; otherwise run eagerly into the slot's fixed
        buffers (never ORT-allocated ones: the session's arena lends a graph's scratch blocks again)."""
        batch = x.shape()[0]
        index, slot = self._pool.acquire(batch, lambda: self._make_slot(x))
        if index != 0:
            return self._run_eager_into(x, slot)
        thread = thread_token()
        key = (batch, x.data_ptr(), thread)  # ONNX Runtime's graphs are per thread: so are the keys
        if key not in self._graphs.graphs and (not self._backend.is_fixed(x) or not self._backend.may_capture(thread)):
            return self._run_eager_into(x, slot)
        self._capture_input = x
        try:
            if key in self._graphs.graphs:
                self._graphs.get(key)()
            else:  # this run captures, in CUDA's global mode (onnxruntime's cuda_graph.cc): no other capture, upload or
                with CAPTURE_LOCK:  # device-wide wait of ours may run meanwhile in any thread
                    self._graphs.get(key)()
        finally:
            self._capture_input = None
        return slot.handles

    def _run_eager_into(self, x: Handle, slot: Slot) -> tuple[Handle, ...]:
        io = self._io
        io.bind_ortvalue_input(self._in_name, x)
        for name, value in zip(self._out_names, slot.handles):
            io.bind_ortvalue_output(name, value)
        self._run(io, self._backend.run_options_no_graph)
        _unbind(io)
        return slot.handles

    def release_impl(self) -> None:
        if getattr(self, "_graphs", None) is not None:
            self._graphs.clear()
        self._pool = None
        self._io = None
        self.session = None


#: provider options a session must have taken as given: fp32 in fp32, the shared stream (else the runner's
#: synchronisation orders nothing), graphs
CHECKED_OPTIONS = ("use_tf32", "user_compute_stream", "enable_cuda_graph")


def _option_value(text: Any) -> Any:
    """A provider option's value compared by meaning: "1" / "true" alike, a pointer in any base."""
    t = str(text).strip().lower()
    if t in ("1", "true", "0", "false"):
        return t in ("1", "true")
    try:
        return int(t, 0)
    except ValueError:
        return t


def _check_options_taken(name: str, session: Any, provider: str, asked: dict[str, str]) -> None:
    """Refuse a session whose provider reports another value for an option of :data:`CHECKED_OPTIONS` than the one
    asked (a provider that ignored one - a plugin build of the CUDA provider reads fewer - would compute TF32, or
    on a stream of its own); an option it does not report is not judged."""
    got = (session.get_provider_options() or {}).get(provider) or {}
    wrong = {k: (asked[k], got[k]) for k in CHECKED_OPTIONS
             if k in asked and k in got and _option_value(asked[k]) != _option_value(got[k])}  # fmt: skip
    if wrong:
        said = ", ".join(f"{k}={v!r} (asked {a!r})" for k, (a, v) in wrong.items())
        raise BackendUnavailable(f"{name}: onnxruntime's {provider} took {said}; expected the options as asked "
                                 "(this onnxruntime build ignores them: another onnxruntime-gpu build, or "
                                 "backend='torch' on this GPU)")  # fmt: skip


# onnxruntime's IOBinding keeps a Python reference to every OrtValue it binds (1.32: _bound_inputs /
# _bound_outputs). The buffer pools tell a free slot from one a paused session holds by reference counts
# (cuda.Slot), so a binding must not keep the pool's own handles: an eager binding is cleared after its run,
# and a graph's lasting binding gets another wrapper of the same device buffer.


def _unbind(io: Any) -> None:
    io.clear_binding_inputs()
    io.clear_binding_outputs()


def _rebound(value: Any) -> Any:
    """Another Python wrapper of ``value``'s OrtValue (same buffer): what a graph's lasting binding holds."""
    inner = getattr(value, "_ortvalue", None)  # OrtValue(C value) is the public constructor around the buffer
    return value if inner is None else type(value)(inner)


def cuda_library_hint(ort: Any) -> str:
    """What the CUDA provider of this onnxruntime-gpu needs, and the usual ways to provide it."""
    try:
        from onnxruntime.capi.build_and_package_info import cuda_version
    except ImportError:
        cuda_version = None
    major = str(cuda_version).split(".")[0] if cuda_version else "?"
    return (
        f"onnxruntime-gpu {ort.__version__} was built for CUDA {cuda_version or 'unknown'}: it needs the CUDA {major}.x "
        f"and cuDNN 9 libraries, e.g. a torch build for CUDA {major}.x installed beside it (with memory='auto' the backend "
        f"imports torch first, which loads them; torch.version.cuda tells), or pip install 'onnxruntime-gpu[cuda,cudnn]', or the "
        "system's CUDA (JetPack on Jetson) on LD_LIBRARY_PATH"
    )


class OnnxRuntimeCudaBackend(WarmGraphsMixin, CudaTimingMixin, OnnxRuntimeBackend):
    """ONNX Runtime with the CUDA execution provider.

    Args:
        device: "cuda" or "cuda:N".
        cudnn_conv_algo_search: "EXHAUSTIVE" (default), "HEURISTIC" or "DEFAULT".
        allow_tf32: TF32 for fp32 convolutions and GEMMs (the CUDA provider's ``use_tf32``; default False: fp32
            computes in fp32). True is faster on Ampere and later, and less exact: on an H200 the real-GPU tests'
            prefixes came out up to 1.7e-4 off the fp32 model (hne_resnet_small: 1.9e-5 of float64).
        cuda_graph: capture one CUDA graph per model file and batch size (fixed shapes only).
        max_graphs: graphs kept per model file (batch sizes); the least recently used is dropped.
        memory: "auto" | "torch" | "cuda-python": who creates the shared stream.
        threads, spinning: the CPU provider's options (for the nodes ONNX Runtime places there).
        provider_options: extra CUDA provider options (strings), e.g. {"arena_extend_strategy": "kSameAsRequested"};
            not ``use_tf32`` (``allow_tf32`` is its one switch).
    """

    name = "onnxruntime"
    format = "onnx"
    devices = ("cuda",)
    #: where OrtValues live and which provider must own the sessions (tests run this class's
    #: IOBinding / buffer logic on real onnxruntime with "cpu" OrtValues and the CPU provider)
    ort_device = "cuda"
    execution_provider = CUDA_EP
    #: each frame in its own calls: the handles are device buffers of fixed addresses (no row stacking yet)
    row_batching = False

    def __init__(
        self,
        device: str = "cuda",
        *,
        cudnn_conv_algo_search: str = "EXHAUSTIVE",
        allow_tf32: bool = False,
        cuda_graph: bool = False,
        max_graphs: int = 4,
        memory: str = "auto",
        threads: int | None = None,
        spinning: bool | None = None,
        provider_options: dict[str, str] | None = None,
    ) -> None:
        if cudnn_conv_algo_search not in CONV_SEARCH:
            raise InputError(f"cudnn_conv_algo_search: received {cudnn_conv_algo_search!r}; "
                             f"expected one of {list(CONV_SEARCH)}")
        for name, flag in (("cuda_graph", cuda_graph), ("allow_tf32", allow_tf32)):
            check_flag(flag, name)
        max_graphs = check_positive(max_graphs, "max_graphs")
        OnnxRuntimeBackend.__init__(self, device, threads=threads, spinning=spinning)  # the device, ort, the CPU options
        self.cuda_graph = cuda_graph
        self.max_graphs = max_graphs
        self.conv_search = cudnn_conv_algo_search
        self.allow_tf32 = allow_tf32
        if "use_tf32" in (provider_options or {}):
            raise InputError(f"provider_options: received 'use_tf32' ({provider_options['use_tf32']!r}); expected "
                             "allow_tf32=True or False, the backend's one switch for TF32 (it sets use_tf32)")  # fmt: skip
        self.provider_options: dict[str, str] = {}  # the CUDA provider's, as asked (set by _open_cuda)
        self.extra_provider_options = dict(provider_options) if provider_options else None  # the caller's
        self.cuda, self.providers = self._open_cuda(memory, provider_options or {})
        self.run_config = {"disable_synchronize_execution_providers": "1"}
        self.run_options = self.run_options_for(self.run_config)
        self.run_options_no_graph = self.run_options_for({**self.run_config, "gpu_graph_id": "-1"} if self.cuda_graph else self.run_config)
        self.io = CudaIO(
            lambda shape, dtype: self.ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.ort_device, self.device_id),
            lambda value: value.data_ptr(),
        )
        self.graphs_per_thread = self.cuda_graph
        self._runners: list[OnnxRuntimeCudaRunner] = []
        self._graph_threads: set[int] = set()  # the threads that warmed the runners: theirs capture graphs
        self._said_thread = False

    def _open_cuda(self, memory: str, extra: dict[str, str]) -> tuple[Any, list]:
        """(the shared stream's device, the session providers); BackendUnavailable when CUDA is unusable."""
        ort = self.ort
        available = ort.get_available_providers()
        if CUDA_EP not in available:
            if absent := no_gpu_here():  # onnxruntime-gpu would not help: there is no GPU to run on
                raise BackendUnavailable(f"backend 'onnxruntime' on device 'cuda': {absent}", hint=CPU_HINT,
                                         cli_hint=CPU_CLI_HINT)  # fmt: skip
            raise BackendUnavailable(
                f"backend 'onnxruntime' on device 'cuda': onnxruntime {ort.__version__} has providers {available}; "
                f"expected {CUDA_EP} (install onnxruntime-gpu instead of onnxruntime: {install_hint('gpu')})"
            )
        require_cuda(self.name, self.device_id)
        tf32_option = _version(ort.__version__) >= USE_TF32_SINCE
        if not tf32_option and not self.allow_tf32:
            raise BackendUnavailable(
                f"backend 'onnxruntime' on device 'cuda': onnxruntime {ort.__version__} computes fp32 convolutions in TF32 "
                f"on Ampere and later GPUs, with no option to turn it off (use_tf32 came in 1.18); expected onnxruntime-gpu "
                f">= 1.18 for fp32 in fp32 ({install_hint('gpu')}), or pass allow_tf32=True to accept TF32 (up to 1.7e-4 "
                "off the fp32 model on an H200)"
            )
        cuda = open_device(self.device_id, memory)
        options = {
            "device_id": str(self.device_id),
            "user_compute_stream": str(cuda.stream_handle),
            "cudnn_conv_algo_search": self.conv_search,
            "do_copy_in_default_stream": "0",
        }
        if tf32_option:
            options["use_tf32"] = "1" if self.allow_tf32 else "0"
        if self.cuda_graph:
            options["enable_cuda_graph"] = "1"
        options.update({str(k): str(v) for k, v in extra.items()})
        self.provider_options = options
        return cuda, [(CUDA_EP, options)]

    def run_options_for(self, entries: dict[str, str]):
        ro = self.ort.RunOptions()
        for k, v in entries.items():
            ro.add_run_config_entry(k, v)
        return ro

    # -- runners and handles ----------------------------------------------------------------------
    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        runner = OnnxRuntimeCudaRunner(unit, self)
        self._runners.append(runner)
        return runner

    # -- warm-up: every row count, its graphs kept, captured by the warming thread ----------------------
    def warm_batch_sizes(self, lo: int, opt: int, hi: int) -> list[int]:
        """Every row count of the range when graphs or the exhaustive search are on (neither pads to a size
        seen: each count's first call searches and captures); else the optimal batch size only."""
        if self.cuda_graph or self.conv_search == "EXHAUSTIVE":
            return list(range(lo, hi + 1))
        return [opt]

    def warming(self) -> None:
        self._graph_threads.add(thread_token())  # its calls capture graphs (may_capture)
        super().warming()

    def device_bytes(self) -> int | None:
        """The device's bytes in use (ONNX Runtime's arenas and graphs are no allocator's that says: the warm-up's
        report is the device's growth while it ran, others' work on the device included)."""
        return self.cuda.used_bytes()

    def may_capture(self, thread: int) -> bool:
        """Whether a call on ``thread`` may capture a graph: a thread that warmed the runners (or any thread, when
        none did: graphs then come at first calls, wherever they are)."""
        if not self._graph_threads or thread in self._graph_threads:
            return True
        if not self._said_thread:
            self._said_thread = True
            log.warning("onnxruntime CUDA graphs belong to the thread that captured them; this thread did not warm the "
                        "runner, so its calls run without graphs (call runner.warmup() on it to capture its own)")  # fmt: skip
        return False

    def from_host(self, array: np.ndarray) -> Handle:
        """Upload the image (already in the root units' dtype: the runner casts it, see LoadedPlan.image_dtype)."""
        array = np.ascontiguousarray(array)
        with CAPTURE_LOCK:  # a legacy-stream copy and a device-wide wait: never while another thread captures
            if not self.cuda_graph:
                value = self.ort.OrtValue.ortvalue_from_numpy(array, self.ort_device, self.device_id)
            else:  # a fixed staging buffer per batch size, so the root graphs can bind its address
                value = self.io.stage(array)
                value.update_inplace(array)
            self.cuda.device_synchronize()  # ORT's host->device copy ran outside our stream
        return value

    def to_host(self, handle: Handle) -> np.ndarray:
        self.cuda.synchronize()  # ORT copies on its own stream; our stream's work must be finished first
        return handle.numpy()

    def is_fixed(self, value) -> bool:
        """Whether ``value`` lives in a buffer that stays put while the backend lives (a graph may bind it):
        a staged image, or a runner's slot-0 output."""
        return self.io.is_fixed(value)

    def timing_options(self) -> dict[str, Any]:
        return {**super().timing_options(), "cuda_graph": self.cuda_graph, "cudnn_conv_algo_search": self.conv_search,
                "allow_tf32": self.allow_tf32, "provider_options": self.extra_provider_options}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            {
                "device": self.device,
                "cuda_graph": self.cuda_graph,
                "cudnn_conv_algo_search": self.conv_search,
                "allow_tf32": self.allow_tf32,
                "provider_options": self.extra_provider_options,
                "stream_from": self.cuda.kind,
            }
        )
        return info

    def close(self) -> None:
        self.io.clear()
