#!/usr/bin/env python3
"""Autonomous stack: a perception loop at a fixed frame rate whose per-frame budget varies with load.

Each frame period is shared with other modules (tracking, planning) whose
demand varies (a simulated load process with bursts). Perception gets what
the others are predicted to leave and uses the anytime contract:

1. ``session = runner.start(x)``; ``session.refine(budget_ms=...)`` evaluates
   leaves until the budget would be exceeded and *yields* - its answer is
   published on time;
2. the other modules run (simulated here by busy-waiting their demand, so
   they really compete for the processor);
3. if they finish early, the slack before the next frame *refines* the same
   session from its cached activations and a better answer is published.

Writes ``timeline.csv`` (one row per frame) and ``timeline.png`` (where matplotlib is installed: a device
with the ``runtime`` extra alone gets the CSV), and prints misses, leaves and accuracy (when labels are given).
Like ``hne-edge bench``, it replaces a file there only when it wrote it (a CSV with the timeline's header, a
PNG with hne-edge's seal); anything else is refused before any work, unless ``--force``.

    python examples/autonomous_stack.py runs/demo/bundle --frames frames.npz --out runs/stack
"""

from __future__ import annotations

import csv
import io
import sys
import time
from pathlib import Path

import numpy as np

from hne_edge.cli.scripts import ArgumentParser, positive, run_main, seed
from hne_edge.errors import InputError
from hne_edge.fileio import atomic_write_text, check_outputs, sealed_png, staged_output
from hne_edge.plots import can_draw, save_figure  # the CLI's figure writer: atomic, sealed as ours
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.bench import load_arrays
from hne_edge.runtime.inputs import check_input, check_labels


def busy_wait_until(t: float) -> None:
    """Simulated module work: spin on the CPU until ``t`` (sleep is too coarse below a millisecond)."""
    while time.perf_counter() < t:
        pass


class LoadProcess:
    """Fraction of each frame period taken by the other modules: a smooth level plus random bursts."""

    def __init__(self, seed: int, base: float = 0.35, burst_prob: float = 0.08) -> None:
        self.rng = np.random.default_rng(seed)
        self.level = base
        self.base, self.burst_prob = base, burst_prob

    def next(self) -> float:
        self.level = 0.8 * self.level + 0.2 * self.base + self.rng.normal(0, 0.05)
        burst = self.rng.uniform(0.2, 0.4) if self.rng.random() < self.burst_prob else 0.0
        return float(np.clip(self.level + burst, 0.05, 0.9))


def load_frames(path: str | None, runner: AnytimeRunner, count: int, seed: int):
    if path:  # read and checked as `hne-edge run` reads frames: a bad file is one line, not a traceback
        x, y = load_arrays(path)
        y = None if y is None else check_labels(y, len(x), runner.num_classes, path)[:count]
        x = x[:count]
        return (runner.preprocess(x) if x.dtype == np.uint8 else check_input(x, runner.input_spec)), y
    c, (h, w) = runner.input_spec.channels, runner.input_spec.spatial
    x = np.random.default_rng(seed).integers(0, 256, size=(count, h, w, c), dtype=np.uint8)
    return runner.preprocess(x), None


COLUMNS = ["frame", "period_ms", "budget_ms", "first_latency_ms", "first_leaves", "first_met_budget", "load",
           "slack_ms", "final_leaves", "first_pred", "final_pred", "overran_frame"]  # timeline.csv's, in order
LABEL_COLUMNS = ["label", "first_correct", "final_correct"]  # with --frames that have labels


def our_timeline(path: Path) -> str | None:
    """Whether the CSV at ``path`` is a timeline this script wrote (its header line is ours), as ``bench.json`` is
    ``bench``'s by its "format": None if it is, else why not (:data:`hne_edge.fileio.Judge`)."""
    try:
        with open(path, "rb") as f:
            head = f.readline(1024).rstrip(b"\r\n")
    except OSError:
        head = b""
    if head in (",".join(COLUMNS).encode(), ",".join(COLUMNS + LABEL_COLUMNS).encode()):
        return None
    return "its first line is not the header of the stack's timeline"


FILES = {"timeline.csv": our_timeline, "timeline.png": sealed_png}  # what the stack writes, and whose it is


def check_out(out: str, force: bool) -> Path:
    """Refuse, before any work, an --out that would replace what the stack did not write (the CLI's rule)."""
    if not out.strip():  # Path("") is the current folder
        raise InputError("--out: received an empty path; expected a folder to write timeline.csv and timeline.png into")
    plots = can_draw()  # no figure without matplotlib (a device's runtime install)
    return check_outputs(out, {n: j for n, j in FILES.items() if plots or n != "timeline.png"}, force=force)


def simulate(runner: AnytimeRunner, x: np.ndarray, y, period_ms: float, seed: int) -> list[dict]:
    load = LoadProcess(seed)
    expected_load = load.base  # what the stack predicts the others will need (EWMA of observed demand)
    margin_ms = 0.05 * period_ms  # headroom for jitter
    rows = []
    next_frame = time.perf_counter()
    for t in range(len(x)):
        busy_wait_until(next_frame)
        frame_start = time.perf_counter()
        frame_end = frame_start + period_ms / 1e3
        budget_ms = max(0.0, period_ms * (1.0 - expected_load) - margin_ms)
        session = runner.start(x[t : t + 1])
        # the answer is due budget_ms after the frame starts: a deadline, which may have passed already when start()
        # ran long (a loaded machine; refine(budget_ms=0) is refused): then the forced first leaf is the answer, late
        first = session.refine(deadline=frame_start + budget_ms / 1e3)  # yields when the next leaf would not fit
        published = time.perf_counter()
        demand = load.next()  # the other modules' actual need this frame
        busy_wait_until(published + demand * period_ms / 1e3)
        expected_load = 0.7 * expected_load + 0.3 * demand
        slack_ms = (frame_end - time.perf_counter()) * 1e3 - margin_ms
        final = first
        if slack_ms > 0 and not session.done:
            final = session.refine(budget_ms=slack_ms)  # resume from the cached activations
        session.close()
        row = {
            "frame": t,
            "period_ms": round(period_ms, 4),
            "budget_ms": round(budget_ms, 4),
            "first_latency_ms": round((published - frame_start) * 1e3, 4),
            "first_leaves": first.leaves,
            # on time as the stack sees it, on the clock of first_latency_ms (the runner's met_budget starts at refine)
            "first_met_budget": int(round((published - frame_start) * 1e3, 4) <= round(budget_ms, 4)),
            "load": round(demand, 3),
            "slack_ms": round(max(slack_ms, 0.0), 4),
            "final_leaves": final.leaves,
            "first_pred": int(first.predictions[0]),
            "final_pred": int(final.predictions[0]),
            "overran_frame": int(time.perf_counter() > frame_end),
        }
        if y is not None:
            row["label"] = int(y[t])
            row["first_correct"] = int(row["first_pred"] == row["label"])
            row["final_correct"] = int(row["final_pred"] == row["label"])
        rows.append(row)
        next_frame = frame_end
    return rows


def timeline_figure(rows: list[dict], num_leaves: int | None = None):
    """The timeline as a matplotlib Figure: budget and answer latency per frame, leaves on time and after refining."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, no backend switch
    from matplotlib.ticker import MaxNLocator

    f = [r["frame"] for r in rows]
    fig = Figure(figsize=(8, 4.5), dpi=110)
    a1, a2 = fig.subplots(2, 1, sharex=True)
    a1.plot(f, [r["budget_ms"] for r in rows], label="perception budget", color="tab:blue")
    # one pre-emption stall (tens of ms) would flatten every budget on a shared scale: cap the axis, mark the stalls
    top = 3 * max(r["budget_ms"] for r in rows)
    a1.plot(f, [min(r["first_latency_ms"], top) for r in rows], label="answer latency", color="tab:green", lw=0.8)
    late = [r for r in rows if not r["first_met_budget"] and r["first_latency_ms"] <= top]
    off = [r for r in rows if r["first_latency_ms"] > top]
    a1.scatter([r["frame"] for r in late], [r["first_latency_ms"] for r in late], color="red", s=12, label="late", zorder=3)
    if off:
        worst = max(r["first_latency_ms"] for r in off)
        a1.scatter([r["frame"] for r in off], [top] * len(off), color="red", marker="^", s=30, zorder=3, clip_on=False,
                   label=f"late, off the scale (up to {worst:.0f} ms)")
    a1.set_ylim(0, top)
    a1.set_ylabel("ms")
    outside = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0}  # off the data
    a1.legend(**outside)
    a2.step(f, [r["first_leaves"] for r in rows], where="mid", label="leaves on time", color="tab:blue")
    a2.step(f, [r["final_leaves"] for r in rows], where="mid", label="after refining in slack", color="tab:orange", lw=0.8)
    a2.set_ylim(0, (num_leaves or max(r["final_leaves"] for r in rows)) + 0.5)
    a2.yaxis.set_major_locator(MaxNLocator(integer=True))
    a2.set_ylabel("leaves")
    a2.set_xlabel("frame")
    a2.legend(**outside)
    fig.suptitle("Anytime perception under a varying load", fontsize=10)
    fig.tight_layout()
    return fig


def plot(rows: list[dict], path: Path, num_leaves: int | None = None) -> Path:
    return save_figure(timeline_figure(rows, num_leaves), path)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--frames", default=None, help=".npz with x (N,H,W,C uint8) and optional y")
    parser.add_argument("--count", type=positive(int, "a number of frames"), default=300)
    parser.add_argument("--period-ms", type=positive(float, "a number of milliseconds"), default=None,
                        help="frame period (default: 1.5 x the profiled full-tree latency)")
    parser.add_argument("--out", default="runs/autonomous_stack")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--force", action="store_true",
                        help="also replace a timeline.csv / timeline.png in --out that hne-edge did not write (yours, "
                             "or an older version's; a link itself, not what it points to); never a folder")
    args = parser.parse_args(argv)
    out = check_out(args.out, args.force)
    runner = AnytimeRunner(args.bundle)
    with runner:
        if runner.profile_data is None or 1 not in runner.profile_data.batches:
            runner.profile(batch_sizes=(1,), warmup=5, repeats=30)
        full_ms = runner.profile_data.batches[1]["levels"][-1]["median_ms"]
        period_ms = args.period_ms if args.period_ms is not None else 1.5 * full_ms
        x, y = load_frames(args.frames, runner, args.count, args.seed)
        rows = simulate(runner, x, y, period_ms, args.seed)
    # staged, then moved in (a bad input, a failure leaves no folder, no half a file); a user's file that appeared
    # meanwhile stays
    with staged_output(out, "--out", ours=FILES, force=args.force) as stage:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=COLUMNS + (LABEL_COLUMNS if y is not None else []))  # our header
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(stage / "timeline.csv", text.getvalue())
        try:
            png = out / plot(rows, stage / "timeline.png", runner.num_leaves).relative_to(stage)
        except ImportError:  # matplotlib is not part of the runtime's dependencies (a device): the CSV is the result
            png = None
    n = len(rows)
    misses = sum(1 - r["first_met_budget"] for r in rows)
    print(f"{n} frames at {period_ms:.3f} ms period (full tree {full_ms:.3f} ms)")
    print(f"answers late: {misses} ({misses / n:.1%}); frames overrunning their period: "
          f"{sum(r['overran_frame'] for r in rows)}")
    print(f"leaves on time: mean {np.mean([r['first_leaves'] for r in rows]):.2f}; "
          f"after refining in slack: mean {np.mean([r['final_leaves'] for r in rows]):.2f}")
    if y is not None:
        print(f"accuracy on time {np.mean([r['first_correct'] for r in rows]):.2%}; "
              f"after refining {np.mean([r['final_correct'] for r in rows]):.2%}")
    print(f"wrote {out / 'timeline.csv'}" + (f" and {png}" if png else " (matplotlib not installed: no PNG)"))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
