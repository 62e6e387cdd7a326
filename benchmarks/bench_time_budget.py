"""How close `train --time-budget T` ends to T on this machine, on the real clock (issue 25 §2, issue 28).

    PYTHONPATH=. python benchmarks/bench_time_budget.py --budgets 20,60 --repeats 3

Trains hne_tiny on scikit-learn's digits (one thread, batch 32) to each budget, ``--repeats`` times, and prints
one row per run: the budget, the wall time of ``fit`` (the interpreter's start-up aside), their ratio, the step
time the plan measured, the epochs it fixed and the load average before and after. The tests check the plan's
arithmetic on a fake clock (tests/train/test_budget.py); this is where the real clock is measured, since a run
on a shared machine ends early or late when the machine's load changes after the plan was fixed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def one_run(budget: float, out: Path) -> dict:
    from hne_edge.train import TrainConfig, fit

    config = TrainConfig.from_preset("digits", {"out": str(out), "quiet": True, "threads": 1, "time_budget": budget,
                                                "optim": {"epochs": 1000, "batch_size": 32}})  # fmt: skip
    load = os.getloadavg()[0]
    started = time.perf_counter()
    result = fit(config)
    used = time.perf_counter() - started
    plan = result.budget
    return {"budget_s": budget, "used_s": used, "ratio": used / budget, "step_ms": 1e3 * plan["step_s"],
            "epochs": plan["epochs"], "load_before": load, "load_after": os.getloadavg()[0]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="20,60", help="comma list of seconds")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    print("| budget s | used s | used / budget | step ms | epochs fixed | load before, after |")
    print("|---|---|---|---|---|---|")
    ratios: dict[float, list[float]] = {b: [] for b in budgets}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for b in budgets:
                row = one_run(b, Path(tmp) / f"run-{b:g}-{r}")
                ratios[b].append(row["ratio"])
                print(f"| {b:g} | {row['used_s']:.1f} | {row['ratio']:.3f} | {row['step_ms']:.1f} | {row['epochs']:.1f} | "
                      f"{row['load_before']:.1f}, {row['load_after']:.1f} |", flush=True)  # fmt: skip
    for b, rs in ratios.items():
        print(f"budget {b:g} s: median used / budget {statistics.median(rs):.3f} over {len(rs)} runs "
              f"(range {min(rs):.3f}-{max(rs):.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
