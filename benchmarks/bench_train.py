"""Training throughput: the trainer's loop against its step alone, and each formulation of the step.

Two figures, measured in one process on the same model, optimiser and precision:

* **the loop**: ``hne_edge.train.fit`` itself (augmentation, loss, optimiser, schedule, progress), --epochs
  epochs of --limit images; the last epoch is reported (the first absorbs cuDNN's kernel choice and, with
  --compile, compilation);
* **the step alone**: ``hne_edge.train.engine.train_step`` (the loop's own step) on one batch already on the
  device, repeated: no data pipeline, no loop. Timed in chunks of steps ending in a synchronisation.

``loop / step`` is the loop's efficiency (the target: >= 0.9, an overhead <= 10 %), measured in pairs on one
model and optimiser: an epoch of ``train_one_epoch`` (the loop fit runs: batches gathered, augmented and
normalised on the device, the schedule, the step) then as many steps alone, --pairs times; the median of the
pairs' ratios is reported, so a machine whose load changes hits both sides of each pair alike. Each ``--pointwise``
formulation (``conv``: grouped 1x1 convolutions; ``bmm``: the same layers as batched matmuls) gets its step
alone timed and its operators per step counted (every ATen call of one step, views apart: on a GPU about a
kernel launch each); the loop runs the first. FLOPs per image = 3 x 2 x the whole tree's MACs (backward ~
twice the forward); GPU utilisation is the median of ``nvidia-smi`` samples during the loop's last epoch.

    # the GPU acceptance run's figures (the trainer's CUDA defaults: batch 512, bf16, channels-last)
    python benchmarks/bench_train.py --device cuda --model hne_resnet_small --limit 25600 --pointwise conv,bmm
    # the CPU figure of BENCHMARKS.md
    nice .venv/bin/python benchmarks/bench_train.py --device cpu --model hne_tiny --batch 64 --limit 1024 --threads 1

``--budget-s`` bounds the whole script: what would not fit is reported "not measured", and ``--json`` is
rewritten after every figure, so a run stopped from outside still leaves what it measured.

**Training to a time budget** (``--time-budget-runs T``, a mode of its own): ``fit`` on the bundled digits
(hne_tiny, batch 32, one thread, the process pinned to one core) to a budget of ``T`` seconds, on the real clock,
and a neighbour - one busy loop pinned to the same core - that starts ``--neighbour-at`` seconds into each run
(after the plan is fixed; -1: none). Each neighbour time runs ``--repeats`` pairs of the product (a plan shortened
when the work slows) and the plan fixed once (``_TimeBudget._check`` off: the trainer before 2026-11-29), the
order alternated; reported: the seconds used against the budget, the steps planned and run, the shortenings.

    python benchmarks/bench_train.py --time-budget-runs 40 --neighbour-at 10,25 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# harness first: it puts this checkout on sys.path
from harness import (REPO, ArgumentParser, command_line, count, cpu_name, load_average, positive_float, work_folder,
                     write_json)

# dense bf16 tensor-core peak (TFLOP/s), from the vendors' data sheets; --peak-tflops overrides
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0,
                    "RTX 4090": 165.0, "Orin": 42.5}


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()}, {os.cpu_count()} cores"


class GpuSampler:
    """Samples ``nvidia-smi``'s utilisation.gpu every ``period`` s while it is entered."""

    def __init__(self, index: int, period: float = 0.2) -> None:
        self.index, self.period = index, period
        self.samples: list[tuple[float, float]] = []  # (time, utilisation %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def _loop(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", str(self.index)]
        while not self._stop.wait(self.period):
            try:
                value = float(subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip())
                self.samples.append((time.monotonic(), value))
            except (ValueError, subprocess.SubprocessError, OSError):
                pass

    def __enter__(self) -> "GpuSampler":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def median_since(self, since: float) -> float | None:
        values = [v for t, v in self.samples if t >= since]
        return statistics.median(values) if values else None


DEFAULT_DATA = REPO.parent / "shared" / "data" / "cifar10_train.npz"


def _data(args) -> str:
    if args.data:  # checked when parsed: a file
        return args.data
    import numpy as np  # synthetic CIFAR-shaped data where the real set is absent: throughput only

    path = work_folder(None, "bench_train_") / "synthetic.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, (args.limit, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, args.limit))
    return str(path)


def count_ops(step) -> dict[str, int]:
    """ATen operators one call of ``step()`` runs (all of them, and those that are not views)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"ops": 0, "compute_ops": 0}

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts["ops"] += 1
            counts["compute_ops"] += not getattr(func, "is_view", False)
            return func(*args, **(kwargs or {}))

    with Counter():
        step()
    return counts


class StepAlone:
    """The loop's step (``train_step``) on one device-resident batch, as ``fit`` would build it for ``config``."""

    def __init__(self, config, pointwise: str) -> None:
        import torch

        from hne_edge.models import tree_cost
        from hne_edge.models.layers import set_pointwise
        from hne_edge.train.data import load_data
        from hne_edge.train.device import amp_dtype_for, torch_device
        from hne_edge.train.engine import build_model_for_data, make_optimizer

        self.torch = torch
        self.device = torch_device(config.device)
        bundle = load_data(config.data, seed=config.seed)
        torch.manual_seed(config.seed)
        model = build_model_for_data(config.model, bundle)
        self.macs = tree_cost(model).total_macs  # on the CPU, at the data's image size
        model = set_pointwise(model.to(self.device), pointwise)
        channels_last = config.channels_last and self.device.type == "cuda"
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # as fit sets it
        self.model, self.tree, self.loss = model, model.tree, config.loss
        self.optimizer = make_optimizer(model, config.optim, self.device)
        self.amp = amp_dtype_for(config, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == torch.float16 else None
        self.step_model = torch.compile(model) if config.compile else model
        b, size = config.optim.batch_size, bundle.input_size
        g = torch.Generator().manual_seed(0)
        x = torch.randn(b, bundle.in_chans, size, size, generator=g).to(self.device)
        self.x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        self.y = torch.randint(0, len(bundle.class_names), (b,), generator=g).to(self.device)
        self.batch = b
        self.config, self.bundle, self.loader = config, bundle, None
        model.train()

    def loop_epoch(self, epoch: int) -> float:
        """Images/s of one epoch of the loop fit runs (``train_one_epoch`` over the device-resident loader)."""
        from hne_edge.train.engine import train_one_epoch
        from hne_edge.train.schedule import _Schedule

        torch = self.torch
        if self.loader is None:
            cl = self.config.channels_last and self.device.type == "cuda"
            self.loader = self.bundle.train_loader(self.batch, seed=0, device=self.device if self.device.type == "cuda" else None,
                                                   channels_last=cl)  # fmt: skip
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _Schedule("cosine", 10**6))
        self.loader.set_epoch(epoch)
        stats = train_one_epoch(self.step_model, self.loader, self.optimizer, self.scheduler, tree=self.tree, loss=self.loss,
                                device=self.device, scaler=self.scaler, amp_dtype=self.amp,
                                channels_last=self.config.channels_last and self.device.type == "cuda",
                                after_step=lambda step: False)  # fmt: skip
        return stats["images_per_s"]

    def steps(self, n: int) -> float:
        """Images/s of ``n`` steps alone, ended by a synchronisation."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        self.sync()
        return n * self.batch / (time.perf_counter() - t0)

    def step(self) -> None:
        from hne_edge.train.engine import train_step

        train_step(self.step_model, self.x, self.y, self.optimizer, tree=self.tree, loss=self.loss, scaler=self.scaler,
                   amp_dtype=self.amp)  # fmt: skip

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def time(self, min_s: float, max_steps: int, warmup: int = 3) -> dict:
        """Images/s of chunks of steps (each ended by a synchronisation), after ``warmup`` untimed steps."""
        for _ in range(warmup):
            self.step()
        self.sync()
        chunk, rates, steps, t_all = 1, [], 0, time.perf_counter()
        while steps < max_steps and (time.perf_counter() - t_all < min_s or len(rates) < 3):
            t0 = time.perf_counter()
            for _ in range(chunk):
                self.step()
            self.sync()
            dt = time.perf_counter() - t0
            rates.append(chunk * self.batch / dt)
            steps += chunk
            if dt < 0.2:  # chunks of at least ~0.2 s: the synchronisation is then a small part of each
                chunk *= 2
        return {"images_per_s": statistics.median(rates), "chunks": len(rates), "steps": steps,
                "step_ms": 1e3 * self.batch / statistics.median(rates)}  # fmt: skip


def time_budget_runs(args) -> None:
    """``--time-budget-runs``: see the module docstring."""
    import contextlib

    from hne_edge.train import budget as budget_module
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.engine import fit

    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    budget = args.time_budget_runs
    neighbours = [float(v) for v in args.neighbour_at.split(",") if v.strip()]

    @contextlib.contextmanager
    def plan_fixed_once():
        check = budget_module._TimeBudget._check
        budget_module._TimeBudget._check = lambda self, done_steps: None
        try:
            yield
        finally:
            budget_module._TimeBudget._check = check

    def one(mode: str, at: float, out: Path) -> dict:
        config = TrainConfig.from_preset("digits", {"out": str(out), "quiet": True, "threads": 1, "time_budget": budget,
                                                    "optim": {"epochs": 100_000, "batch_size": 32}})  # fmt: skip
        procs: list = []
        start = lambda: procs.append(subprocess.Popen([sys.executable, "-c", spin]))  # noqa: E731
        timer = threading.Timer(at, start) if at >= 0 else None
        load = load_average()
        with plan_fixed_once() if mode == "fixed once" else contextlib.nullcontext():
            t0 = time.perf_counter()
            if timer:
                timer.start()
            try:
                result = fit(config)
            finally:
                used = time.perf_counter() - t0
                if timer:
                    timer.cancel()
                for proc in procs:
                    proc.kill()
                    proc.wait()
        plan = result.budget
        return {"plan": mode, "neighbour_at_s": at, "budget_s": budget, "used_s": round(used, 2),
                "used_over_budget": round(used / budget, 3), "steps": plan["total_steps"],
                "planned_steps": plan.get("planned_steps", plan["total_steps"]),
                "shortened": plan.get("shortened") or [], "fixed_at_s": plan["fixed_at_s"],
                "last_lr": result.history[-1]["lr"], "load_before": load}

    rows = []
    print("| plan | neighbour from | used s / budget s | used / budget | steps run / planned | shortened | load |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for at in neighbours:
            for r in range(args.repeats):
                modes = ["fixed once", "shortened"] if r % 2 == 0 else ["shortened", "fixed once"]
                for mode in modes:
                    row = one(mode, at, Path(tmp) / f"run-{len(rows)}")
                    rows.append(row)
                    paces = ", ".join(f"{c['pace']:.2f}" for c in row["shortened"])
                    print(f"| {mode} | {f'{at:g} s' if at >= 0 else 'none'} | {row['used_s']:.1f} / {budget:g} | "
                          f"{row['used_over_budget']:.3f} | {row['steps']} / {row['planned_steps']} | "
                          f"{len(row['shortened'])}{f' (pace {paces})' if paces else ''} | "
                          f"{row['load_before'] if row['load_before'] is not None else float('nan'):.1f} |", flush=True)  # fmt: skip
                    if args.json:
                        write_json(args.json, {"command": command_line(), "machine": cpu_name(), "core": core,
                                               "rows": rows})
    for at in neighbours:
        for mode in ("fixed once", "shortened"):
            ratios = [r["used_over_budget"] for r in rows if r["neighbour_at_s"] == at and r["plan"] == mode]
            print(f"neighbour {'from ' + format(at, 'g') + ' s' if at >= 0 else 'none'}, plan {mode}: used / budget "
                  f"median {statistics.median(ratios):.3f} (runs {', '.join(f'{v:.3f}' for v in ratios)})")  # fmt: skip
    print(f"Command: `{command_line()}`")


def main() -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hne_resnet_small")
    p.add_argument("--batch", type=count(), default=None,
                   help="default: the trainer's for the device (512 on CUDA, 128 on a CPU)")
    p.add_argument("--limit", type=count(), default=25600, help="training images per epoch of the loop")
    p.add_argument("--epochs", type=count(), default=2, help="epochs of the loop; the last one is measured")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=count(0), default=0, help="torch CPU threads (0: the trainer's default)")
    p.add_argument("--data", default=None,
                   help=f"an .npz (x, y); '': synthetic CIFAR-shaped data (throughput only). Default: {DEFAULT_DATA} "
                        "where it is, else synthetic data")
    p.add_argument("--no-amp", action="store_true")
    p.add_argument("--amp-dtype", default=None, help="bfloat16 | float16 (default: the trainer's)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the loop and the step alone)")
    p.add_argument("--no-channels-last", action="store_true")
    p.add_argument("--pointwise", default="conv", help="comma list of formulations to time (conv, bmm); the loop runs the first")
    p.add_argument("--step-seconds", type=positive_float, default=2.0,
                   help="the step alone is timed for at least this long")
    p.add_argument("--pairs", type=count(), default=3,
                   help="(loop epoch, as many steps alone) pairs timed for the ratio")
    p.add_argument("--budget-s", type=positive_float, default=None,
                   help="the whole script's time; what would not fit is not measured")
    p.add_argument("--no-loop", action="store_true", help="time only the step alone")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for the utilisation of peak")
    p.add_argument("--out", default=None, help="append the markdown result to this file")
    p.add_argument("--json", default=None, help="write the figures to this JSON file (rewritten after each figure)")
    p.add_argument("--time-budget-runs", type=positive_float, default=None, metavar="SECONDS",
                   help="instead: train the digits preset to this budget beside a neighbour (see --neighbour-at)")
    p.add_argument("--neighbour-at", default="10",
                   help="comma list: seconds into each run a busy loop joins its core (-1: none)")
    p.add_argument("--repeats", type=count(), default=2, help="pairs (fixed once, shortened) per --neighbour-at")
    args = p.parse_args()
    if args.time_budget_runs is not None:
        return time_budget_runs(args)
    if args.data is None:  # not given: the usual set where it is, else synthetic images (a mistyped path is refused)
        args.data = str(DEFAULT_DATA) if DEFAULT_DATA.is_file() else ""
        if not args.data:
            print(f"warning: {DEFAULT_DATA} is absent: synthetic CIFAR-shaped images (throughput only)",
                  file=sys.stderr)  # fmt: skip
    elif args.data and not Path(args.data).is_file():
        p.error(f"--data: received {args.data}, which is not a file; expected an .npz (x, y), or --data '' for "
                "synthetic CIFAR-shaped images")
    started = time.monotonic()
    modes = [m.strip() for m in args.pointwise.split(",") if m.strip()]
    if not modes or set(modes) - {"conv", "bmm"}:
        p.error(f"--pointwise: received {args.pointwise!r}; expected a comma list of conv, bmm")

    import torch

    from hne_edge.train.config import AUTO_BATCH, TrainConfig
    from hne_edge.train.engine import fit

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    batch = args.batch or AUTO_BATCH["cuda" if device.startswith("cuda") else "cpu"]
    if args.limit < batch:  # the loader drops a last partial batch: no batch, no loop to time (was a ZeroDivisionError)
        p.error(f"--limit: received {args.limit}, no full batch of {batch}; expected --limit >= the batch "
                f"(or a smaller --batch)")
    config = {
        "data": {"name": "npz", "data_dir": _data(args), "val_split": 0.0, "limit": args.limit},
        "model": {"name": args.model},
        "loss": {"kind": "hierarchical", "alpha": 0.5, "temperature": 2.0},
        "optim": {"epochs": args.epochs, "batch_size": batch, "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        "seed": 0, "device": device, "threads": args.threads, "quiet": True,
        "amp": not args.no_amp, "channels_last": not args.no_channels_last,
    }
    if args.amp_dtype:
        config["amp_dtype"] = args.amp_dtype
    if args.compile:
        config["compile"] = True
    name = _device_name(device)
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    cuda = device.startswith("cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    elif cuda:
        torch.set_num_threads(min(4, os.cpu_count() or 1))  # what fit does on CUDA
    figures: dict = {
        "model": args.model, "batch": batch, "device": device, "device_name": name, "torch": torch.__version__,
        "compile": args.compile, "amp": cuda and not args.no_amp, "channels_last": cuda and not args.no_channels_last,
        "threads": torch.get_num_threads(), "load_average": load_average(), "peak_tflops": peak,
        "pointwise": modes, "loop": None, "step": {}, "not_measured": [],
    }  # fmt: skip

    def write() -> None:
        if args.json:
            write_json(args.json, figures)

    def left() -> float:
        return float("inf") if args.budget_s is None else args.budget_s - (time.monotonic() - started)

    steppers: dict = {}

    def stepper(mode: str) -> StepAlone:
        if mode not in steppers:
            steppers[mode] = StepAlone(TrainConfig.from_dict({**config, "pointwise": mode}), mode)
            figures["step"].setdefault(mode, {}).update(count_ops(steppers[mode].step))
        return steppers[mode]

    def time_step(mode: str) -> None:
        st = stepper(mode)
        result = st.time(min(args.step_seconds, max(left() / 4, 0.5)), max_steps=10_000)
        figures["step"][mode].update(result, tflops=result["images_per_s"] * 6 * st.macs / 1e12)
        write()

    write()
    time_step(modes[0])
    if not args.no_loop:
        st = stepper(modes[0])  # 1. pairs: an epoch of the loop, then as many steps alone
        pairs = []
        for i in range(args.pairs):
            if i and left() < 3 * (pairs[-1]["loop_s"] + pairs[-1]["step_s"]):
                figures["not_measured"].append(f"pairs {i + 1}-{args.pairs}: the --budget-s {args.budget_s:g} was spent")
                break
            t0 = time.perf_counter()
            loop = st.loop_epoch(i + 1)
            t1 = time.perf_counter()
            alone = st.steps(len(st.loader))
            pairs.append({"loop": loop, "step": alone, "ratio": loop / alone, "loop_s": t1 - t0, "step_s": time.perf_counter() - t1})
            figures["pairs"] = pairs
            figures["loop_vs_step"] = statistics.median(p["ratio"] for p in pairs)
            figures["overhead_pct"] = 100 * (1 - figures["loop_vs_step"])
            write()
    for mode in modes[1:]:  # 2. the other formulations' step alone
        if left() < 5:
            figures["not_measured"].append(f"step alone, pointwise {mode}: the --budget-s {args.budget_s:g} was spent")
            write()
            continue
        time_step(mode)
    if not args.no_loop:  # 3. the trainer itself: fit, its last epoch (the pairs measured its loop already)
        pair_s = figures["pairs"][0]["loop_s"] if figures.get("pairs") else 0.0
        if left() > 3 * args.epochs * pair_s + 10:
            with tempfile.TemporaryDirectory() as tmp, GpuSampler(torch.device(device).index or 0) as sampler:
                loop_config = TrainConfig.from_dict({**config, "out": tmp, **({"pointwise": modes[0]} if modes[0] != "conv" else {})})
                t0 = time.monotonic()
                result = fit(loop_config)
                last = result.history[-1]
                img_s = last["train_images_per_s"]
                util = sampler.median_since(time.monotonic() - last["train_seconds"])
                figures["loop"] = {"pointwise": modes[0], "images_per_s": img_s, "epochs": args.epochs, "images": args.limit,
                                   "wall_s": time.monotonic() - t0, "tflops": img_s * 6 * steppers[modes[0]].macs / 1e12,
                                   "utilisation_pct": util}  # fmt: skip
            write()
        else:
            figures["not_measured"].append(f"the trainer (fit): the --budget-s {args.budget_s:g} was spent")
    step0 = figures["step"][modes[0]]["images_per_s"]
    for mode in modes[1:]:
        if "images_per_s" in figures["step"].get(mode, {}):
            figures[f"{mode}_vs_{modes[0]}"] = figures["step"][mode]["images_per_s"] / step0
    figures["wall_s"] = time.monotonic() - started
    write()

    def pct(tflops: float) -> str:
        return f"{100 * tflops / peak:.2f}% of {peak:.0f}" if peak else "n/a"

    flags = [f for f, on in (("bf16/fp16 autocast", figures["amp"]), ("torch.compile", args.compile),
                             ("channels_last", figures["channels_last"])) if on]  # fmt: skip
    lines = [
        f"### Training throughput, {args.model}, batch {batch}, {device}",
        "",
        f"Device: {name}; torch {torch.__version__}; {', '.join(flags) or 'fp32'}; {figures['threads']} CPU threads; "
        f"load average {load_average() or float('nan'):.1f}. Loop: epoch {args.epochs} of {args.epochs}, {args.limit} images; "
        f"step alone: one device-resident batch, median of timed chunks. Wall {figures['wall_s']:.0f} s in all.",
        "",
        "| what | pointwise | images/s | TFLOP/s | % of peak | ops per step (non-view) | loop / step |",
        "|---|---|---|---|---|---|---|",
    ]
    if figures["loop"]:
        lp = figures["loop"]
        util = f", GPU {lp['utilisation_pct']:.0f}% busy" if lp["utilisation_pct"] is not None else ""
        lines.append(f"| the trainer (fit, epoch {args.epochs}){util} | {lp['pointwise']} | {lp['images_per_s']:,.0f} | "
                     f"{lp['tflops']:.3f} | {pct(lp['tflops'])} | | |")  # fmt: skip
    if figures.get("pairs"):
        ps = figures["pairs"]
        ratios = ", ".join(f"{p['ratio']:.3f}" for p in ps)
        lines.append(f"| the loop (train_one_epoch), {len(ps)} pairs | {modes[0]} | {statistics.median(p['loop'] for p in ps):,.0f} "
                     f"| | | | {figures['loop_vs_step']:.3f} (pairs: {ratios}) |")  # fmt: skip
        lines.append(f"| the step alone, in the pairs | {modes[0]} | {statistics.median(p['step'] for p in ps):,.0f} | | | | |")
    for mode, st in figures["step"].items():
        if "images_per_s" in st:
            lines.append(f"| the step alone | {mode} | {st['images_per_s']:,.0f} | {st['tflops']:.3f} | {pct(st['tflops'])} | "
                         f"{st['ops']} ({st['compute_ops']}) | |")  # fmt: skip
    lines += [""] + [f"Not measured: {n}" for n in figures["not_measured"]]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + f"\nCommand: `{command_line()}`\n\n")


if __name__ == "__main__":
    main()
