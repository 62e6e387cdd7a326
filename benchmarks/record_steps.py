"""Record the true time of every step of a mixed runner, frame by frame, for the deadline tests (virtual clock).

    .venv/bin/python benchmarks/record_steps.py --realtime --out tests/data          # ONNX Runtime CPU, 1 thread, batch 1
    python3 benchmarks/record_steps.py --backend torch --device cuda --batches 1,16 --out OUT   # a GPU (acceptance stage)

hne_resnet_small (seed 0 weights: latency does not depend on them), a bundle with the files the backend needs
(``bench_gpu.bundle_for``: batch range (min, max, max) of ``--batches``), the runner of plan "mixed". Per frame,
``runner.time_steps(x)`` runs each route of the mixed program once (leaf by leaf, subtree by subtree, the whole
tree), unbudgeted, as a frame pays it: row ``r`` of ``frames_ms`` is every step's time in frame ``r``. Then one
``run(x, max_leaves=1)``: its elapsed time minus its step is ``entry_ms[r]``, what a run() pays outside its steps
(the input check, the image's upload: a synchronous copy on a GPU), and its step's, ``first_ms[r]``: the export-free
first-leaf file, which a frame stopping after leaf 0 runs (against leaf 0's exporting segment, ``frames_ms[r][0]``:
about 0.5 ms less on ONNX Runtime CUDA as inferred from the H200's plans, issue 40; this measures it). One file per
batch size,
``OUT/steps_<model>_<backend>_<device>_b<batch>.json``; steps are named by what they add, as the bundle's ONNX
files are (``segments/leaf03.onnx``, ``subtrees/unit02.onnx``, ``fused/tree.onnx``) whatever the backend, so
tests/runtime/test_deadlines.py replays any recording on its fake bundle. ``--seconds`` caps the recording
(each batch size gets its share of what is left once the runner is ready, and at least 20 frames; a file is
written per batch size as soon as it is done).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# harness first: it puts this checkout on sys.path
from harness import (ArgumentParser, command_line, count, counts, load_average, machine, parse_args, positive_float,
                     realtime, write_json)

MIN_FRAMES = 20  # recorded whatever --seconds says (a file with fewer frames tells nothing)


def step_name(step: dict, tree) -> str:
    """A step by what it adds, in the bundle's file names: a leaf's segment, a whole subtree's unit, the tree."""
    lo, hi = step["leaves"]
    if step["kind"] == "leaf":
        return f"segments/leaf{lo:02d}.onnx"
    if step["kind"] == "tree":
        return "fused/tree.onnx"
    unit = next(u for u in tree.subtree_units if (u.first_leaf, u.end) == (lo, hi))
    return f"subtrees/unit{unit.index:02d}.onnx"


def record(runner, batch: int, frames: int, seconds: float, warmup: int = 10) -> dict:
    """``frames`` frames (fewer when ``seconds`` runs out) of every step's time and the run()'s entry, in ms."""
    import numpy as np

    spec = runner.input_spec
    x = np.random.default_rng(batch).standard_normal((batch, spec.channels, *spec.spatial)).astype(np.float32)
    for _ in range(warmup):  # graphs of this batch size captured and launched, buffers allocated
        runner.time_steps(x)
        runner.run(x, max_leaves=1)
    rows, entry, first = [], [], []
    end = time.monotonic() + seconds
    while len(rows) < frames and (time.monotonic() < end or len(rows) < min(frames, MIN_FRAMES)):
        rows.append([round(t * 1e3, 4) for t in runner.time_steps(x)])
        r = runner.run(x, max_leaves=1)
        ran = sum(ms for *_, ms in r.step_ms)
        entry.append(round(max(0.0, r.elapsed_ms - ran), 4))
        first.append(round(ran, 4))
    out = {"frames_ms": rows, "entry_ms": entry}
    if runner.first_leaf_file is not None:  # what that run's step was: the export-free first-leaf file
        out["first_ms"] = first
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hne_resnet_small")
    ap.add_argument("--backend", default="onnxruntime")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=counts, default="1",
                    help="comma list; the bundle's batch range is (first, last, last)")
    ap.add_argument("--frames", type=count(), default=300)
    ap.add_argument("--seconds", type=positive_float, default=600.0,
                    help="at most this long for all batch sizes together")
    ap.add_argument("--threads", type=count(), default=1, help="CPU backends' intra-op threads")
    ap.add_argument("--workdir", type=Path, default=None, help="the bundle's folder (bench_gpu.py's: reused when present)")
    ap.add_argument("--out", type=Path, required=True, help="folder for steps_*.json")
    ap.add_argument("--smoke", action="store_true",
                    help="hne_tiny, 5 frames, for the options not given: a check that it runs, not figures")
    ap.add_argument("--realtime", action="store_true",
                    help="SCHED_FIFO priority 1 (Linux, root), as a deployed real-time process would run: on a shared "
                         "machine the recording is then of the device, not of the other jobs' time slices")
    args = parse_args(ap, argv, {"model": "hne_tiny", "frames": 5})
    if args.realtime:
        realtime()
    batches = sorted(set(args.batches))
    from bench_gpu import bundle_for

    from hne_edge.runtime import AnytimeRunner

    t_start = time.monotonic()
    _, bundle, _ = bundle_for(args.model, ["mixed"], [args.backend], args.workdir, batches)  # reused when there
    options = {"threads": args.threads} if args.device == "cpu" else {}
    with AnytimeRunner(bundle, backend=args.backend, device=args.device, plan="mixed", load_profile=False, **options) as runner:
        describe = runner.backend.describe()
        where = machine(describe.get("gpu"))
        steps = [{"name": step_name(s, runner.tree), "leaves": list(s["leaves"]), "kind": s["kind"]} for s in runner.steps]
        args.out.mkdir(parents=True, exist_ok=True)
        for i, batch in enumerate(batches):
            left = args.seconds - (time.monotonic() - t_start)
            t0 = time.monotonic()
            got = record(runner, batch, args.frames, left / (len(batches) - i), warmup=2 if args.smoke else 10)
            tag = args.backend if args.device == "cpu" else f"{args.backend}_{args.device.replace(':', '')}"
            path = args.out / f"steps_{args.model}_{tag}_b{batch}.json"
            write_json(path, {
                "command": command_line([sys.argv[0], *argv] if argv is not None else None),
                "model": args.model,
                "backend": f"{args.backend} ({args.device}; {', '.join(f'{k} {v}' for k, v in describe.items() if k not in ('backend', 'device'))})"
                           + (", SCHED_FIFO" if args.realtime else ""),
                "batch": batch,
                "machine": f"{where}; load average {load_average() or float('nan'):.1f} at the end, {time.monotonic() - t0:.0f} s"
                           + (" (--smoke: not figures)" if args.smoke else ""),
                "steps": steps,
                **got,
            }, indent=None)  # fmt: skip
            print(f"wrote {path}: {len(got['frames_ms'])} frames x {len(steps)} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
