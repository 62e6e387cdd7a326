"""The doctor's report as text: the environment, the bundles, one table of checks, the absent backends."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from . import DoctorReport
    from .environment import Environment

__all__ = ["format_report", "format_environment"]

COLUMNS = ("backend", "device", "precision", "plan", "bundle", "prefixes", "max error / bound", "budget", "cancel",
           "first leaf", "full tree", "result")  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def format_environment(env: "Environment") -> list[str]:
    lib = env.libraries
    rows: list[tuple[str, str]] = [("python", f"{env.python} ({env.executable})"), ("os", env.os)]
    rows.append(("numpy", lib["numpy"].describe()))
    ort = lib["onnxruntime"].describe()
    rows.append(("onnxruntime", ort + (f" (providers: {', '.join(env.ort_providers)})" if lib["onnxruntime"].ok else "")))
    rows.append(("onnx", lib["onnx"].describe() + ("" if lib["onnx"].ok else " (needed to export, not to run)")))
    torch = lib["torch"].describe()
    if lib["torch"].ok:
        build = f"CUDA {env.torch_cuda_build} build, cuDNN {env.torch_cudnn}" if env.torch_cuda_build else "CPU-only build"
        torch += f" ({build}; sees {'?' if env.cuda is None else env.cuda.torch_devices} GPU(s))"
    rows.append(("torch", torch))
    rows.append(("cuda-python", lib["cuda-python"].describe()))
    trt = lib["tensorrt"].describe()
    for index, reason in env.tensorrt_support.items():
        trt += f"; GPU {index}: {reason or 'supported'}"
    rows.append(("tensorrt", trt))
    for g in env.gpus:
        memory = f"{g.memory_mib} MiB" if g.memory_mib else "memory unknown"
        rows.append((f"GPU {g.index}", f"{g.name}, {memory}, driver {g.driver or 'unknown'}, compute capability "
                                        f"{g.compute_capability or 'unknown'} (from {g.source})"))  # fmt: skip
    if not env.gpus:
        rows.append(("GPU", "none found" + (f" ({'; '.join(env.gpu_notes)})" if env.gpu_notes else "")))
    elif env.gpu_notes:
        rows.append(("GPU notes", "; ".join(env.gpu_notes)))
    if env.gpus and env.cuda is not None and env.cuda.notes:  # a GPU that torch / cuda-python could not use: why
        rows.append(("CUDA", "; ".join(env.cuda.notes)))
    c = env.cpu
    usable = f" ({c.usable_cores} usable)" if c.usable_cores not in (None, c.logical_cores) else ""
    cores = f"{c.logical_cores} logical cores{usable}"
    load = f", load average {c.load_average:.1f}" if c.load_average is not None else ""
    rows.append(("CPU", f"{c.model}, {c.machine}, {cores}{load}"))
    if c.features:
        have = [k for k, v in c.features.items() if v]
        lack = [k for k, v in c.features.items() if not v]
        rows.append(("ISA", f"{', '.join(have) or 'none of the listed'}" + (f"; not: {', '.join(lack)}" if lack else "")
                     + f" ({c.features_source})"))  # fmt: skip
    else:
        rows.append(("ISA", c.features_source or f"not known for {c.machine}"))
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def prefixes_cell(prefixes: list[int], leaves: int) -> str:
    """The prefixes column: how many anytime prefixes matched, and the largest (of the tree's leaves)."""
    return f"{len(prefixes)} up to {prefixes[-1]}/{leaves}" if prefixes else f"0/{leaves}"


def format_report(report: "DoctorReport") -> str:
    env = report.environment
    lines = [f"hne-edge {env.hne_edge} doctor", "", "environment", *format_environment(env), ""]
    if report.bundles:
        lines.append("bundles (hne_tiny, slim, random weights, 16 leaves)")
        width = max(len(k) for k in report.bundles)
        lines += [f"  {k:<{width}}  {v}" for k, v in report.bundles.items()]
        lines.append("")
    table = [COLUMNS] if not report.broken else []
    for c in report.checks:
        error = f"{c.max_error:.1e} / {c.bound:.1e}" if c.max_error is not None else "-"
        table.append((c.backend, c.device, c.precision, c.plan, c.bundle, prefixes_cell(c.prefixes, c.leaves), error,
                      c.budget or "-", c.cancel.split(" (")[0] if c.cancel else "-", _ms(c.first_leaf_ms),
                      _ms(c.full_tree_ms), "ok" if c.ok else "FAILED"))  # fmt: skip
    widths = [max(len(str(row[i])) for row in table) for i in range(len(COLUMNS))] if table else []
    lines += ["  ".join(f"{v:<{w}}" for v, w in zip(row, widths)).rstrip() for row in table]
    absent = [a for a in report.available if not a.present]
    if absent:
        lines += ["", "absent"]
        lines += [f"  {a.label}: {a.reason}" + (f"; to get it: {a.how}" if a.how else "") for a in absent]
    lines.append("")
    failures = report.failures
    if report.broken:  # what the doctor itself needs: nothing else could be checked
        lines.append(f"FAILED: {', '.join(report.broken)} (needed by every backend): nothing else could be checked")
        lines += [f"  {name}: {why}" for name, why in report.broken.items()]
    elif failures:
        lines.append(f"FAILED: {len(failures)} of {len(report.checks)} checks ({report.seconds:.1f} s)")
        lines += [f"  {c.label}: {c.error}" for c in failures]
    elif report.checks:
        lines.append(f"ok: {len(report.checks)} checks passed in {report.seconds:.1f} s; every backend present works")
    else:
        lines.append("FAILED: nothing could be checked (no backend is present)")
    return "\n".join(lines)
