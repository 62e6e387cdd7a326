"""GPU-like step timings for the deadline tests: what the H200 measured, with the noise a GPU adds, as a trace.

    .venv/bin/python benchmarks/gpu_like_steps.py --out tests/data/steps_hne_resnet_small_gpu_like_b1.json
    .venv/bin/python benchmarks/gpu_like_steps.py --batch 16 --out tests/data/steps_hne_resnet_small_gpu_like_b16.json

Writes the format of ``benchmarks/record_steps.py`` (frame ``r``: every step of the mixed program of
hne_resnet_small, in ms), so ``tests/runtime/test_deadlines.py`` replays it on a virtual clock exactly as it
replays a recording. Until ``record_steps.py --device cuda`` has recorded a real GPU (the acceptance run's
``record-steps`` stage), this is the stand-in. How it is built, component by component (each can be
switched off with ``--without``, to see which one a scheduler change is about):

* ``medians`` - launch-bound, flat in batch (NVIDIA H200, torch CUDA, one CUDA graph per unit, 2026-11-26,
  ``../shared/gpu/2026-11-26-h200``): a leaf's chain costs ``CALL_MS`` per call (replay, logits copy, sync)
  plus ``NODE_MS`` per node, fitted to the first leaf (5 nodes, 0.62 ms) and the full tree leaf by leaf
  (31 nodes in 16 calls, 4.33 ms); a whole subtree in one call costs ``CALL_MS`` plus ``LEVEL_MS`` per
  depth level it spans (grouped convolutions: a level of 8 nodes costs what a level of 1 does), fitted to
  plan ``subtrees``' full tree (2.05 ms); the whole tree in one graph 1.24 ms. At batch 16 every step costs
  ``B16`` times more (fused 1.43 / 1.24; first leaf 0.71 / 0.62).
* ``jitter`` - every call: x lognormal(0, 1.5%) (kernel time), + an exponential host delay of mean 4 us
  (the sync's wake-up).
* ``tail`` - heavy tails: 0.6% of calls are held up by the host (a GC pass, an interrupt, another
  process's time slice) for 0.04 ms x (1 + Pareto(1.5)), at most 1.5 ms.
* ``drift`` - the machine's speed changes between phases of a run: a two-state Markov chain of the frame's
  speed, 1.00 or 1.10 (the H200's same measurement differed by 6-15% between phases of one run:
  bench_gpu's full tree 2.37 vs 2.51 ms, gpucheck2's 2.05 ms), switching with probability 1/150 per frame.
* ``modes`` - a unit of 4 leaves or more is slower in 12% of its calls, x1.12 (two kernel schedules, or a
  clock step, that its median does not show).
* ``entry_ms`` - a run()'s own work before its first step (the input check, the image's synchronous upload,
  the session): 0.07 ms x lognormal(0, 10%) per frame, with the same heavy tail (the H200's runner took
  0.672 ms for the first leaf where the same graph called alone took 0.598 ms: 0.074 ms). Replays charge it to the
  image upload.

Deterministic (``--seed``); the numbers are assumptions wherever the H200 did not measure them (the
tails, the modes, the drift's rate), stated here so that a real recording can replace them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

CALL_MS = 0.0502  # per call: graph replay launch, logits to the host, sync
NODE_MS = 0.1140  # per node of a leaf's chain (about 20 small kernels in a graph)
LEVEL_MS = 0.1261  # per depth level of a whole subtree in one call (grouped: flat in width)
FUSED_MS = 1.24  # the whole tree in one graph
B16 = 1.15  # batch 16 / batch 1, every step (launch-bound: flat in batch)
COMPONENTS = ("jitter", "tail", "drift", "modes")


def step_table(branching=(1, 2, 2, 2, 2)):
    """The mixed program's steps of the hne_resnet_small tree: (name, [lo, hi), kind, median ms at batch 1)."""
    from hne_edge.tree import TreeSpec

    tree = TreeSpec(tuple(branching))
    steps = [(f"segments/leaf{s.leaf:02d}.onnx", [s.leaf, s.leaf + 1], "leaf", CALL_MS + NODE_MS * len(s.nodes))
             for s in tree.segments]  # fmt: skip
    for u in tree.subtree_units:
        if u.num_leaves > 1:
            levels = len({tree.node(n).depth for n in u.nodes})
            steps.append((f"subtrees/unit{u.index:02d}.onnx", [u.first_leaf, u.end], "subtree", CALL_MS + LEVEL_MS * levels))
    steps.append(("fused/tree.onnx", [0, tree.num_leaves], "tree", FUSED_MS))
    return steps


ENTRY_MS = 0.07  # a run()'s work before its first step (check, upload, session)


def trace(frames: int, batch: int = 1, seed: int = 0, without: tuple[str, ...] = ()) -> tuple[list, np.ndarray, np.ndarray]:
    """(steps, times, entry): ``times[r, j]`` the ms of step ``j`` in frame ``r``; ``entry[r]`` frame ``r``'s
    run() overhead before its first step, ms."""
    steps = step_table()
    rng = np.random.default_rng(seed)
    med = np.array([s[3] for s in steps]) * (B16 if batch > 1 else 1.0)
    n = len(steps)
    t = np.tile(med, (frames, 1))
    if "drift" not in without:
        speed, state = np.empty(frames), 0
        for r in range(frames):
            if rng.random() < 1 / 150:
                state = 1 - state
            speed[r] = 1.10 if state else 1.0
        t *= speed[:, None]
    if "modes" not in without:
        big = np.array([hi - lo >= 4 for _, (lo, hi), _, _ in steps])
        t *= np.where(big[None, :] & (rng.random((frames, n)) < 0.12), 1.12, 1.0)
    if "jitter" not in without:
        t = t * rng.lognormal(0.0, 0.015, (frames, n)) + rng.exponential(0.004, (frames, n))
    if "tail" not in without:
        hit = rng.random((frames, n)) < 0.006
        t += np.where(hit, np.minimum(0.04 * (1 + rng.pareto(1.5, (frames, n))), 1.5), 0.0)
    entry = ENTRY_MS * rng.lognormal(0.0, 0.1, frames)
    if "tail" not in without:
        entry += np.where(rng.random(frames) < 0.006, np.minimum(0.04 * (1 + rng.pareto(1.5, frames)), 1.5), 0.0)
    return steps, t, entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without", default="", help=f"comma list of components to leave out: {', '.join(COMPONENTS)}")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    without = tuple(c for c in args.without.split(",") if c)
    unknown = sorted(set(without) - set(COMPONENTS))
    if unknown:
        ap.error(f"--without: received {unknown}; expected some of {list(COMPONENTS)}")
    from hne_edge.fileio import atomic_write_json

    steps, t, entry = trace(args.frames, args.batch, args.seed, without)
    data = {
        "command": " ".join(["python", "benchmarks/gpu_like_steps.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": "hne_resnet_small",
        "backend": "GPU-like (built, not recorded): H200 torch CUDA medians + " + (", ".join(c for c in COMPONENTS if c not in without) or "no noise"),
        "batch": args.batch,
        "machine": "none: built by benchmarks/gpu_like_steps.py from the H200's figures (see its docstring)",
        "steps": [{"name": name, "leaves": leaves, "kind": kind} for name, leaves, kind, _ in steps],
        "frames_ms": [[round(float(v), 3) for v in row] for row in t],
        "entry_ms": [round(float(v), 3) for v in entry],
    }
    atomic_write_json(args.out, data, indent=None)
    print(f"wrote {args.out}: {args.frames} frames x {len(steps)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
