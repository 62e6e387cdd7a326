"""ONNX Runtime backend on the CPU execution provider (the CUDA one: :mod:`.onnxruntime_cuda`).

One ``InferenceSession`` per model file, tuned for low-latency small batches:
graph optimisation level ALL, sequential execution, a configurable number of
intra-op threads (``threads``; default: ONNX Runtime's choice, the physical
cores) and inter-op threads 1. Sessions are thread-safe for ``run``; the
runtime's per-session activation cache is not, which is why
:class:`~hne_edge.runtime.AnytimeRunner` refuses concurrent use.

Handles are host numpy arrays (the CUDA variant keeps activations on the
device as ``OrtValue`` s bound with IOBinding).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ...bundle import FUSED, check_self_contained
from ...errors import BackendUnavailable, BundleError, ResourceExhausted, install_hint
from ...limits import check_threads, format_bytes
from .base import Backend, Handle, LoadedPlan, Runner, Unit

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeRunner", "allocation_error"]

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16"}
# how ONNX Runtime words a failed allocation (its CPU arena, std::bad_alloc, the CUDA allocator)
_ALLOCATION_FAILURES = ("failed to allocate memory", "bad_alloc", "bad allocation", "out of memory")


def allocation_error(exc: BaseException, name: str, batch: Any = None) -> ResourceExhausted | None:
    """The :class:`ResourceExhausted` that ONNX Runtime's error ``exc`` stands for, or None when it is no allocation failure."""
    text = str(exc)
    if not any(words in text.lower() for words in _ALLOCATION_FAILURES):
        return None
    size = re.search(r"buffer of size (\d+)", text)
    asked = f" (one buffer of {format_bytes(int(size.group(1)))})" if size else ""
    at = f" to run batch {batch}" if batch is not None else ""
    return ResourceExhausted(f"{name}: ONNX Runtime could not allocate memory{asked}{at}",
                             hint="run a smaller batch, or free memory (other processes, fewer runners)")  # fmt: skip


def _batch(handle: Any) -> int | None:
    shape = getattr(handle, "shape", None)
    shape = shape() if callable(shape) else shape  # numpy: a tuple; OrtValue: a method
    return int(shape[0]) if shape else None


def _import_ort():
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailable(
            f"backend 'onnxruntime' needs the onnxruntime package ({exc}); {install_hint('runtime')}"
        ) from None
    return onnxruntime


def open_session(runner: Runner, ort: Any, sess_options: Any, providers: list, where: str = "", **options: Any):
    """An InferenceSession for ``runner.unit`` (``options``: InferenceSession's keyword arguments), its graph I/O
    names checked against the manifest."""
    data = runner._backend.read_file(runner.unit.path, runner.unit.file)  # hashed once; these bytes are what runs
    check_self_contained(data, runner.name)
    try:
        session = ort.InferenceSession(data, sess_options=sess_options, providers=providers, **options)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise allocation_error(exc, runner.name) or BundleError(
            f"{runner.name}: onnxruntime could not load the model{where}: {exc}"
        ) from None
    labelled = session.get_modelmeta().custom_metadata_map.get("hne_edge.nodes")  # the exporter's label of it
    if labelled is not None and labelled.split(",") != list(runner.unit.nodes):
        raise BundleError(f"{runner.name}: the ONNX file computes {labelled} (its metadata); the manifest lists it as "
                          f"{','.join(runner.unit.nodes)}")  # fmt: skip
    names_in = [i.name for i in session.get_inputs()]
    names_out = [o.name for o in session.get_outputs()]
    if names_in != list(runner.input_names) or sorted(names_out) != sorted(runner.output_names):
        raise BundleError(
            f"{runner.name}: the ONNX graph has inputs {names_in} and outputs {names_out}; "
            f"the manifest says {list(runner.input_names)} -> {list(runner.output_names)}"
        )
    # dtypes and fixed dims too: a disagreement would otherwise surface as an InvalidArgument mid-frame
    for metas, specs in ((session.get_inputs(), runner.unit.inputs), (session.get_outputs(), runner.unit.outputs)):
        graph = {m.name: m for m in metas}
        for spec in specs:
            meta = graph[spec.name]
            dtype = _ORT_DTYPES.get(meta.type, meta.type)
            dims = list(meta.shape)
            fixed_differ = len(dims) != len(spec.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(dims, spec.shape)
            )
            if dtype != spec.dtype or (spec.shape and fixed_differ):
                raise BundleError(
                    f"{runner.name}: tensor {spec.name} is {dtype} {dims} in the ONNX graph; the manifest says "
                    f"{spec.dtype} {list(spec.shape)}"
                )
    return session


class OnnxRuntimeRunner(Runner):
    def __init__(self, unit: Unit, backend: "OnnxRuntimeBackend") -> None:
        super().__init__(unit)
        self._backend = backend
        self.session = None

    def activate_impl(self) -> None:
        b = self._backend
        self.session = open_session(self, b.ort, b.session_options(), b.providers)
        self._run = self.session.run
        self._out_names = list(self.output_names)
        self._in_name = self.input_names[0]
        self._single = len(self.unit.inputs) == 1

    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        try:
            if self._single:
                return self._run(self._out_names, {self._in_name: inputs[0]})
            return self._run(self._out_names, dict(zip(self.input_names, inputs)))
        except Exception as exc:  # free when nothing is raised
            error = allocation_error(exc, self.name, _batch(inputs[0]))
            if error is None:
                raise
            raise error from None

    def run_logits_impl(self, inputs: Sequence[Handle]) -> Handle:
        # ask onnxruntime for the logits only: the exported activations are not copied out
        try:
            return self._run(self._out_names[-1:], {self._in_name: inputs[0]} if self._single else dict(zip(self.input_names, inputs)))[0]
        except Exception as exc:
            error = allocation_error(exc, self.name, _batch(inputs[0]))
            if error is None:
                raise
            raise error from None

    def release_impl(self) -> None:
        self.session = None
        self._run = None


class OnnxRuntimeBackend(Backend):
    """Args:
    device: "cpu".
    threads: intra-op threads per session (None: onnxruntime's default, the physical cores); at most
        :func:`hne_edge.limits.max_threads`.
    spinning: let idle intra-op threads spin (lower latency, burns CPU). None: off when the runner chains
        several sessions (every plan but fused), onnxruntime's default (on) for the fused tree alone.

    Why off for a chain: each session owns its intra-op pool, and after its call that pool's idle threads spin
    while the next session's threads need the same cores. hne_resnet_small, plan segments, 2 threads on a
    2-core machine (bench_ort_spinning.py at b5d69df, CHANGELOG.md; medians of 3 rounds): a full pass took 111.7 ms spinning,
    10.1 ms not (6.9 ms on one thread); the fused tree alone, one pool, ran faster spinning (3.4 ms against 5.0).
    """

    name = "onnxruntime"
    format = "onnx"
    devices = ("cpu",)

    def __init__(self, device: str = "cpu", threads: int | None = None, spinning: bool | None = None) -> None:
        super().__init__(device)
        self.ort = _import_ort()
        self.threads = check_threads(threads)
        self.spinning = spinning
        self.providers = ["CPUExecutionProvider"]
        self._chained = False  # a plan of several sessions was loaded (see spinning)

    def load(self, manifest: Any, bundle_dir: Any, plan: str, precision: str) -> LoadedPlan:
        loaded = super().load(manifest, bundle_dir, plan, precision)
        self._chained = self._chained or plan != FUSED  # before any session opens: a runner loads, then activates
        return loaded

    def spins(self) -> bool | None:
        """Whether the sessions let idle intra-op threads spin (None: onnxruntime's default, on); see ``spinning``."""
        if self.spinning is not None:
            return self.spinning
        return False if self._chained else None

    def session_options(self):
        ort = self.ort
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        if self.threads is not None:
            options.intra_op_num_threads = self.threads
        spins = self.spins()
        if spins is not None:
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spins else "0")
        options.log_severity_level = 4  # fatal only: every error reaches the caller as an exception, said once
        return options

    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        return OnnxRuntimeRunner(unit, self)

    def timing_options(self) -> dict[str, Any]:
        return {"threads": self.threads, "spinning": self.spinning}

    def describe(self) -> dict[str, Any]:
        info = {
            "backend": self.name,
            "device": self.device,
            "onnxruntime": self.ort.__version__,
            "providers": self.providers,
            "threads": self.threads,
            "spinning": self.spins(),
        }
        if self.fallback_reason is not None:
            info["fallback_reason"] = self.fallback_reason
        return info
