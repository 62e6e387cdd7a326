"""``hne-edge doctor``: does this install work on this machine, with which backends, how fast?

    from hne_edge.doctor import run_doctor
    report = run_doctor()              # ~10-30 s on a CPU
    print(report.format_table()); report.ok; report.to_dict()

1. The environment (:mod:`.environment`): Python, numpy, onnxruntime and its providers, torch and its CUDA
   build, cuda-python, TensorRT (and whether it supports each GPU), every GPU, the CPU and its ISA features.
2. A tiny HNE bundle in a temporary folder (:mod:`.tiny`): exported now when torch and onnx are here, and
   always the pre-exported copy the package ships (what a runtime-only install, numpy + onnxruntime, runs).
3. For every backend x device of the runtime's registry that is present, every precision and every anytime
   plan of the bundle: real runner, every prefix against the float64 reference, a budgeted session, cancel,
   first-leaf and full-tree times (:mod:`.checks`). Absent backends are listed with how to get them.

``report.ok`` is True when every check of every present backend passed (the CLI exits 0, else 1).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..bundle import PRECISIONS
from ..limits import check_threads
from ..progress import NULL_PROGRESS, Progress
from .environment import Environment, collect_environment

if TYPE_CHECKING:  # pragma: no cover - .tiny is imported when the doctor runs, so `python -m hne_edge.doctor.tiny` runs clean
    from .checks import Availability, Check  # .checks and .tiny need numpy: imported when the doctor runs, after
    from .tiny import TinyBundle  # it found numpy importable (a broken numpy is a failed row, not a traceback)

# what every check needs: when one of these does not import, it is the report's failure and nothing else runs
REQUIRED = ("numpy",)

__all__ = ["DoctorReport", "run_doctor", "check_backend", "check_failed"]


@dataclass
class DoctorReport:
    environment: Environment
    available: list[Availability]
    checks: list[Check]
    bundles: dict[str, str] = field(default_factory=dict)  # "fresh" / "shipped" -> what it is
    seconds: float = 0.0
    broken: dict[str, str] = field(default_factory=dict)  # REQUIRED libraries that do not import -> why

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and not self.failures and not self.broken

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "environment": self.environment.to_dict(),
            "bundles": self.bundles,
            "checks": [c.to_dict() for c in self.checks],
            "absent": [{"backend": a.backend, "device": a.device, "reason": a.reason, "how": a.how}
                       for a in self.available if not a.present],  # fmt: skip
            "failures": list(self.broken) + [c.label for c in self.failures],
        }

    def format_table(self) -> str:
        from .report import format_report

        return format_report(self)


def run_doctor(
    *,
    export: bool | None = None,
    repeats: int = 20,
    threads: int | None = 1,
    progress: Progress | None = None,
    environment: Environment | None = None,
) -> DoctorReport:
    """Run every check (see the module docstring); never raises for what it finds.

    Args:
        export: also export a fresh tiny bundle and run the matrix on it (default: when torch and onnx
            are installed). The shipped bundle is always checked on ONNX Runtime CPU.
        repeats: runs per timing (the medians of the first leaf and the full tree).
        threads: CPU threads of the CPU backends (``None``: the library's default). One by default: the
            tiny model's operators take microseconds, so a thread pool only adds synchronisation, and on a
            busy machine a worker that is not scheduled stalls every operator.
        progress: counts the checks and names the one running (:mod:`hne_edge.progress`; None: silent).
        environment: what :func:`~.environment.collect_environment` returned, if the caller has it already.
    """
    started = time.perf_counter()
    threads = check_threads(threads)  # bad input: one InputError up front, not a failed row per backend
    progress = progress or NULL_PROGRESS
    say = lambda note: progress.set(note=note)  # noqa: E731
    say("looking at the environment")
    env = environment or collect_environment()
    broken = {name: env.libraries[name].describe() for name in REQUIRED if not env.libraries[name].ok}
    if broken:
        return DoctorReport(env, [], [], seconds=time.perf_counter() - started, broken=broken)
    from . import tiny
    from .checks import Availability, availability

    available = availability(env)
    present = [a for a in available if a.present]
    if export is None:
        export = env.libraries["torch"].ok and env.libraries["onnx"].ok
    checks: list[Check] = []
    bundles: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hne-doctor-") as tmp:
        shipped = _bundle(lambda: tiny.unpack_shipped(Path(tmp) / "shipped"), "shipped", checks)
        if shipped is not None:
            asset = tiny.ASSET
            bundles["shipped"] = (f"{asset.name} ({asset.stat().st_size / 1024:.0f} KiB, shipped with hne-edge): "
                                  "its float64 reference was computed when it was built")
        fresh = None
        if export:
            say("exporting the tiny bundle")
            fresh = _bundle(lambda: tiny.export_tiny(Path(tmp) / "fresh", precisions=("fp32",)), "fresh", checks)
            if fresh is not None:
                torch = env.libraries["torch"].version
                bundles["fresh"] = f"exported now (torch {torch}, onnx {env.libraries['onnx'].version}); " \
                                   "its float64 reference was computed now from the fused model"
        tinies = [t for t in (fresh, shipped) if t is not None]
        with _torch_threads_kept(env):
            if tinies:
                for a in present:
                    checks += check_backend(tinies, a, env, repeats, threads, progress)
            if fresh is not None and shipped is not None and any(a.label == "onnxruntime cpu" for a in present):
                # the bundle a runtime-only install runs: its fp32 files too, so the asset cannot rot unnoticed
                checks += check_backend([shipped], Availability("onnxruntime", "cpu", True), env, repeats, threads,
                                        progress, precisions=("fp32",))  # fmt: skip
    return DoctorReport(env, available, checks, bundles, time.perf_counter() - started)


@contextlib.contextmanager
def _torch_threads_kept(env: Environment) -> Iterator[None]:
    """The torch CPU backend sets torch's process-wide thread count: give the caller theirs back."""
    if not env.libraries["torch"].ok:
        yield
        return
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bundle(make: Callable[[], TinyBundle], origin: str, checks: list[Check]) -> TinyBundle | None:
    """``make()``, or None with a failed check naming why (a broken exporter or asset is a failure too)."""
    from .checks import Check

    try:
        return make()
    except Exception as exc:
        import traceback

        step = "export" if origin == "fresh" else "unpack"
        checks.append(Check(step, "-", "-", "-", origin, ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                            traceback=traceback.format_exc()))  # fmt: skip
        return None


def check_backend(tinies: list[TinyBundle], a: Availability, env: Environment, repeats: int, threads: int | None,
                  progress: Progress = NULL_PROGRESS, precisions: tuple[str, ...] = PRECISIONS) -> list[Check]:  # fmt: skip
    """Every precision x anytime plan of ``a`` on the first of ``tinies`` that has it (the fresh export is
    fp32 only: the ONNX backends' fp16 rows run the shipped bundle's fp16 files)."""
    from ..runtime.backends import backend_class
    from .checks import build_engines_for, check_variant, plans_for

    chosen: list[tuple[TinyBundle, str, str]] = []
    try:  # importing the backend's module can fail on a broken install: that is this backend's failure
        cls = backend_class(a.backend, a.device)
        for precision in precisions:
            for tiny in tinies:
                chosen += [(tiny, precision, p) for p in plans_for(tiny.bundle_dir, cls, precision)
                           if not any(c[1:] == (precision, p) for c in chosen)]  # fmt: skip
    except Exception as exc:
        return [check_failed(a, tinies[0], "-", exc)]
    if not chosen:
        return [check_failed(a, tinies[0], "-", RuntimeError(f"no bundle has a plan {a.label} can run"))]
    rows = []
    if a.backend == "tensorrt":
        for tiny in tinies:
            mine = [c for c in chosen if c[0] is tiny]
            if not mine:
                continue
            progress.set(note=f"building TensorRT engines ({tiny.origin} bundle)")
            try:
                build_engines_for(tiny.bundle_dir, env, sorted({c[1] for c in mine}), sorted({c[2] for c in mine}))
            except Exception as exc:
                rows.append(check_failed(a, tiny, "engine build", exc))
                chosen = [c for c in chosen if c[0] is not tiny]
    options = {"threads": threads} if a.device == "cpu" and threads else {}
    for tiny, precision, plan in chosen:
        progress.set(note=f"{a.label} {precision} {plan} ({tiny.origin} bundle)")
        rows.append(check_variant(tiny, a.backend, a.device, precision, plan, repeats=repeats, backend_options=options))
        progress.update(1)
    return rows


def check_failed(a: Availability, tiny: TinyBundle, what: str, exc: BaseException) -> Check:
    import traceback

    from .checks import Check

    return Check(a.backend, a.device, "-", what, tiny.origin, ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                 traceback="".join(traceback.format_exception(exc)))  # fmt: skip
