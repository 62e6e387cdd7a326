"""The backend interface: what the anytime scheduler needs from a device runtime.

Two small classes, in the manner of Polygraphy's runners:

* :class:`Backend` - one per :class:`~hne_edge.runtime.AnytimeRunner`. It
  knows which bundle files it reads (``format``), turns the bundle's plan
  into execution :class:`Unit` s (``load`` returns them in a :class:`LoadedPlan`,
  with the image dtype and weights), creates one :class:`Runner` per unit, and
  moves tensors between host numpy and its own *handles*
  (``from_host`` / ``to_host``). It also owns the clock the scheduler reads
  and a ``synchronize()`` hook for asynchronous devices.
* :class:`Runner` - one per model file (or module): ``activate()`` allocates
  (session, engine context, buffers), ``run(inputs)`` validates then calls
  ``run_impl``, ``release()`` frees. Usable as a context manager.

Handles are opaque to the scheduler: a CPU backend uses numpy arrays, a GPU
backend may use device buffers (``OrtValue``, torch CUDA tensors, TensorRT
bindings) so activations never leave the device. Only a leaf's logits come
back to host, through ``Backend.to_host``, which must block until the data
is ready (the scheduler's per-leaf timing relies on that).

Validation happens once: ``Runner.run`` checks the inputs against the
unit's metadata (for host arrays), but the scheduler calls ``run_impl``
directly - it checked the image at the boundary, and every other input is a
handle that a runner of the same backend produced.

To add a backend: subclass :class:`Backend` (set ``name``, ``format``,
``devices``; call ``Backend.__init__``, which parses the device once;
implement ``create_runner``; override ``load`` when the units are not the
bundle's files of ``format``, and ``from_host`` / ``to_host`` /
``synchronize`` when handles live on the device) and :class:`Runner`
(``activate_impl``, ``run_impl``, ``release_impl``), then register it in
``hne_edge.runtime.backends.BACKENDS`` under ``(name, device kind)``. The
scheduler needs no change.
"""

from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ...bundle import (
    ANYTIME_PLANS,
    DTYPE_OF,
    FUSED,
    NODES,
    PLAN_TABLE,
    SEGMENTS,
    SUBTREES,
    Manifest,
    ModelFile,
    TensorSpec,
    activation_name,
    bundle_path,
    read_verified,
)
from ...errors import BackendUnavailable, BundleError, HNEError, InputError
from ...tree import TreeSpec

__all__ = [
    "Handle",
    "Unit",
    "LoadedPlan",
    "Runner",
    "RunnerInactiveError",
    "Backend",
    "device_name",
    "parse_device",
    "image_dtype",
    "units_from_files",
    "units_from_tree",
]

Handle = Any  # a backend's tensor: numpy array (CPU backends), OrtValue, torch tensor, device pointer...


@dataclass(frozen=True)
class Unit:
    """One execution unit: something that computes a chain of tree nodes in one call.

    For ONNX / TensorRT this is a model file of the bundle; the torch backend
    builds units from the tree (one per segment, node, subtree unit, or the
    whole tree) over one weights file.
    """

    name: str  # bundle path of the file, or e.g. "torch/model.pt#segment3"
    nodes: tuple[str, ...]  # tree nodes computed, root side first
    leaf: int | None  # depth-first position of the (first) leaf whose logits it outputs (None: inner node)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    macs: int  # per sample
    # "segment" (a leaf's chain, plans "segments" / "first"), "node" (plan "nodes"), "subtree" (a unit of
    # plan "subtrees") or "tree" (plan "fused"): the plan's Plan.unit (hne_edge.bundle.PLAN_TABLE)
    kind: str
    # what the torch model's views take: the segment's leaf (model.segment_module), the node's id
    # (node_module), the subtree unit's index (unit_module); None for the whole tree
    key: int | str | None
    path: Path | None = None  # absolute path of the file it loads
    file: ModelFile | None = None
    num_leaves: int = 1  # leaves whose logits it outputs (leaf .. leaf + num_leaves - 1)


@dataclass(frozen=True)
class LoadedPlan:
    """What :meth:`Backend.load` returns: everything later calls need, explicitly (no hidden backend state)."""

    plan: str
    precision: str
    units: tuple[Unit, ...]  # in the manifest's execution order
    image_dtype: str  # what the root units read: the runner casts the checked image to it before from_host
    weights: ModelFile | None = None  # the weights file the units are views of (torch backends), else None
    model: Any = None  # the module built from ``weights`` (torch backends), else None


def device_name(kind: str, index: int | None) -> str:
    """``("cpu", None)`` -> "cpu", ``("cuda", 0)`` -> "cuda", ``("cuda", 1)`` -> "cuda:1" (profiles are keyed by it)."""
    return kind if not index else f"{kind}:{index}"


def parse_device(backend: str, device: str, devices: Sequence[str]) -> int:
    """``"cuda"`` -> 0, ``"cuda:1"`` -> 1, ``"cpu"`` -> 0; anything not of ``devices``: BackendUnavailable naming them."""
    if device in devices:
        return 0
    kind, _, index = str(device).partition(":")
    if kind in devices and kind != "cpu" and index.isdigit():
        return int(index)
    cuda = " or 'cuda:N'" if "cuda" in devices else ""
    raise BackendUnavailable(
        f"backend {backend!r}: received device {device!r}; expected one of {list(devices)}{cuda}",
        hint="e.g. device='cuda'" if cuda else "GPU devices come with the GPU backends",
        cli_hint="e.g. --device cuda" if cuda else "GPU devices come with the GPU backends (--backend)",
    )


def check_flag(value: Any, name: str) -> bool:
    """A backend's on/off option: True or False only (``bool("false")`` is True: a string would turn it on)."""
    if not isinstance(value, bool):
        raise InputError(f"{name}: received {value!r}; expected True or False")
    return value


def check_positive(value: Any, name: str, why: str = "") -> int:
    """A backend's count that must be at least 1 (``why``: appended to the message, e.g. " (...)")."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name}: received {value!r}; expected an int >= 1{why}")
    return int(value)


def image_dtype(units: Sequence[Unit], manifest: Manifest) -> str:
    """The dtype the root units read (fp16 files read fp16); the manifest's input dtype when no unit reads the image."""
    return next((u.inputs[0].dtype for u in units if u.inputs[0].node is None), manifest.input.dtype)


def _unit_of_file(f: ModelFile, bundle_dir: Path, tree: TreeSpec) -> Unit:
    count, kind = 1, PLAN_TABLE[f.plan].unit
    if kind == "node":
        key = f.nodes[0]
    elif kind == "subtree":
        unit = next(u for u in tree.subtree_units if u.first_leaf == f.leaf)
        key, count = unit.index, unit.num_leaves
    elif kind == "tree":
        key, count = None, tree.num_leaves
    else:
        key = f.leaf
    return Unit(name=f.path, nodes=f.nodes, leaf=f.leaf, inputs=f.inputs, outputs=f.outputs, macs=f.macs,
                kind=kind, key=key, path=bundle_path(bundle_dir, f), file=f, num_leaves=count)  # fmt: skip


def units_from_files(manifest: Manifest, bundle_dir: Path, plan: str, precision: str, format: str) -> list[Unit]:
    """One unit per model file of ``format/plan/precision`` (the manifest's validated files)."""
    return [_unit_of_file(f, bundle_dir, manifest.tree) for f in manifest.files_for(plan, precision, format)]


def units_from_tree(manifest: Manifest, plan: str, precision: str, name: str, path: Path | None) -> list[Unit]:
    """Units synthesized from the tree (for backends that run modules, not files).

    Activation shapes are unknown without the model (``shape=()``, not checked); logits have their rank:
    ``("batch", classes)`` for one leaf, ``("batch", leaves, classes)`` for a subtree unit or the tree.
    """
    dtype = DTYPE_OF[precision]
    tree = manifest.tree
    classes = manifest.num_classes

    def spec(node: str | None) -> TensorSpec:
        if node is None:  # the image, in the units' dtype (the runner casts it)
            return TensorSpec(manifest.input.name, None, dtype, manifest.input.shape)
        return TensorSpec(activation_name(node), node, dtype, ())

    def logits(node: str | None, count: int | None = None) -> TensorSpec:
        return TensorSpec("logits", node, dtype, ("batch", classes) if count is None else ("batch", count, classes))

    # (label, nodes, input, exports, logits or None, leaf, kind, key, leaves)
    if plan == SEGMENTS:
        chains = [(f"segment{seg.leaf}", seg.nodes, seg.input, seg.exports, logits(seg.nodes[-1]), seg.leaf, "segment",
                   seg.leaf, 1) for seg in tree.segments]  # fmt: skip
    elif plan == NODES:
        chains = [(node.id, (node.id,), node.parent, () if node.is_leaf else (node.id,),
                   logits(node.id) if node.is_leaf else None, node.leaves[0] if node.is_leaf else None, "node", node.id, 1)
                  for node in tree.nodes]  # fmt: skip
    elif plan == SUBTREES:
        chains = [(f"unit{u.index}", u.nodes, u.input, u.exports,
                   logits(u.nodes[-1]) if u.index == 0 else logits(u.root, u.num_leaves), u.first_leaf, "subtree",
                   u.index, u.num_leaves) for u in tree.subtree_units]  # fmt: skip
    elif plan == FUSED:
        chains = [("tree", tuple(n.id for n in tree.nodes), None, (), logits(None, tree.num_leaves), 0, "tree", None,
                   tree.num_leaves)]  # fmt: skip
    else:
        raise BundleError(f"plan must be one of {list(ANYTIME_PLANS)} for this backend; received {plan!r}")
    units = []
    for label, nodes, src, exports, out, leaf, kind, key, count in chains:
        units.append(
            Unit(
                name=f"{name}#{label}",
                nodes=tuple(nodes),
                leaf=leaf,
                inputs=(spec(src),),
                outputs=tuple(spec(e) for e in exports) + ((out,) if out is not None else ()),
                macs=sum(manifest.node_macs[n] for n in nodes),
                kind=kind,
                key=key,
                path=path,
                num_leaves=count,
            )
        )
    return units


class RunnerInactiveError(HNEError, RuntimeError):
    """A runner was called before ``activate()`` or after ``release()``."""


class Runner(ABC):
    """Runs one :class:`Unit`. Lifecycle: ``activate()`` -> ``run()``* -> ``release()``."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.is_active = False

    @property
    def name(self) -> str:
        return self.unit.name

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.unit.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.unit.outputs)

    # -- lifecycle ---------------------------------------------------------
    def activate(self) -> "Runner":
        if not self.is_active:
            self.activate_impl()
            self.is_active = True
        return self

    def release(self) -> None:
        if self.is_active:
            self.is_active = False
            self.release_impl()

    def __enter__(self) -> "Runner":
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- inference ---------------------------------------------------------
    def run(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        """Validated inference: ``inputs`` in ``unit.inputs`` order; outputs in ``unit.outputs`` order."""
        if not self.is_active:
            raise RunnerInactiveError(f"runner {self.name}: not active; call activate() or use it as a context manager")
        if len(inputs) != len(self.unit.inputs):
            raise InputError(
                f"runner {self.name}: received {len(inputs)} input(s); expected {len(self.unit.inputs)} "
                f"({', '.join(self.input_names)})"
            )
        for value, meta in zip(inputs, self.unit.inputs):
            if isinstance(value, np.ndarray):
                if value.dtype != np.dtype(meta.dtype):
                    raise InputError(
                        f"runner {self.name}: input tensor {meta.name} | received dtype {value.dtype}; expected {meta.dtype}"
                    )
                fixed = [(i, d) for i, d in enumerate(meta.shape) if isinstance(d, int)]
                if meta.shape and (value.ndim != len(meta.shape) or any(value.shape[i] != d for i, d in fixed)):
                    raise InputError(
                        f"runner {self.name}: input tensor {meta.name} | received shape {tuple(value.shape)}; "
                        f"expected {tuple(meta.shape)}"
                    )
        return self.run_impl(inputs)

    @abstractmethod
    def run_impl(self, inputs: Sequence[Handle]) -> tuple[Handle, ...]:
        """Unchecked inference (the scheduler's hot path). Outputs in ``unit.outputs`` order."""

    def run_logits_impl(self, inputs: Sequence[Handle]) -> Handle:
        """Only the last output (the leaf's logits), for a leaf after which nothing reads the exports.

        ``AnytimeRunner.run(max_leaves=n)`` uses it for leaf ``n-1`` so backends can skip
        materialising activations no one will read. Default: ``run_impl(inputs)[-1]``.
        """
        return self.run_impl(inputs)[-1]

    def activate_impl(self) -> None:  # pragma: no cover - trivial default
        pass

    def release_impl(self) -> None:  # pragma: no cover - trivial default
        pass


class Backend(ABC):
    """A device runtime: creates runners for a bundle's units and moves tensors to/from the host."""

    name: ClassVar[str]  # "onnxruntime", "torch", "tensorrt", ...
    format: ClassVar[str]  # which bundle files it reads: "onnx" | "torch" | "tensorrt"
    devices: ClassVar[tuple[str, ...]] = ("cpu",)

    #: The scheduler's time source, in seconds. Budgets, deadlines and the cost
    #: model all use it. Real backends use host wall-clock time (the leaf's
    #: logits are on the host when ``to_host`` returns); tests inject a virtual clock.
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, device: str = "cpu") -> None:
        """Parses ``device`` once: ``device_kind`` ("cpu" | "cuda"), ``device_id`` and the canonical ``device`` name."""
        self.device_id = parse_device(self.name, device, self.devices)
        self.device_kind = str(device).partition(":")[0]
        self.device = device_name(self.device_kind, self.device_id)

    #: Why this CPU backend stands in for the GPU one asked for (``create_backend(..., fallback_to_cpu=True)``).
    fallback_reason: str | None = None

    #: Calls that paid a one-off since the backend opened: a CUDA graph captured, a shape's first run (its
    #: allocations, cuDNN's search). Their time is neither a step's cost nor a stall of the machine (issue 39: a
    #: capture learned as a step's cost held a new row count's frames to one leaf): a caller that sees the count
    #: move across a call does not feed that call's time to the cost model. CPU backends never count one.
    cold_calls: int = 0

    def count_cold_call(self) -> None:
        self.cold_calls += 1

    #: Check each model file's sha256 on the very bytes handed to the device runtime
    #: (``AnytimeRunner(verify=...)`` sets it); a file is never reopened by path after its check.
    verify: bool = True

    def read_file(self, path: Path, model_file: ModelFile | None) -> bytes:
        """The bytes a runner loads: read once, checked against the manifest's sha256 when ``verify``."""
        return read_verified(path, model_file if self.verify else None)

    def has_plan(self, manifest: Manifest, plan: str, precision: str) -> bool:
        """Whether :meth:`load` can load ``plan`` in ``precision`` from this bundle (default: it has those files)."""
        return (self.format, plan, precision) in manifest.variants()

    def load(self, manifest: Manifest, bundle_dir: Path, plan: str, precision: str) -> LoadedPlan:
        """The units of ``plan`` and what running them needs (default: the bundle's files of this backend's format)."""
        units = tuple(units_from_files(manifest, bundle_dir, plan, precision, self.format))
        return LoadedPlan(plan, precision, units, image_dtype(units, manifest))

    @abstractmethod
    def create_runner(self, unit: Unit, loaded: LoadedPlan) -> Runner:
        """A (not yet active) runner for ``unit`` of ``loaded``."""

    def from_host(self, array: np.ndarray) -> Handle:
        """Upload a validated host array (the image); CPU backends pass it through."""
        return array

    def owned(self, handle: Handle, array: np.ndarray) -> Handle:
        """``handle`` (what :meth:`from_host` made of ``array`` or its cast) made independent of ``array``, the
        caller's buffer, for a session that outlives the call: a handle sharing its memory is copied, an upload (a
        GPU's, a cast's) is kept as it is. ``run`` skips it: its frame ends in the call."""
        return handle.copy() if isinstance(handle, np.ndarray) and np.may_share_memory(handle, array) else handle

    def to_host(self, handle: Handle) -> np.ndarray:
        """A host numpy array of ``handle``; must block until the values are ready."""
        return handle

    def synchronize(self) -> None:
        """Wait for queued device work (profiling calls it before reading the clock)."""

    #: Whether one call may serve several frames: the stream scheduler (:mod:`..streams`) stacks their rows with
    #: :meth:`concat_rows` and splits the activations it keeps with :meth:`split_rows`. The defaults work on numpy
    #: handles; a backend whose handles are device buffers bound to fixed addresses says False (each frame then
    #: runs in its own calls).
    row_batching: ClassVar[bool] = True
    #: Whether what the warm-up builds serves only the thread that warmed (ONNX Runtime's CUDA graphs): a runner
    #: served from another thread (the stream scheduler's worker) is warmed again there.
    graphs_per_thread: bool = False

    def concat_rows(self, handles: Sequence[Handle]) -> Handle:
        """One handle holding ``handles``' rows in order (each a batch-first tensor of this backend)."""
        return np.concatenate(handles, axis=0)

    def split_rows(self, handle: Handle, rows: Sequence[int]) -> list[Handle]:
        """``handle``'s rows cut into consecutive parts of ``rows`` rows each, each safe to keep after later calls."""
        return np.split(handle, np.cumsum(rows)[:-1])

    def warm_batch_sizes(self, lo: int, opt: int, hi: int) -> list[int]:
        """The row counts a runner warms when it opens (``AnytimeRunner.warmup``), of the bundle's batch range: the
        first call of a shape must never be a frame's. A CPU backend's first call of a new shape costs little more
        than its others: the optimal batch size only. A GPU backend that captures a graph per shape says every
        size it will run (:class:`~.torch_cuda.TorchCudaBackend`: its capture sizes)."""
        return [opt]

    def warming(self) -> None:
        """Called before a runner's warm-up: nothing it builds may be dropped before :meth:`warmed` (a GPU backend's
        graph cache, bounded while serving, holds every size the warm-up captures)."""

    def warmed(self) -> None:
        """Called once a runner's warm-up ran every size of :meth:`warm_batch_sizes`: what it built is kept for the
        runner's life (a GPU backend keeps every graph it captured: nothing is evicted while serving)."""

    def device_bytes(self) -> int | None:
        """Device memory this backend's process holds now (bytes; None: not a device that says), for the warm-up's
        report."""
        return None

    def describe(self) -> dict[str, Any]:
        """Versions and settings, recorded in saved profiles."""
        return {"backend": self.name, "device": self.device}

    def timing_options(self) -> dict[str, Any]:
        """The constructor's options, as given, that change what a step costs (threads, bfloat16, CUDA graphs...):
        a profile whose :meth:`describe` says other values for them was measured on another setup."""
        return {}

    def changed_options(self) -> dict[str, Any]:
        """:meth:`timing_options` not at the constructor's defaults (they name a profile's file)."""
        params = inspect.signature(type(self)).parameters
        return {k: v for k, v in self.timing_options().items() if k not in params or v != params[k].default}

    def close(self) -> None:
        """Free backend-wide resources (after every runner was released)."""
