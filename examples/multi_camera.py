#!/usr/bin/env python3
"""Several cameras, one device: K camera streams replayed in real time through one StreamScheduler.

Each camera is a folder of images (``--cameras front/,left/,right/``, sorted by name, looped) or synthetic
frames (``--streams K``). Every camera runs at ``--fps`` with its own phase and a +-``--jitter-ms`` jitter;
each frame's deadline is one frame period after its arrival (``--deadline-ms``). The scheduler serves them
all on one runner: it rejects at once a frame whose first leaf cannot make its deadline, gives every admitted
frame its first leaf in deadline order, spends the slack on the leaves worth most per millisecond, and stacks
frames of different cameras waiting at the same step into one call where that pays.

Prints a live per-camera table every ``--refresh`` seconds (frames, rejected, deadline misses, mean leaves,
p50 / p99 latency from arrival to answer) and the same table at the end, with the expected accuracy when
``--accuracy`` names an accuracy record (an ``hne-edge eval`` metrics.json or a checkpoint record).

    python examples/multi_camera.py runs/demo/bundle --streams 4 --fps 30 --seconds 5
    python examples/multi_camera.py runs/demo/bundle --cameras front/,left/ --fps 15
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

from hne_edge.cli.options import flag_names
from hne_edge.cli.scripts import ArgumentParser, positive, run_main, seed
from hne_edge.errors import InputError
from hne_edge.runtime import AnytimeRunner, StreamScheduler
from hne_edge.runtime.bench import camera_arrivals
from hne_edge.runtime.images import is_image_path, read_image
from hne_edge.runtime.streams import accuracy_by_n, expected_accuracy, read_accuracy


def camera_frames(runner: AnytimeRunner, folders: list[str], streams: int, seed: int) -> list[np.ndarray]:
    """Per camera, its frames as the runner takes them (N, C, H, W): a folder's images, or synthetic ones."""
    if not folders:
        c, (h, w) = runner.input_spec.channels, runner.input_spec.spatial
        rng = np.random.default_rng(seed)
        return [runner.preprocess(rng.integers(0, 256, size=(8, h, w, c), dtype=np.uint8)) for _ in range(streams)]
    out = []
    for folder in folders:
        if not Path(folder).is_dir():
            raise InputError(f"--cameras: {folder} {'is not a folder' if Path(folder).exists() else 'does not exist'}; "
                             "expected a folder of images (.png, .jpg, ...)")  # fmt: skip
        paths = sorted(p for p in Path(folder).iterdir() if is_image_path(p))
        if not paths:
            raise InputError(f"--cameras: {folder} holds no image files; expected a folder of images (.png, .jpg, ...)")
        frames = []
        for p in paths:  # one at a time, as `hne-edge run` reads images: an odd one is named, not a numpy traceback
            image = read_image(p, runner.input_spec.channels)
            try:
                frames.append(runner.preprocess(image))
            except InputError as exc:
                raise InputError(f"--cameras: {p}: {exc}") from None
        out.append(np.concatenate(frames))
    return out


class Table:
    """Per-camera counts, updated from the scheduler's callbacks (its worker thread) and printed from the main one."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.lock = threading.Lock()
        self.rows = {name: {"frames": 0, "rejected": 0, "misses": 0, "leaves": [], "latency": [], "on_time": []} for name in names}

    def add(self, result) -> None:
        with self.lock:
            row = self.rows[result.stream]
            row["frames"] += 1
            row["on_time"].append(result.leaves_on_time)
            if result.stopped_by == "rejected":
                row["rejected"] += 1
                return
            row["misses"] += not result.met_deadline
            row["leaves"].append(result.leaves)
            row["latency"].append(result.latency_ms)

    def render(self, title: str) -> str:
        lines = [title, f"{'camera':<12} {'frames':>6} {'rejected':>8} {'misses':>6} {'leaves':>6} {'p50 ms':>8} {'p99 ms':>8}"]
        with self.lock:
            for name in self.names:
                r = self.rows[name]
                lat = np.asarray(r["latency"]) if r["latency"] else np.zeros(1)
                leaves = np.mean(r["leaves"]) if r["leaves"] else 0.0
                lines.append(f"{name:<12} {r['frames']:>6} {r['rejected']:>8} {r['misses']:>6} {leaves:>6.2f} "
                             f"{np.percentile(lat, 50):>8.2f} {np.percentile(lat, 99):>8.2f}")  # fmt: skip
        return "\n".join(lines)

    def on_time(self) -> list[int]:
        with self.lock:
            return [n for r in self.rows.values() for n in r["on_time"]]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--cameras", default=None, help="comma-separated image folders, one per camera")
    parser.add_argument("--streams", type=positive(int, "a number of cameras"), default=4,
                        help="synthetic cameras (without --cameras)")
    parser.add_argument("--fps", type=positive(float, "frames per second"), default=30.0)
    parser.add_argument("--seconds", type=positive(float, "a number of seconds"), default=5.0)
    parser.add_argument("--deadline-ms", type=positive(float, "a number of milliseconds"), default=None,
                        help="each frame's deadline after its arrival (default: one frame period)")
    parser.add_argument("--jitter-ms", type=float, default=2.0)
    parser.add_argument("--accuracy", default=None, help="accuracy record (metrics.json / checkpoint record)")
    parser.add_argument("--refresh", type=positive(float, "a number of seconds"), default=1.0)
    parser.add_argument("--threads", type=positive(int, "a number of threads"), default=None)
    parser.add_argument("--seed", type=seed, default=0)
    args = parser.parse_args(argv)

    folders = [c for c in args.cameras.split(",") if c] if args.cameras else []
    names = [Path(f.rstrip("/")).name or f for f in folders] if folders else [f"cam{k}" for k in range(args.streams)]
    if len(set(names)) != len(names):
        raise InputError(f"--cameras: received folders named {names}; expected a different name for each camera")
    record = read_accuracy(args.accuracy) if args.accuracy else None
    table = Table(names)
    with flag_names({"jitter_ms": "--jitter-ms", "deadline_ms": "--deadline-ms"}):  # the flags, not the parameters
        arrivals = camera_arrivals(len(names), args.fps, args.seconds, args.deadline_ms, args.jitter_ms, args.seed)
    with AnytimeRunner(args.bundle, threads=args.threads) as runner:
        frames = camera_frames(runner, folders, len(names), args.seed)
        with StreamScheduler(runner, accuracy=record) as streams:  # profiles the runner first if it has no profile
            print(f"{len(names)} cameras at {args.fps:g} fps for {args.seconds:g} s, deadline "
                  f"{args.deadline_ms or 1e3 / args.fps:.1f} ms after arrival; stacking {'on' if streams.batching else 'off'}")  # fmt: skip
            t0 = time.perf_counter() + 0.05
            shown = t0
            for a in arrivals:
                while True:  # wait for the frame's arrival, printing the table every --refresh seconds
                    now = time.perf_counter()
                    if now >= shown + args.refresh:
                        shown = now
                        print(table.render(f"\n-- {now - t0:.1f} s"), flush=True)
                    if now >= t0 + a.time:
                        break
                    time.sleep(min(t0 + a.time, shown + args.refresh) - now)
                x = frames[a.stream][a.index % len(frames[a.stream])][None]
                streams.submit(names[a.stream], x, deadline=t0 + a.deadline).add_done_callback(
                    lambda h: table.add(h.result()))
        print(table.render(f"\n-- done: {len(arrivals)} frames in {time.perf_counter() - t0:.1f} s"))
    if record is not None:
        curve = accuracy_by_n(record, runner.num_leaves)
        print(f"expected accuracy {expected_accuracy(table.on_time(), curve):.2%} "
              "(the record's accuracy after the leaves each frame had by its deadline; 0 for a frame rejected or late)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
