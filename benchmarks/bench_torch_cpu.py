"""The torch backend on the CPU (issue 12): BatchNorm folding and fp16, full tree, hne_resnet_small.

    nice .venv/bin/python benchmarks/bench_torch_cpu.py

Three runners on one bundle, 1 thread each: fp32 with BatchNorm folded (the
default), fp32 unfolded (``fold_batchnorm=False``), fp16 (converted fp32
weights). ``runner.run(x)`` (all 16 leaves), 7 frames per runner, interleaved
(forward, then reverse order), medians. Randomized weights: latency does not
depend on their values.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    import torch

    from hne_edge.exporters import export_onnx
    from hne_edge.models import create_model
    from hne_edge.runtime import AnytimeRunner

    torch.manual_seed(0)
    model = create_model("hne_resnet_small").eval()
    bundle = export_onnx(model, Path(tempfile.mkdtemp()) / "b", precisions=("fp32",), plan="segments", batch=(1, 1, 16), torch_weights=True)
    variants = {"fp32": ("fp32", True), "fp32 unfolded": ("fp32", False), "fp16": ("fp16", True)}
    for batch in (1, 16):
        x = np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        runners = {k: AnytimeRunner(bundle, backend="torch", threads=1, load_profile=False, precision=p, fold_batchnorm=f)
                   for k, (p, f) in variants.items()}  # fmt: skip
        times = {k: [] for k in runners}
        for rep in range(7):
            for k, r in runners.items() if rep % 2 == 0 else reversed(list(runners.items())):
                t0 = time.perf_counter()
                r.run(x)
                times[k].append(time.perf_counter() - t0)
        print(f"batch {batch}: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in times.items()), flush=True)
        for r in runners.values():
            r.close()


if __name__ == "__main__":
    main()
