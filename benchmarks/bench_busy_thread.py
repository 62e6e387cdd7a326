"""A busy Python thread beside the runner: what the interpreter lock adds to each call (issue 27).

    .venv/bin/python benchmarks/bench_busy_thread.py --out benchmarks/results/busy_thread.md
    .venv/bin/python benchmarks/bench_busy_thread.py --smoke     # proves the script runs (hne_tiny, few calls)

ONNX Runtime releases the interpreter lock while a session runs and takes it back to return: when another
thread of the process is running Python then (a camera thread decoding, a stream scheduler's submitting thread
that fell behind), the runner's thread waits for it up to the interpreter's switch interval (``sys
.getswitchinterval()``, 5 ms by default) - after every session call. Per switch interval, the time of a first
leaf (``runner.run(x, max_leaves=1)``, batch 1, plan segments, 1 intra-op thread) on a thread pinned to the
first core, while the main thread sleeps (idle) or runs a Python loop (busy) pinned to the second core (with
one core, both share it). Every configuration runs once per round, in turn, ``--rounds`` times; the table gives
the median over rounds of each round's median.

Why it exists: bench_streams' overload rows, 2,400 submits a second from one thread, showed one-row first leaves
of 5-15 ms where the profile said 1.2.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_ort_spinning import common_arguments, exported_bundle  # noqa: E402

from hne_edge.bundle import SEGMENTS  # noqa: E402
from hne_edge.runtime.bench import _pin  # noqa: E402

SWITCH_S = (0.005, 0.0002)


def first_leaf_ms(runner, calls: int, busy: bool, switch_s: float, device: list[int], host: list[int]) -> float:
    """The median time of ``calls`` first leaves on a thread pinned to ``device``, the main thread idle or busy."""
    spec = runner.input_spec
    x = np.zeros((1, spec.channels, *spec.spatial), spec.dtype)
    times: list[float] = []

    def serve() -> None:
        _pin(device)
        for _ in range(3):
            runner.run(x, max_leaves=1)
        for _ in range(calls):
            t = time.perf_counter()
            runner.run(x, max_leaves=1)
            times.append((time.perf_counter() - t) * 1e3)

    before = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    try:
        worker = threading.Thread(target=serve)
        worker.start()
        _pin(host)
        spin = 0
        while worker.is_alive():
            if busy:
                for i in range(200):  # pure Python: holds the interpreter between its switches
                    spin += i * i
            else:
                time.sleep(0.001)
        worker.join()
    finally:
        sys.setswitchinterval(before)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(ap, "hne_tiny, 5 calls, 1 round")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.calls, args.rounds = "hne_tiny", 5, 1
    from hne_edge.runtime import AnytimeRunner

    bundle = exported_bundle(args, "bench_busy_thread_")
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    device, host = allowed[:1], (allowed[1:2] or allowed[:1])
    configs = [(s, busy) for s in SWITCH_S for busy in (False, True)]
    medians: dict[tuple, list[float]] = {c: [] for c in configs}
    started = time.strftime("%Y-%m-%d %H:%M")
    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    try:
        with AnytimeRunner(bundle, backend="onnxruntime", plan=SEGMENTS, threads=1, warmup=1) as runner:
            for _ in range(args.rounds):
                for switch_s, busy in configs:
                    medians[(switch_s, busy)].append(first_leaf_ms(runner, args.calls, busy, switch_s, device, host))
    finally:
        _pin(allowed)
    if load:
        load.append(os.getloadavg()[0])
    cmd = "python benchmarks/bench_busy_thread.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# A busy Python thread beside the runner: {args.model}, plan {SEGMENTS}, batch 1, 1 intra-op thread", "",
             f"`{cmd.strip()}` - {started}, {platform.machine()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}; runner thread on core(s) {device}, main thread on {host}; "
             f"{args.rounds} rounds of {args.calls} first leaves; load average "
             f"{' -> '.join(f'{v:.1f}' for v in load) or 'n/a'}.", "",
             "| switch interval | main thread | first leaf ms, median of rounds (each round's) | vs idle |",
             "|---|---|---|---|"]  # fmt: skip
    for switch_s, busy in configs:
        m = medians[(switch_s, busy)]
        idle = statistics.median(medians[(switch_s, False)])
        lines.append(f"| {switch_s * 1e3:g} ms | {'busy (Python loop)' if busy else 'idle'} | **{statistics.median(m):.2f}** "
                     f"({', '.join(f'{v:.2f}' for v in m)}) | {statistics.median(m) / idle:.1f}x |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
