"""GPU backends benchmark (issue 6): first leaf, full tree, CUDA graphs, deadlines - on a CUDA GPU.

    .venv/bin/python benchmarks/bench_gpu.py --out benchmarks/results/gpu.md

Per backend available here (onnxruntime CUDA, torch CUDA, TensorRT), per
model (hne_resnet_small, hne_mobilenetv2; randomized weights: latency does
not depend on their values), batch 1 and 16, CUDA graphs off and on:

* first leaf: ``runner.run(x, max_leaves=1)`` vs a standalone single network
  (root -> leaf 0, one file / module) on the same backend;
* full tree: ``runner.run(x)`` vs 16 independent networks (the standalone
  network 16 times: every path has the same architecture) vs the fused
  grouped model (torch CUDA only: one grouped call);
* deadlines: after ``runner.profile()``, 300 frames per budget (25/50/75 % of
  the full-tree median): miss rate and mean leaves.

Timing: every call ends with the logits on the host (the runner's
``to_host`` synchronizes the stream; the baselines synchronize explicitly),
wall time by ``time.perf_counter``, median of ``--repeats`` after warm-up.
Exits 0 with a clear message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = ("hne_resnet_small", "hne_mobilenetv2")
BATCHES = (1, 16)


def cuda_status() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (the benchmark builds the models with torch)"
    if not torch.cuda.is_available():
        return False, f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU"
    return True, torch.cuda.get_device_name(0)


def available_backends() -> list[str]:
    out = ["torch"]
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            out.append("onnxruntime")
    except ImportError:
        pass
    try:
        import tensorrt  # noqa: F401

        out.append("tensorrt")
    except ImportError:
        pass
    return out


def median_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def standalone(backend: str, model, onnx_path: Path, x: np.ndarray, graph: bool):
    """A callable running the single network root -> leaf 0 on ``backend`` (logits on the host)."""
    import torch

    if backend == "torch":
        net = model.path_module(0).cuda().eval().to(memory_format=torch.channels_last)
        xt = torch.from_numpy(x).cuda().contiguous(memory_format=torch.channels_last)
        if graph:
            static = xt.clone()
            with torch.inference_mode():
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        net(static)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = net(static)
            return lambda: (g.replay(), out.cpu())
        return lambda: _torch_call(net, xt)
    if backend == "onnxruntime":
        import onnxruntime as ort

        opts = {"cudnn_conv_algo_search": "EXHAUSTIVE", **({"enable_cuda_graph": "1"} if graph else {})}
        sess = ort.InferenceSession(str(onnx_path), providers=[("CUDAExecutionProvider", opts)])
        io = sess.io_binding()
        xin = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        io.bind_ortvalue_input("image", xin)
        if graph:
            io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_shape_and_type((len(x), model.config.num_classes), np.float32, "cuda", 0))
        else:
            io.bind_output("logits", "cuda", 0)

        def run():
            sess.run_with_iobinding(io)
            return io.get_outputs()[0].numpy()

        return run
    if backend == "tensorrt":
        return _trt_standalone(onnx_path, x)
    raise ValueError(backend)


def _torch_call(net, xt):
    import torch

    with torch.inference_mode():
        return net(xt).cpu()


def _trt_standalone(onnx_path: Path, x: np.ndarray):
    """Build (strongly typed, fixed batch) and run one engine for the standalone network."""
    import tensorrt as trt
    import torch

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if major < 11 else 0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(onnx_path)), "TensorRT could not parse the standalone network"
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("image", x.shape, x.shape, x.shape)
    config.add_optimization_profile(profile)
    engine = trt.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(network, config))
    ctx = engine.create_execution_context()
    ctx.set_input_shape("image", x.shape)
    xin = torch.from_numpy(x).cuda()
    out = torch.empty(tuple(ctx.get_tensor_shape("logits")), device="cuda")
    ctx.set_tensor_address("image", xin.data_ptr())
    ctx.set_tensor_address("logits", out.data_ptr())
    stream = torch.cuda.Stream()

    def run():
        ctx.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        return out.cpu()

    return run


def bench_model(name: str, backends: list[str], warmup: int, repeats: int, frames: int) -> list[dict]:
    import torch

    from hne_edge.exporters import export_onnx, export_standalone_network
    from hne_edge.models import create_model
    from hne_edge.runtime import AnytimeRunner

    torch.manual_seed(0)
    model = create_model(name).eval()
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_gpu_{name}_"))
    bundle = export_onnx(model, tmp / "bundle", precisions=("fp32",), plan="both", batch=(1, 1, 16), torch_weights=True)
    single = export_standalone_network(model, 0, tmp / "single.onnx")
    if "tensorrt" in backends:
        from hne_edge.exporters.tensorrt import build_engines

        build_engines(bundle, precisions=("fp32",), plans=("segments",))
    rows = []
    for backend in backends:
        for graph in (False, True):
            with AnytimeRunner(bundle, backend=backend, device="cuda", cuda_graph=graph, load_profile=False) as runner:
                c, (h, w) = runner.input_spec.channels, runner.input_spec.spatial
                for b in BATCHES:
                    x = np.random.default_rng(0).standard_normal((b, c, h, w)).astype(np.float32)
                    row = {"model": name, "backend": backend, "cuda_graph": graph, "batch": b}
                    row["first_leaf_ms"] = median_ms(lambda: runner.run(x, max_leaves=1), warmup, repeats)
                    row["full_tree_ms"] = median_ms(lambda: runner.run(x), warmup, repeats)
                    try:
                        one = standalone(backend, model, single, x, graph)
                        row["standalone_ms"] = median_ms(one, warmup, repeats)
                        row["16_independent_ms"] = median_ms(lambda: [one() for _ in range(runner.num_leaves)], 2, max(3, repeats // 4))
                    except Exception as exc:  # a baseline failing must not hide the runner's numbers
                        row["standalone_error"] = f"{type(exc).__name__}: {exc}"
                    if backend == "torch":
                        fused = model.cuda().eval()
                        xt = torch.from_numpy(x).cuda()
                        row["fused_ms"] = median_ms(lambda: _torch_call(fused, xt), warmup, repeats)
                    prof = runner.profile(batch_sizes=(b,), warmup=5, repeats=30, save=False)
                    full = prof.batches[b]["levels"][-1]["median_ms"]
                    row["deadlines"] = []
                    for frac in (0.25, 0.5, 0.75):
                        budget = full * frac
                        results = [runner.run(x, budget_ms=budget) for _ in range(frames)]
                        row["deadlines"].append(
                            {
                                "budget_ms": round(budget, 3),
                                "miss_rate": float(np.mean([not r.met_budget for r in results])),
                                "mean_leaves": float(np.mean([r.leaves for r in results])),
                            }
                        )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def to_markdown(rows: list[dict], gpu: str) -> str:
    lines = [f"# GPU backends on {gpu}", "", "| model | backend | graphs | batch | first leaf | standalone | full tree | 16 independent | fused | deadlines (budget: miss, leaves) |", "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v: "n/a" if v is None else f"{v:.3f} ms"  # noqa: E731
    for r in rows:
        d = "; ".join(f"{x['budget_ms']} ms: {x['miss_rate']:.1%}, {x['mean_leaves']:.1f}" for x in r["deadlines"])
        lines.append(
            f"| {r['model']} | {r['backend']} | {'on' if r['cuda_graph'] else 'off'} | {r['batch']} | {f(r['first_leaf_ms'])} | "
            f"{f(r.get('standalone_ms'))} | {f(r['full_tree_ms'])} | {f(r.get('16_independent_ms'))} | {f(r.get('fused_ms'))} | {d} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backends", default=None, help="comma list (default: every GPU backend installed)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="markdown table (a .json with the raw rows goes beside it)")
    args = ap.parse_args(argv)
    ok, gpu = cuda_status()
    if not ok:
        print(f"bench_gpu: skipped - {gpu}. Nothing was measured; run this on a machine with an NVIDIA GPU.")
        return 0
    backends = args.backends.split(",") if args.backends else available_backends()
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name, backends, args.warmup, args.repeats, args.frames)
    md = to_markdown(rows, gpu)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        args.out.with_suffix(".json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
