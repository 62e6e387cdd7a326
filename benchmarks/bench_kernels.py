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

* **levers** (``--levers``, issue 40 item 4) - the same two units computed another way, one lever at a time from
  the backend as shipped (fp32, channels-last on a GPU, cuDNN autotuning before capture, CUDA graphs): NCHW, no
  autotuning, TF32, fp16, bfloat16, the branch-parallel 1x1 convolutions as one ``bmm``, grouped convolutions of
  at most 4 / 16 groups as block-diagonal dense ones, and with ``--compile`` the units compiled (inductor's
  default, and ``max-autotune-no-cudagraphs``). Each is checked first - every prefix of the fused tree (the mean
  of its first 1, 2, 4, ... leaves) and the first leaf against the float64 model - then each is timed against the
  backend as shipped, the two alternated ABBA (:func:`harness.paired`), and its row written: a run cut off by a
  time cap keeps every lever it finished (the likeliest wins come first). A lever that computes in fp32 and leaves the tolerance of the real-GPU tests (1e-4 of
  the largest logit) is marked wrong, whatever its time. GPU-only levers are skipped with ``--device cpu``.
  ``--checkpoint`` takes trained weights (the shipped reference: logits and activations of a real model).

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
from harness import command_line, machine, median_ms, paired, timed, write_report  # first: puts the checkout on sys.path

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
            backend.synchronize()  # the backend's stream does not order the copy below, which runs on the default one
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


# an fp32 lever's largest prefix error relative to the largest |logit| of the float64 model: the real-GPU tests'
# tolerance (1e-4, tests/runtime/test_gpu_hardware.py) at O(1) logits; untrained weights give logits of ~0.01
FP32_RELATIVE_TOLERANCE = 1e-4
# (name, the backend's options, fp16 units, GPU only, compiled): one change each from the backend as shipped, the
# likeliest wins first (a stage cut off by its cap keeps the rows before)
LEVERS = (
    ("as shipped", {}, False, False, False),
    ("bfloat16 (bfloat16=True)", {"bfloat16": True}, False, False, False),
    ("fp16 (precision='fp16')", {}, True, False, False),
    ("dense <= 16 groups (dense_groups=16)", {"dense_groups": 16}, False, False, False),
    ("dense <= 4 groups (dense_groups=4)", {"dense_groups": 4}, False, False, False),
    ("1x1 as bmm (pointwise='bmm')", {"pointwise": "bmm"}, False, False, False),
    ("NCHW (channels_last=False)", {"channels_last": False}, False, True, False),
    ("TF32 (allow_tf32=True)", {"allow_tf32": True}, False, True, False),
    ("no cuDNN autotuning (cudnn_benchmark=False)", {"cudnn_benchmark": False}, False, True, False),
    ("compiled (compile=True)", {"compile": True}, False, False, True),
    ("compiled, autotuned (compile_mode='max-autotune-no-cudagraphs')",
     {"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}, False, False, True),
)  # fmt: skip
# ONNX Runtime (``--backend onnxruntime``), as the runner runs the bundle's files: (name, the backend's options, GPU
# only); the backend as shipped runs eagerly, EXHAUSTIVE convolution search, TF32 off (issue 40 item 3: where the
# H200's 2x against torch CUDA went)
ORT_LEVERS = (
    ("as shipped", {}, False),
    ("CUDA graph (cuda_graph=True)", {"cuda_graph": True}, True),
    ("NHWC (provider_options prefer_nhwc=1)", {"provider_options": {"prefer_nhwc": "1"}}, True),
    ("NHWC and CUDA graph", {"provider_options": {"prefer_nhwc": "1"}, "cuda_graph": True}, True),
    ("heuristic search (cudnn_conv_algo_search='HEURISTIC')", {"cudnn_conv_algo_search": "HEURISTIC"}, True),
    ("TF32 (allow_tf32=True)", {"allow_tf32": True}, True),
    ("no spinning (spinning=False)", {"spinning": False}, None),  # None: the CPU only (intra-op threads' spin)
)  # fmt: skip
REDUCED = ("fp16", "bfloat16", "TF32")  # levers that leave fp32 on purpose: their error is reported, not judged


def held_out_loader(checkpoint: Path, data_file: Path):
    """The checkpoint's held-out images of ``data_file`` (its config's split: the reference holds out the file's last
    5,000), normalised as it was trained: read once for every lever."""
    from hne_edge.train.checkpoint import load_checkpoint
    from hne_edge.train.config import TrainConfig, upgrade_config
    from hne_edge.train.data import BatchLoader, load_data

    state = load_checkpoint(checkpoint)
    config = TrainConfig.from_dict(upgrade_config(state["config"]))  # a config an earlier release wrote, too
    config.data.data_dir, config.data.name = str(data_file), "npz"
    norm = state["normalization"]
    return BatchLoader(load_data(config.data, seed=config.seed).val, 500, mean=norm["mean"], std=norm["std"])


def held_out_accuracy(prepared, half: bool, loader, sizes: tuple[int, ...], device: str, torch) -> dict[str, float]:
    """Top-1 % of the first n leaves (each n of ``sizes``) of a lever's fused tree on ``loader``'s images."""
    from hne_edge.demo import ensemble_rows
    from hne_edge.models.layers import ComputeIn
    from hne_edge.train.evaluation import predict

    module = ComputeIn(prepared, torch.float16) if half else prepared  # the image cast as the runner casts it
    with torch.inference_mode():
        logits, labels = predict(module, loader, torch.device(device))
    return {str(r["n"]): round(100 * r["accuracy"], 2) for r in ensemble_rows(logits, labels, sizes)}


def prefix_errors(out, want, sizes: tuple[int, ...]) -> list[float]:
    """Max |error| of each prefix (the mean of the first n leaves, each n of ``sizes`` up to ``want``'s leaves) of
    (batch, leaves, classes) logits."""
    return [float((out[:, :n].double().mean(1) - want[:, :n].mean(1)).abs().max()) for n in sizes if n <= want.shape[1]]


def _check_lever(row: dict, out, want, scale: float, sizes: tuple[int, ...]) -> None:
    """``row``'s exactness: every prefix of ``out`` (batch, leaves, classes) against float64, and the verdict."""
    row["prefix_errors"] = prefix_errors(out, want, sizes)
    row["max_error_vs_float64"] = max(row["prefix_errors"])
    row["relative_error"] = row["max_error_vs_float64"] / scale
    row["wrong"] = not row["lever"].startswith(REDUCED) and row["relative_error"] > FP32_RELATIVE_TOLERANCE


def _time_lever(row: dict, run, shipped: dict, repeats: int) -> None:
    """``row``'s time: the first lever of a unit is the shipped one (timed alone); every other is timed against it,
    the two alternated ABBA."""
    for _ in range(5):
        run()
    if row["unit"] not in shipped:
        shipped[row["unit"]] = run
        row["ms"], row["vs_shipped"] = median_ms([timed(run) for _ in range(repeats)]), 1.0
    else:
        row["shipped_ms"], row["ms"] = paired(shipped[row["unit"]], run, repeats)
        row["vs_shipped"] = row["ms"] / row["shipped_ms"]


def levers_table(model, device: str, x: np.ndarray, compiled: bool, repeats: int, torch, write,
                 accuracy: tuple[Path, Path] | None = None) -> list[dict]:  # fmt: skip
    """Each lever's fused tree and first leaf: checked against float64 (every prefix), then timed against the backend
    as shipped, the two alternated ABBA (:func:`harness.paired`); ``write(rows)`` after each lever, so a run cut off
    by its cap keeps every lever it finished. ``accuracy`` (checkpoint, data file): also each lever's fused tree's
    held-out top-1 at every prefix (what a reduced precision costs, where float64 only says how far the logits
    moved)."""
    from bench_gpu import torch_call

    from hne_edge.runtime.backends import create_backend

    ref_model = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        want = ref_model(torch.from_numpy(x).double())  # (batch, leaves, classes)
    scale, sizes = float(want.abs().max()), model.tree.ensemble_sizes  # the prefixes: 1, 2, 4, ..., N leaves
    loader = held_out_loader(*accuracy) if accuracy is not None else None
    rows: list[dict] = []
    shipped: dict[str, object] = {}  # unit -> the shipped backend's call
    for name, options, half, gpu_only, is_compiled in LEVERS:
        if (gpu_only and device == "cpu") or (is_compiled and not compiled):
            continue
        for unit, module, ref in (("fused tree", model, want), ("first leaf", model.path_module(0), want[:, :1])):
            row = {"lever": name, "unit": unit, "options": {**options, **({"precision": "fp16"} if half else {})}}
            rows.append(row)
            try:
                backend = create_backend("torch", device, **options)
                policy = getattr(backend, "policy", contextlib.nullcontext())
                stream = backend.cuda.stream_context if device != "cpu" else contextlib.nullcontext
                t0 = time.perf_counter()
                prepared = backend.prepare(copy.deepcopy(module), half=half)
                xin = backend.from_host(x.astype(np.float16) if half else x)
                with torch.inference_mode(), stream(), policy:
                    out = prepared(xin)  # the first call compiles, autotunes
                backend.synchronize()  # the copy below runs on the default stream, which waits for no other
                out = out.float().cpu()
                row["first_call_s"] = round(time.perf_counter() - t0, 2)
                _check_lever(row, out if unit == "fused tree" else out[:, None], ref, scale, sizes)

                def call(m=prepared, xin=xin, policy=policy, stream=stream):
                    with torch.inference_mode(), stream(), policy:
                        return m(xin)

                got = profile_call(torch, call, device)
                row["kernels" if device != "cpu" else "ops"] = got["kernels" if device != "cpu" else "ops"]
                if loader is not None and unit == "fused tree":
                    with stream(), policy:
                        row["accuracy_pct"] = held_out_accuracy(prepared, half, loader, sizes, device, torch)
                run = torch_call(backend, prepared, x, graph=device != "cpu", half=half, prepared=True)
                _time_lever(row, run, shipped, repeats)
            except Exception as exc:  # one lever failing (a compiler error, an unsupported kernel) hides no other
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            write(rows)
    return rows


def ort_levers_table(model, bundle: Path, device: str, x: np.ndarray, repeats: int, write) -> list[dict]:
    """``levers_table`` for ONNX Runtime, through the runner as users run the bundle: the fused tree (plan fused) and
    the first leaf (plan subtrees stopped after leaf 0: the export-free first-leaf file), each lever's runners
    checked against float64 (every prefix), then timed against the shipped ones, alternated ABBA. The bundle's
    weights are ``model``'s (bench_gpu's seed 0: timing does not depend on them)."""
    import torch

    from hne_edge.runtime import AnytimeRunner

    with torch.no_grad():
        want = copy.deepcopy(model).double().eval()(torch.from_numpy(x).double())  # (batch, leaves, classes)
    scale = float(want.abs().max())
    rows: list[dict] = []
    shipped: dict[str, object] = {}
    shipped_runners: list = []  # open to the end: timed against every later lever; every other closes after its row
    try:
        for name, options, gpu_only in ORT_LEVERS:
            if (gpu_only is True and device == "cpu") or (gpu_only is None and device != "cpu"):
                continue
            for unit, plan, stop in (("fused tree", "fused", None), ("first leaf", "subtrees", 1)):
                row = {"lever": name, "unit": unit, "options": options}
                rows.append(row)
                runner = None
                try:
                    t0 = time.perf_counter()
                    runner = AnytimeRunner(bundle, backend="onnxruntime", device=device, plan=plan,
                                           load_profile=False, **options)  # fmt: skip
                    result = runner.run(x, max_leaves=stop)
                    row["first_call_s"] = round(time.perf_counter() - t0, 2)
                    out = torch.from_numpy(np.ascontiguousarray(result.leaf_logits.transpose(1, 0, 2)))
                    _check_lever(row, out, want[:, : out.shape[1]], scale, model.tree.ensemble_sizes)
                    run = lambda runner=runner, stop=stop: runner.run(x, max_leaves=stop).logits  # noqa: E731
                    if device != "cpu":  # ONNX Runtime's kernels too: the profiler sees every kernel of the process
                        row["kernels"] = profile_call(torch, run, device)["kernels"]
                    _time_lever(row, run, shipped, repeats)
                    if shipped[unit] is run:
                        shipped_runners.append(runner)
                        runner = None
                except Exception as exc:  # one lever failing (a provider option this build lacks) hides no other
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                finally:
                    if runner is not None:  # its sessions (and CUDA graphs) freed before the next lever opens its own
                        runner.close()
                write(rows)
    finally:
        for runner in shipped_runners:
            runner.close()
    return rows


def levers_markdown(rows: list[dict], device: str, model: str, batch: int = 1) -> list[str]:
    lines = ["", f"Levers on {model}, one at a time from the backend as shipped (batch {batch}, each timed against the "
             f"shipped units alternated ABBA; {'GPU kernels' if device != 'cpu' else 'aten ops'} of one call; every "
             "prefix against float64):", "",
             "| lever | unit | ms | vs shipped | kernels (or ops) | max error vs float64 (relative) | first call s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['lever']} | {r['unit']} | {r['error']} |||||")
            continue
        ms = f"{r['ms']:.3f}" if "ms" in r else "not timed"
        ratio = f"{r['vs_shipped']:.2f}" if r.get("vs_shipped") else "-"
        err = f"{r['max_error_vs_float64']:.1e} ({r['relative_error']:.1e})" + (" **wrong**" if r["wrong"] else "")
        count = r.get("kernels", r.get("ops", "n/a"))
        lines.append(f"| {r['lever']} | {r['unit']} | {ms} | {ratio} | {count} | {err} | {r['first_call_s']} |")
    scored = [r for r in rows if "accuracy_pct" in r]
    if scored:  # what a reduced precision costs where it matters: the held-out top-1 by the leaves averaged
        sizes = list(scored[0]["accuracy_pct"])
        lines += ["", "Held-out top-1 (%) of each lever's fused tree, the first n leaves averaged:", "",
                  "| lever | " + " | ".join(f"n = {n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        lines += [f"| {r['lever']} | " + " | ".join(f"{r['accuracy_pct'][n]:.2f}" for n in sizes) + " |"
                  for r in scored]
    return lines


def to_markdown(data: dict) -> str:
    lines = [f"# {'Levers' if set(data) & {'levers', 'units'} == {'levers'} else 'Kernels per unit'}: {data['where']}", "",
             f"Command: `{data['command']}`", ""]  # fmt: skip
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
    if data.get("levers"):
        lines += levers_markdown(data["levers"], data["device"], f"{data['model']}, {data.get('backend', 'torch')}",
                                 data.get("batch", 1))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hne_resnet_small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true", help="also the fused tree and the first leaf compiled (torch.compile)")
    ap.add_argument("--compile-only", action="store_true", help="only the compiled units (a second, separately capped call)")
    ap.add_argument("--levers", action="store_true",
                    help="only the levers table: each lever's fused tree and first leaf, checked, then timed against the "
                         "shipped units (with --compile: the compiled levers too)")  # fmt: skip
    ap.add_argument("--backend", choices=("torch", "onnxruntime"), default="torch",
                    help="--levers: the torch backend's units (default), or ONNX Runtime's through the runner, on the "
                         "bundle in --workdir (exported there when missing)")  # fmt: skip
    ap.add_argument("--accuracy-data", type=Path, default=None,
                    help="--levers with --checkpoint: also each lever's held-out top-1 on this training file (the "
                         "checkpoint's split: the reference's last 5,000 images of CIFAR-10's training set)")  # fmt: skip
    ap.add_argument("--batch", type=int, default=1, help="images a call (default 1; the levers at another batch size)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="the weights (and model) of a checkpoint, e.g. hne_edge/assets/cifar10_reference.pt; default: "
                         "--model with seed-0 weights")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--workdir", type=Path, default=None, help="the bundle's folder (bench_gpu.py's: reused when present)")
    ap.add_argument("--smoke", action="store_true",
                    help="hne_tiny, few repeats, no unfolded pass and no ONNX counts: checks that it runs, measures nothing")
    ap.add_argument("--out", type=Path, required=True, help="markdown (a .json beside it, written after every row)")
    args = ap.parse_args(argv)
    if not 1 <= args.batch <= 16:
        ap.error(f"--batch: received {args.batch}; expected 1..16 (the bundles here are exported for 1..16)")
    if args.accuracy_data is not None and (args.checkpoint is None or not args.levers or args.backend != "torch"):
        ap.error("--accuracy-data: expected --levers, the torch backend and --checkpoint (whose held-out split it "
                 "scores)")
    if args.accuracy_data is not None and not args.accuracy_data.is_file():
        ap.error(f"--accuracy-data: {args.accuracy_data} is not a file; expected a training .npz (x, y)")
    if args.smoke:
        args.model, args.repeats = "hne_tiny", 3
    import torch
    from bench_gpu import bundle_for

    from hne_edge.models import create_model

    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"bench_kernels: skipped - torch {torch.__version__} sees no CUDA device; pass --device cpu for the op counts")
        return 0
    where = torch.cuda.get_device_name(0) if args.device != "cpu" else f"CPU ({machine()})"
    data: dict = {"where": where + (" (smoke run: not figures)" if args.smoke else ""), "device": args.device, "model": args.model,
                  "command": command_line()}  # fmt: skip

    def write() -> None:
        write_report(args.out, to_markdown(data), data)

    torch.manual_seed(0)
    if args.checkpoint is not None:
        from hne_edge.train.checkpoint import model_from_checkpoint

        model = model_from_checkpoint(args.checkpoint)[0].float().eval()
        args.model, data["model"] = model.config.name, f"{model.config.name} ({args.checkpoint.name})"
    else:
        model = create_model(args.model).eval()
    spec_size = model.config.input_size
    x = np.random.default_rng(0).standard_normal((args.batch, 3, spec_size, spec_size)).astype(np.float32)
    data["batch"] = args.batch
    if args.levers:
        def write_levers(rows: list[dict]) -> None:
            data["levers"] = rows
            write()

        if args.backend == "onnxruntime":
            from bench_gpu import bundle_for

            data["backend"] = "onnxruntime"  # the bundle bench_gpu's mixed rows use (reused from --workdir)
            model, bundle, _ = bundle_for(args.model, ["mixed"], ["onnxruntime"], args.workdir, (1, 16))
            data["model"] = f"{args.model} (seed 0: the bundle's weights)"
            ort_levers_table(model, bundle, args.device, x, args.repeats, write_levers)
        else:
            accuracy = (args.checkpoint, args.accuracy_data) if args.accuracy_data else None
            levers_table(model, args.device, x, args.compile, args.repeats, torch, write_levers, accuracy)
        print(to_markdown(data))
        return 0
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
