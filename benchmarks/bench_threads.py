"""Training throughput by torch thread count, alone and beside another torch process (issue 28).

Torch's default (one thread per physical core) collapses when another process wants the same cores: its
threads wait for each other at every parallel region while the other process holds a core. This script
trains the digits preset (``hne-edge train``, hne_tiny on 8x8 images, the demo's training) once per
configuration, in a fresh process each, and reports the last epoch's images/s:

* ``threads N``: ``--threads N`` (N = torch's default here, and 1);
* ``auto``: no ``--threads``: the trainer's default, torch's threads lowered to the CPUs that the load
  average leaves free (``hne_edge.limits.free_cpus_threads``);

each alone and beside a competitor (another process running torch matrix products with torch's default
threads). The configurations alternate (round-robin, ``--rounds`` times), so each figure is the median of
runs taken side by side under the same background load; the load average is printed with them.

    nice .venv/bin/python benchmarks/bench_threads.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMPETITOR = "import torch\na = torch.randn(384, 384)\nwhile True:\n    a = torch.tanh(a @ a)\n"


def train_images_per_s(threads: int | None, limit: int, epochs: int, timeout: float) -> tuple[float, str]:
    """The last epoch's images/s of one ``hne-edge train`` run, and the trainer's first line (its thread choice)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hne_edge", "train", "--out", f"{tmp}/run", "--limit", str(limit),
               "--epochs", str(epochs), "--batch-size", "32"] + ([] if threads is None else ["--threads", str(threads)])  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        env.pop("OMP_NUM_THREADS", None)  # torch's own default, as a user gets it
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        log = json.loads(Path(tmp, "run", "train_log.json").read_text())
        return log["epochs"][-1]["train_images_per_s"], proc.stderr.splitlines()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="times each configuration runs (alternating)")
    p.add_argument("--limit", type=int, default=512, help="training images per epoch")
    p.add_argument("--epochs", type=int, default=2, help="the last one is measured")
    p.add_argument("--timeout", type=float, default=600, help="seconds one training run may take")
    args = p.parse_args()

    import torch

    default = torch.get_num_threads()
    configs = [("threads", default), ("threads", 1), ("auto", None)]
    if default == 1:
        configs = configs[1:]
    results: dict[tuple[str, str], list[float]] = {}
    loads: list[float] = []
    notes: dict[str, str] = {}
    for beside in ("alone", "beside a torch process"):
        competitor = None
        if beside != "alone":
            competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR])
            time.sleep(5)  # it is running (the load average catches up within the first runs)
        try:
            for _ in range(args.rounds):
                for kind, threads in configs:
                    name = f"threads {threads}" if kind == "threads" else "auto (no --threads)"
                    loads.append(os.getloadavg()[0])
                    rate, first = train_images_per_s(threads, args.limit, args.epochs, args.timeout)
                    results.setdefault((name, beside), []).append(rate)
                    if kind == "auto":
                        chosen = re.search(r"\d+ torch threads? \([^)]*\)", first)
                        notes[beside] = chosen.group(0) if chosen else "torch's default threads"
                    print(f"{name:>22} {beside:>24}: {rate:8.0f} img/s (load {loads[-1]:.1f})", flush=True)
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()
    print(f"\nhne_tiny on digits, batch 32, {args.limit} images, epoch {args.epochs} of {args.epochs}; "
          f"{os.cpu_count()} CPUs, torch's default {default} threads; load average {min(loads):.1f}-{max(loads):.1f}")
    print("| configuration | alone: img/s (median) | beside a torch process: img/s (median) |")
    print("|---|---|---|")
    for name in dict.fromkeys(n for n, _ in results):
        cells = []
        for beside in ("alone", "beside a torch process"):
            rates = results[(name, beside)]
            cells.append(f"**{statistics.median(rates):,.0f}** ({', '.join(f'{r:,.0f}' for r in rates)})")
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    for beside, note in notes.items():
        print(f"auto, {beside}: {note}")


if __name__ == "__main__":
    main()
