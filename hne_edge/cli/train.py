"""``hne-edge train`` and ``hne-edge eval``: thin shells over :func:`hne_edge.train.fit` and
:func:`hne_edge.train.evaluation.evaluate_checkpoint`."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from ..train.config import (DATASETS, DEFAULT_PRESET, EMA_AUTO, EMA_AUTO_WINDOW, HOLDOUTS, LOSSES,  # torch-free:
                            NORMALIZATIONS, POINTWISE, PRESETS, WEIGHTINGS)  # --help stays instant
from ..tree import TREE_PRESETS
from .options import (CheckpointPath, config_device_option, device_option, flag_names, force_option, names_typed_flags,
                      quiet_option, threads_option, typed_flags)

# config keys whose flag is not "--" + the key's last part with "-" for "_" (errors name the flag the user typed)
FLAG_OF = {"data.name": "--data", "model.name": "--model", "loss.kind": "--loss", "loss.temperature_squared": "--t-squared"}

@click.command("train")
@click.option("--data", type=click.Choice(DATASETS), default=None, help="Dataset (default: digits, bundled with scikit-learn).")
@click.option("--data-dir", default=None, help="CIFAR root, ImageFolder root, or .npz file (x: N,H,W,C uint8; y: N).")
@click.option("--download", is_flag=True, default=None, help="Download CIFAR-10/100 into --data-dir.")
@click.option("--model", default=None, help="Zoo model (hne-edge info lists them).")
@click.option("--tree", default=None, help=f"{' | '.join(TREE_PRESETS)} | branching factors, e.g. 1,2,2,2,2.")
@click.option("--loss", type=click.Choice(LOSSES), default=None, help="Training objective (default hierarchical: L^I + L^HD).")
@click.option("--alpha", type=float, default=None, help="Weight of the distillation term (default 0.5).")
@click.option("--temperature", type=float, default=None, help="Soft-label temperature T (default 2).")
@click.option("--weighting", type=click.Choice(WEIGHTINGS), default=None,
              help="paper: the paper's sums (L^HD weighs B/N of L^I; default). mean-t2: hne-edge 0.1's means x T^2.")
@click.option("--t-squared/--no-t-squared", "temperature_squared", default=None,
              help="Multiply the distillation term by T^2 (off by default; mean-t2 always does).")
@click.option("--normalize", type=click.Choice(NORMALIZATIONS), default=None,
              help="none: the paper's objective (default). label: divide it by (1 - alpha), i.e. L^I + alpha/(1-alpha) "
                   "L^HD, the label term at full weight (weight decay unchanged). Use label for short schedules "
                   "(tens of epochs), where the paper's halved label term costs accuracy (RESULTS.md).")
@click.option("--epochs", type=int, default=None, help="Epochs (under --time-budget: the most it may run).")
@click.option("--time-budget", default=None,
              help="Train for this long instead (7m, 90s, 1h30m or seconds): the first steps are timed, then the number "
                   "of steps is fixed so that the schedule, validations and checkpoints end inside it (and shortened "
                   "if the work slows down later).")
@click.option("--batch-size", default=None,
              help="Global batch size (split across processes), or auto: 512 on CUDA, 128 on a CPU, at most the "
                   "training images (the cifar preset's).")
@click.option("--lr", type=float, default=None,
              help="Learning rate (SGD, cosine schedule); with --lr-batch, the rate at that batch size.")
@click.option("--lr-batch", type=int, default=None,
              help="The batch size --lr is quoted at: the rate is scaled linearly to --batch-size (the cifar preset: 128).")
@click.option("--warmup-epochs", type=float, default=None,
              help="When the rate is scaled up, rise to it linearly from --lr over this many epochs (the cifar preset: 2).")
@click.option("--weight-decay", type=float, default=None)
@click.option("--ema", default=None,
              help="Keep an exponential moving average of the weights with this decay per step (such as 0.999), or "
                   f"{EMA_AUTO} (a window of {EMA_AUTO_WINDOW:.0%} of the run's steps, whatever its length), and "
                   "deliver it: validations, the checkpoint and exports use it (default: off, the paper's recipe).")
@click.option("--accum-steps", type=int, default=None, help="Micro-batches per step (gradient accumulation).")
@click.option("--seed", type=int, default=None)
@click.option("--val-split", type=float, default=None, help="Fraction of training images held out for validation.")
@click.option("--holdout", type=click.Choice(HOLDOUTS), default=None,
              help="Which images --val-split holds out: random (seeded; default) or last (the file's last ones, in order).")
@click.option("--limit", type=int, default=None, help="Train on at most this many images (quick runs).")
@click.option("--val-limit", type=int, default=None,
              help="Validate on at most this many of the held-out images (default: all of the seeded --val-split).")
@click.option("--out", default=None, help="Output folder (checkpoint.pt, train_log.json, config.yaml).")
@click.option("--resume", is_flag=True, help="Continue the run in --out exactly where it stopped.")
@click.option("--config", "config_path", default=None, help="YAML config (may name a preset); flags override it.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None, help="Paper recipe to start from.")
@click.option("--pointwise", type=click.Choice(POINTWISE), default=None,
              help="How the 1x1 convolutions of the branches run in training: conv (grouped, default) or bmm (batched "
                   "matmul); the same parameters and outputs.")
@config_device_option
@threads_option("torch")
@quiet_option
@click.option("--nproc-per-node", type=int, default=1, show_default=True, help="Processes for DDP (spawns torch.distributed.run).")
@names_typed_flags
def train(data, data_dir, download, model, tree, loss, alpha, temperature, weighting, temperature_squared, normalize, epochs,
          time_budget, batch_size, lr, lr_batch, warmup_epochs, weight_decay, ema, accum_steps, seed, val_split,
          holdout, limit, val_limit, out, resume, config_path, preset, pointwise, device, threads, quiet,
          nproc_per_node):
    """Train an HNE; with no options, hne_tiny on the bundled digits (~20 s on a CPU).

    With only --data, the run starts from the matching paper preset (cifar10/cifar100/npz: cifar,
    imagefolder: imagenet). --resume without --config/--preset continues the stored config.
    """
    from ..errors import InputError
    from ..train.config import TrainConfig, merge, upgrade_config
    from ..tree import parse_tree

    if config_path and preset:
        raise InputError("--config and --preset contradict each other: give one (a YAML config may say `preset: NAME`)")
    overrides: dict = {}
    flags = typed_flags()

    def put(section: str | None, key: str, value) -> None:
        if value is not None:
            (overrides.setdefault(section, {}) if section else overrides)[key] = value
            name = f"{section}.{key}" if section else key
            flags[name] = FLAG_OF.get(name, "--" + key.replace("_", "-"))

    if batch_size is not None and batch_size != "auto":
        try:
            batch_size = int(batch_size)
        except ValueError:
            raise InputError(f"--batch-size: received {batch_size!r}; expected a positive integer or auto") from None
    if ema is not None and ema != EMA_AUTO:
        try:
            ema = float(ema)
        except ValueError:
            raise InputError(f"--ema: received {ema!r}; expected auto or a decay with 0 < decay < 1") from None
    for key, value in (("name", data), ("data_dir", data_dir), ("download", download), ("val_split", val_split), ("limit", limit),
                       ("val_limit", val_limit), ("holdout", holdout)):
        put("data", key, value)
    put("model", "name", model)
    if tree is not None:
        overrides.setdefault("model", {}).setdefault("overrides", {})["tree"] = parse_tree(tree, "--tree")
        flags["model.overrides"] = flags["TreeSpec.branching"] = "--tree"
    for key, value in (("kind", loss), ("alpha", alpha), ("temperature", temperature), ("weighting", weighting),
                       ("temperature_squared", temperature_squared), ("normalize", normalize)):
        put("loss", key, value)
    for key, value in (("epochs", epochs), ("batch_size", batch_size), ("lr", lr), ("lr_batch", lr_batch),
                       ("warmup_epochs", warmup_epochs), ("weight_decay", weight_decay), ("accum_steps", accum_steps),
                       ("ema", ema)):
        put("optim", key, value)
    for key, value in (("seed", seed), ("out", out), ("device", device), ("threads", threads), ("quiet", quiet),
                       ("time_budget", time_budget), ("pointwise", pointwise)):
        put(None, key, value)

    model_source = None  # how the model was chosen when --model did not name it: fit's first line says so
    if config_path:
        config = TrainConfig.from_file(config_path, overrides)
        model_source = None if model else f"the model of {config_path}"
    elif preset:
        config = TrainConfig.from_preset(preset, overrides)
        model_source = None if model else f"the {preset} preset's model"
    elif resume:
        from ..train.checkpoint import load_resumable

        if out is None:
            raise InputError("--resume needs --out (the folder of the run to continue)")
        stored = load_resumable(Path(out) / "checkpoint.pt").get("config")
        if not stored:
            raise InputError(f"{out}/checkpoint.pt records no training config; pass --config or --preset")
        config = TrainConfig.from_dict(merge(upgrade_config(stored), overrides))
    else:  # fit's first line names the model and epochs the preset chose
        config = TrainConfig.for_data(data, overrides)
        if model is None:
            model_source = f"the {DEFAULT_PRESET[data or 'digits']} preset's model for --data {data or 'digits'}"

    if nproc_per_node < 1:
        raise InputError(f"--nproc-per-node: received {nproc_per_node}; expected >= 1")
    if nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        return _spawn_torchrun(nproc_per_node, config, resume)

    from ..train.engine import fit

    result = fit(config, resume=resume, model_source=model_source)
    if int(os.environ.get("RANK", "0")) == 0:
        final = result.final
        acc = (f"val acc n=1 {final['val_acc_first']:.1%}, n={len(final['val_acc_n'])} {final['val_acc']:.1%}; "
               if "val_acc" in final else "")
        click.echo(f"{acc}checkpoint {result.checkpoint}; log {result.log}")
        for note in result.notes:
            click.echo(f"note: {note}")


def _spawn_torchrun(nproc: int, config, resume: bool) -> None:
    """Re-run this command under ``python -m torch.distributed.run`` with ``nproc`` processes."""
    import subprocess

    from ..train.engine import check_run_folder

    check_run_folder(config.out, resume)  # fail here, once, rather than in every rank
    argv = sys.argv[1:]
    clean: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc-per-node":
            skip = True
            continue
        if arg.startswith("--nproc-per-node="):
            continue
        clean.append(arg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "hne_edge", *clean]
    code = subprocess.call(cmd)
    if code:
        sys.exit(code)


@click.command("eval")
@click.argument("checkpoint", type=CheckpointPath())
@click.option("--out", default=None, help="Folder for metrics.json and the PNGs (default: the checkpoint's folder); "
              "files there of these names are replaced only if hne-edge wrote them.")
@click.option("--split", type=click.Choice(["val", "test"]), default=None,
              help="val (default): the run's seeded hold-out; test: the official test set (cifar10/100, imagefolder val/).")
@click.option("--test-data", type=click.Path(dir_okay=False), default=None,
              help="Evaluate on this .npz instead (x: N,H,W,C uint8; y: N; optional classes: y indexes these names, "
                   "each one of the checkpoint's; without them y numbers the model's classes), e.g. your own test set.")
@click.option("--data-dir", default=None, help="Where the run's data lives now, if it moved (the same images: their "
              "sha256 is checked where the run recorded it).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@device_option
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@force_option("metrics.json and the PNGs in --out")
@functools.partial(quiet_option, help="No progress output; print only the output path.")
def eval_(checkpoint, out, split, test_data, data_dir, batch_size, device, no_plots, force, quiet):
    """Accuracy, NLL, ECE, logit diversity and MACs for every ensemble size n = 1..N."""
    from ..errors import InputError
    from ..progress import progress_for
    from ..train.evaluation import evaluate_checkpoint

    if test_data and split:
        raise InputError(f"--test-data and --split {split} contradict each other: --test-data names the images to use")
    device_flag = flag_names({"device: received": "--device: received"})  # not "no CUDA device"
    with progress_for(None, "eval", "image", quiet=quiet) as progress, device_flag:
        metrics = evaluate_checkpoint(
            checkpoint, out, split=split or "val", test_data=test_data, data={"data_dir": data_dir} if data_dir else None,
            batch_size=batch_size, device=device, plots=not no_plots, progress=progress, force=force,
        )
    out_dir = Path(out) if out else Path(checkpoint).parent
    if not quiet:
        click.echo(f"{metrics['model']} ({metrics['loss']} loss) on {metrics['data']} {metrics['split']}: {metrics['num_images']} images")
        click.echo(f"{'n':>3} {'MMACs':>9} {'acc %':>7} {'NLL':>7} {'ECE':>7} {'logit std':>9}")
        for row in metrics["anytime"]:
            click.echo(f"{row['n']:>3} {row['macs'] / 1e6:>9.3f} {100 * row['accuracy']:>7.2f} {row['nll']:>7.4f} "
                       f"{row['ece']:>7.4f} {row['diversity']:>9.4f}")
        leaves = " ".join(f"{100 * r['accuracy']:.1f}" for r in metrics["leaves"])
        click.echo(f"per-leaf acc %: {leaves}")
    from ..train.evaluation import chance_note

    note = chance_note(metrics["anytime"][-1]["accuracy"], metrics["num_images"], metrics["num_classes"], metrics["split"])
    if note:
        click.echo(f"note: {note}")
    click.echo(f"wrote {out_dir / 'metrics.json'}")
