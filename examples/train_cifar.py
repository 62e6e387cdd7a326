#!/usr/bin/env python3
"""The paper's CIFAR recipe (SGD 0.1, momentum 0.9, cosine, 200 epochs, batch 128, wd 5e-4, L^HD).

One GPU or CPU:
    python examples/train_cifar.py --model hne_resnet_small --data cifar10 --data-dir data/cifar --download
Several GPUs on one node (DistributedDataParallel; the batch of 128 is global):
    torchrun --nproc-per-node 8 examples/train_cifar.py --model hne_resnet --data cifar100 --data-dir data/cifar
The CIFAR-10 training set as a numpy archive (x: N,32,32,3 uint8; y: N), e.g. ../shared/data:
    python examples/train_cifar.py --data npz --data-dir ../shared/data/cifar10_train.npz

With your own held-out set (same npz format), every ensemble size is scored on it at the end:
    python examples/train_cifar.py --data npz --data-dir train.npz --test-data test.npz

The options mean what ``hne-edge train``'s do (``--data``, ``--limit``, ``--val-limit``...).

Then: ``hne-edge eval OUT/checkpoint.pt`` and ``hne-edge export OUT/checkpoint.pt --out bundle``.
The same runs are available as YAML configs in examples/configs/ for ``hne-edge train --config``.
"""

from __future__ import annotations

import argparse
import sys

from hne_edge.cli.scripts import ArgumentParser, positive, run_main
from hne_edge.errors import InputError
from hne_edge.train.config import LOSSES, NORMALIZATIONS, WEIGHTINGS  # torch-free: --help stays instant


def check_test_data(path: str) -> None:
    """Refuse a --test-data that is not an .npz of images with labels (the archive's checks against the model come
    after training, from evaluate_checkpoint)."""
    from hne_edge.train.data import load_npz

    try:
        load_npz(path)
    except FileNotFoundError:
        raise InputError(f"--test-data: {path} does not exist; expected an .npz (x: N,32,32,3 uint8; y: N)") from None
    except InputError as exc:
        raise InputError(f"--test-data: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="hne_resnet_small", choices=["hne_resnet_small", "hne_resnet", "hne_tiny"])
    p.add_argument("--data", default="cifar10", choices=["cifar10", "cifar100", "npz"])
    p.add_argument("--dataset", dest="data", choices=["cifar10", "cifar100", "npz"], default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old spelling; the CLI says --data
    p.add_argument("--data-dir", required=True)
    p.add_argument("--download", action="store_true")
    p.add_argument("--loss", default="hierarchical", choices=LOSSES)
    p.add_argument("--weighting", default="paper", choices=WEIGHTINGS,
                   help="paper: the paper's equations (default); mean-t2: hne-edge 0.1's means x T^2")
    p.add_argument("--normalize", default="none", choices=NORMALIZATIONS,
                   help="none: the paper's objective (default); label: divided by (1 - alpha), for short schedules")
    p.add_argument("--epochs", type=positive(int, "a number of epochs"), default=200)
    p.add_argument("--test-data", default=None, help="an .npz (x: N,32,32,3 uint8; y: N) to score the final model on")
    p.add_argument("--limit", type=positive(int, "a number of images"), default=None,
                   help="train on this many images (quick checks)")
    p.add_argument("--val-limit", type=positive(int, "a number of images"), default=None,
                   help="validate on this many held-out images (default: all of them)")
    p.add_argument("--out", default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    from hne_edge.train import TrainConfig, evaluate_checkpoint, fit

    if args.test_data:  # read now, before any work: a mistyped path is not found after the whole training
        check_test_data(args.test_data)

    config = TrainConfig.from_preset(
        "cifar",
        {
            "data": {"name": args.data, "data_dir": args.data_dir, "download": args.download, "limit": args.limit,
                     "val_limit": args.val_limit},
            "model": {"name": args.model},
            "loss": {"kind": args.loss, "weighting": args.weighting, "normalize": args.normalize},
            "optim": {"epochs": args.epochs},
            "out": args.out or f"runs/{args.data}_{args.model}_{args.loss}",
        },
    )
    result = fit(config, resume=args.resume)  # DDP is picked up from torchrun's environment
    if result.history:  # rank 0 (every process returns; only rank 0 writes)
        final = result.final  # fit validated the last epoch already: no second pass over the same images
        if "val_acc_n" in final:
            curve = ", ".join(f"n={n}: {final['val_acc_n'][n - 1]:.2%}" for n in (1, 2, 4, 8, 16) if n <= len(final["val_acc_n"]))
            print(f"validation accuracy by ensemble size: {curve}")
        if args.test_data:
            metrics = evaluate_checkpoint(result.checkpoint, test_data=args.test_data)
            curve = ", ".join(f"n={m['n']}: {m['accuracy']:.2%}" for m in metrics["anytime"] if m["n"] in (1, 2, 4, 8, 16))
            print(f"test accuracy ({args.test_data}) by ensemble size: {curve}")
        print(f"checkpoint: {result.checkpoint}")
        for note in result.notes:
            print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(run_main(main))
