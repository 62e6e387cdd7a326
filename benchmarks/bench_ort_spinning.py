"""ONNX Runtime's spinning intra-op threads, for a chain of sessions and for the fused tree (issue 27).

    .venv/bin/python benchmarks/bench_ort_spinning.py --out benchmarks/results/ort_spinning.md
    .venv/bin/python benchmarks/bench_ort_spinning.py --smoke     # proves the script runs (hne_tiny, few passes)

Per plan (segments: one session per leaf, in a chain; fused: one session for the whole tree), intra-op threads
(``--threads``) and spinning (default: what the backend chooses, ``spinning=None``; on; off), the time of a
full pass over the tree (all 16 leaves, batch 1) as ``AnytimeRunner.profile()`` measures it: the sum of its
steps, median and p90 over ``--repeats`` passes, per round. Every configuration runs once per round, in turn,
``--rounds`` times (side by side on one machine: the ratios are what transfers); the table gives each one's
median over rounds and the ratio to the plan's 1-thread time in the same rounds. The process is pinned to the
first ``threads`` cores (Linux), as a device of that many cores.

Why it exists: stream scheduling on 2 threads (bench_streams) missed its deadlines on a 2-core machine; the
profile showed a segments pass of 105 ms with spinning against 12.7 ms without: each session's pool spins
after its call while the next session's needs the cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hne_edge.bundle import FUSED, SEGMENTS  # noqa: E402

SPINNING = {"default": None, "on": True, "off": False}


def export(workdir: Path, name: str) -> Path:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import randomize_

    from hne_edge.exporters import export_onnx
    from hne_edge.models import create_model

    bundle = workdir / f"{name}_{SEGMENTS}+{FUSED}"
    if not (bundle / "manifest.json").exists():
        torch.manual_seed(0)
        export_onnx(randomize_(create_model(name)), bundle, plan=f"{SEGMENTS},{FUSED}", batch=(1, 1, 1), verify=False, force=True)
    return bundle


def common_arguments(ap: argparse.ArgumentParser, smoke_help: str) -> None:
    """The arguments this benchmark shares with bench_busy_thread."""
    ap.add_argument("--model", default="hne_resnet_small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="keep the exported bundle here between runs")
    ap.add_argument("--out", default=None, help="markdown file")
    ap.add_argument("--smoke", action="store_true", help=smoke_help)


def exported_bundle(args: argparse.Namespace, prefix: str) -> Path:
    """``args.model``'s bundle in ``args.workdir`` (a new temporary folder when None), exported once."""
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    return export(workdir, args.model)


def full_passes(bundle: Path, plan: str, threads: int, spinning: bool | None, repeats: int) -> tuple[np.ndarray, object]:
    """Seconds of each of ``repeats`` full passes (the sum of the profile's steps), and what the backend chose."""
    from hne_edge.runtime import AnytimeRunner

    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(allowed) >= threads:
        os.sched_setaffinity(0, allowed[:threads])
    try:
        with AnytimeRunner(bundle, backend="onnxruntime", plan=plan, threads=threads, warmup=2, spinning=spinning) as r:
            profile = r.profile(batch_sizes=(1,), warmup=5, repeats=repeats, save=False)
            chose = r.backend.describe()["spinning"]
    finally:
        if allowed:
            os.sched_setaffinity(0, allowed)
    steps = profile.batches[1]["leaves"]
    return np.asarray([sum(s["samples_ms"][i] for s in steps) for i in range(repeats)]), chose


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(ap, "hne_tiny, 3 passes, 1 round")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--plans", default=f"{SEGMENTS},{FUSED}")
    ap.add_argument("--spinning", default="default,on,off")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    import onnxruntime

    if args.smoke:
        args.model, args.repeats, args.rounds = "hne_tiny", 3, 1
    bundle = exported_bundle(args, "bench_ort_spinning_")
    configs = [(plan, int(t), s) for plan in args.plans.split(",") for t in args.threads.split(",") for s in args.spinning.split(",")]
    medians: dict[tuple, list[float]] = {c: [] for c in configs}
    p90s: dict[tuple, list[float]] = {c: [] for c in configs}
    chose: dict[tuple, object] = {}
    started = time.strftime("%Y-%m-%d %H:%M")
    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    for _ in range(args.rounds):
        for c in configs:
            plan, threads, spin = c
            t, chose[c] = full_passes(bundle, plan, threads, SPINNING[spin], args.repeats)
            medians[c].append(float(np.median(t)))
            p90s[c].append(float(np.percentile(t, 90)))
    if load:
        load.append(os.getloadavg()[0])
    cmd = "python benchmarks/bench_ort_spinning.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# ONNX Runtime spinning: {args.model}, batch 1, a full pass of the tree", "",
             f"`{cmd.strip()}` - {started}, {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime "
             f"{onnxruntime.__version__}; {args.rounds} rounds of {args.repeats} passes; load average "
             f"{' -> '.join(f'{v:.1f}' for v in load) or 'n/a'}.", "",
             "| plan | threads | spinning | backend chose | pass ms, median of rounds (each round's) | p90 ms | vs 1 thread, default |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in configs:
        plan, threads, spin = c
        one = next((medians[(plan, 1, s)] for s in SPINNING if (plan, 1, s) in medians), None)
        ratio = f"{np.median(medians[c]) / np.median(one):.2f}x" if one else "-"
        lines.append(f"| {plan} | {threads} | {spin} | {chose[c]} | **{np.median(medians[c]):.2f}** "
                     f"({', '.join(f'{m:.2f}' for m in medians[c])}) | {np.median(p90s[c]):.2f} | {ratio} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
