#!/usr/bin/env python3
"""Embedded app: the minimal anytime loop. Load a bundle, feed frames, fixed budget, read answer + uncertainty.

This is the code to paste into an app. It needs numpy and onnxruntime only
(no torch): the wheel with the ``runtime`` extra on the device (docs/guide.md, "Installing on a device").

    python examples/embedded_app.py runs/demo/bundle --budget-ms 0.5
    python examples/embedded_app.py BUNDLE --frames frames.npz     # x: (N, H, W, C) uint8 [, y: (N,)]

Without ``--frames`` it feeds random frames (to show the loop and the timing).
"""

from __future__ import annotations

import sys

import numpy as np

from hne_edge.cli.scripts import ArgumentParser, positive, run_main
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.bench import load_arrays
from hne_edge.runtime.inputs import check_labels


def frames_from(path: str | None, runner: AnytimeRunner, count: int):
    """Yield (uint8 HWC frame, label or None). A camera callback would take this place."""
    if path:  # read and checked as `hne-edge run` reads frames: a bad file is one line, not a traceback
        x, y = load_arrays(path)
        y = None if y is None else check_labels(y, len(x), runner.num_classes, path)
        for i in range(min(count, len(x))):
            yield x[i], (None if y is None else int(y[i]))
        return
    c, (h, w) = runner.input_spec.channels, runner.input_spec.spatial
    rng = np.random.default_rng(0)
    for _ in range(count):
        yield rng.integers(0, 256, size=(h, w, c), dtype=np.uint8), None


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", help="bundle directory written by `hne-edge export`")
    parser.add_argument("--budget-ms", type=positive(float, "a number of milliseconds"), default=None,
                        help="per-frame time budget (default: all leaves)")
    parser.add_argument("--frames", default=None, help=".npz with x (N,H,W,C uint8) and optional y")
    parser.add_argument("--count", type=positive(int, "a number of frames"), default=20, help="frames to process")
    args = parser.parse_args(argv)

    runner = AnytimeRunner(args.bundle)  # validates the bundle once; sessions created here
    correct = seen = 0
    with runner:
        for i, (frame, label) in enumerate(frames_from(args.frames, runner, args.count)):
            x = runner.preprocess(frame[None])  # (1, C, H, W) float32, normalised like training
            result = runner.run(x, budget_ms=args.budget_ms)
            u = result.uncertainty
            print(
                f"frame {i:3d}: {result.labels[0]:>10s} p={result.confidence[0]:.2f} "
                f"leaves={result.leaves:2d} {result.elapsed_ms:6.2f} ms "
                f"{'ok  ' if result.met_budget else 'LATE'} logit-std={u.logit_std[0]:.3f} "
                f"vote-entropy={u.vote_entropy[0]:.2f}"
            )
            if label is not None:
                seen += 1
                correct += int(result.predictions[0] == label)
    if seen:
        print(f"accuracy {correct / seen:.2%} on {seen} labelled frames")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
