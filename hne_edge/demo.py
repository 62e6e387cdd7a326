"""The end-to-end demo: train -> evaluate -> export -> verify -> profile -> anytime under budgets.

Every step calls the same library function a user would (``fit``,
``evaluate_checkpoint``, ``export_onnx``, ``verify_bundle``,
``AnytimeRunner``); the demo only strings them together and prints one
table. Defaults run on scikit-learn's bundled digits (no download) in about
a minute on 2 CPU cores.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .fileio import atomic_write_json

__all__ = ["DemoResult", "run_demo", "budget_sweep", "format_budget_table", "MARKER"]

MARKER = ".hne-edge-demo"  # a folder with this file was written by the demo and may be replaced by it


@dataclass
class DemoResult:
    out_dir: Path
    checkpoint: Path
    bundle: Path
    metrics: dict[str, Any]
    budgets: list[dict[str, Any]]


def budget_sweep(runner, images: np.ndarray, labels: np.ndarray, budgets_ms: list[float | None]) -> list[dict[str, Any]]:
    """Run every image (batch 1) under each budget; summarise leaves, accuracy, latency and misses.

    A miss is a frame whose answer came after its budget (the first leaf is
    always evaluated, so a budget below the first leaf's time is a forced miss).
    """
    rows = []
    for budget in budgets_ms:
        leaves, correct, elapsed, misses, forced = [], 0, [], 0, 0
        for i in range(len(images)):
            r = runner.run(images[i : i + 1], budget_ms=budget)
            leaves.append(r.leaves)
            correct += int(r.predictions[0] == labels[i])
            elapsed.append(r.elapsed_ms)
            misses += int(not r.met_budget)
            forced += int(r.overran_min_leaves)
        rows.append(
            {
                "budget_ms": budget,
                "frames": len(images),
                "mean_leaves": float(np.mean(leaves)),
                "accuracy": correct / len(images),
                "p50_ms": float(np.percentile(elapsed, 50)),
                "p99_ms": float(np.percentile(elapsed, 99)),
                "misses": misses,
                "forced_first_leaf_misses": forced,
            }
        )
    return rows


def format_budget_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'budget':>10} {'leaves':>7} {'accuracy':>9} {'p50 ms':>8} {'p99 ms':>8} {'misses':>9}  {'(forced)':>8}"]
    for r in rows:
        budget = "none" if r["budget_ms"] is None else f"{r['budget_ms']:.3f} ms"
        lines.append(
            f"{budget:>10} {r['mean_leaves']:>7.2f} {r['accuracy']:>9.2%} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
            f"{r['misses']:>4}/{r['frames']:<4}  {r['forced_first_leaf_misses']:>8}"
        )
    lines.append("misses: answers later than the budget; (forced): of those, frames whose budget was shorter "
                 "than the first leaf, which always runs")
    return "\n".join(lines)


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists():
        if not (force or (out / MARKER).exists()):
            raise FileExistsError(
                f"{out} exists and was not written by hne-edge demo; choose another --out or pass --force"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("written by hne-edge demo; the next demo run may replace this folder\n")


def run_demo(
    out_dir: str | Path = "runs/demo",
    *,
    data: str = "digits",
    data_dir: str | None = None,
    model: str | None = None,
    epochs: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    frames: int | None = None,
    force: bool = False,
    quiet: bool = False,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the whole pipeline into ``out_dir`` (see the module docstring)."""
    from .exporters import export_onnx, verify_bundle
    from .models import tree_cost
    from .plots import plot_budget_sweep, plot_tree
    from .runtime import AnytimeRunner
    from .train import TrainConfig, evaluate_checkpoint, fit, model_from_checkpoint
    from .train.data import load_data

    out = Path(out_dir)
    overrides: dict[str, Any] = {"out": str(out / "train"), "seed": seed, "quiet": quiet}
    if data == "digits":
        preset = "digits"
    else:
        preset = "imagenet" if data == "imagefolder" else "cifar"
        overrides["data"] = {"name": data, "data_dir": data_dir}
        overrides["model"] = {"name": model or "hne_tiny", "overrides": {}}
    if model and data == "digits":
        overrides["model"] = {"name": model, "overrides": {"in_chans": 1, "input_size": 8}}
    optim: dict[str, Any] = {}
    if epochs is not None:
        optim["epochs"] = epochs
    elif data != "digits":
        optim["epochs"] = 3  # a CPU-sized taste; the paper trains 200 epochs
    if optim:
        overrides["optim"] = optim
    if limit is not None:
        overrides.setdefault("data", {"name": data, "data_dir": data_dir})["limit"] = limit
    config = TrainConfig.from_preset(preset, overrides)  # validate before touching the disk
    _prepare_out(out, force)
    t_start = time.perf_counter()

    def step(n: int, text: str) -> None:
        echo(f"[{n}/6 {time.perf_counter() - t_start:6.1f}s] {text}")

    step(1, f"training {config.model.name} on {config.data.name} ({config.loss.kind} distillation, "
            f"{config.optim.epochs} epochs)")
    result = fit(config)
    step(2, "evaluating every ensemble size n = 1..N on the validation split")
    metrics = evaluate_checkpoint(result.checkpoint, out / "eval")
    fused, state = model_from_checkpoint(result.checkpoint)
    plot_tree(fused.tree, out / "eval" / "tree.png", {k: v.macs for k, v in tree_cost(fused).nodes.items()})
    step(3, "exporting the ONNX bundle (per-node and per-leaf segment plans, and the export-free first leaf)")
    bundle = export_onnx(
        fused,
        out / "bundle",
        class_names=state["class_names"],
        normalization=state["normalization"],
        plan="both",
        batch=(1, 1, 16),
        verify=False,  # step 4 runs the verification and prints its table
    )
    step(4, "verifying every file against PyTorch (ONNX Runtime CPU)")
    report = verify_bundle(bundle, model=fused)
    report.raise_for_failures()
    worst = max((c.max_abs_diff for c in report.checks), default=0.0)
    echo(f"        {len(report.checks)} checks passed; largest |ONNX - PyTorch| = {worst:.2e}")
    step(5, "profiling each leaf on this CPU (ONNX Runtime, segments plan)")
    data_bundle = load_data(config.data, seed=config.seed)
    val = data_bundle.val
    images = val.images.permute(0, 2, 3, 1).numpy()  # uint8 NHWC, as a camera would give
    labels = val.labels.numpy()
    if frames is not None:
        images, labels = images[:frames], labels[:frames]
    np.savez(out / "frames.npz", x=images, y=labels)  # for the next commands printed at the end
    with AnytimeRunner(bundle) as runner:
        runner.profile(batch_sizes=(1,), warmup=5, repeats=30)
        levels = runner.profile_data.batches[1]["levels"]
        first, full = levels[0]["median_ms"], levels[-1]["median_ms"]
        step(6, f"anytime inference on {len(images)} validation frames under per-frame budgets "
                f"(first leaf {first:.3f} ms, all {runner.num_leaves} leaves {full:.3f} ms)")
        x = runner.preprocess(images)
        budgets: list[float | None] = [first * 0.5] + [first + (full - first) * f for f in (0.0, 0.1, 0.25, 0.5, 1.0)]
        budgets.append(None)
        rows = budget_sweep(runner, x, labels, budgets)
    table = format_budget_table(rows)
    echo("")
    echo(table)
    plot_budget_sweep(rows, out / "eval" / "anytime_budget.png", fused.tree.num_leaves)
    atomic_write_json(out / "demo.json",
                      {"train": config.to_dict(), "budgets": rows, "metrics_file": str(out / "eval" / "metrics.json")},
                      indent=2)
    acc = metrics.get("anytime") or []
    if acc:
        echo("")
        echo("validation accuracy by ensemble size (PyTorch): "
             + ", ".join(f"n={m['n']}: {m['accuracy']:.2%}" for m in acc if m["n"] in (1, 2, 4, 8, 16)))
    echo("")
    echo(f"done in {time.perf_counter() - t_start:.0f}s. Everything is under {out}/:")
    echo(f"  checkpoint  {result.checkpoint}")
    echo(f"  metrics     {out / 'eval' / 'metrics.json'}")
    echo(f"  plots       {out / 'eval'}/*.png (accuracy vs MACs, diversity, per-leaf accuracy, tree, budgets)")
    echo(f"  bundle      {bundle}")
    echo(f"  frames      {out / 'frames.npz'} (the validation images, uint8 NHWC, with labels)")
    echo("next:")
    echo(f"  hne-edge inspect {bundle}")
    echo(f"  hne-edge bench {bundle} --frames {out / 'frames.npz'} --out {out / 'bench'}")
    echo(f"  hne-edge run {bundle} {out / 'frames.npz'} --budget-ms {rows[3]['budget_ms']:.3f}")
    echo(f"  python examples/embedded_app.py {bundle} --frames {out / 'frames.npz'}")
    echo(f"  python examples/autonomous_stack.py {bundle} --frames {out / 'frames.npz'} --out {out / 'stack'}")
    return DemoResult(out, result.checkpoint, bundle, metrics, rows)
