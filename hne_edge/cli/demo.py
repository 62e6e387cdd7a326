"""``hne-edge demo``: the whole pipeline on a small model, one command."""

from __future__ import annotations

import click

from ..train.config import DATASETS
from .options import flag_names


@click.command("demo")
@click.option("--out", "out_dir", default="runs/demo", show_default=True, type=click.Path(file_okay=False),
              help="Output folder: new, empty, or a previous demo's (replaced); never a folder holding anything else.")
@click.option("--data", default="auto", show_default=True,
              type=click.Choice(("auto",) + DATASETS),
              help="Dataset. auto: CIFAR-10 from ../shared/data/cifar10_train.npz with the shipped checkpoint if that "
                   "file exists, else digits (scikit-learn, no download).")
@click.option("--data-dir", default=None, help="Dataset folder or .npz file (for cifar10/100, npz, imagefolder).")
@click.option("--model", default=None, help="Zoo model (default: hne_tiny).")
@click.option("--epochs", type=int, default=None, help="Training epochs (default: the preset's; 3 for CIFAR on a CPU).")
@click.option("--limit", type=int, default=None, help="Use only this many training images.")
@click.option("--num-frames", "frames", type=click.IntRange(min=1), default=None,
              help="Validation frames for the budget sweep (default: all for digits, 1000 otherwise).")
@click.option("--frames", "frames_alias", type=click.IntRange(min=1), default=None, hidden=True)  # old --num-frames
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True,
              help="Also replace a folder holding only what a demo writes but not its .hne-edge-demo marker.")
@click.option("--pretrained", default="auto", show_default=True,
              help="The CIFAR-10 checkpoint --data auto starts from: auto (the GPU-trained reference HNE_small when "
                   "this package ships one, else tiny), reference, tiny (the small CPU-trained hne_tiny), or the path "
                   "of such a checkpoint with its .json record beside it.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def demo(out_dir, data, data_dir, model, epochs, limit, frames, frames_alias, seed, force, pretrained, quiet) -> None:
    """Train, evaluate, export, verify, profile and run a small distilled HNE end to end.

    Ends with a table: per-frame budget -> mean leaves -> accuracy -> p50/p99 latency -> budget misses.
    """
    from ..demo import run_demo

    if data in ("npz", "imagefolder") and data_dir is None:
        raise click.UsageError(f"--data {data} needs --data-dir")
    if data in ("auto", "digits") and data_dir is not None:
        raise click.UsageError(f"--data-dir needs --data npz, cifar10, cifar100 or imagefolder; received --data {data}")
    ctx = click.get_current_context()
    typed = {key: flag for key, (param, flag) in _FLAGS.items()
             if ctx.get_parameter_source(param) is click.core.ParameterSource.COMMANDLINE}  # fmt: skip
    with flag_names(typed):  # the training config's keys, as the flags that set them
        run_demo(out_dir, data=data, data_dir=data_dir, model=model, epochs=epochs, limit=limit, seed=seed,
                 frames=frames if frames is not None else frames_alias, force=force, quiet=quiet, pretrained=pretrained,
                 echo=click.echo)  # fmt: skip


# the training config's keys the demo's flags set: its errors name the flag typed ("--epochs: received 0")
_FLAGS = {"optim.epochs": ("epochs", "--epochs"), "data.limit": ("limit", "--limit"), "seed": ("seed", "--seed"),
          "model.name": ("model", "--model"), "data.data_dir": ("data_dir", "--data-dir")}
