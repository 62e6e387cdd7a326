"""The end-to-end demo: train -> export -> verify -> evaluate -> profile -> anytime under budgets.

Every step calls the same library function a user would (``fit``,
``export_onnx``, ``verify_bundle``, ``AnytimeRunner``, ``write_metrics``);
the demo only strings them together and prints one table. It evaluates
through the verified bundle on ONNX Runtime (:func:`bundle_logits`), not in
PyTorch as ``hne-edge eval`` does: a tenth of the CPU time on the reference
model, and the figures it prints are of what a device runs.

Data (``--data auto``, the default): CIFAR-10 at the project's data
convention path ``../shared/data/cifar10_train.npz`` when that file exists,
else scikit-learn's bundled digits (no download), with a line saying which
and why. Digits is easy (one leaf already scores ~98%), so it shows only
the latency side of anytime inference. On CIFAR-10 the demo starts from a
checkpoint shipped in the repository (``hne_edge/assets/``, trained by this
project; how is recorded next to it; the wheel leaves the weights out), because the accuracy rise with the
number of leaves needs more training than a few minutes of CPU allow:
``--pretrained auto`` (the default) takes the reference HNE_small trained on a
GPU (:data:`REFERENCE`, ``benchmarks/ship_reference.py`` puts it there) when
the package ships one, else the small CPU-trained hne_tiny (:data:`PRETRAINED`,
also ``--pretrained tiny``); ``--pretrained PATH`` takes another such
checkpoint with its ``.json`` record beside it. Any training option
(``--epochs``, ``--limit``, ``--model``, a ``--seed`` other than 0) or an
explicit ``--data`` trains here instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .errors import InputError
from .fileio import (absolute_folder, atomic_file, atomic_write_json, check_output_dir, foreign_entry, new_folders,
                     remove_new_folders, remove_stale, scratch_path)

__all__ = ["DemoResult", "run_demo", "choose_data", "bundle_logits", "budget_sweep", "format_budget_table", "ensemble_rows",
           "format_ensemble_line", "how_to_run_hne_edge", "examples_folder", "pretrained_checkpoint", "pretrained_record", "MARKER", "DEMO_LAYOUT",
           "CIFAR10_NPZ", "PRETRAINED", "REFERENCE"]

MARKER = ".hne-edge-demo"  # a folder with this file (and nothing a demo does not write) was written by the demo


def _bundle_folder(path: Path) -> str | None:
    """Why ``path`` is not a bundle the demo may replace (the export's own rule), or None."""
    from .bundle import why_not_replaceable

    return why_not_replaceable(path)


# what a demo writes into --out, at every depth, and the folders its printed next steps write there: the next
# demo run replaces a folder holding these and nothing else. train/: a run's files (train/engine.py RUN_LAYOUT);
# eval/: write_metrics' metrics.json and plot_metrics' figures, and the demo's two; bundle/: a bundle;
# bench/: `hne-edge bench`'s; stack/: examples/autonomous_stack.py's
DEMO_LAYOUT = {
    MARKER: "file",
    "train": {"checkpoint.pt": "file", "train_log.json": "file", "config.yaml": "file"},
    "eval": dict.fromkeys(("metrics.json", "accuracy_vs_macs.png", "diversity_vs_macs.png", "leaf_accuracy.png",
                           "tree.png", "anytime_budget.png"), "file"),  # fmt: skip
    "bundle": _bundle_folder,
    "frames.npz": "file",
    "demo.json": "file",
    "bench": {"bench.json": "file", "bench.png": "file"},
    "stack": {"timeline.csv": "file", "timeline.png": "file"},
}
CIFAR10_NPZ = "../shared/data/cifar10_train.npz"  # the data convention: ../shared beside the project root
ASSETS = Path(__file__).parent / "assets"
PRETRAINED = ASSETS / "cifar10_demo.pt"  # the CPU-trained hne_tiny; its record: cifar10_demo.json; config: .yaml
REFERENCE = ASSETS / "cifar10_reference.pt"  # the GPU-trained HNE_small, when shipped (benchmarks/ship_reference.py)
PRETRAINED_CHOICES = ("auto", "reference", "tiny")  # or the path of a checkpoint with its .json record beside it
SWEEP_FRAMES = 1000  # default frames of the CIFAR budget sweep (batch-1 runs under 7 budgets stay ~1 minute)
EVAL_BATCH = 16  # the bundle's largest batch, which the demo's evaluation runs
EVALUATED_WITH = "ONNX Runtime on the CPU, fp32, segments plan"  # what the demo's accuracy was measured with


@dataclass
class DemoResult:
    out_dir: Path
    checkpoint: Path
    bundle: Path
    metrics: dict[str, Any]
    budgets: list[dict[str, Any]]


def how_to_run_hne_edge(cwd: str | Path = ".") -> str | None:
    """The line telling a shell user how to reach ``hne-edge``, or None when it is on their PATH already.

    ``make demo`` runs ``.venv/bin/hne-edge``, which is not on the PATH until the virtualenv is activated,
    so the next commands the demo prints would end in "command not found" without this line (issue 20).
    """
    scripts = Path(sysconfig.get_path("scripts"))  # where this interpreter's console scripts live
    script = scripts / "hne-edge"
    found = shutil.which("hne-edge")
    if found is not None and script.exists() and Path(found).resolve() == script.resolve():
        return None
    try:
        shown = os.path.relpath(scripts, cwd) if scripts.is_relative_to(Path(cwd).absolute()) else str(scripts)
    except ValueError:  # another drive (Windows)
        shown = str(scripts)
    if not script.exists():
        return "hne-edge is not installed here: run these as `python -m hne_edge ...` from the repository root"
    if (scripts / "activate").is_file():
        return (f"hne-edge is in {shown}/, not on your PATH: run `source {shown}/activate` first, "
                f"or write {shown}/hne-edge and {shown}/python in their place")
    return f"hne-edge is in {shown}/, not on your PATH: write {shown}/hne-edge and {shown}/python in their place"


def choose_data(data: str, data_dir: str | None, cwd: str | Path = ".") -> tuple[str, str | None, str | None]:
    """Resolve ``--data auto``: ``(data, data_dir, note)``; ``note`` says what was chosen and why (None if not auto)."""
    if data != "auto":
        return data, data_dir, None
    if data_dir is not None:
        raise InputError(f"--data-dir {data_dir} needs --data npz/cifar10/cifar100/imagefolder; received --data auto")
    if (Path(cwd) / CIFAR10_NPZ).is_file():
        return "npz", CIFAR10_NPZ, f"data: CIFAR-10 from {CIFAR10_NPZ} (found; --data digits runs the smaller digits demo)"
    return "digits", None, (f"data: scikit-learn digits, because {CIFAR10_NPZ} is not here (digits is easy: expect "
                            "a flat accuracy by ensemble size; --data npz --data-dir PATH.npz to use your CIFAR-10 copy)")


def pretrained_checkpoint(choice: str = "auto") -> Path:
    """The checkpoint ``--pretrained choice`` names: ``auto`` (:data:`REFERENCE` when shipped, else
    :data:`PRETRAINED`), ``reference``, ``tiny`` or a path (with its ``.json`` record beside it)."""
    if choice == "auto":
        return REFERENCE if REFERENCE.is_file() else PRETRAINED
    if choice == "tiny":
        return PRETRAINED
    if choice == "reference":
        if not REFERENCE.is_file() and REFERENCE.with_suffix(".json").is_file():
            raise _not_installed(REFERENCE)
        if not REFERENCE.is_file():
            raise InputError(f"--pretrained reference: this package ships no {REFERENCE.name} (no GPU-trained reference "
                             "yet); expected --pretrained auto or tiny")  # fmt: skip
        return REFERENCE
    path = Path(choice)
    if not path.is_file() or not path.with_suffix(".json").is_file():
        raise InputError(f"--pretrained: received {choice!r}; expected auto, reference, tiny or a checkpoint file with its "
                         ".json record beside it")  # fmt: skip
    return path


def _not_installed(checkpoint: Path) -> InputError:
    """A shipped checkpoint whose record is here but whose weights are not: an install from the wheel, which leaves
    the demo's checkpoints out (issue 42: 3.2 MB of torch weights on every runtime-only device, which never loads
    them); they are in the checkout, where ``make demo`` runs."""
    return InputError(f"{checkpoint.name} is not in this install: the wheel leaves the demo's checkpoints out (torch "
                      "weights only the demo loads); run the demo from a checkout (make demo), or train here: --epochs N "
                      "(and --limit N images for a quick run)")  # fmt: skip


def pretrained_record(checkpoint: Path = PRETRAINED) -> dict[str, Any]:
    """How a shipped checkpoint was trained (the ``.json`` beside it: ``cifar10_demo.json`` by default)."""
    return json.loads(Path(checkpoint).with_suffix(".json").read_text())


def ensemble_rows(logits, labels, sizes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[dict[str, Any]]:
    """Accuracy of the first n leaves with its standard error, and the gain over n = 1 with a paired standard error.

    Both are measured on the same images, so the gain's error is that of the mean per-image difference
    (correct with n leaves minus correct with one), far smaller than the two accuracies' errors combined.
    """
    from .train.losses import ensemble_logits

    m = labels.shape[0]
    first = (ensemble_logits(logits, 1).argmax(-1) == labels).double()
    rows = []
    for n in sizes:
        if n > logits.shape[1]:
            break
        correct = (ensemble_logits(logits, n).argmax(-1) == labels).double()
        p, diff = correct.mean().item(), correct - first
        rows.append({"n": n, "images": m, "accuracy": p, "se": (p * (1 - p) / m) ** 0.5,
                     "gain": diff.mean().item(), "gain_se": diff.std(correction=1).item() / m**0.5 if m > 1 else 0.0})
    return rows


def format_ensemble_line(rows: list[dict[str, Any]]) -> str:
    last = rows[-1]
    return (f"validation accuracy by ensemble size ({last['images']} images, ± one standard error): "
            + ", ".join(f"n={r['n']}: {r['accuracy']:.1%} ± {r['se']:.1%}" for r in rows)
            + f"\n  n={last['n']} vs n=1: {last['gain'] * 100:+.1f} points ± {last['gain_se'] * 100:.1f} (paired, same images)")


def bundle_logits(runner, images: np.ndarray, progress=None) -> np.ndarray:
    """Every leaf's logits ``(M, N, classes)`` for uint8 NHWC ``images``, run through ``runner``'s bundle (all leaves, in
    batches of its largest size): the demo's evaluation.

    The demo evaluated in PyTorch before (issue 42): hne_resnet_small's 5,000 validation images took 61 of its 88 s
    on an idle 2-core machine and 7.5 of 9.5 minutes at load 12-20; ONNX Runtime runs the same bundle, verified
    against PyTorch, in a tenth of the CPU time (4.5 against 46 ms of CPU time an image at load 24, with the same
    correct answers on all 5,000 images at every n).
    """
    batch = runner.input_spec.batch[2]
    if progress is not None:
        progress.restart(len(images), "eval", "image")
        progress.set(note=f"through the bundle on {runner.backend.name} {runner.device}")
    out = []
    for i in range(0, len(images), batch):
        out.append(runner.run(runner.preprocess(images[i : i + batch])).leaf_logits.transpose(1, 0, 2))
        if progress is not None:
            progress.update(len(out[-1]))
    return np.concatenate(out)


def budget_sweep(runner, images: np.ndarray, labels: np.ndarray, budgets_ms: list[float | None]) -> list[dict[str, Any]]:
    """Run every image (batch 1) under each budget; summarise leaves, accuracy, latency and misses
    (:func:`hne_edge.runtime.summarize_frames`, what ``hne-edge run`` prints too).

    A miss is a frame whose answer came after its budget. It is forced when the budget was shorter than the
    first leaf (which always runs) takes 9 times in 10, as the runner measured it (its p90); a miss on a budget that
    fits the first leaf is the machine's (a leaf slower than that: a pre-empted process), not the budget's.
    """
    from .runtime import summarize_frames

    rows = []
    for budget in budgets_ms:
        results, correct = [], []
        for i in range(len(images)):
            r = runner.run(images[i : i + 1], budget_ms=budget)
            results.append(r)
            correct.append(bool(r.predictions[0] == labels[i]))
        s = summarize_frames(results, correct)
        rows.append({"budget_ms": budget, "frames": s["frames"], "mean_leaves": s["mean_leaves"], "accuracy": s["accuracy"],
                     "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"], "misses": s["misses"],
                     "forced_misses": s["forced_misses"]})  # fmt: skip
    return rows


def format_budget_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'budget':>10} {'leaves':>7} {'accuracy':>9} {'p50 ms':>8} {'p99 ms':>8} {'misses':>9}  {'(forced)':>8}"]
    for r in rows:
        budget = "none" if r["budget_ms"] is None else f"{r['budget_ms']:.3f} ms"
        lines.append(
            f"{budget:>10} {r['mean_leaves']:>7.2f} {r['accuracy']:>9.2%} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
            f"{r['misses']:>4}/{r['frames']:<4}  {r['forced_misses']:>8}"
        )
    lines.append("misses: answers later than the budget; (forced): of those, frames whose budget was shorter "
                 "than the first leaf (which always runs) takes 9 times in 10 as the runner measured it; the others ran slower "
                 "than that (on a busy machine, the process pre-empted)")
    return "\n".join(lines)


def _train_config(out: Path, data: str, data_dir: str | None, model: str | None, epochs: int | None,
                  limit: int | None, seed: int, quiet: bool):
    """The config of a demo that trains: the dataset's preset, hne_tiny, a CPU-sized number of epochs."""
    from .train import TrainConfig

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
    return TrainConfig.from_preset(preset, overrides)


@contextlib.contextmanager
def _demo_folder(out: Path, force: bool) -> Iterator[None]:
    """Make ``out`` a new, empty demo folder for the block, replacing only a previous demo's (see
    :data:`DEMO_LAYOUT`). The previous one is moved aside, not deleted, until the block succeeds: a demo that fails
    (bad data, a full disk) or is stopped (Ctrl-C, SIGTERM) leaves it as it was and no folder of its own. The new
    demo is built at ``out`` itself, so the paths it records (the checkpoint's, the bundle's) are the final ones."""
    if out.is_symlink():
        raise InputError(f"--out {out} is a symbolic link (to {os.readlink(out)}); expected a folder",
                         hint="pass the folder it points to")  # fmt: skip
    if check_output_dir(out, "--out").exists():
        entry = foreign_entry(out, DEMO_LAYOUT)
        if entry is not None:
            raise InputError(
                f"{out} was not written by hne-edge demo: it holds {entry}, which a demo never writes",
                hint="choose another out_dir, or remove it yourself", cli_hint="choose another --out, or remove it yourself",
            )
        if any(out.iterdir()) and not (out / MARKER).is_file() and not force:
            raise InputError(
                f"{out} holds only what a demo writes but not its {MARKER} file, so it may not be a demo's",
                hint="pass force=True to replace it", cli_hint="pass --force to replace it",
            )
    out = absolute_folder(out)
    created = new_folders(out.parent)  # (out itself is removed with what is in it)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)  # a killed demo's previous one, set aside
    previous = scratch_path(out, "old") if out.exists() else None
    if previous is not None:
        os.replace(out, previous)
    try:
        out.mkdir()
        (out / MARKER).write_text("written by hne-edge demo; the next demo run may replace this folder\n")
        yield
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        if previous is not None:
            os.replace(previous, out)
        else:
            remove_new_folders(created)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def _refuse_inputs_inside(out: Path, inputs: list) -> None:
    """An input of the demo inside ``--out`` (the ``frames.npz`` a previous demo wrote, as ``--data-dir``) would be
    replaced with the folder before it is read: refused, as ``export`` refuses a folder holding its checkpoint."""
    home = out.resolve()
    for given in inputs:
        if given is not None and (Path(given).resolve() == home or home in Path(given).resolve().parents):
            raise InputError(f"--out {out} holds {given}, an input of this demo, which replacing the folder would "
                             "delete; expected an --out that does not contain its inputs",
                             hint="choose another out_dir, or move the input out of it",
                             cli_hint="choose another --out, or move the input out of it")  # fmt: skip


def run_demo(
    out_dir: str | Path = "runs/demo",
    *,
    data: str = "auto",
    data_dir: str | None = None,
    model: str | None = None,
    epochs: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    frames: int | None = None,
    force: bool = False,
    quiet: bool = False,
    pretrained: str = "auto",
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the whole pipeline into ``out_dir`` (see the module docstring)."""
    from .train import TrainConfig, load_checkpoint
    from .train.config import upgrade_config
    from .train.data import npz_fingerprint

    if not str(out_dir).strip():  # Path("") is the current directory: never what an empty --out meant
        raise InputError("--out: received an empty path; expected the name of a folder for the demo's files",
                         hint="pass out_dir='runs/demo'", cli_hint="pass --out DIR, e.g. --out runs/demo")  # fmt: skip
    out = Path(out_dir)
    auto = data == "auto"
    data, data_dir, note = choose_data(data, data_dir)
    # the shipped checkpoint stands in for training only where nothing asks to train (it was trained with seed 0)
    use_shipped = auto and data == "npz" and model is None and epochs is None and limit is None and seed == 0
    shipped = pretrained_checkpoint(pretrained)  # a bad --pretrained is refused whatever the data
    if use_shipped:
        if not shipped.is_file():
            raise _not_installed(shipped)
        record = pretrained_record(shipped)
        found = npz_fingerprint(data_dir)
        if found != record["data"]["sha256"]:  # another order or other images: the hold-out could hold training images
            raise InputError(
                f"{data_dir}: not the file {shipped.name} was trained on (sha256 of x and y {found[:12]}..., "
                f"expected {record['data']['sha256'][:12]}...), so its validation split could hold training images; "
                f"train here instead: hne-edge demo --data npz --data-dir {data_dir}"
            )
        stored = upgrade_config(load_checkpoint(shipped)["config"])
        config = TrainConfig.from_dict({**stored, "data": {**stored["data"], "data_dir": data_dir}, "quiet": quiet})
    else:
        config = _train_config(out, data, data_dir, model, epochs, limit, seed, quiet)  # validate before touching the disk
    if data == "imagefolder" and not config.data.val_split and not (Path(data_dir) / "val").is_dir():
        raise InputError(f"--data-dir {data_dir}: has no val/ folder, and the imagenet preset holds none of the "
                         "training images out, so the demo would have no validation images; expected train/ and val/ "
                         "class folders")  # fmt: skip
    _refuse_inputs_inside(out, [data_dir, shipped if use_shipped else None])
    with _demo_folder(out, force):  # a demo that fails or is stopped leaves the previous one as it was
        return _pipeline(out, config, note, use_shipped, shipped, record if use_shipped else None, data, frames, quiet,
                         echo)  # fmt: skip


def _pipeline(out: Path, config, note: str | None, use_shipped: bool, shipped: Path, record: dict | None, data: str,
              frames: int | None, quiet: bool, echo: Callable[[str], None]) -> DemoResult:
    """The demo's six steps into ``out`` (made empty by :func:`_demo_folder`)."""
    import torch

    from .bundle import BOTH
    from .exporters import export_onnx, verify_bundle
    from .models import tree_cost
    from .plots import plot_budget_sweep, plot_tree
    from .progress import progress_for
    from .runtime import AnytimeRunner
    from .train import fit, model_from_checkpoint
    from .train.data import load_data
    from .train.evaluation import dataset_name, write_metrics

    t_start = time.perf_counter()

    def step(n: int, text: str) -> None:
        echo(f"[{n}/6 {time.perf_counter() - t_start:6.1f}s] {text}")

    if note:
        echo(note)
    if use_shipped:
        step(1, f"using the checkpoint shipped with hne-edge ({shipped.name}): {record['summary']}")
        other = "--pretrained tiny: the small CPU-trained one; " if shipped == REFERENCE else ""
        echo(f"        it trained for {record['train_seconds'] / 60:.0f} min on {record['machine']}; command, data and "
             f"figures: {shipped.with_suffix('.json')}. {other}To train here instead: --epochs N (and --limit N images "
             "for a quick run)")
        checkpoint = shipped
    else:
        step(1, f"training {config.model.name} on {config.data.name} ({config.loss.kind} loss, "
                f"{config.optim.epochs} epochs)")
        checkpoint = fit(config).checkpoint
    with contextlib.ExitStack() as stack:  # on an error too: the progress stops, the runner closes
        progress = stack.enter_context(progress_for(None, "demo", quiet=quiet))  # each phase restarts it
        fused, state = model_from_checkpoint(checkpoint)
        step(2, "exporting the ONNX bundle (per-node and per-leaf segment plans, and the export-free first leaf)")
        bundle = export_onnx(
            fused,
            out / "bundle",
            class_names=state["class_names"],
            normalization=state["normalization"],
            plan=BOTH,
            batch=(1, 1, EVAL_BATCH),
            verify=False,  # step 3 runs the verification and prints its table
            progress=progress,
        )
        step(3, "verifying every file against PyTorch (ONNX Runtime CPU)")
        report = verify_bundle(bundle, model=fused, progress=progress)
        report.raise_for_failures()
        worst = max((c.max_abs_diff for c in report.checks), default=0.0)
        echo(f"        {len(report.checks)} checks passed; largest |ONNX - PyTorch| = {worst:.2e}")
        data_bundle = load_data(config.data, seed=config.seed)  # its val: the split `hne-edge eval` evaluates
        all_images, all_labels = data_bundle.frames(data_bundle.val)  # uint8 NHWC, as a camera would give
        runner = stack.enter_context(AnytimeRunner(bundle))
        step(4, f"evaluating every ensemble size n = 1..N on the {len(all_labels)} validation images through the "
                f"verified bundle ({EVALUATED_WITH})")
        logits = torch.from_numpy(bundle_logits(runner, all_images, progress))
        targets = torch.from_numpy(all_labels).long()
        source = {"data": config.data.name, "dataset": dataset_name(config.data), "split": "val",
                  "evaluated_with": f"{EVALUATED_WITH}, bundle {bundle}"}
        cost = tree_cost(fused)
        metrics = write_metrics(fused, state, checkpoint, logits, targets, source, out / "eval", cost=cost)
        plot_tree(fused.tree, out / "eval" / "tree.png", {k: v.macs for k, v in cost.nodes.items()})
        step(5, "profiling each leaf on this CPU (ONNX Runtime, segments plan)")
        by_size = ensemble_rows(logits, targets)
        images, labels = all_images, all_labels
        if frames is None and data != "digits":
            frames = SWEEP_FRAMES
        if frames is not None:
            images, labels = images[:frames], labels[:frames]
        with atomic_file(out / "frames.npz") as f:  # for the next commands printed at the end
            np.savez(f, x=images, y=labels)
        runner.profile(batch_sizes=(1,), warmup=5, repeats=30, progress=progress)
        progress.close()
        levels = runner.profile_data.batches[1]["levels"]
        first, full = levels[0]["median_ms"], levels[-1]["median_ms"]
        step(6, f"anytime inference on {len(images)} validation frames under per-frame budgets "
                f"(first leaf {first:.3f} ms, all {runner.num_leaves} leaves {full:.3f} ms; budgets up to 4x that)")
        x = runner.preprocess(images)
        # from below the first leaf (a forced miss) up to 4x the whole tree: on a busy machine the tree takes
        # longer than profiled, and the larger budgets show the scheduler using the time it is given
        budgets: list[float | None] = [first * 0.5] + [first + (full - first) * f for f in (0.0, 0.25, 0.5, 1.0)]
        budgets += [2 * full, 4 * full, None]
        rows = budget_sweep(runner, x, labels, budgets)
    table = format_budget_table(rows)
    echo("")
    echo(table)
    plot_budget_sweep(rows, out / "eval" / "anytime_budget.png", fused.tree.num_leaves)
    atomic_write_json(out / "demo.json",
                      {"train": config.to_dict(), "checkpoint": str(checkpoint), "by_ensemble_size": by_size, "budgets": rows, "metrics_file": str(out / "eval" / "metrics.json")},
                      indent=2)
    worst_se = max((r["accuracy"] * (1 - r["accuracy"]) / r["frames"]) ** 0.5 for r in rows)
    echo(f"(accuracy over {len(images)} frames: one standard error is at most {worst_se:.1%})")
    echo("")
    echo(format_ensemble_line(by_size))
    echo("")
    echo(f"done in {time.perf_counter() - t_start:.0f}s. Everything is under {out}/:")
    echo(f"  checkpoint  {checkpoint}")
    echo(f"  metrics     {out / 'eval' / 'metrics.json'}")
    echo(f"  plots       {out / 'eval'}/*.png (accuracy vs MACs, diversity, per-leaf accuracy, tree, budgets)")
    echo(f"  bundle      {bundle}")
    echo(f"  frames      {out / 'frames.npz'} (the validation images, uint8 NHWC, with labels)")
    echo("next:")
    hint = how_to_run_hne_edge()
    if hint is not None:
        echo(f"  ({hint})")
    echo(f"  hne-edge inspect {bundle}")
    echo(f"  hne-edge bench {bundle} --frames {out / 'frames.npz'} --out {out / 'bench'}")
    echo(f"  hne-edge run {bundle} {out / 'frames.npz'} --budget-ms {rows[3]['budget_ms']:.3f}")
    examples = examples_folder()
    if examples is not None:  # a checkout's (an installed wheel has none)
        echo(f"  python {examples / 'embedded_app.py'} {bundle} --frames {out / 'frames.npz'}")
        echo(f"  python {examples / 'autonomous_stack.py'} {bundle} --frames {out / 'frames.npz'} --out {out / 'stack'}")
    return DemoResult(out, checkpoint, bundle, metrics, rows)


def examples_folder(cwd: str | Path = ".") -> Path | None:
    """The checkout's ``examples/`` as a shell user in ``cwd`` reaches it (relative below ``cwd``, else absolute), or
    None where there is none: the demo printed ``python examples/...``, which only worked from the repository's
    root."""
    folder = Path(__file__).resolve().parent.parent / "examples"
    if not (folder / "embedded_app.py").is_file():
        return None
    here = Path(cwd).resolve()
    return Path(os.path.relpath(folder, here)) if folder.is_relative_to(here) else folder
