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
* deadlines, after ``runner.profile()`` (the bundle's min and opt batch sizes, 1 and 16): frames with budgets
  uniform in [first leaf, the plan's full tree]; misses (not forced by ``min_leaves``) <= 1%, and leaves >= 95%
  of the **plan-achievable oracle**'s: it knows every step's true time in the frame (the budgeted run's own
  steps, the others from ``runner.time_steps`` right after: each route once, unbudgeted), pays the run's own
  overhead before and after its steps (the upload), stops only where the plan can stop and, for mixed, picks
  the best sequence of the plan's real steps that fits (``program.best_leaves``). The old oracle, which spread
  a step's time evenly over its leaves and stopped anywhere, is kept as a labelled upper bound
  (``best_leaves(split=True)``): on a GPU a 16-leaf call costs about twice a 1-leaf call, so it credits a plan
  with stops no plan can make (issue 26);
* the batch model: the profile at 1 and 16 predicts batch 8 (interpolated) against batch 8 measured.

Each configuration runs per plan (``--plans``, default segments, subtrees, mixed and fused, issue 21): the full
tree leaf by leaf, in B + 1 calls, mixed (a whole subtree or the whole fused tree in one call where the budget
fits it), and the fused tree (one step: no first leaf, no deadlines). ``--graphs on|off|both``.
``--workdir`` keeps the exported bundle between runs (the acceptance run's stages share it). ``--capture-sizes``
chooses the batch sizes the torch CUDA runner captures graphs for when it opens (default 1, 2, 4, 8, ... up to the
bundle's max). Each row says where its seconds went (``seconds``: export, opening and warm-up, profile, the row),
and the log says it as each runner opens.

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
import sys
import time
from pathlib import Path

import numpy as np
from harness import machine, paired, work_folder, write_report  # first: it puts this checkout on sys.path

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


# -- baselines ------------------------------------------------------------------------------------


def torch_call(backend, module, x: np.ndarray, graph: bool, half: bool = False, prepared: bool = False):
    """One call of ``module`` prepared as the runner's units are (``backend.prepare``, unless ``prepared``): the image
    uploaded (``backend.from_host``, as every runner frame does, in the units' dtype), then one eager call or one
    graph replay, logits to the host."""
    torch = backend.torch
    module = module if prepared else backend.prepare(module, half)
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
    """Frames with budgets uniform in [lo, hi] ms: misses, forced overruns, leaves vs the plan-achievable oracle
    and vs the even-split bound (see the module docstring)."""
    from hne_edge.runtime.bench import frame_oracles

    lo, hi = min(lo, hi), max(lo, hi)  # a plan whose full tree (one fused call) beats its first leaf: the range flips
    hi = max(hi, 1.5 * lo)  # and a range too narrow to say anything widens to 1.5x the lower end
    misses = forced = leaves = oracle = bound = one_leaf_misses = 0
    for _ in range(frames):
        budget = float(rng.uniform(lo, hi))
        r = runner.run(x, budget_ms=budget)
        o = frame_oracles(runner, x, r, budget)
        oracle, bound = oracle + o["oracle"], bound + o["split_bound"]
        leaves += r.leaves
        forced += r.overran_min_leaves
        missed = (not r.met_budget) and not r.overran_min_leaves
        misses += missed
        one_leaf_misses += missed and r.leaves == runner.stops[0]
    return {"frames": frames, "budget_range_ms": [lo, hi], "miss_rate": misses / frames, "forced_overruns": forced, "first_step_misses": one_leaf_misses,
            "mean_leaves": leaves / frames, "leaves_vs_oracle": leaves / oracle, "leaves_vs_split_bound": leaves / bound}


def batch_model_check(runner, prof, batch: int = 8, repeats: int = 10) -> dict:
    """The profile's batch model on this device: batch ``batch`` predicted from the profiled sizes (interpolated
    by ``cost_model.profile_at_batch``) against ``batch`` measured; the ratio of the medians' sums, and the range."""
    from hne_edge.runtime.cost_model import profile_at_batch

    at = profile_at_batch(prof, batch)
    if at is None:
        return {"batch": batch, "error": f"the profile at {sorted(prof.batches)} predicts nothing at batch {batch}"}
    measured = runner.profile(batch_sizes=(batch,), warmup=2, repeats=repeats, save=False).leaf_medians_s(batch)
    ratios = [p / m for p, m in zip(at[0], measured) if m > 0]
    return {"batch": batch, "profiled": sorted(prof.batches), "predicted_ms": 1e3 * sum(at[0]), "measured_ms": 1e3 * sum(measured),
            "ratio": sum(at[0]) / sum(measured), "step_ratio_min": min(ratios), "step_ratio_max": max(ratios)}  # fmt: skip


def bench_config(runner, model, single: Path, backend: str, graph: bool, b: int, args, rng) -> dict:  # noqa: PLR0913
    spec = runner.input_spec
    x = rng.standard_normal((b, spec.channels, *spec.spatial)).astype(np.float32)
    N = runner.num_leaves
    anytime = runner.stops[0] < N  # plan fused has one step: no first leaf, no deadlines
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
        full(), one(), fused and fused(), anytime and first()
    row = {"model": model.config.name, "backend": backend, "plan": runner.plan, "device": runner.device, "cuda_graph": graph,
           "batch": b, "steps": [f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo) for lo, hi, _ in runner.run(x).step_ms]}  # fmt: skip
    if fused is not None:
        row["full_ms"], row["fused_ms"] = paired(full, fused, args.repeats)
        row["full_vs_fused"] = row["full_ms"] / row["fused_ms"]
    if anytime:
        row["first_ms"], row["standalone_ms"] = paired(first, one, args.repeats)
        row["first_vs_standalone"] = row["first_ms"] / row["standalone_ms"]
    row["full_ms_2"], row["sixteen_ms"] = paired(full, sixteen, max(3, args.repeats // 4))
    macs = runner.manifest.prefix_macs()
    path_macs = sum(runner.manifest.node_macs[n] for n in runner.tree.path(0))
    row["mac_ratio"] = N * path_macs / macs[-1]
    row["speedup"] = row["sixteen_ms"] / row["full_ms_2"]
    row["speedup_vs_macs"] = row["speedup"] / row["mac_ratio"]
    if anytime and args.frames:
        row.update(deadlines(runner, x, row["first_ms"], row["full_ms_2"], args.frames, rng))
    return row


def bundle_for(name: str, plans: list[str], backends: list[str], workdir: Path | None, batches=None):
    """(model, bundle, standalone ONNX file or None): the model built from seed 0 (latency does not depend on the
    weights), exported once per ``workdir`` with the files every plan asked for needs (mixed runs segments,
    subtrees and fused files; the torch backend needs only the weights) and batch range (min, max, max) of
    ``batches``: the min and opt batch sizes ``runner.profile()`` measures. Not verified here (the doctor and the
    GPU tests check numerics; this measures time). Without ``workdir``, into a temporary folder removed at exit."""
    batches = tuple(batches or BATCHES)
    import torch

    from hne_edge.exporters import export_onnx, export_standalone_network
    from hne_edge.models import create_model

    torch.manual_seed(0)
    model = create_model(name).eval()
    if backends == ["torch"]:  # the torch backend runs every plan from the weights: one small ONNX file to make
        files = ["fused"]
    else:
        files = sorted({q for p in plans for q in (("segments", "subtrees", "fused") if p == "mixed" else (p,))})
    tmp = work_folder(workdir, f"bench_gpu_{name}_")
    bundle = tmp / f"{name}_{'+'.join(files)}_b{batches[0]}-{batches[-1]}"
    if not (bundle / "manifest.json").is_file():  # an export is published whole (written aside, then renamed)
        export_onnx(model, bundle, precisions=("fp32",), plan=",".join(files), batch=(batches[0], batches[-1], batches[-1]),
                    torch_weights=True, force=True, verify=False, first_leaf=files != ["fused"])  # fmt: skip
    single = None
    if set(backends) - {"torch"}:
        single = tmp / f"{name}_standalone_leaf0.onnx"
        if not single.is_file():
            export_standalone_network(model, 0, single)
    if "tensorrt" in backends:
        from hne_edge.exporters.tensorrt import build_engines

        build_engines(bundle, precisions=("fp32",))  # every plan the bundle has
    return model, bundle, single


def runner_options(backend: str, device: str, graph: bool, capture_sizes: tuple[int, ...] | None) -> dict:
    """The runner's backend options for one configuration: on the CPU one thread (less noise); on a GPU its graphs,
    and for torch the capture sizes when given (each one an eager call, cuDNN's autotuning of its shapes and a
    capture per unit when the runner opens)."""
    if device == "cpu":
        return {"threads": 1}
    options: dict = {"cuda_graph": graph}
    if capture_sizes and backend == "torch" and graph:
        options["capture_sizes"] = list(capture_sizes)
    return options


def bench_model(name: str, backends: list[str], device: str, plans: list[str], args, on_row=None) -> list[dict]:
    """Every row of model ``name``; ``on_row(rows so far)`` after each (the report is written as rows come). Each
    row says where its seconds went (``seconds``: the bundle's export, the runner's opening and warm-up, its
    profile, the row itself), so a stage cut off by its cap says what took its time."""
    from hne_edge.runtime import AnytimeRunner

    t0 = time.perf_counter()
    model, bundle, single = bundle_for(name, plans, backends, args.workdir, args.batches)
    bundle_s = time.perf_counter() - t0
    print(f"bench_gpu: {name}: bundle ready in {bundle_s:.1f} s", flush=True)  # the log says where a cut-off run was
    rows = []
    rng = np.random.default_rng(0)
    graph_options = {"on": (True,), "off": (False,), "both": (True, False)}[args.graphs]
    for backend in backends:
        for plan in plans:
            for graph in (graph_options if device != "cpu" else (False,)):
                options = runner_options(backend, device, graph, args.capture_sizes)
                t0 = time.perf_counter()
                with AnytimeRunner(bundle, backend=backend, device=device, plan=plan, load_profile=False, **options) as runner:
                    seconds = {"bundle": round(bundle_s, 2), "open": round(time.perf_counter() - t0, 2),
                               "warmup": round((runner.warmup_report or {}).get("seconds", 0.0), 2)}  # fmt: skip
                    check = None
                    t0 = time.perf_counter()
                    try:  # the profile every batch's deadlines use: the bundle's min and opt batch sizes (1, 16)
                        prof = runner.profile(warmup=min(5, args.warmup), repeats=args.profile_repeats, save=False)
                        if args.frames and runner.stops[0] < runner.num_leaves and args.batch_check:
                            mid = (args.batches[0] + args.batches[-1]) // 2
                            if args.batches[0] < mid < args.batches[-1]:
                                check = batch_model_check(runner, prof, batch=mid, repeats=args.profile_repeats)
                    except Exception as exc:
                        check = {"error": f"{type(exc).__name__}: {exc}"}
                    seconds["profile"] = round(time.perf_counter() - t0, 2)
                    print(f"bench_gpu: {name} {backend}/{plan}: opened in {seconds['open']:.1f} s (warm-up "
                          f"{seconds['warmup']:.1f} s), profiled in {seconds['profile']:.1f} s", flush=True)  # fmt: skip
                    for b in args.batches:
                        t0 = time.perf_counter()
                        try:
                            row = bench_config(runner, model, single, backend, graph, b, args, rng)
                        except Exception as exc:  # one configuration failing must not hide the others
                            row = {"model": name, "backend": backend, "plan": plan, "cuda_graph": graph, "batch": b,
                                   "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
                        if check is not None and b == args.batches[0]:
                            row["batch_model"] = check
                        row["seconds"] = {**seconds, "row": round(time.perf_counter() - t0, 2)}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if on_row is not None:
                            on_row(rows)
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
        "| misses (<= 1%) | leaves vs plan-achievable oracle (>= 95%) | (vs even-split upper bound) | full, fused, first, standalone, 16 indep. (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks = []
    for r in rows:
        head = f"| {r['model']} | {r['backend']} | {r['plan']} | {'on' if r['cuda_graph'] else 'off'} | {r['batch']} |"
        if "error" in r:
            lines.append(f"{head} {r['error']} ||||||| ")
            continue
        times = ", ".join(ms(r.get(k)) for k in ("full_ms", "fused_ms", "first_ms", "standalone_ms", "sixteen_ms"))
        if "miss_rate" in r:
            dl = (f"{pct(r, 'miss_rate', True)} ({r['forced_overruns']} forced, {r['first_step_misses']} at the first step) | "
                  f"{pct(r, 'leaves_vs_oracle', False)} (mean {r['mean_leaves']:.2f}) | {100 * r['leaves_vs_split_bound']:.1f}% |")  # fmt: skip
        else:
            dl = "n/a | n/a | n/a |"
        lines.append(
            f"{head} {ratio(r, 'full_vs_fused', True)} | {ratio(r, 'first_vs_standalone', True)} | "
            f"{ratio(r, 'speedup_vs_macs', False)} (speedup {r['speedup']:.2f}x, MACs {r['mac_ratio']:.2f}x) | {dl} {times} |"
        )
        c = r.get("batch_model")
        if c:
            label = f"{r['model']} {r['backend']} {r['plan']} graphs {'on' if r['cuda_graph'] else 'off'}"
            checks.append(f"- {label}: " + (c["error"] if "error" in c else
                          f"batch {c['batch']} predicted from a profile at {c['profiled']}: {c['predicted_ms']:.3f} ms vs "
                          f"{c['measured_ms']:.3f} ms measured (ratio {c['ratio']:.2f}; per step {c['step_ratio_min']:.2f}-"
                          f"{c['step_ratio_max']:.2f})"))  # fmt: skip
    lines += ["", "Deadlines: budgets uniform in [first leaf, the plan's full tree]; misses exclude forced overruns (the "
              "forced first step predicted not to fit). Oracle: the best sequence of the plan's own steps that fits each "
              "frame's true step times (program.best_leaves); the even-split bound spreads a step's time over its leaves "
              "and stops anywhere (an upper bound no plan reaches)."]  # fmt: skip
    if checks:
        lines += ["", "The profile's batch model (cost_model.profile_at_batch):", *checks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backends", default=None, help="comma list (default: every GPU backend installed; cpu: torch)")
    ap.add_argument("--plans", default="segments,subtrees,mixed,fused",
                    help="comma list of runner plans (nodes: debugging; fused: the whole tree only)")
    ap.add_argument("--graphs", choices=("on", "off", "both"), default="both", help="CUDA graphs (GPU devices)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    help="comma list, smallest first: the bundle's min and opt (the profile's sizes) are the first and last")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the exported bundle here (reused when present)")
    ap.add_argument("--capture-sizes", default=None,
                    help="torch on a GPU: the batch sizes its graphs are captured for when a runner opens (default: the "
                         "backend's, 1, 2, 4, 8, ... up to the bundle's max); e.g. the --batches measured")  # fmt: skip
    ap.add_argument("--no-batch-check", dest="batch_check", action="store_false",
                    help="skip the batch model's check (a profile at the batch between the first and last)")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (cpu: the torch CPU backend, to check the script)")
    ap.add_argument("--smoke", action="store_true", help="tiny repeats and frames: checks that everything runs, measures nothing")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--profile-repeats", type=int, default=30)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="markdown table (a .json with the raw rows goes beside it)")
    args = ap.parse_args(argv)
    args.batches = tuple(sorted({int(b) for b in args.batches.split(",") if b.strip()}))
    args.capture_sizes = tuple(sorted({int(b) for b in args.capture_sizes.split(",")})) if args.capture_sizes else None
    if args.smoke:
        args.warmup, args.repeats, args.profile_repeats, args.frames = 1, 3, 2, 3
    if args.device == "cpu":
        where = f"CPU ({machine()}, torch CPU backend{', smoke run: not figures' if args.smoke else ''})"
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
    rows: list[dict] = []

    def write(done: list[dict]) -> None:  # after every row: a run stopped by a time cap keeps what it measured
        write_report(args.out, to_markdown(done, where), {"where": where, "rows": done})

    for name in args.models.split(","):
        before = list(rows)
        rows += bench_model(name, backends, args.device, plans, args, on_row=lambda new, before=before: write(before + new))
    write(rows)
    print(to_markdown(rows, where))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
