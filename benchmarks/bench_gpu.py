"""GPU runtime targets (issues 6 and 12): anytime at no extra cost over the fused model, on a CUDA GPU.

    .venv/bin/python benchmarks/bench_gpu.py --out benchmarks/results/gpu.md
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --smoke      # proves the script runs (CPU torch)

Per backend (torch CUDA; ONNX Runtime CUDA and TensorRT where installed),
model (hne_resnet_small, hne_resnet; randomized weights: latency does not
depend on their values), anytime plan (every plan of ``bundle.ANYTIME_PLANS``
by default, so a new plan is measured as soon as the bundle has it), batch 1
and 16, CUDA graphs on (the torch default) and off. Every ratio is of medians, the two calls interleaved (ABBA) in one
process; every call ends with the logits on the host. The targets (issue 12):

* full tree: ``runner.run(x)`` <= 1.0x the fused grouped model's single call
  (``model(x)``, prepared like the backend's units: BatchNorm folded,
  channels-last, one CUDA graph; the image uploaded per call, as the runner does);
* first leaf: ``runner.run(x, max_leaves=1)`` <= 1.05x a standalone network
  (root -> leaf 0, ``model.path_module(0)``) prepared the same way;
* 16 independent networks (that standalone network run 16 times) / the full
  tree >= 0.9x the MAC ratio (16 x one path's MACs / the tree's MACs);
* deadlines, after ``runner.profile()``: frames with budgets uniform in
  [first leaf, full tree]; misses (not forced by ``min_leaves``) <= 1%, and
  leaves >= 95% of an oracle's, which knows each leaf's true time (the
  budgeted run's own, then an unbudgeted run of the same frame) and fits as
  many leaves as their cumulative time allows.

Each configuration runs per plan (``--plans``, default segments, subtrees
and mixed, issue 21): the full tree leaf by leaf, in B + 1 calls, and mixed
(a whole subtree or the whole fused tree in one call where the budget fits
it). The deadline oracle splits a step's time evenly over its leaves.

The baselines for onnxruntime / TensorRT are their own standalone ONNX file /
engine; the fused model is measured on torch only. ``--device cpu`` runs the
same rows with the CPU torch backend (no graphs): a check that the script
works, not GPU figures. Without a CUDA device and without ``--device cpu`` it
exits 0 with a message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = ("hne_resnet_small", "hne_resnet")
BATCHES = (1, 16)
TARGETS = {"full_vs_fused": 1.0, "first_vs_standalone": 1.05, "speedup_vs_macs": 0.9, "miss_rate": 0.01, "leaves_vs_oracle": 0.95}


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


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired(fa, fb, repeats: int) -> tuple[float, float]:
    """Medians (ms) of two calls alternated ABBA, so each follows the same work."""
    ta, tb = [], []
    for k in range(repeats):
        for which in ((0, 1) if k % 2 == 0 else (1, 0)):
            (ta if which == 0 else tb).append(timed(fa if which == 0 else fb))
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


# -- baselines ------------------------------------------------------------------------------------


def torch_call(backend, module, x: np.ndarray, graph: bool, half: bool = False):
    """One call of ``module`` prepared as the runner's units are (``backend.prepare``): the image uploaded
    (``backend.from_host``, as every runner frame does, in the units' dtype), then one eager call or one
    graph replay, logits to the host."""
    torch = backend.torch
    module = backend.prepare(module, half)
    x = x.astype(np.float16) if half else x
    policy = getattr(backend, "policy", contextlib.nullcontext())
    stream = backend.cuda.stream_context if hasattr(backend, "cuda") else contextlib.nullcontext
    if not graph:

        def run():
            xin = backend.from_host(x)
            with torch.inference_mode(), stream(), policy:
                out = module(xin)
            return backend.to_host(out)

        return run
    static = backend.from_host(x).clone()
    with torch.inference_mode(), stream():
        with policy:
            module(static)  # warm-up: cuDNN autotuning, lazy allocations
            replay, (out,) = backend.cuda.capture_outputs(lambda: (module(static),))

    def run_graph():
        xin = backend.from_host(x)
        with torch.inference_mode(), stream():
            static.copy_(xin)
        replay()
        return backend.to_host(out)

    return run_graph


def ort_standalone(onnx_path: Path, x: np.ndarray, num_classes: int, graph: bool):
    import onnxruntime as ort

    opts = {"cudnn_conv_algo_search": "EXHAUSTIVE", **({"enable_cuda_graph": "1"} if graph else {})}
    sess = ort.InferenceSession(str(onnx_path), providers=[("CUDAExecutionProvider", opts)])
    io = sess.io_binding()
    io.bind_ortvalue_input("image", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    if graph:
        io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_shape_and_type((len(x), num_classes), np.float32, "cuda", 0))
    else:
        io.bind_output("logits", "cuda", 0)

    def run():
        sess.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()

    return run


def trt_standalone(onnx_path: Path, x: np.ndarray):
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


# -- one configuration ----------------------------------------------------------------------------


def deadlines(runner, x: np.ndarray, lo: float, hi: float, frames: int, rng) -> dict:
    misses = forced = leaves = oracle = 0
    for _ in range(frames):
        budget = float(rng.uniform(lo, hi))
        r = runner.run(x, budget_ms=budget)
        f = runner.run(x)
        true = list(r.leaf_ms) + list(f.leaf_ms[r.leaves :])
        oracle += max(1, int((np.cumsum(true) <= budget).sum()))
        leaves += r.leaves
        forced += r.overran_min_leaves
        misses += (not r.met_budget) and not r.overran_min_leaves
    return {"frames": frames, "miss_rate": misses / frames, "forced_overruns": forced, "leaves_vs_oracle": leaves / oracle}


def bench_config(runner, model, single: Path, backend: str, graph: bool, b: int, args, rng) -> dict:  # noqa: PLR0913
    spec = runner.input_spec
    x = rng.standard_normal((b, spec.channels, *spec.spatial)).astype(np.float32)
    N = runner.num_leaves
    if backend == "torch":
        half = runner.precision == "fp16"
        one = torch_call(runner.backend, model.path_module(0), x, graph, half)
        fused = torch_call(runner.backend, model, x, graph, half)
    elif backend == "onnxruntime":
        one, fused = ort_standalone(single, x, model.config.num_classes, graph), None
    else:
        one, fused = trt_standalone(single, x), None
    sixteen = lambda: [one() for _ in range(N)]  # noqa: E731
    full = lambda: runner.run(x).logits  # noqa: E731
    first = lambda: runner.run(x, max_leaves=1).logits  # noqa: E731
    for _ in range(args.warmup):
        full(), first(), one(), fused and fused()
    row = {"model": model.config.name, "backend": backend, "plan": runner.plan, "device": runner.device, "cuda_graph": graph,
           "batch": b}  # fmt: skip
    if fused is not None:
        row["full_ms"], row["fused_ms"] = paired(full, fused, args.repeats)
        row["full_vs_fused"] = row["full_ms"] / row["fused_ms"]
    row["first_ms"], row["standalone_ms"] = paired(first, one, args.repeats)
    row["first_vs_standalone"] = row["first_ms"] / row["standalone_ms"]
    row["full_ms_2"], row["sixteen_ms"] = paired(full, sixteen, max(3, args.repeats // 4))
    macs = runner.manifest.prefix_macs()
    path_macs = sum(runner.manifest.node_macs[n] for n in runner.tree.path(0))
    row["mac_ratio"] = N * path_macs / macs[-1]
    row["speedup"] = row["sixteen_ms"] / row["full_ms_2"]
    row["speedup_vs_macs"] = row["speedup"] / row["mac_ratio"]
    runner.profile(batch_sizes=(b,), warmup=min(5, args.warmup), repeats=args.profile_repeats, save=False)
    row.update(deadlines(runner, x, row["first_ms"], row["full_ms_2"], args.frames, rng))
    return row


def bench_model(name: str, backends: list[str], device: str, plans: list[str], args) -> list[dict]:
    import torch

    from hne_edge.exporters import export_onnx, export_standalone_network
    from hne_edge.models import create_model
    from hne_edge.runtime import AnytimeRunner

    torch.manual_seed(0)
    model = create_model(name).eval()
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_gpu_{name}_"))
    # the files every runner plan asked for needs: mixed runs segments, subtrees and fused files
    files = sorted({q for p in plans for q in (("segments", "subtrees", "fused") if p == "mixed" else (p,))})
    bundle = export_onnx(model, tmp / "bundle", precisions=("fp32",), plan=",".join(files), batch=(1, 1, 16),
                         torch_weights=True)  # fmt: skip
    single = export_standalone_network(model, 0, tmp / "single.onnx") if set(backends) - {"torch"} else None
    if "tensorrt" in backends:
        from hne_edge.exporters.tensorrt import build_engines

        build_engines(bundle, precisions=("fp32",))  # every plan the bundle has
    rows = []
    rng = np.random.default_rng(0)
    for backend in backends:
        for plan in plans:
            for graph in ((True, False) if device != "cpu" else (False,)):
                options = {"cuda_graph": graph} if device != "cpu" else {"threads": 1}  # cpu: one core, less noise
                with AnytimeRunner(bundle, backend=backend, device=device, plan=plan, load_profile=False, **options) as runner:
                    for b in BATCHES:
                        try:
                            row = bench_config(runner, model, single, backend, graph, b, args, rng)
                        except Exception as exc:  # one configuration failing must not hide the others
                            row = {"model": name, "backend": backend, "plan": plan, "cuda_graph": graph, "batch": b,
                                   "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    return rows


def to_markdown(rows: list[dict], where: str) -> str:
    def ratio(r, key, le):
        if key not in r:
            return "n/a"
        v, t = r[key], TARGETS[key]
        ok = v <= t if le else v >= t
        return f"{v:.2f}x {'ok' if ok else 'MISSED'}"

    def pct(r, key, le):
        v, t = r[key], TARGETS[key]
        return f"{100 * v:.1f}% {'ok' if (v <= t if le else v >= t) else 'MISSED'}"

    ms = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        f"# GPU runtime targets on {where}",
        "",
        "| model | backend | plan | graphs | batch | full / fused (<= 1.0) | first / standalone (<= 1.05) | (16 indep. / HNE) / MAC ratio (>= 0.9) "
        "| misses (<= 1%) | leaves vs oracle (>= 95%) | full, fused, first, standalone, 16 indep. (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['model']} | {r['backend']} | {r['plan']} | {'on' if r['cuda_graph'] else 'off'} | {r['batch']} |"
        if "error" in r:
            lines.append(f"{head} {r['error']} |||||| ")
            continue
        times = ", ".join(ms(r.get(k)) for k in ("full_ms", "fused_ms", "first_ms", "standalone_ms", "sixteen_ms"))
        lines.append(
            f"{head} {ratio(r, 'full_vs_fused', True)} | {ratio(r, 'first_vs_standalone', True)} | "
            f"{ratio(r, 'speedup_vs_macs', False)} (speedup {r['speedup']:.2f}x, MACs {r['mac_ratio']:.2f}x) | "
            f"{pct(r, 'miss_rate', True)} | {pct(r, 'leaves_vs_oracle', False)} | {times} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backends", default=None, help="comma list (default: every GPU backend installed; cpu: torch)")
    ap.add_argument("--plans", default="segments,subtrees,mixed",
                    help="comma list of runner plans (nodes: debugging; fused: the whole tree only)")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (cpu: the torch CPU backend, to check the script)")
    ap.add_argument("--smoke", action="store_true", help="tiny repeats and frames: checks that everything runs, measures nothing")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--profile-repeats", type=int, default=30)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="markdown table (a .json with the raw rows goes beside it)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.warmup, args.repeats, args.profile_repeats, args.frames = 1, 3, 2, 3
    if args.device == "cpu":
        import platform

        where = f"CPU ({platform.machine()}, torch CPU backend{', smoke run: not figures' if args.smoke else ''})"
        backends = ["torch"]
    else:
        ok, gpu = cuda_status()
        if not ok:
            print(f"bench_gpu: skipped - {gpu}. Nothing was measured; run this on a machine with an NVIDIA GPU "
                  "(or pass --device cpu to check that the script runs).")  # fmt: skip
            return 0
        where = gpu
        backends = args.backends.split(",") if args.backends else available_backends()
    from hne_edge.bundle import RUNNER_PLANS

    plans = args.plans.split(",")
    unknown = [p for p in plans if p not in RUNNER_PLANS]
    if unknown:
        ap.error(f"--plans: received {unknown}; expected some of {list(RUNNER_PLANS)}")
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name, backends, args.device, plans, args)
    md = to_markdown(rows, where)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        args.out.with_suffix(".json").write_text(json.dumps({"where": where, "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
