"""Budget misses with a hand-edited profile (issue 19 section 3): the real profile, medians scaled by 1e-300, by 1e-3, by 1e3.

    .venv/bin/python benchmarks/bench_profile_audit.py --frames 300

hne_tiny (randomized weights), ONNX Runtime CPU, batch 1, one thread. The bundle is profiled here (50
repeats), then each condition opens a fresh runner on the same bundle with the profile file as given
(untouched, or every median / percentile / sample multiplied by the factor) and runs ``--frames`` frames
with ``budget_ms`` = ``--budget-fraction`` of the profiled full tree, counting frames that miss it. The
conditions are interleaved in rounds of 10 frames so that load changes hit them alike. Only the public
API is used, so the same script measures any version of the package (``PYTHONPATH=OTHER_CHECKOUT``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--budget-fraction", type=float, default=0.5)
    parser.add_argument("--factors", default="1,1e-300,1e-3,1e3")
    args = parser.parse_args()

    import torch

    import hne_edge
    from hne_edge.exporters import export_onnx
    from hne_edge.models import create_model
    from hne_edge.runtime import AnytimeRunner

    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="hne-audit-"))
    try:
        bundle = export_onnx(create_model("hne_tiny").eval(), work / "b", plan="segments", first_leaf=False,
                             torch_weights=False, batch=(1, 1, 1), verify=False)  # fmt: skip
        with AnytimeRunner(bundle, threads=1) as runner:
            runner.profile(batch_sizes=(1,), warmup=20, repeats=50)
            profile_path = Path(runner.profile_path)
            full_ms = sum(leaf["median_ms"] for leaf in runner.profile_data.batches[1]["leaves"])
        original = json.loads(profile_path.read_text())
        budget = args.budget_fraction * full_ms
        factors = [float(f) for f in args.factors.split(",")]
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        runners, misses, leaves, dropped = {}, {f: 0 for f in factors}, {f: [] for f in factors}, {}
        for f in factors:  # one runner per condition, each loading its own copy of the profile
            copy = work / f"b{f:g}"
            shutil.copytree(bundle, copy)
            data = json.loads(json.dumps(original))
            for leaf in data["batch_sizes"]["1"]["leaves"]:
                for key in ("median_ms", "p90_ms", "p95_ms", "mean_ms"):
                    leaf[key] *= f
                leaf["samples_ms"] = [s * f for s in leaf["samples_ms"]]
            (copy / "profiles" / profile_path.name).write_text(json.dumps(data))
            runners[f] = AnytimeRunner(copy, threads=1)
            assert runners[f].profile_data is not None, runners[f].profile_status
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for start in range(0, args.frames, 10):
                for f in factors:
                    for _ in range(min(10, args.frames - start)):
                        n = len(caught)
                        r = runners[f].run(x, budget_ms=budget)
                        misses[f] += not r.met_budget
                        leaves[f].append(r.leaves)
                        if len(caught) > n:
                            dropped.setdefault(f, start)
        for r in runners.values():
            r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"hne-edge {hne_edge.__version__} ({Path(hne_edge.__file__).parent}); {platform.processor() or platform.machine()}; "
          f"hne_tiny, ONNX Runtime CPU, 1 thread, batch 1; profiled full tree {full_ms:.3f} ms, budget {budget:.3f} ms")  # fmt: skip
    print(f"{'profile medians x':>18}  {'misses':>9}  {'mean leaves':>11}  {'dropped (warning)':>18}")
    for f in factors:
        note = f"by frame {dropped[f] + 10}" if f in dropped else "no"
        print(f"{f:>18g}  {misses[f]:>4}/{args.frames:<4}  {np.mean(leaves[f]):>11.2f}  {note:>18}")


if __name__ == "__main__":
    main()
