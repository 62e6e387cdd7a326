"""What each unit launches, per plan: toward the launch floor, measured first (issue 26 item 6).

    .venv/bin/python benchmarks/bench_kernels.py --device cpu --out benchmarks/results/kernels.md   # op counts, this CPU
    python3 benchmarks/bench_kernels.py --device cuda --out OUT/kernels.md                         # kernels, a GPU
    python3 benchmarks/bench_kernels.py --device cuda --compile-only --out OUT/kernels_compiled.md  # + torch.compile

Two tables, hne_resnet_small (seed 0 weights), batch 1:

* **per plan** - every unit of every runner plan (segments, subtrees, fused) as the torch backend builds it
  (BatchNorm folded, as by default; and unfolded for comparison): the torch profiler's op count of one call.
  On the CPU: the aten ops the module calls (convolution, relu, add, cat, ...; not the ops they call inside, nor
  views and reshapes), each about one kernel launch on a GPU; on a GPU: the CUDA kernels launched (copies and memsets apart). For the ONNX files of the same plans: their node count, and the
  node count after ONNX Runtime's (CPU) graph optimizations, which fuse more.
* **units** (``--device cuda``) - the fused tree and the first leaf, the two units the H200 measured (1.24 ms
  and 0.62 ms at batch 1, against a launch floor of 0.023 ms): kernels per class (convolution, elementwise,
  reduction, copy, other) with their GPU time from the profiler, and each unit's time as the runner calls it
  (image uploaded, one CUDA graph replay, logits to the host; median of ``--repeats``). With ``--compile``
  (or ``--compile-only``) the same units compiled (``compile=True``: ``torch.compile``, inductor), each checked
  against the float64 model (max |error| on its logits) before it is timed. The targets (H200): fused tree at
  batch 1 <= 0.6 ms, first leaf <= 0.3 ms.

The JSON beside ``--out`` is written after every row, so a run stopped by a time cap keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import machine, write_report  # first: it puts this checkout on sys.path

PLANS = ("segments", "subtrees", "fused")
KERNEL_CLASSES = (("convolution", ("conv", "cudnn", "implicit", "xmma", "cutlass", "wgrad", "dgrad", "winograd", "gemm", "sm80",
                                   "sm90")),
                  ("elementwise", ("elementwise", "vectorized", "unrolled", "triton_poi", "relu", "add", "clamp", "mul")),
                  ("reduction", ("reduce", "triton_red", "mean", "avg", "pool")),
                  ("copy", ("copy", "memcpy", "memset", "cat")))  # fmt: skip


# ops that only reshape or alias a tensor: no kernel
VIEWS = {f"aten::{n}" for n in ("view", "reshape", "expand", "flatten", "unflatten", "unsqueeze", "squeeze", "permute",
                                "transpose", "t", "as_strided", "select", "slice", "detach", "alias", "_unsafe_view")}  # fmt: skip


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def profile_call(torch, fn, device: str) -> dict:
    """One call of ``fn`` under the torch profiler: leaf aten ops (CPU) or CUDA kernels per class, with GPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    fn()  # warm: lazy allocations, cuDNN algorithm choice
    if device != "cpu":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        fn()
        if device != "cpu":
            torch.cuda.synchronize()
    events = list(prof.events())
    if device == "cpu":  # the aten ops the module calls (not those they call inside): what an eager GPU call launches
        top = [e for e in events if e.name.startswith("aten::") and e.name not in VIEWS
               and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))]  # fmt: skip
        by_name: dict[str, int] = {}
        for e in top:
            by_name[e.name] = by_name.get(e.name, 0) + 1
        return {"ops": len(top), "by_op": dict(sorted(by_name.items(), key=lambda kv: -kv[1]))}
    gpu = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    kernels = [e for e in gpu if not any(k in e.name.lower() for k in ("memcpy", "memset"))]
    classes: dict[str, dict] = {}
    for e in kernels:
        c = classes.setdefault(kernel_class(e.name), {"kernels": 0, "gpu_us": 0.0})
        c["kernels"] += 1
        c["gpu_us"] += float(getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0) or 0.0)
    return {"kernels": len(kernels), "copies": len(gpu) - len(kernels), "classes": classes,
            "gpu_us": round(sum(c["gpu_us"] for c in classes.values()), 1)}  # fmt: skip


def onnx_counts(bundle: Path, plans) -> dict:
    """{plan: [(file, nodes, nodes after ONNX Runtime's CPU graph optimizations)]}."""
    import onnx
    import onnxruntime as ort

    from hne_edge.bundle import read_manifest

    manifest = read_manifest(bundle)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for plan in plans:
            rows = []
            for f in manifest.files_for(plan, "fp32", "onnx"):
                path = bundle / f.path
                nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
                o = ort.SessionOptions()
                o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                o.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
                o.log_severity_level = 3
                ort.InferenceSession(str(path), sess_options=o, providers=["CPUExecutionProvider"])
                optimized = len(onnx.load(o.optimized_model_filepath, load_external_data=False).graph.node)
                rows.append((f.path.split("/")[-1], nodes, optimized))
            out[plan] = rows
    return out


def unit_inputs(runner, x) -> dict[str, object]:
    """Each unit's input on frame ``x`` (a forward pre-hook on every unit module during one full run)."""
    seen: dict[str, object] = {}
    handles = [r.module.register_forward_pre_hook(lambda m, a, name=r.name: seen.setdefault(name, a[0].clone()))
               for r in runner._runners]  # fmt: skip
    runner.run(x)
    for h in handles:
        h.remove()
    return seen


def per_plan(bundle: Path, device: str, x: np.ndarray, fold: bool, torch) -> dict:
    """{plan: [(unit, ops or kernels)]} for the torch backend's units of each plan."""
    from hne_edge.runtime import AnytimeRunner

    out = {}
    for plan in PLANS:
        options = {"fold_batchnorm": fold}
        if device != "cpu":
            options["cuda_graph"] = False  # one eager call each: the kernels a graph would hold
        with AnytimeRunner(bundle, backend="torch", device=device, plan=plan, load_profile=False, warmup=0, **options) as runner:
            inputs = unit_inputs(runner, x)
            rows = []
            for r in runner._runners:
                inp = inputs[r.name]

                policy = getattr(runner.backend, "policy", contextlib.nullcontext())  # the runner's fp32 flags

                def call(m=r.module, inp=inp, policy=policy):
                    with torch.inference_mode(), policy:
                        return m(inp)

                got = profile_call(torch, call, device)
                rows.append((r.name.split("#")[-1], got["ops"] if device == "cpu" else got["kernels"]))
            out[plan] = rows
    return out


def time_unit(torch, backend, prepared, x: np.ndarray, repeats: int) -> float:
    """Median ms of one call of a prepared module as the runner makes it: upload, one graph replay (CUDA) or call,
    logits to the host."""
    from bench_gpu import torch_call

    run = torch_call(backend, prepared, x, graph=backend.device != "cpu", prepared=True)
    for _ in range(5):
        run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def units_table(model, device: str, x: np.ndarray, compiled: bool, repeats: int, torch) -> list[dict]:
    """The fused tree and the first leaf: kernels per class, time as the runner calls it, error vs float64."""
    from hne_edge.runtime.backends import create_backend

    backend = create_backend("torch", device, compile=compiled, **({"cuda_graph": True} if device != "cpu" else {}))
    policy = getattr(backend, "policy", contextlib.nullcontext())  # fp32 in fp32 (no TF32), as the runner's calls
    stream = backend.cuda.stream_context if device != "cpu" else contextlib.nullcontext
    ref_model = copy.deepcopy(model).double().eval()
    xd = torch.from_numpy(x).double()
    rows = []
    for name, module, ref in (("fused tree", model, lambda: ref_model(xd)),
                              ("first leaf", model.path_module(0), lambda: ref_model(xd)[:, 0])):  # leaf 0's logits
        row = {"unit": name, "compiled": compiled, "device": device}
        try:
            t0 = time.perf_counter()
            prepared = backend.prepare(copy.deepcopy(module), half=False)
            xin = backend.from_host(x)
            with torch.inference_mode(), stream(), policy:
                out = prepared(xin)  # the first call compiles
            with torch.no_grad():
                want = ref()
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            row["max_error_vs_float64"] = float((out.double().cpu() - want).abs().max())

            def call(m=prepared, xin=xin):
                with torch.inference_mode(), stream(), policy:
                    return m(xin)

            row.update(profile_call(torch, call, device))
            row["ms"] = time_unit(torch, backend, prepared, x, repeats)
        except Exception as exc:  # one unit failing (a compiler error) must not hide the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def to_markdown(data: dict) -> str:
    lines = [f"# Kernels per unit: {data['where']}", ""]
    if data.get("per_plan"):
        lines += [f"Torch backend units, batch 1, one call each ({'aten ops called' if data['device'] == 'cpu' else 'CUDA kernels'}; "
                  "BatchNorm folded, as by default, and unfolded):", "",
                  "| plan | units | per unit (folded) | total folded | total unfolded |", "|---|---|---|---|---|"]  # fmt: skip
        for plan, rows in data["per_plan"].items():
            unfolded = data.get("per_plan_unfolded", {}).get(plan, [])
            lines.append(f"| {plan} | {len(rows)} | {', '.join(str(n) for _, n in rows)} | {sum(n for _, n in rows)} | "
                         f"{sum(n for _, n in unfolded) if unfolded else 'n/a'} |")  # fmt: skip
    if data.get("onnx"):
        lines += ["", "ONNX files (fp32; BatchNorm folded at export): nodes, and nodes after ONNX Runtime's CPU graph optimizations:", "",
                  "| plan | files | nodes per file | total | after ORT optimization |", "|---|---|---|---|---|"]  # fmt: skip
        for plan, rows in data["onnx"].items():
            lines.append(f"| {plan} | {len(rows)} | {', '.join(str(n) for _, n, _ in rows)} | {sum(n for _, n, _ in rows)} | "
                         f"{sum(o for *_, o in rows)} |")  # fmt: skip
    if data.get("units"):
        lines += ["", "The fused tree and the first leaf as the runner calls them (targets on an H200: fused <= 0.6 ms, first leaf "
                  "<= 0.3 ms):", "", "| unit | compiled | ms | kernels (or ops) | by class: kernels / GPU us | max error vs float64 | first call s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in data["units"]:
            if "error" in r:
                lines.append(f"| {r['unit']} | {r['compiled']} | {r['error']} ||||| ")
                continue
            classes = "; ".join(f"{k} {v['kernels']} / {v['gpu_us']:.0f}" for k, v in r.get("classes", {}).items()) or "n/a"
            lines.append(f"| {r['unit']} | {r['compiled']} | {r['ms']:.3f} | {r.get('kernels', r.get('ops'))} | {classes} | "
                         f"{r['max_error_vs_float64']:.1e} | {r['first_call_s']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hne_resnet_small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true", help="also the fused tree and the first leaf compiled (torch.compile)")
    ap.add_argument("--compile-only", action="store_true", help="only the compiled units (a second, separately capped call)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--workdir", type=Path, default=None, help="the bundle's folder (bench_gpu.py's: reused when present)")
    ap.add_argument("--smoke", action="store_true",
                    help="hne_tiny, few repeats, no unfolded pass and no ONNX counts: checks that it runs, measures nothing")
    ap.add_argument("--out", type=Path, required=True, help="markdown (a .json beside it, written after every row)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.repeats = "hne_tiny", 3
    import torch
    from bench_gpu import bundle_for

    from hne_edge.models import create_model

    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"bench_kernels: skipped - torch {torch.__version__} sees no CUDA device; pass --device cpu for the op counts")
        return 0
    where = torch.cuda.get_device_name(0) if args.device != "cpu" else f"CPU ({machine()})"
    data: dict = {"where": where + (" (smoke run: not figures)" if args.smoke else ""), "device": args.device, "model": args.model}

    def write() -> None:
        write_report(args.out, to_markdown(data), data)

    torch.manual_seed(0)
    model = create_model(args.model).eval()
    spec_size = model.config.input_size
    x = np.random.default_rng(0).standard_normal((1, 3, spec_size, spec_size)).astype(np.float32)
    if not args.compile_only:  # the two units the H200 measured first, then every unit of every plan
        data["units"] = units_table(model, args.device, x, False, args.repeats, torch)
        write()
        onnx = args.device == "cpu" and not args.smoke  # the ONNX node counts: a CPU figure (the smoke checks the torch path)
        _, bundle, _ = bundle_for(args.model, list(PLANS), ["onnxruntime"] if onnx else ["torch"], args.workdir, (1, 16))
        data["per_plan"] = per_plan(bundle, args.device, x, True, torch)
        write()
        if not args.smoke:
            data["per_plan_unfolded"] = per_plan(bundle, args.device, x, False, torch)
            write()
        if onnx:
            data["onnx"] = onnx_counts(bundle, PLANS)
            write()
    if args.compile or args.compile_only:
        data.setdefault("units", [])
        data["units"] += units_table(model, args.device, x, True, args.repeats, torch)
        write()
    print(to_markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
