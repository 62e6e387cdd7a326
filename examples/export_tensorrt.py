#!/usr/bin/env python3
"""Build TensorRT engines on the target device and run the anytime tree with them.

Run this ON the device (Jetson on JetPack 6 / TensorRT 10, or an x86 GPU with
TensorRT 10/11): engines are specific to the TensorRT version and the GPU.

    make demo                                                  # anywhere: writes the ONNX bundle runs/demo/bundle
    python examples/export_tensorrt.py runs/demo/bundle        # on the device (the bundle copied there)

The demo's bundle is fp32. For fp16 engines, export a bundle with fp16 files first, from the checkpoint the
demo names on its "checkpoint" line (the one shipped with hne-edge, unless the demo trained one):

    hne-edge export CHECKPOINT --out bundle --precision fp32,fp16                      # anywhere
    python examples/export_tensorrt.py bundle --precision fp16                        # on the device

It adds the engines to the bundle's manifest (``hne-edge export --format
tensorrt`` does the same), checks them against ONNX Runtime (fails, exit 2, beyond the precision's bound,
the one ``hne-edge doctor`` uses: fp32 1e-4, fp16 1e-3 + 5e-3 x max|logit|), and prints the latency of every
anytime level with the TensorRT backend.
"""

from __future__ import annotations

import sys

import numpy as np

from hne_edge.bundle import RUNNER_PLANS
from hne_edge.cli.scripts import ArgumentParser, run_main


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="an ONNX bundle written by `hne-edge export`")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    p.add_argument("--plan", default="segments", choices=RUNNER_PLANS,
                   help="mixed: engines for every plan the bundle has (segments, subtrees and fused are its parts)")
    p.add_argument("--cuda-graph", action="store_true", help="capture a CUDA graph per engine and batch size")
    args = p.parse_args(argv)
    from hne_edge.exporters import build_engines
    from hne_edge.exporters.verify import compare_outputs
    from hne_edge.runtime import AnytimeRunner

    built = build_engines(args.bundle, precisions=[args.precision], plans=None if args.plan == "mixed" else [args.plan])
    print(f"built {len(built)} engines into {args.bundle}")
    with AnytimeRunner(args.bundle, plan=args.plan, precision=args.precision) as reference, AnytimeRunner(
        args.bundle, backend="tensorrt", device="cuda", plan=args.plan, precision=args.precision,
        cuda_graph=args.cuda_graph,
    ) as runner:
        spec = runner.input_spec
        x = np.random.default_rng(0).standard_normal((1, spec.channels, *spec.spatial)).astype(spec.dtype)
        # judged as the doctor judges a backend (the precision's bound, TOLERANCES): a wrong engine stops here, exit 2
        check = compare_outputs(f"TensorRT {args.precision} engines", "all leaves, vs ONNX Runtime CPU",
                                runner.run(x).logits, reference.run(x).logits, args.precision)
        check.raise_if_failed()
        print(f"TensorRT vs ONNX Runtime CPU, all leaves: max |diff| = {check.max_abs_diff:.2e}, within the "
              f"{args.precision} bound {check.bound:.3g}")
        profile = runner.profile(batch_sizes=(1,))
        for level in profile.batches[1]["levels"]:
            print(f"n={level['n']:2d}  median {level['median_ms']:.3f} ms  p95 {level['p95_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
