"""``hne-edge profile | bench | run``: thin shells over :mod:`hne_edge.runtime` (no torch needed)."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import click
import numpy as np

from ..bundle import DEFAULT_PLAN, MIXED, PLAN_TABLE, PRECISIONS, RUNNER_PLANS, path_component, profile_filename
from ..fileio import atomic_write_json, check_outputs, json_record, sealed_png, staged_output
from ..limits import MAX_REPLAY_FRAMES, THREADS_PER_CPU, check_replay
from ..plots import can_draw
from ..progress import progress_for
from ..runtime.backends import BACKEND_NAMES
from ..runtime.bench import DURATION_S, MAX_SAMPLES, MIN_SAMPLES
from ..runtime.inputs import as_samples, check_frames, check_labels, frames
from ..runtime.bench import MAX_JITTER_MS
from ..runtime.streams import GUARD_MS, MAX_GUARD_MS
from . import printable
from .options import (BundlePath, FiniteRange, batch_sizes_option, device_option, flag_names, force_option, quiet_option,
                      threads_option, within_batch_range)


class _BackendChoice(click.Choice):
    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.endswith("-cuda") and value[: -len("-cuda")] in self.choices:
            self.fail(f"received {value!r}; expected one of {', '.join(self.choices)} "
                      f"(for the GPU: --backend {value[: -len('-cuda')]} --device cuda)", param, ctx)  # fmt: skip
        return super().convert(value, param, ctx)


def _runner_options(f):
    f = click.option("--cuda-graph", type=click.Choice(["on", "off"]), default=None, is_flag=False, flag_value="on",
                     help="GPU backends: replay a CUDA graph per unit and batch size (default: torch on, others "
                          "off; the CPU runs none: off).")(f)
    f = threads_option("Intra-op")(f)
    f = click.option("--precision", default="fp32", show_default=True, type=click.Choice(PRECISIONS))(f)
    f = click.option("--plan", default=DEFAULT_PLAN, show_default=True, type=click.Choice(RUNNER_PLANS),
                     help="; ".join(f"{p}: {PLAN_TABLE[p].runs}" for p in RUNNER_PLANS) + ".")(f)
    f = device_option(f)
    f = click.option("--backend", default="onnxruntime", show_default=True, type=_BackendChoice(BACKEND_NAMES),
                     help="onnxruntime (CPU or CUDA) | torch (needs torch/model.pt) | tensorrt (engines in the bundle).")(f)
    return f


def _open(bundle, backend, device, plan, precision, threads, cuda_graph=None):
    from ..errors import InputError
    from ..limits import check_threads
    from ..runtime import AnytimeRunner
    from ..runtime.devices import resolve_device

    threads = check_threads(threads or None, "--threads")  # named as typed (the backends' bound says "threads:")

    resolved = resolve_device(backend, device)
    if cuda_graph == "on" and resolved.partition(":")[0] == "cpu":  # off is what the CPU does: create_backend takes it
        chose = " (no GPU here: it chose the CPU)" if device == "auto" else ""
        raise InputError(f"--cuda-graph on: received with --device {device}{chose}; expected a GPU device (--device "
                         "cuda, on a machine with an NVIDIA GPU): on the CPU, leave --cuda-graph off")
    options = {} if cuda_graph is None else {"cuda_graph": cuda_graph == "on"}
    return AnytimeRunner(bundle, backend=backend, device=resolved, plan=plan, precision=precision, threads=threads,
                         **options)  # fmt: skip


@click.command()
@click.argument("bundle", type=BundlePath())
@batch_sizes_option(None, "Batch sizes to profile (default: the bundle's min and opt batch sizes; the cost model "
                         "interpolates between profiled sizes).")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0))
@click.option("--repeats", default=50, show_default=True, type=click.IntRange(min=1))
@force_option("a file of the profile's name (profiles/DEVICE-BACKEND-PLAN-PRECISION.json in BUNDLE, with "
              "-DIGEST before .json for non-default backend options such as --threads)")
@_runner_options
@quiet_option
def profile(bundle, batch_sizes, warmup, repeats, force, backend, device, plan, precision, threads, cuda_graph, quiet):
    """Measure each leaf step and model file; save the cost model next to the bundle."""
    from ..runtime.profile_file import check_profile_target, save_profile

    with contextlib.ExitStack() as stack:
        # the runtime's warnings at load (a file at the profile's name ignored) wait until the command is known to go
        # on (a refusal is one line, nothing before it); then they are said, before it measures, as warnings are
        with warnings.catch_warnings(record=True) as held:
            warnings.simplefilter("always")
            runner = stack.enter_context(_open(bundle, backend, device, plan, precision, threads, cuda_graph))
            lo, opt, _ = runner.input_spec.batch
            within_batch_range(runner.input_spec.batch, batch_sizes or (), "--batch-sizes")
            sizes = batch_sizes or tuple(sorted({lo, opt}))
            name = profile_filename(runner.device, runner.backend.name, plan, precision,
                                    runner.backend.changed_options())
            check_profile_target(bundle, name, force)  # before it measures; checked again when it saves
        for w in held:
            warnings.warn(w.message, stacklevel=1)
        with progress_for(None, "profile", "pass", quiet=quiet) as progress:
            prof = runner.profile(batch_sizes=sizes, warmup=warmup, repeats=repeats, save=False, progress=progress)
            saved, _ = save_profile(prof, bundle, force)  # a user's file that appeared meanwhile stays: the cache gets it
        for b in sizes:
            data = prof.batches[b]
            levels = {level["n"]: level for level in data["levels"]}
            click.echo(f"{runner.manifest.model_name}  {backend}/{runner.device}  plan={plan}  {precision}  batch={b}")
            click.echo(f"{'step':>4}  {'leaves':>7}  {'median ms':>9}  {'p95 ms':>8}  {'n leaves: median ms':>20}  {'p95 ms':>8}")
            for step, info in zip(data["leaves"], runner.steps):
                lo, hi = info["leaves"]
                level = levels.get(hi) if info["kind"] == "leaf" or plan != MIXED else None  # the base walk's levels
                click.echo(
                    f"{step['leaf']:>4}  {f'{lo}-{hi - 1}' if hi - lo > 1 else str(lo):>7}  {step['median_ms']:9.3f}  "
                    f"{step['p95_ms']:8.3f}  " + (f"{level['median_ms']:20.3f}  {level['p95_ms']:8.3f}" if level else "")
                )
        click.echo(f"saved {saved}")


BENCH_FORMAT = "hne-edge-bench"  # bench.json's "format": a file that says it is ours to replace (fileio)
_BENCH_FILES = {"bench.json": json_record(BENCH_FORMAT), "bench.png": sealed_png}  # what bench writes, and whose it is


@click.command()
@click.argument("bundle", type=BundlePath())
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0))
@click.option("--duration", type=FiniteRange(min=0, max=86_400), default=DURATION_S, show_default=True,
              help="Measure for at least this many seconds of timed runs (as trtexec's --duration) ...")
@click.option("--min-samples", type=click.IntRange(min=1, max=MAX_SAMPLES), default=MIN_SAMPLES, show_default=True,
              help="... and at least this many runs of every level (their p99 is the 99th percentile of these).")
@click.option("--repeats", default=None, type=click.IntRange(min=1, max=MAX_SAMPLES),
              help="Exactly this many runs of every level instead of --duration and --min-samples.")
@click.option("--frames", "frames", type=click.Path(exists=True, dir_okay=False), metavar="PATH.npz",
              help="Frames with labels (x: N,H,W,C uint8 or N,C,H,W float; y: N) for accuracy per level.")
@click.option("--data", "frames_alias", type=click.Path(exists=True, dir_okay=False), hidden=True)  # old --frames
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use at most this many of --frames.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: bench-<model>); a bench.json or bench.png there is replaced only if "
                   "hne-edge wrote it.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the table.")
@force_option("bench.json and bench.png in --out")
@_runner_options
@quiet_option
def bench(bundle, batch_size, warmup, duration, min_samples, repeats, frames, frames_alias, limit, out, as_json, force,
          backend, device, plan, precision, threads, cuda_graph, quiet):  # fmt: skip
    """Latency of every anytime level n = 1..N (mean, median, p90, p95, p99) and its throughput; JSON + PNG curve."""
    from ..runtime.bench import level_accuracy, level_latencies, load_arrays

    data = frames or frames_alias

    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner, \
            progress_for(None, "bench", "repetition", quiet=quiet) as progress:
        within_batch_range(runner.input_spec.batch, [batch_size], "--batch-size")
        out_dir = Path(out or f"bench-{path_component(runner.manifest.model_name)}")  # the name comes from a file
        plots = can_draw()  # no figure without matplotlib (the runtime install's)
        check_outputs(out_dir, {n: j for n, j in _BENCH_FILES.items() if plots or n != "bench.png"}, force=force)
        if data:  # checked before anything is measured, every frame as the runner will; normalised as they run
            x, y = load_arrays(data)
            if y is None:
                raise click.BadParameter(f"{data}: received no 'y'; expected labels for accuracy", param_hint="--frames")
            x, y = as_samples(x, runner.input_spec), np.atleast_1d(y)
            if limit:
                x, y = x[:limit], y[:limit]
            y = check_labels(y, len(x), runner.num_classes, str(data))
            check_frames(x, runner.input_spec, runner.input_spec.batch[2], str(data), pad=True)  # level_accuracy's
        levels = level_latencies(runner, batch=batch_size, warmup=warmup, repeats=repeats, progress=progress,
                                 min_samples=min_samples, duration_s=duration)  # fmt: skip
        accuracy = None
        if data:
            accuracy = level_accuracy(runner, x, y, progress=progress)  # one per leaf count 1..N
            for level in levels:  # the plan's stops: 1..N, or 1, 2, 4, ..., N (subtrees), or N (fused)
                level["accuracy"] = accuracy[level["n"] - 1]
        result = {
            "format": BENCH_FORMAT,
            "model": runner.manifest.model_name,
            "bundle": str(Path(bundle).resolve()),
            "backend": backend,
            "device": runner.device,
            "plan": plan,
            "precision": precision,
            "threads": threads,
            "batch_size": batch_size,
            "repeats": levels[0]["samples"],  # runs of every level, each level's statistics are of
            "min_samples": repeats or min_samples,
            "duration_s": 0.0 if repeats else duration,
            "measured_s": sum(level["mean_ms"] * level["samples"] for level in levels) / 1e3,  # of timed runs
            "samples": None if accuracy is None else int(len(y)),
            "levels": levels,
        }
    # a failure (a full disk) leaves nothing, not even a new empty folder; a user's file that appeared meanwhile stays
    with staged_output(out_dir, "--out", ours=_BENCH_FILES, force=force) as stage:
        atomic_write_json(stage / "bench.json", result)
        try:
            from ..plots import plot_bench

            png = out_dir / plot_bench(result, stage / "bench.png").relative_to(stage)
        except ImportError:  # matplotlib is not part of the runtime's dependencies
            png = None
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(f"{result['model']}  {backend}/{result['device']}  plan={plan}  {precision}  batch={batch_size}  "
               f"({result['repeats']} samples per level in {result['measured_s']:.1f} s)")
    head = (f"{'n':>3}  {'MMACs':>8}  {'mean ms':>8}  {'median ms':>9}  {'p90 ms':>8}  {'p95 ms':>8}  {'p99 ms':>8}  "
            f"{'samples/s':>9}" + ("  accuracy" if accuracy else ""))  # fmt: skip
    click.echo(head)
    for level in levels:
        line = (f"{level['n']:>3}  {level['macs'] / 1e6:8.2f}  {level['mean_ms']:8.3f}  {level['median_ms']:9.3f}  "
                f"{level['p90_ms']:8.3f}  {level['p95_ms']:8.3f}  {level['p99_ms']:8.3f}  {level['samples_per_s']:9.1f}")
        if accuracy:
            line += f"  {level['accuracy']:8.2%}"
        click.echo(line)
    click.echo(f"wrote {out_dir / 'bench.json'}" + (f" and {png}" if png else " (matplotlib not installed: no PNG)"))


def _load_inputs(paths, runner):
    """[(name, x, y or None)]: the samples of each .npy/.npz, and of images given in a row (batched together, as
    --batch-size says; name: one per image), batch first and not yet normalised (:func:`~..runtime.inputs.frames`
    normalises a frame at a time)."""
    from ..errors import InputError
    from ..runtime.bench import load_arrays
    from ..runtime.images import is_image_path, read_image

    spec, items, images = runner.input_spec, [], []

    def samples(x, where):
        try:
            return as_samples(x, spec)
        except InputError as exc:
            raise InputError(f"{where}: {exc.args[0]}", hint=exc.hint, cli_hint=exc.cli_hint) from None

    def batch_images():
        if images:
            items.append(([name for name, _ in images], np.concatenate([x for _, x in images]), None))
            images.clear()

    for p in paths:
        path = Path(p)
        if path.suffix.lower() in (".npy", ".npz"):
            batch_images()
            x, y = load_arrays(str(path))
            x = samples(x, str(path))
            if y is not None:
                y = check_labels(np.atleast_1d(y), len(x), runner.num_classes, str(path))
            items.append((path.name, x, y))
        elif is_image_path(path):
            images.append((path.name, samples(read_image(path, spec.channels), str(path))))
        else:
            raise click.BadParameter(f"{path}: received suffix {path.suffix!r}; expected an image or .npy/.npz")
    batch_images()
    return items


RUN_FLAGS = {"budget_ms": "--budget-ms", "max_leaves": "--max-leaves", "min_leaves": "--min-leaves"}  # run()'s names


@click.command()
@click.argument("bundle", type=BundlePath())
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--budget-ms", type=float, default=None, help="Per-frame time budget in milliseconds.")
@click.option("--max-leaves", type=int, default=None)
@click.option("--min-leaves", type=int, default=1, show_default=True)
@click.option("--agreement", type=FiniteRange(0, 1, min_open=True), default=None,
              help="Stop early when this fraction of >= 2 leaves agree.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Samples per frame, from each .npy/.npz and from images given in a row; a last frame holds what "
                   "is left.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: {summary, records} (accuracy as a fraction, as in every JSON file).")
@_runner_options
def run(bundle, inputs, budget_ms, max_leaves, min_leaves, agreement, batch_size, as_json, backend, device, plan, precision, threads, cuda_graph):
    """Anytime inference on images or .npy/.npz (x, optional y), one frame per --batch-size samples.

    Every frame is checked before the first runs."""
    from ..runtime import Agreement, summarize_frames

    stop = Agreement(min_leaves=2, vote=agreement) if agreement is not None else None
    records, results = [], []
    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner:
        # the size the user typed, not the size of the frame made of their samples
        within_batch_range(runner.input_spec.batch, [batch_size], "--batch-size")
        sources = _load_inputs(inputs, runner)
        for name, x, _ in sources:  # every frame, before the first runs
            where = name if isinstance(name, str) else name[0] if len(name) == 1 else f"images {name[0]}..{name[-1]}"
            check_frames(x, runner.input_spec, batch_size, where)
        for name, x, y in sources:
            for start, xb, _ in frames(x, runner.input_spec, batch_size):
                with flag_names(RUN_FLAGS):
                    r = runner.run(xb, budget_ms=budget_ms, max_leaves=max_leaves, min_leaves=min_leaves, stop_when=stop)
                results.append(r)
                d = r.to_dict()
                for k, s in enumerate(d.pop("samples")):
                    idx = start + k  # an image is its own input, sample 0
                    source, index = (name, idx) if isinstance(name, str) else (name[idx], 0)
                    rec = {"input": source, "index": index, **s, **d, "total_leaves": runner.num_leaves}
                    if y is not None:  # "class" is an index and "label" its name, for the truth as for the answer
                        rec["class_true"] = int(y[idx])
                        names = runner.class_names
                        rec["label_true"] = names[int(y[idx])]  # in range: check_labels
                        rec["correct"] = int(y[idx]) == s["class"]
                    records.append(rec)
    scored = [r["correct"] for r in records if "correct" in r]
    summary = {"bundle": str(Path(bundle).resolve()), "backend": backend, "device": runner.device, "plan": plan,
               "precision": precision, "budget_ms": budget_ms, "total_leaves": runner.num_leaves,
               **summarize_frames(results, scored or None)}  # fmt: skip
    if as_json:
        click.echo(json.dumps({"summary": summary, "records": records}, indent=1))
        return
    for rec in records:
        line = (
            f"{printable(rec['input'])}[{rec['index']}]  {printable(rec['label'])}  p={rec['prob']:.3f}  leaves={rec['leaves']}/{rec['total_leaves']}"
            f"  std={rec['logit_std']:.3f}  vote_H={rec['vote_entropy']:.3f}  {rec['elapsed_ms']:.2f} ms"
        )
        if budget_ms is not None and not rec["met_budget"]:
            line += "  (over budget" + (", forced leaves" if rec["overran_min_leaves"] else "") + ")"
        if "correct" in rec:
            line += "  correct" if rec["correct"] else f"  WRONG (true {printable(rec['label_true'])})"
        click.echo(line)
    if scored:
        click.echo(f"accuracy {summary['accuracy']:.2%} over {summary['scored']} samples")
    if len(results) > 1:
        lat = summary["latency_ms"]
        click.echo(f"mean leaves {summary['mean_leaves']:.2f} of {runner.num_leaves}; latency per frame p50 "
                   f"{lat['p50']:.3f} ms, p90 {lat['p90']:.3f} ms, p99 {lat['p99']:.3f} ms, max {lat['max']:.3f} ms")
    if budget_ms is not None and results:
        click.echo(f"budget misses {summary['misses']}/{summary['frames']} frames ({summary['forced_misses']} forced: "
                   "the budget was shorter than the minimum leaves take 9 times in 10)")


STREAM_FLAGS = {"streams": "--streams", "fps": "--fps", "seconds": "--seconds"}  # check_replay's names


def _streams(value: str) -> tuple[int, ...]:
    from .options import parse_sizes

    return parse_sizes(value, "--streams")


@click.command("bench-streams")
@click.argument("bundle", type=BundlePath())
@click.option("--streams", "streams", default="1,2,4", show_default=True, metavar="K[,K...]",
              help=f"Numbers of cameras to replay, one configuration each: at most {MAX_REPLAY_FRAMES:,} frames each "
                   f"(K x --fps x --seconds); with --methods runners (a thread per camera) at most {THREADS_PER_CPU} "
                   "cameras per CPU.")
@click.option("--fps", type=FiniteRange(min=0, min_open=True), default=30.0, show_default=True, help="Frames per second per camera.")
@click.option("--seconds", type=FiniteRange(min=0, min_open=True), default=5.0, show_default=True, help="Replayed per configuration and method.")
@click.option("--deadline-ms", type=FiniteRange(min=0, min_open=True), default=None,
              help="A frame's deadline after its arrival (default: one frame period).")
@click.option("--jitter-ms", type=FiniteRange(min=0, max=MAX_JITTER_MS), default=2.0, show_default=True, help="Arrival jitter, uniform +-.")
@click.option("--methods", default="scheduler,runners,fifo", show_default=True,
              help="scheduler: one StreamScheduler; runners: one runner per camera in its own thread, budget the time "
                   "to the deadline; fifo: one runner, frames first in first out, budget the time left.")
@click.option("--accuracy", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Accuracy per number of leaves (an `hne-edge eval` metrics.json or a checkpoint record): the "
                   "scheduler's value of a leaf, and the expected accuracy column.")
@click.option("--guard-ms", type=FiniteRange(min=0, max=MAX_GUARD_MS), default=GUARD_MS, show_default=True,
              help="The scheduler plans every answer this much before its deadline, beyond the hand-out lags it "
                   "measures (a thread woken late, the interpreter's lock).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: a row per configuration and method.")
@_runner_options
@quiet_option
def bench_streams(bundle, streams, fps, seconds, deadline_ms, jitter_ms, methods, accuracy, guard_ms, as_json, backend,
                  device, plan, precision, threads, cuda_graph, quiet):  # fmt: skip
    """Several cameras, one device: replay K cameras in real time through the stream scheduler and its baselines."""
    from ..runtime.bench import STREAM_METHODS, camera_arrivals, replay_streams, stream_profile_sizes, summarize_streams
    from ..runtime.cost_model import profile_measures
    from ..runtime.streams import accuracy_by_n, gain_curve, read_accuracy

    counts = _streams(streams)
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    if not chosen or any(m not in STREAM_METHODS for m in chosen):
        raise click.BadParameter(f"received {methods!r}; expected some of {','.join(STREAM_METHODS)}", param_hint="--methods")
    with flag_names(STREAM_FLAGS):  # before any runner opens: every replay's frames and threads are bounded
        for k in counts:
            check_replay(k, fps, seconds, runners="runners" in chosen)
    record = read_accuracy(accuracy) if accuracy else None
    rows = []
    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner:  # measures once for every runner
        sizes = stream_profile_sizes(runner.input_spec.batch)
        if any(not profile_measures(runner.profile_data, b) for b in sizes):
            with progress_for(None, "profile", "pass", quiet=quiet) as progress:
                runner.profile(batch_sizes=sizes, warmup=3, repeats=20, save=False, progress=progress)
        profile, spec, num_leaves = runner.profile_data, runner.input_spec, runner.num_leaves
    curve = accuracy_by_n(record, num_leaves) if record else gain_curve(None, num_leaves)
    frames = np.random.default_rng(0).standard_normal((64, spec.channels, *spec.spatial)).astype(spec.dtype)

    def open_runner():
        r = _open(bundle, backend, device, plan, precision, threads, cuda_graph)
        r.use_profile(profile)
        return r

    for k in counts:
        arrivals = camera_arrivals(k, fps, seconds, deadline_ms, jitter_ms, seed=k)
        for method in chosen:
            options = {"accuracy": record, "guard_ms": guard_ms} if method == "scheduler" else {}
            run = replay_streams(method, open_runner, frames, arrivals, **options)
            summary = summarize_streams(run, curve)
            rows.append({"streams": k, "fps": fps, "method": method, **summary,
                         **{key: run[key] for key in ("calls", "stacked_calls") if key in run}})  # fmt: skip
            if not quiet and not as_json:
                click.echo(f"K={k} {method}: done", err=True)
    if as_json:
        click.echo(json.dumps({"bundle": str(Path(bundle).resolve()), "backend": backend, "plan": plan, "guard_ms": guard_ms,
                               "rows": rows}, indent=1))
        return
    value, shown = ("exp. acc", ">19.2%") if record else ("mean leaves in time", ">19.2f")  # accuracy: a percentage
    click.echo(f"{'K':>3} {'method':<9} {'frames':>6} {'rejected':>8} {'misses':>12} {'leaves':>6} {value:>19} "
               f"{'p50 ms':>8} {'p99 ms':>8} {'busy':>5}")  # fmt: skip
    for r in rows:
        click.echo(f"{r['streams']:>3} {r['method']:<9} {r['frames']:>6} {r['rejected']:>8} "
                   f"{r['misses']:>5} ({r['miss_rate']:>5.1%}) {r['mean_leaves']:>6.2f} {r['expected_accuracy']:{shown}} "
                   f"{r['latency_ms']['p50']:>8.2f} {r['latency_ms']['p99']:>8.2f} {r['busy']:>5.0%}")  # fmt: skip
