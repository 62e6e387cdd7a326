"""``hne-edge demo``: the whole pipeline on a small model, one command."""

from __future__ import annotations

import click

from ..train.config import DATASETS


@click.command("demo")
@click.option("--out", "out_dir", default="runs/demo", show_default=True, type=click.Path(file_okay=False),
              help="Output folder (a previous demo's folder is replaced).")
@click.option("--data", default="digits", show_default=True,
              type=click.Choice(DATASETS),
              help="Dataset; digits ships with scikit-learn (no download).")
@click.option("--data-dir", default=None, help="Dataset folder or .npz file (for cifar10/100, npz, imagefolder).")
@click.option("--model", default=None, help="Zoo model (default: hne_tiny).")
@click.option("--epochs", type=int, default=None, help="Training epochs (default: the preset's; 3 for CIFAR on a CPU).")
@click.option("--limit", type=int, default=None, help="Use only this many training images.")
@click.option("--frames", type=int, default=None, help="Validation frames for the budget sweep (default: all).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="Replace --out even if it was not written by a demo.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def demo(out_dir, data, data_dir, model, epochs, limit, frames, seed, force, quiet) -> None:
    """Train, evaluate, export, verify, profile and run a small distilled HNE end to end.

    Ends with a table: per-frame budget -> mean leaves -> accuracy -> p50/p99 latency -> budget misses.
    """
    from ..demo import run_demo

    if data != "digits" and data_dir is None and data not in ("cifar10", "cifar100"):
        raise click.UsageError(f"--data {data} needs --data-dir")
    run_demo(out_dir, data=data, data_dir=data_dir, model=model, epochs=epochs, limit=limit, seed=seed,
             frames=frames, force=force, quiet=quiet, echo=click.echo)
