"""The doctor's checks: which backends are here, and does each really work on this device.

For every (backend, device kind) of the runtime's registry (:data:`hne_edge.runtime.backends.BACKENDS`)
:func:`availability` decides from the :class:`~.environment.Environment` whether it is present (its
library and, for CUDA, a GPU it can use) or absent, and then how to get it. A machine without a GPU is
never told to install a GPU package: it is told that the backend needs a GPU.

For every present backend x precision x runner plan of the bundle (``mixed`` included), :func:`check_variant` opens a real
:class:`~hne_edge.runtime.AnytimeRunner` on the tiny bundle (:mod:`.tiny`) and checks, against the float64
reference of the fused model:

* every anytime prefix the plan stops at (``runner.stops``: n = 1..N for ``segments``; 1, 2, 4, ..., N for
  ``subtrees``), stepping a session step by step and through ``run(x, max_leaves=n)`` (the export-free
  first-leaf file for n = 1 where the bundle has one);
* a session under a budget (half the measured full tree), then resumed to the end;
* cancel: before the first step (no result), from another thread after two steps (no further step), and
  from inside a running refine (stops at the next step boundary), where the plan has that many steps;

and times the first leaf and the full tree at batch 1 (medians). Bounds are the exporter's
(:data:`hne_edge.exporters.base.TOLERANCES`, against ``max |reference|``); times are reported, never judged.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..bundle import ANYTIME_PLANS, MIXED, MIXED_NEEDS, WEIGHTS, read_manifest
from ..errors import EXTRA_OF_MODULE, install_hint
from ..exporters.base import TOLERANCES
from ..runtime import AnytimeRunner, SessionCancelled
from ..runtime.backends import BACKENDS, Backend, create_backend
from ..tensorrt_compat import INSTALL_HINT as TENSORRT_HINT
from .environment import Environment

if TYPE_CHECKING:  # pragma: no cover - (importing .tiny here would make `python -m hne_edge.doctor.tiny` warn)
    from .tiny import TinyBundle

__all__ = ["Availability", "Check", "CheckFailed", "availability", "plans_for", "check_variant", "build_engines_for"]

NO_GPU = "needs an NVIDIA GPU; none was found on this machine"
CUDA_TORCH = "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"
DRIVER_HOW = ("update the NVIDIA driver to one for the CUDA version of torch / cuda-python here, or run on the CPU: "
              "--device cpu")


def _pip(module: str) -> str:
    """How to install the extra of hne-edge that brings ``module`` (errors.EXTRA_OF_MODULE is its one home)."""
    return install_hint(EXTRA_OF_MODULE[module])


@dataclass(frozen=True)
class Availability:
    """Whether one (backend, device kind) of the registry can run here."""

    backend: str
    device: str  # "cpu" | "cuda"
    present: bool
    reason: str = ""  # absent: what is missing; present: empty
    how: str = ""  # absent: how to get it ("" when nothing installable would help, e.g. no GPU)

    @property
    def label(self) -> str:
        return f"{self.backend} {self.device}"


@dataclass
class Check:
    """One row of the doctor's table: a backend, device, precision and plan run on one bundle."""

    backend: str
    device: str
    precision: str
    plan: str
    bundle: str  # "fresh" | "shipped"
    ok: bool = False
    prefixes: list[int] = field(default_factory=list)  # the leaf counts of the anytime prefixes that matched the
    # reference through run(), in order: the plan's stops (fused: [16]; subtrees: [1, 2, 4, 8, 16]), as far as it got
    leaves: int = 0
    max_error: float | None = None  # the worst |runtime - float64 reference| over every comparison
    bound: float | None = None  # its bound (fp32: 1e-4; fp16: 2e-2 + 2e-2 max|ref|)
    budget: str = ""  # budget_cell: "6/16 leaves in 0.41 ms, within 0.52 ms"
    cancel: str = ""
    first_leaf_ms: float | None = None
    full_tree_ms: float | None = None
    error: str | None = None  # what failed (one line), None when ok
    traceback: str | None = None  # of the failure (``hne-edge --debug doctor`` prints it)

    @property
    def label(self) -> str:
        what = " ".join(v for v in (self.backend, self.device, self.precision, self.plan) if v != "-")
        return f"{what} ({self.bundle} bundle)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


class CheckFailed(Exception):
    """A check found the runtime doing something other than it promises (the message says what)."""


# -- which backends are here ------------------------------------------------------------------------


def availability(env: Environment) -> list[Availability]:
    """One entry per (backend, device kind) of the registry, in registry order."""
    return [_availability(env, name, kind) for name, kind in BACKENDS]


def _availability(env: Environment, name: str, kind: str) -> Availability:
    lib = env.libraries
    ort, torch, trt = lib["onnxruntime"], lib["torch"], lib["tensorrt"]

    def absent(reason: str, how: str = "") -> Availability:
        return Availability(name, kind, False, reason, how)

    def broken() -> Availability:  # installed but does not import: present, so its check runs and fails
        return Availability(name, kind, True)

    def no_stream(reason: str, how: str) -> Availability:  # neither torch nor cuda-python sees the GPU: why
        refused = env.cuda.driver_error if env.gpus else None
        if refused is None:
            return absent(reason, how)
        # a GPU was found (nvidia-smi, a Jetson), so a driver is installed: older than the CUDA libraries, here already
        driver = f" {env.gpus[0].driver}" if env.gpus[0].driver else ""
        return absent(f"the GPU's driver{driver} is too old for the CUDA libraries installed here ({refused})",
                      DRIVER_HOW)

    if (name, kind) == ("onnxruntime", "cpu"):
        if ort.error:
            return broken()
        return Availability(name, kind, True) if ort.ok else absent("onnxruntime is not installed", _pip("onnxruntime"))
    if (name, kind) == ("torch", "cpu"):
        if torch.error:
            return broken()
        return Availability(name, kind, True) if torch.ok else absent(
            "torch is not installed", f"{_pip('torch')} (the runtime does not need it: this backend is optional)")  # fmt: skip
    if kind == "cuda" and not env.has_gpu:
        return absent(NO_GPU)
    if (name, kind) == ("onnxruntime", "cuda"):
        if not ort.ok:
            return absent("onnxruntime is not installed", f"{_pip('cuda')} (onnxruntime-gpu and cuda-python)")
        if "CUDAExecutionProvider" not in env.ort_providers:
            return absent(
                f"onnxruntime {ort.version} has no CUDAExecutionProvider (providers {env.ort_providers})",
                f"pip uninstall onnxruntime && {_pip('cuda')} (onnxruntime-gpu installs the same package, so the CPU "
                "one goes first)",
            )
        if not env.cuda.device_count:
            return no_stream("no library here gives it a CUDA stream: neither torch with CUDA nor cuda-python sees the "
                             "GPU", f"{_pip('cuda')} (cuda-python), or a CUDA build of torch")  # fmt: skip
        return Availability(name, kind, True)
    if (name, kind) == ("torch", "cuda"):
        if not torch.ok:
            return absent("torch is not installed", CUDA_TORCH)
        if env.torch_cuda_build is None:
            return absent(f"torch {torch.version} is a CPU-only build", CUDA_TORCH)
        return Availability(name, kind, True)  # a GPU and torch with CUDA: if torch cannot use it, that is a failure
    if (name, kind) == ("tensorrt", "cuda"):
        if trt.error:
            return broken()
        if not trt.ok:
            return absent("TensorRT is not installed", TENSORRT_HINT.split(": ", 1)[-1].split(" and run on")[0])
        if not env.cuda.device_count:  # its device memory and stream come from torch with CUDA or cuda-python
            return no_stream("no library here gives it device memory and a stream: neither torch with CUDA nor "
                             "cuda-python sees the GPU", f"{_pip('tensorrt')} (brings cuda-python), or a CUDA build of "
                             "torch")  # fmt: skip
        return Availability(name, kind, True)
    # a backend this doctor does not know yet: present when it can be created here
    try:
        create_backend(name, kind).close()
    except ImportError as exc:  # BackendUnavailable is an ImportError
        return absent(str(exc))
    return Availability(name, kind, True)


def plans_for(bundle_dir: Path, backend: type[Backend], precision: str) -> list[str]:
    """The runner plans ``backend`` can run from this bundle at ``precision``: every one of
    :data:`~hne_edge.bundle.ANYTIME_PLANS` whose files the bundle has, and ``mixed`` where it has
    ``segments`` and ``subtrees``. The torch backends build every plan
    from the one weights file; TensorRT runs engines built from the ONNX files (:func:`build_engines_for`)."""
    variants = read_manifest(bundle_dir, verify_files=False).variants()
    if backend.format == "torch":
        plans = list(ANYTIME_PLANS) if ("torch", WEIGHTS, "fp32") in variants else []
    else:
        source = "onnx" if backend.format == "tensorrt" else backend.format
        plans = [plan for plan in ANYTIME_PLANS if (source, plan, precision) in variants]
    return plans + ([MIXED] if set(MIXED_NEEDS) <= set(plans) else [])  # mixed runs their files


def build_engines_for(bundle_dir: Path, env: Environment, precisions: list[str], plans: list[str]) -> None:
    """Build the TensorRT engines the doctor's rows run, from the bundle's ONNX files.

    At builder optimisation level 0: a tiny engine builds in a fraction of the default level's time, and
    the numerics are what the doctor checks; ``bench_gpu.py`` times engines built at the default level.
    """
    from ..exporters.tensorrt import build_engines  # torch-free; imports TensorRT

    reason = env.tensorrt_support.get(0)
    if reason:
        raise CheckFailed(reason)
    files = sorted({p for plan in plans for p in (MIXED_NEEDS if plan == MIXED else (plan,))})  # mixed: their engines
    build_engines(bundle_dir, precisions=precisions, plans=files, optimization_level=0)


# -- one variant ------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: {text}"


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


class _Comparer:
    """Compares runtime outputs with the float64 reference and keeps the worst error relative to its bound."""

    def __init__(self, tiny: TinyBundle, precision: str, check: Check) -> None:
        self.tiny, self.tolerance, self.check = tiny, TOLERANCES[precision], check
        self.worst = -1.0

    def __call__(self, got: np.ndarray, n: int, what: str) -> None:
        want = self.tiny.prefix(n)
        got = np.asarray(got, dtype=np.float64)
        if got.shape != want.shape:
            raise CheckFailed(f"{what}: received logits of shape {got.shape}; expected {want.shape}")
        bound = self.tolerance.bound(float(np.abs(want).max()))
        error = float(np.abs(got - want).max()) if np.all(np.isfinite(got)) else float("inf")
        if error / bound > self.worst:
            self.worst, self.check.max_error, self.check.bound = error / bound, error, bound
        if not error <= bound:
            raise CheckFailed(f"{what}: max |logits - float64 reference| = {error:.3g} exceeds the bound {bound:.3g}")


def check_variant(tiny: TinyBundle, backend: str, device: str, precision: str, plan: str, *, repeats: int = 20,
                  backend_options: dict | None = None) -> Check:  # fmt: skip
    """Run one backend / device / precision / plan on ``tiny`` (see the module docstring); never raises."""
    check = Check(backend, device, precision, plan, tiny.origin)
    try:
        _run_checks(tiny, check, repeats, backend_options or {})
        check.ok = True
    except Exception as exc:  # every failure becomes the row's error; the other rows still run
        check.error = _one_line(exc)
        check.traceback = traceback.format_exc()
    return check


def _run_checks(tiny: TinyBundle, check: Check, repeats: int, options: dict) -> None:
    x, x1 = tiny.x, tiny.x[:1]
    compare = _Comparer(tiny, check.precision, check)
    with AnytimeRunner(tiny.bundle_dir, backend=check.backend, device=check.device, plan=check.plan,
                       precision=check.precision, load_profile=False, **options) as runner:  # fmt: skip
        n_leaves = check.leaves = runner.num_leaves
        if n_leaves != tiny.reference.shape[1]:
            raise CheckFailed(f"the runner has {n_leaves} leaves; the reference has {tiny.reference.shape[1]}")
        # every anytime prefix the plan can stop at, step by step through one session (the cached
        # activations), then through run(): plan "segments" stops after every leaf, "subtrees" at 1, 2, 4, ...
        stops = list(runner.stops)
        session, seen = runner.start(x), []
        while session.step():
            seen.append(session.result().leaves)
            compare(session.result().logits, seen[-1], f"session after {seen[-1]} leaves")
        if not seen or seen[-1] != n_leaves or seen != sorted(set(seen)) or not set(seen) <= set(stops):
            raise CheckFailed(f"session.step() ended at the leaf counts {seen}; expected increasing stops of the plan "
                              f"({stops}) ending at {n_leaves}")  # fmt: skip
        for n in stops:
            r = runner.run(x, max_leaves=n)
            if r.leaves != n:
                raise CheckFailed(f"run(max_leaves={n}) evaluated {r.leaves} leaves")
            first = f" (first-leaf file {runner.first_leaf_file})" if n == 1 and runner.first_leaf_file else ""
            compare(r.logits, n, f"run(max_leaves={n}){first}")
            check.prefixes.append(n)
        # times at batch 1 (medians); the cost model has learned from every run above
        if stops[0] == 1:  # plan "fused" has no first-leaf stop
            check.first_leaf_ms = _median_ms(lambda: runner.run(x1, max_leaves=1), repeats)
        check.full_tree_ms = _median_ms(lambda: runner.run(x1), repeats)
        # a session under a budget, resumed to the end
        budget = check.full_tree_ms / 2
        session = runner.start(x)
        r = session.refine(budget_ms=budget)
        compare(r.logits, r.leaves, f"refine(budget_ms={budget:.3g}) after {r.leaves} leaves")
        if r.leaves < n_leaves and r.stopped_by != "budget":
            raise CheckFailed(f"refine under a budget stopped after {r.leaves} leaves by {r.stopped_by!r}; expected 'budget'")
        check.budget = budget_cell(r.leaves, n_leaves, r.elapsed_ms, budget, r.met_budget, r.overran_min_leaves)
        r = session.refine()
        if r.leaves != n_leaves or r.stopped_by != "complete":
            raise CheckFailed(f"the resumed session ended with {r.leaves} leaves ({r.stopped_by!r}); expected all {n_leaves}")
        compare(r.logits, n_leaves, "the resumed session")
        check.cancel = _check_cancel(runner, x, compare, n_leaves, seen)


def budget_cell(leaves: int, n_leaves: int, elapsed_ms: float, budget_ms: float, met: bool, forced: bool) -> str:
    """The budget column: what the budgeted session ran, and whether it kept the budget and why not, so the cell
    agrees with the row's verdict (the session checks stopping and resuming; times are reported, never judged):
    a plan whose first step alone outlasts half the tree (fused: one call) is over by design."""
    text = f"{leaves}/{n_leaves} leaves in {elapsed_ms:.2f} ms"
    if met:
        return f"{text}, within {budget_ms:.2f} ms"
    return f"{text}, over {budget_ms:.2f} ms ({'its first step is forced' if forced else 'a late step; not judged'})"


def _check_cancel(runner: AnytimeRunner, x: np.ndarray, compare: _Comparer, n_leaves: int, seen: list[int]) -> str:
    """``seen``: the leaf counts a session's steps reached (the plan's step boundaries)."""
    session = runner.start(x)
    session.cancel()
    try:
        session.refine()
        raise CheckFailed("a session cancelled before its first leaf returned a result; expected SessionCancelled")
    except SessionCancelled:
        pass
    if len(seen) < 3:  # plan "fused": one step, nothing between the first result and the last to cancel
        return "ok (before the first step)"
    session = runner.start(x)  # cancelled from another thread after two steps: nothing more is evaluated
    session.step()
    session.step()
    canceller = threading.Thread(target=session.cancel)
    canceller.start()
    canceller.join()
    r = session.refine(budget_ms=60_000)
    if r.leaves != seen[1] or r.stopped_by != "cancelled" or session.step():
        raise CheckFailed(f"after cancel() at {seen[1]} leaves the session went on to {r.leaves} ({r.stopped_by!r}); "
                          f"expected {seen[1]}, 'cancelled'")  # fmt: skip
    compare(r.logits, seen[1], "the cancelled session")
    if len(seen) < 4:
        return f"ok (stopped at {r.leaves} of {n_leaves})"
    session = runner.start(x)  # cancelled while refine runs (from its stop_when hook): stops at the next boundary
    r = session.refine(stop_when=lambda done: len(done) >= 3 and session.cancel())
    if r.stopped_by != "cancelled" or not 3 <= r.leaves < n_leaves:
        raise CheckFailed(f"cancel() during refine after 3 leaves: stopped after {r.leaves} ({r.stopped_by!r}); "
                          f"expected 3 to {n_leaves - 1} leaves, 'cancelled'")  # fmt: skip
    compare(r.logits, r.leaves, "the session cancelled while running")
    return f"ok (stopped at {r.leaves} of {n_leaves})"
