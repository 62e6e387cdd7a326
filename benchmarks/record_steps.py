"""Record the true time of every step of a mixed runner, frame by frame, for the deadline oracle test.

    .venv/bin/python benchmarks/record_steps.py --out tests/data/steps_hne_resnet_small_ort_cpu_b1.json

hne_resnet_small (randomized weights), ONNX Runtime CPU, 1 intra-op thread, batch 1, a bundle with plans
segments, subtrees and fused. ``runner.profile()`` runs each route of the mixed program (leaf by leaf,
subtree by subtree, the whole tree) ``--frames`` times; sample ``r`` of every step of a route is frame
``r``. tests/runtime/test_steps.py replays these times on a virtual clock (the numerics are the fake
backend's) and compares the mixed runner with an oracle that knows every step's time.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hne_resnet_small")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "hne_record_steps"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--realtime", action="store_true",
                    help="SCHED_FIFO priority 1 (Linux, root), as a deployed real-time process would run: on a shared "
                         "machine the recording is then of the device, not of the other jobs' time slices")
    args = ap.parse_args()
    if args.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import randomize_

    from hne_edge.exporters import export_onnx
    from hne_edge.fileio import atomic_write_json
    from hne_edge.models import create_model
    from hne_edge.runtime import AnytimeRunner

    bundle = Path(args.workdir) / f"{args.model}_mixed"
    if not (bundle / "manifest.json").exists():
        torch.manual_seed(0)
        export_onnx(randomize_(create_model(args.model)), bundle, plan="segments,subtrees,fused", batch=(1, 1, 16),
                    torch_weights=False, verify=False, force=True)  # fmt: skip
    with AnytimeRunner(bundle, plan="mixed", threads=args.threads, load_profile=False) as runner:
        t0 = time.time()
        prof = runner.profile(batch_sizes=(args.batch,), warmup=10, repeats=args.frames, save=False)
        steps = [{"name": s["name"].split("/")[-2] + "/" + s["name"].split("/")[-1], "leaves": list(s["leaves"]),
                  "kind": s["kind"]} for s in runner.steps]  # fmt: skip
        samples = [leaf["samples_ms"] for leaf in prof.batches[args.batch]["leaves"]]
    data = {
        "command": " ".join(["python", "benchmarks/record_steps.py", *sys.argv[1:]]),
        "model": args.model,
        "backend": "onnxruntime (CPU), intra-op threads %d%s" % (args.threads, ", SCHED_FIFO" if args.realtime else ""),
        "batch": args.batch,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs shared with other jobs, "
                   f"load average {os.getloadavg()[0]:.1f} at the end, {time.time() - t0:.0f} s",
        "steps": steps,
        "frames_ms": [[round(s[r], 4) for s in samples] for r in range(args.frames)],  # frame r: every step's ms
    }
    atomic_write_json(args.out, data)
    print(f"wrote {args.out}: {args.frames} frames x {len(steps)} steps")


if __name__ == "__main__":
    main()
