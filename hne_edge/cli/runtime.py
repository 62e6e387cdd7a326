"""``hne-edge profile | bench | run``: thin shells over :mod:`hne_edge.runtime` (no torch needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from ..bundle import ANYTIME_PLANS, path_component
from ..errors import InputError
from . import printable

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def _runner_options(f):
    f = click.option("--cuda-graph", type=click.Choice(["on", "off"]), default=None, is_flag=False, flag_value="on",
                     help="GPU backends: replay a CUDA graph per unit and batch size (default: torch on, others off).")(f)
    f = click.option("--threads", type=int, default=None, help="Intra-op threads (default: the backend's).")(f)
    f = click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "fp16"]))(f)
    f = click.option("--plan", default="segments", show_default=True, type=click.Choice(ANYTIME_PLANS))(f)
    f = click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N")(f)
    f = click.option("--backend", default="onnxruntime", show_default=True, help="onnxruntime | torch | tensorrt")(f)
    return f


def _open(bundle, backend, device, plan, precision, threads, cuda_graph=None):
    from ..runtime import AnytimeRunner

    options = {} if cuda_graph is None else {"cuda_graph": cuda_graph == "on"}  # CPU backends refuse it with a clear error
    return AnytimeRunner(bundle, backend=backend, device=device, plan=plan, precision=precision, threads=threads, **options)


def _check_labels(source, x: np.ndarray, y: np.ndarray) -> None:
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise InputError(
            f"{source}: received y of shape {tuple(y.shape)} and dtype {y.dtype} for {len(x)} samples of x; "
            f"expected {len(x)} integer labels"
        )


def _parse_sizes(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"received {value!r}; expected comma-separated ints like 1,8") from None
    if not sizes:
        raise click.BadParameter(f"received {value!r}; expected at least one batch size")
    return sizes


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--batch-sizes", default="1", show_default=True, help="Comma-separated batch sizes to profile.")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0))
@click.option("--repeats", default=50, show_default=True, type=click.IntRange(min=1))
@_runner_options
def profile(bundle, batch_sizes, warmup, repeats, backend, device, plan, precision, threads, cuda_graph):
    """Measure each leaf step and model file; save the cost model next to the bundle."""
    import warnings

    sizes = _parse_sizes(batch_sizes)
    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prof = runner.profile(batch_sizes=sizes, warmup=warmup, repeats=repeats)
        for w in caught:
            click.echo(f"note: {w.message}")
        for b in sizes:
            data = prof.batches[b]
            click.echo(f"{runner.manifest.model_name}  {backend}/{device}  plan={plan}  {precision}  batch={b}")
            click.echo(f"{'leaf':>4}  {'median ms':>9}  {'p95 ms':>8}  {'n leaves: median ms':>20}  {'p95 ms':>8}")
            for leaf, level in zip(data["leaves"], data["levels"]):
                click.echo(
                    f"{leaf['leaf']:>4}  {leaf['median_ms']:9.3f}  {leaf['p95_ms']:8.3f}  "
                    f"{level['median_ms']:20.3f}  {level['p95_ms']:8.3f}"
                )
        click.echo(f"saved {runner.profile_path}")


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0))
@click.option("--repeats", default=30, show_default=True, type=click.IntRange(min=1))
@click.option("--data", type=click.Path(exists=True, dir_okay=False), help=".npz with x (and y) for accuracy-vs-latency.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use at most this many samples of --data.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Output folder (default: bench-<model>).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the table.")
@_runner_options
def bench(bundle, batch_size, warmup, repeats, data, limit, out, as_json, backend, device, plan, precision, threads, cuda_graph):
    """Latency of every anytime level n = 1..N (median / p95); JSON + PNG curve."""
    from ..runtime.bench import level_accuracy, level_latencies, load_arrays

    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner:
        levels = level_latencies(runner, batch=batch_size, warmup=warmup, repeats=repeats)
        accuracy = None
        if data:
            x, y = load_arrays(data)
            if y is None:
                raise click.BadParameter(f"{data}: received no 'y'; expected labels for accuracy", param_hint="--data")
            _check_labels(data, x, y)
            if limit:
                x, y = x[:limit], y[:limit]
            if x.dtype == np.uint8:
                x = runner.preprocess(x)
            accuracy = level_accuracy(runner, x, y)
            for level, acc in zip(levels, accuracy):
                level["accuracy"] = acc
        result = {
            "model": runner.manifest.model_name,
            "bundle": str(Path(bundle).resolve()),
            "backend": backend,
            "device": device,
            "plan": plan,
            "precision": precision,
            "threads": threads,
            "batch_size": batch_size,
            "repeats": repeats,
            "samples": None if accuracy is None else int(len(y)),
            "levels": levels,
        }
        out_dir = Path(out or f"bench-{path_component(runner.manifest.model_name)}")  # the name comes from a file
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=1) + "\n")
    png = _plot(levels, accuracy is not None, out_dir / "bench.png", result)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(f"{result['model']}  {backend}/{device}  plan={plan}  {precision}  batch={batch_size}  ({repeats} repeats)")
    head = f"{'n':>3}  {'MMACs':>8}  {'median ms':>9}  {'p95 ms':>8}" + ("  accuracy" if accuracy else "")
    click.echo(head)
    for level in levels:
        line = f"{level['n']:>3}  {level['macs'] / 1e6:8.2f}  {level['median_ms']:9.3f}  {level['p95_ms']:8.3f}"
        if accuracy:
            line += f"  {level['accuracy']:8.4f}"
        click.echo(line)
    click.echo(f"wrote {out_dir / 'bench.json'}" + (f" and {png}" if png else " (matplotlib not installed: no PNG)"))


def _plot(levels, with_accuracy, path, meta):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    lat = [lv["median_ms"] for lv in levels]
    if with_accuracy:
        ax.plot(lat, [lv["accuracy"] for lv in levels], "o-")
        ax.set_xlabel("median latency (ms)")
        ax.set_ylabel("top-1 accuracy")
    else:
        ns = [lv["n"] for lv in levels]
        ax.plot(ns, lat, "o-", label="median")
        ax.plot(ns, [lv["p95_ms"] for lv in levels], "--", label="p95")
        ax.set_xlabel("leaves evaluated (n)")
        ax.set_ylabel("latency (ms)")
        ax.legend()
    ax.set_title(f"{meta['model']} {meta['backend']}/{meta['device']} batch {meta['batch_size']}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _load_inputs(paths, runner):
    """[(source name, x float NCHW, y or None)] from image files and .npy/.npz files."""
    items = []
    for p in paths:
        path = Path(p)
        if path.suffix.lower() in (".npy", ".npz"):
            from ..runtime.bench import load_arrays

            x, y = load_arrays(str(path))
            if y is not None:
                y = np.atleast_1d(y)
                _check_labels(path, x if x.ndim == 4 else x[None], y)
            if x.dtype == np.uint8:
                x = runner.preprocess(x)
            elif x.ndim == 3:
                x = x[None]
            items.append((path.name, x, y))
        elif path.suffix.lower() in _IMAGE_SUFFIXES:
            try:
                from PIL import Image
            except ImportError:
                raise click.UsageError(f"{path}: reading images needs Pillow (pip install pillow); or pass .npy/.npz") from None
            mode = "L" if runner.input_spec.channels == 1 else "RGB"
            try:
                with Image.open(path) as im:
                    arr = np.asarray(im.convert(mode))
            except (OSError, ValueError, Image.DecompressionBombError) as exc:  # UnidentifiedImageError is an OSError
                raise InputError(f"{path}: cannot decode the image ({type(exc).__name__}); expected a readable image file") from None
            items.append((path.name, runner.preprocess(arr), None))
        else:
            raise click.BadParameter(f"{path}: received suffix {path.suffix!r}; expected an image or .npy/.npz")
    return items


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--budget-ms", type=float, default=None, help="Per-frame time budget in milliseconds.")
@click.option("--max-leaves", type=int, default=None)
@click.option("--min-leaves", type=int, default=1, show_default=True)
@click.option("--agreement", type=float, default=None, help="Stop early when this fraction of >= 2 leaves agree.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1), help="Samples per frame.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines.")
@_runner_options
def run(bundle, inputs, budget_ms, max_leaves, min_leaves, agreement, batch_size, as_json, backend, device, plan, precision, threads, cuda_graph):
    """Anytime inference on images or .npy/.npz (x, optional y), one frame per --batch-size samples."""
    from ..runtime import Agreement

    stop = Agreement(min_leaves=2, vote=agreement) if agreement is not None else None
    records = []
    with _open(bundle, backend, device, plan, precision, threads, cuda_graph) as runner:
        for source, x, y in _load_inputs(inputs, runner):
            for start in range(0, len(x), batch_size):
                xb = x[start : start + batch_size]
                r = runner.run(xb, budget_ms=budget_ms, max_leaves=max_leaves, min_leaves=min_leaves, stop_when=stop)
                d = r.to_dict()
                for k, s in enumerate(d.pop("samples")):
                    idx = start + k
                    rec = {"input": source, "index": idx, **s, **d, "total_leaves": runner.num_leaves}
                    if y is not None:  # "class" is an index and "label" its name, for the truth as for the answer
                        rec["class_true"] = int(y[idx])
                        names = runner.class_names
                        rec["label_true"] = names[int(y[idx])] if int(y[idx]) < len(names) else str(int(y[idx]))
                        rec["correct"] = int(y[idx]) == s["class"]
                    records.append(rec)
    if as_json:
        click.echo(json.dumps(records, indent=1))
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
    if any("correct" in r for r in records):
        scored = [r for r in records if "correct" in r]
        click.echo(f"accuracy {sum(r['correct'] for r in scored) / len(scored):.4f} over {len(scored)} samples", err=False)
    if len(records) > 1:
        click.echo(f"mean leaves {np.mean([r['leaves'] for r in records]):.2f}", file=sys.stdout)
    if budget_ms is not None and records:
        late = [r for r in records if not r["met_budget"]]
        forced = sum(r["overran_min_leaves"] for r in late)
        click.echo(f"budget misses {len(late)}/{len(records)} samples ({forced} forced: the minimum leaves did not fit)")
