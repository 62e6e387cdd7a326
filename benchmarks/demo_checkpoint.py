"""Train and package the CIFAR-10 checkpoint that `hne-edge demo` ships (hne_edge/assets/cifar10_demo.*).

    # 1. train (the config records every setting; ~10 min on 2 cores, 1 thread)
    nice .venv/bin/python -m hne_edge train --config hne_edge/assets/cifar10_demo.yaml \
        --data-dir ../shared/data/cifar10_train.npz --out runs/cifar10_demo
    # 2. package: a lean copy of the final epoch (weights, config, history; no optimizer state) and a JSON record
    .venv/bin/python benchmarks/demo_checkpoint.py runs/cifar10_demo --command "<the command of step 1>"

The record holds the command, the commit, the data file's fingerprint (the demo refuses another file:
its seeded validation split could then hold training images), the machine, the training time and the
held-out figures: accuracy of the first n leaves with one standard error, and the gain over n = 1 with a
paired standard error. The final epoch is shipped, whatever its figures (no selection on the hold-out).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the training run's --out folder")
    parser.add_argument("--command", required=True, help="the exact training command, for the record")
    parser.add_argument("--note", default="", help="anything else a reader needs (e.g. the load while it trained)")
    parser.add_argument("--out", type=Path, default=REPO / "hne_edge" / "assets" / "cifar10_demo.pt")
    args = parser.parse_args(argv)

    from hne_edge.demo import ensemble_rows
    from hne_edge.fileio import atomic_write_json
    from hne_edge.train import load_checkpoint, model_from_checkpoint
    from hne_edge.train.checkpoint import save_release
    from hne_edge.train.config import TrainConfig, upgrade_config
    from hne_edge.train.data import BatchLoader, load_data, npz_fingerprint
    from hne_edge.train.evaluation import predict

    state = load_checkpoint(args.run / "checkpoint.pt")
    config = TrainConfig.from_dict(upgrade_config(state["config"]))
    history = state["extra"]["history"]
    if state["epoch"] != config.optim.epochs:
        raise SystemExit(f"{args.run}: epoch {state['epoch']} of {config.optim.epochs}; package a finished run")
    model, _ = model_from_checkpoint(state)
    save_release(args.out, state)
    data = load_data(config.data, seed=config.seed)
    norm = state["normalization"]
    logits, labels = predict(model, BatchLoader(data.val, 256, mean=norm["mean"], std=norm["std"]))
    rows = ensemble_rows(logits, labels)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    loss = {"independent": "L^I", "hierarchical": "L^I + L^HD", "distill": "L^I + L^D"}.get(config.loss.kind, config.loss.kind)
    first, last = rows[0], rows[-1]
    record = {
        "summary": (f"{config.model.name} (slim, {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters), "
                    f"{loss}, {config.optim.epochs} epochs on {len(data.train):,} CIFAR-10 images; held out: "
                    f"n=1 {first['accuracy']:.1%}, n={last['n']} {last['accuracy']:.1%} on {last['images']:,} images"),
        "command": args.command,
        "commit": commit,
        "config": state["config"],
        "data": {
            "file": config.data.data_dir,
            "sha256": npz_fingerprint(config.data.data_dir),
            "fingerprint": "sha256 of x's bytes then y's as int64",
            "train_images": len(data.train),
            "validation_images": len(data.val),
            "split": f"seeded permutation (seed {config.seed}): the first {config.data.val_split:g} of it held out, "
                     f"then the first --limit {config.data.limit} of each part",
        },
        "epochs": config.optim.epochs,
        "seed": config.seed,
        "train_seconds": round(sum(h["train_seconds"] for h in history), 1),
        "machine": _machine(),
        "torch": __import__("torch").__version__,
        "note": args.note,
        "held_out": rows,
        "history": [{k: v for k, v in h.items() if k != "val_acc_n"} for h in history],
    }
    atomic_write_json(args.out.with_suffix(".json"), record, indent=1)
    print(record["summary"])
    for r in rows:
        print(f"n={r['n']:>2}: {r['accuracy']:.2%} ± {r['se']:.2%}   vs n=1 {100 * r['gain']:+.2f} ± {100 * r['gain_se']:.2f}")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB) and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
