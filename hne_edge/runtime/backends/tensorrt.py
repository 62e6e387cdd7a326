"""TensorRT backend: ``AnytimeRunner(bundle, backend="tensorrt", device="cuda")``.

Runs the bundle's engines (``format: "tensorrt"``, built on the target by
``hne-edge export BUNDLE --format tensorrt``; this module never imports the exporters):

* **Compatibility first.** Before anything is deserialized, every engine's
  recorded ``build`` (TensorRT version, compute capability, flags) is checked
  against this TensorRT and this GPU with
  :func:`~hne_edge.tensorrt_compat.engine_compatibility` (the rule the exporter records); a mismatch is a
  :class:`~hne_edge.errors.BundleError` that names both sides and says how to
  rebuild.
* **One execution context per engine, one shared scratch allocation.** Contexts
  are created without their own device memory (allocation strategy
  ``USER_MANAGED``) and all point at one buffer sized to the largest engine's
  need: the units run one after another on one stream, so they never use it
  at the same time. The buffer is allocated at the first run (after every
  runner is active) and re-set on every context if a larger need appears.
* ``set_input_shape`` only when the input shape changes; ``set_tensor_address``
  only when an address changes; ``execute_async_v3`` on the shared stream; no
  synchronization until ``to_host`` (the leaf's logits).
* **Buffers reused across frames**: each runner's outputs live in a
  :class:`~.cuda.SlotPool` per batch size (a second slot only while a paused
  session still holds the first). The image is staged into a fixed buffer per
  batch size.
* ``cuda_graph=True``: one graph per (input shape, input address) and runner,
  captured after one ordinary enqueue; every row count of the bundle's range
  is captured when the runner opens (nothing pads a call to a captured size)
  and kept for its life; replayed when the input sits in a fixed
  buffer (the staged image or another runner's first output slot) and the
  runner's first output slot is free; otherwise the ordinary enqueue is used.
* Device memory, the stream, copies, events and graph capture come from torch
  when it is installed with CUDA, else cuda-python (``memory=`` chooses).

TensorRT 10 vs 11 (the differences this module handles; each is probed with
``hasattr`` rather than by version number, so point releases that add the
newer call are used as soon as they have it):

* context without device memory: ``engine.create_runtime_config()`` +
  ``set_execution_context_allocation_strategy(USER_MANAGED)`` +
  ``create_execution_context(config)`` (TensorRT 10.11+ / 11), else
  ``create_execution_context(USER_MANAGED)`` (10.0+), else
  ``create_execution_context_without_device_memory()`` (older 10.x; removed in 11).
* scratch size: ``engine.device_memory_size_v2`` (10.1+; the only one in 11),
  else ``engine.device_memory_size``.
* setting it: ``context.set_device_memory(ptr, size)`` (10.1+; the only one in
  11), else the ``context.device_memory = ptr`` property.
* network creation flags and the strongly typed builds are the exporter's
  business (the TensorRT exporter); engines are deserialized the
  same way in both.

The compatibility checks, error paths and the 10/11 API selection are tested
with fakes; tests/runtime/test_gpu_fakes.py; the real GPU tests are in tests/runtime/test_gpu_hardware.py (skipped
without TensorRT and a GPU).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...bundle import Manifest, ModelFile
from ...errors import BackendUnavailable, BundleError, DeviceError
from ...limits import check_threads
from ...tensorrt_compat import device_info, engine_compatibility, load_tensorrt, version_compatible
from .base import Backend, Handle, LoadedPlan, Runner, Unit, check_flag, check_positive
from .cuda import (
    CudaIO, CudaTimingMixin, DeviceArray, GraphCache, Slot, SlotPool, WarmGraphsMixin, open_device, require_cuda,
)

__all__ = [
    "TensorRTBackend",
    "TensorRTRunner",
    "check_engine_files",
    "create_context_without_memory",
    "engine_memory_size",
    "set_context_memory",
]

log = logging.getLogger("hne_edge.runtime.gpu")

REBUILD_HINT = (
    "rebuild the engines on this device: hne-edge export BUNDLE --format tensorrt "
    "(or hne_edge.exporters.tensorrt.build_engines(bundle))"
)


# -- pure checks (no TensorRT needed) -------------------------------------------------------------


def check_engine_files(files: Sequence[ModelFile], trt_version: str, compute_capability: str) -> None:
    """Refuse engines built for another TensorRT version or GPU; the message names both sides."""
    problems: dict[str, list[str]] = {}
    for f in files:
        reason = engine_compatibility(f.build or {}, trt_version, compute_capability)
        if reason is not None:
            problems.setdefault(reason, []).append(f.path)
    if problems:
        lines = [
            f"{reason} [{paths[0]}{f' and {len(paths) - 1} more' if len(paths) > 1 else ''}]"
            for reason, paths in problems.items()
        ]
        raise BundleError(
            f"TensorRT engines cannot run here (TensorRT {trt_version}, compute capability {compute_capability}): "
            + "; ".join(lines)
            + f"; {REBUILD_HINT}"
        )


# -- TensorRT 10 / 11 API differences (probed, not version-switched) ------------------------------


def create_context_without_memory(engine: Any, trt: Any) -> Any:
    """An execution context that uses device memory we provide (see the module docstring)."""
    strategy = getattr(getattr(trt, "ExecutionContextAllocationStrategy", None), "USER_MANAGED", None)
    if strategy is not None and hasattr(engine, "create_runtime_config"):
        config = engine.create_runtime_config()
        config.set_execution_context_allocation_strategy(strategy)
        return engine.create_execution_context(config)
    if strategy is not None:
        return engine.create_execution_context(strategy)
    return engine.create_execution_context_without_device_memory()


def engine_memory_size(engine: Any) -> int:
    size = getattr(engine, "device_memory_size_v2", None)
    return int(engine.device_memory_size if size is None else size)


def set_context_memory(context: Any, ptr: int, size: int) -> None:
    if hasattr(context, "set_device_memory"):
        context.set_device_memory(ptr, size)
    else:
        context.device_memory = ptr


# -- runner ---------------------------------------------------------------------------------------


class TensorRTRunner(Runner):
    def __init__(self, unit: Unit, backend: "TensorRTBackend") -> None:
        super().__init__(unit)
        self._backend = backend
        self.engine = None
        self.context = None

    def activate_impl(self) -> None:
        with self._backend.cuda.current():  # an engine is deserialized onto, and runs on, the current device
            self._activate()

    def _activate(self) -> None:
        b = self._backend
        trt = b.trt
        build = (self.unit.file.build if self.unit.file else None) or {}
        if version_compatible(build) and hasattr(b.runtime, "engine_host_code_allowed"):
            # such an engine embeds TensorRT's lean runtime (host code), which a Runtime refuses unless allowed (its
            # default: not); the file is the bundle's, checked against the manifest's sha256 as it is read
            b.runtime.engine_host_code_allowed = True
        engine = b.runtime.deserialize_cuda_engine(b.read_file(self.unit.path, self.unit.file))
        if engine is None:
            raise BundleError(
                f"{self.name}: TensorRT {trt.__version__} could not deserialize the engine (see the TensorRT log); "
                f"{REBUILD_HINT}"
            )
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        if inputs != list(self.input_names) or sorted(outputs) != sorted(self.output_names):
            raise BundleError(
                f"{self.name}: the engine has inputs {inputs} and outputs {outputs}; "
                f"the manifest says {list(self.input_names)} -> {list(self.output_names)}"
            )
        context = create_context_without_memory(engine, trt)
        if context is None:
            raise BackendUnavailable(f"{self.name}: TensorRT could not create an execution context (out of GPU memory?)")
        self.engine, self.context = engine, context
        self._in_name = inputs[0]
        self._out_names = list(self.output_names)
        self._out_dtypes = [np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in self._out_names]
        self._in_shape: tuple[int, ...] | None = None
        self._out_shapes: list[tuple[int, ...]] = []
        self._addresses: tuple[int, ...] | None = None
        self._memory_generation = -1
        self._pool = SlotPool()
        self._graphs = (GraphCache(self._capture, max_graphs=b.max_graphs, on_capture=b.count_cold_call)
                        if b.cuda_graph else None)  # fmt: skip
        b.register_scratch(engine_memory_size(engine))

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        with self._backend.cuda.current():  # the calling thread's (a worker's starts on device 0)
            return self._run(inputs[0])

    def _run(self, x: DeviceArray) -> tuple[Handle, ...]:
        b = self._backend
        if self._memory_generation != b.scratch_generation or b.scratch is None:
            b.ensure_scratch()
            set_context_memory(self.context, b.scratch.ptr, b.scratch.nbytes)
            self._memory_generation = b.scratch_generation
            if self._graphs is not None:
                self._graphs.drop()  # captured with the old scratch address
        if x.shape != self._in_shape:
            if not self.context.set_input_shape(self._in_name, x.shape):
                raise BundleError(f"{self.name}: TensorRT refused input shape {x.shape} (outside the engine's profile?)")
            self._in_shape = x.shape
            self._out_shapes = [tuple(self.context.get_tensor_shape(n)) for n in self._out_names]
            self._addresses = None
        index, slot = self._pool.acquire(x.shape, lambda: self._make_slot(graph=self._pool.first(x.shape)))
        addresses = (x.ptr, *(h.ptr for h in slot.handles))
        if addresses != self._addresses:
            for name, ptr in zip((self._in_name, *self._out_names), addresses):
                if not self.context.set_tensor_address(name, ptr):  # an unknown name, a misaligned address
                    raise DeviceError(f"{self.name}: TensorRT refused address {ptr:#x} for tensor {name!r} (its log says why)")  # fmt: skip
            self._addresses = addresses
        if self._graphs is not None and index == 0 and b.is_fixed(x):
            self._graphs.get((x.shape, x.ptr))()
        else:
            self._enqueue()
        return slot.handles

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self._backend.cuda.stream_handle):
            raise DeviceError(f"{self.name}: TensorRT execute_async_v3 failed (see the TensorRT log)")

    def _capture(self, key: Any):
        self._enqueue()  # TensorRT: one enqueue after a shape change before capturing
        return self._backend.cuda.capture(self._enqueue)

    def _make_slot(self, graph: bool) -> Slot:
        b = self._backend
        return Slot(tuple(b.alloc(s, dt, graph=graph) for s, dt in zip(self._out_shapes, self._out_dtypes)))

    def release_impl(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()
        self._pool = None
        self.context = None
        self.engine = None


# -- backend --------------------------------------------------------------------------------------


class TensorRTBackend(WarmGraphsMixin, CudaTimingMixin, Backend):
    """Args:
    device: "cuda" or "cuda:N".
    cuda_graph: capture a CUDA graph per engine and input shape (see the module docstring).
    max_graphs: graphs kept per engine beyond those captured when the runner opened; the least recently used is
        dropped.
    memory: "auto" | "torch" | "cuda-python": who allocates device memory and owns the stream.
    verbose: TensorRT logger at VERBOSE instead of WARNING.
    """

    name = "tensorrt"
    format = "tensorrt"
    devices = ("cuda",)
    #: each frame in its own calls: the handles are device buffers of fixed addresses (no row stacking yet)
    row_batching = False

    def __init__(
        self,
        device: str = "cuda",
        *,
        cuda_graph: bool = False,
        max_graphs: int = 4,
        memory: str = "auto",
        verbose: bool = False,
        threads: int | None = None,  # accepted for symmetry with the CPU backends; unused
    ) -> None:
        super().__init__(device)
        check_flag(cuda_graph, "cuda_graph")
        max_graphs = check_positive(max_graphs, "max_graphs")
        check_threads(threads)  # unused, but held to the one bound like every other thread count
        self.trt = trt = load_tensorrt()  # BackendUnavailable with the install hint
        require_cuda(self.name, self.device_id, f" (TensorRT {trt.__version__} is installed)")
        self.gpu, self.compute_capability = device_info(self.device_id)
        self.cuda = open_device(self.device_id, memory)
        self.logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.cuda_graph = cuda_graph
        self.max_graphs = max_graphs
        self.scratch: DeviceArray | None = None
        self.scratch_generation = 0
        self._scratch_need = 0
        self.io = CudaIO(self._device_array, lambda array: array.ptr)
        self._runners: list[TensorRTRunner] = []  # their graph caches: WarmGraphsMixin

    # -- bundle -----------------------------------------------------------------------------------
    def load(self, manifest: Manifest, bundle_dir: Path, plan: str, precision: str) -> LoadedPlan:
        """The engines of ``plan``, refused before anything is deserialized when built for another TensorRT / GPU."""
        try:
            files = manifest.files_for(plan, precision, "tensorrt")
        except BundleError as exc:
            raise BundleError(f"{exc}; {REBUILD_HINT}") from None
        check_engine_files(files, self.trt.__version__, self.compute_capability)
        return super().load(manifest, bundle_dir, plan, precision)

    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        runner = TensorRTRunner(unit, self)
        self._runners.append(runner)
        return runner

    def warm_batch_sizes(self, lo: int, opt: int, hi: int) -> list[int]:
        """Every row count of the range with graphs (one per input shape, none padded to another); else the optimal
        batch size only."""
        return list(range(lo, hi + 1)) if self.cuda_graph else [opt]

    # -- memory -----------------------------------------------------------------------------------
    def register_scratch(self, nbytes: int) -> None:
        self._scratch_need = max(self._scratch_need, int(nbytes))

    def ensure_scratch(self) -> None:
        """One scratch buffer for every context, as large as the largest engine needs."""
        if self.scratch is None or self.scratch.nbytes < self._scratch_need:
            self.scratch = self.alloc((max(self._scratch_need, 1),), np.uint8)
            self.scratch_generation += 1

    def _device_array(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
        ptr, owner = self.cuda.malloc(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        return DeviceArray(ptr, shape, dtype, owner)

    def alloc(self, shape: Sequence[int], dtype: Any, *, graph: bool = True) -> DeviceArray:
        """A buffer that lives as long as the backend (a runner's outputs, the scratch, a staged image); ``graph``:
        see :meth:`CudaIO.alloc`."""
        return self.io.alloc(shape, dtype, graph=graph)

    def is_fixed(self, array: DeviceArray) -> bool:
        return self.io.is_fixed(array)

    # -- handles ----------------------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> Handle:
        """Stage the image (already in the engines' dtype: the runner casts it, see LoadedPlan.image_dtype)."""
        array = np.ascontiguousarray(array)
        staged = self.io.stage(array)
        self.cuda.upload(staged.ptr, array)
        return staged

    def to_host(self, handle: Handle) -> np.ndarray:
        out = np.empty(handle.shape, handle.dtype)
        self.cuda.download(handle.ptr, out)  # synchronizes the stream first
        return out

    def timing_options(self) -> dict[str, Any]:
        return {"cuda_graph": self.cuda_graph}

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": self.device,
            "tensorrt": self.trt.__version__,
            "gpu": self.gpu,
            "compute_capability": self.compute_capability,
            "cuda_graph": self.cuda_graph,
            "memory": self.cuda.kind,
            "scratch_bytes": self._scratch_need,
        }

    def close(self) -> None:
        self.io.clear()
        self.scratch = None
