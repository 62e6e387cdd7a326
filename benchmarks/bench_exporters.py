"""TorchScript vs dynamo ONNX exporter, side by side (issue 20 item 11); writes benchmarks/results/exporters.md.

    .venv/bin/python benchmarks/bench_exporters.py --models hne_tiny

Per model (random weights with non-trivial BatchNorm statistics, so the parity check means something), for
the TorchScript exporter (the default) and the dynamo exporter, each at the bundle's default opset 17 and
the dynamo one also at the opset it writes natively (18):

* export of every plan (nodes, segments, the export-free first leaf) in fp32, then fp32 + fp16: seconds per file
  (no verification), files, bundle size, the files' opset;
* the bundle's verification against PyTorch (``verify_bundle`` with the model: every file and every anytime
  prefix of every plan through the runtime): passed or not, and the worst |ONNX - PyTorch| relative to its
  bound;
* ONNX Runtime CPU latency of all leaves (segments plan, fp32, batch 1, one thread), the exporters' bundles
  timed round-robin so load changes hit them alike.

A configuration that fails (an ExportError: the check every bundle file must pass) is recorded with its
message instead of figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CONFIGS = [("torchscript", 17), ("dynamo", 17), ("dynamo", 18)]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.onnx"))


def export_one(model, out: Path, exporter: str, opset: int, precision: str) -> dict:
    """Export every plan of ``model`` in ``precision``; figures or the error."""
    import onnx

    from hne_edge.errors import HNEError
    from hne_edge.exporters import export_onnx, verify_bundle

    row: dict = {"exporter": exporter, "opset": opset, "precision": precision}
    t = time.perf_counter()
    try:
        export_onnx(model, out, precisions=precision.split("+"), plan="both", opset=opset, exporter=exporter, verify=False,
                    torch_weights=False)  # fmt: skip
    except HNEError as exc:
        row["error"] = str(exc)
        row["seconds_to_error"] = time.perf_counter() - t
        return row
    seconds = time.perf_counter() - t
    files = sorted(out.rglob("*.onnx"))
    row.update(files=len(files), seconds=seconds, s_per_file=seconds / len(files), mb=_size(out) / 1e6,
               file_opsets=sorted({o.version for f in files for o in onnx.load(str(f)).opset_import
                                   if o.domain in ("", "ai.onnx")}))  # fmt: skip
    report = verify_bundle(out, model=model)
    worst = max(report.checks, key=lambda c: c.max_abs_diff / c.bound if c.bound else c.max_abs_diff)
    row.update(verified=report.ok, checks=len(report.checks), worst_diff=worst.max_abs_diff, worst_bound=worst.bound,
               worst_check=f"{worst.file} ({worst.check})")  # fmt: skip
    return row


def latencies(bundles: dict[str, Path], repeats: int) -> dict[str, float]:
    """Median ms of all leaves (segments, fp32, batch 1, 1 thread) per bundle, timed round-robin."""
    from hne_edge.runtime import AnytimeRunner

    runners = {k: AnytimeRunner(p, plan="segments", precision="fp32", threads=1, load_profile=False)
               for k, p in bundles.items()}  # fmt: skip
    spec = next(iter(runners.values())).input_spec
    x = np.random.default_rng(0).standard_normal((1, spec.channels, *spec.spatial)).astype(np.float32)
    ref = None
    for r in runners.values():
        for _ in range(3):
            r.run(x)
        out = r.run(x).logits
        ref = out if ref is None else ref
        assert np.abs(out - ref).max() < 1e-3  # the same numbers, whichever exporter wrote them
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for k, r in runners.items():
            t = time.perf_counter()
            r.run(x)
            times[k].append((time.perf_counter() - t) * 1e3)
    for r in runners.values():
        r.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="hne_tiny")
    p.add_argument("--repeats", type=int, default=200, help="latency calls per bundle")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "exporters.md"))
    args = p.parse_args()
    import torch

    from conftest import randomize_
    from hne_edge.models import create_model

    torch.set_num_threads(1)
    lines = [
        "# ONNX exporters side by side: TorchScript (the default) vs dynamo",
        "",
        f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores shared with other jobs (load average at start "
        f"{os.getloadavg()[0]:.1f}); torch {torch.__version__}, one torch thread; ONNX Runtime CPU, one thread. "
        "Random weights with non-trivial BatchNorm statistics. Every plan (nodes, segments, first leaf).",
        "",
        "| model | exporter | opset asked | precision | files | s/file | size (MB) | file opset | verified vs PyTorch | worst diff / bound |",
        "|---|---|---:|---|---:|---:|---:|---|---|---|",
    ]
    notes, latency_rows = [], []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = randomize_(create_model(name))
        with tempfile.TemporaryDirectory() as tmp:
            fp32_bundles = {}
            for exporter, opset in CONFIGS:
                for precision in ("fp32", "fp32+fp16"):
                    out = Path(tmp) / f"{exporter}{opset}-{precision}"
                    row = export_one(model, out, exporter, opset, precision)
                    print(row, flush=True)
                    if "error" in row:
                        lines.append(f"| {name} | {exporter} | {opset} | {precision} | - | - | - | - | export failed "
                                     f"after {row['seconds_to_error']:.0f} s (note {len(notes) + 1}) | - |")
                        notes.append(row["error"])
                        continue
                    lines.append(
                        f"| {name} | {exporter} | {opset} | {precision} | {row['files']} | {row['s_per_file']:.2f} | "
                        f"{row['mb']:.2f} | {', '.join(map(str, row['file_opsets']))} | "
                        f"{'yes' if row['verified'] else 'NO'} ({row['checks']} checks) | "
                        f"{row['worst_diff']:.2e} / {row['worst_bound']:.2e} |"
                    )
                    if precision == "fp32":
                        fp32_bundles[f"{exporter} (opset {opset})"] = out
            ms = latencies(fp32_bundles, args.repeats)
            latency_rows += [f"| {name} | {k} | {v:.3f} |" for k, v in ms.items()]
    lines += ["", "ONNX Runtime CPU, all 16 leaves, segments plan, fp32, batch 1, one thread; median of "
              f"{args.repeats} calls per bundle, the bundles called round-robin:", "",
              "| model | exporter | all leaves (ms) |", "|---|---|---:|", *latency_rows]
    if notes:
        lines += ["", "Failures (the message of the check that refused the file):", ""]
        lines += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    lines += ["", f"Command: `.venv/bin/python benchmarks/bench_exporters.py --models {args.models} --repeats {args.repeats}`"]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
