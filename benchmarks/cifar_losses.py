"""L^I vs L^D vs L^HD on real CIFAR-10 (45k train / 5k validation), same budget, same seed, on a CPU.

Reproduces the "accuracy vs n" comparison of RESULTS.md. The model is a slimmed
hne_tiny (16-leaf binary HNE; strides chosen so it trains at ~0.2 s per batch of
128 on one CPU core); the schedule is the paper's CIFAR recipe (SGD 0.1, momentum 0.9,
cosine, batch 128, wd 5e-4) shortened to --epochs.

    nice .venv/bin/python benchmarks/cifar_losses.py --epochs 8 --parallel

Each run is resumable (re-running continues from runs/cifar_losses/<loss>/checkpoint.pt).
Writes runs/cifar_losses/{<loss>/metrics.json, summary.md, *.png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (channels, stride, repeats) per tree block: 32 -> 16 -> 16 -> 8 -> 4 -> 4 spatial sizes.
BLOCKS = [[16, 2, 1], [16, 1, 1], [32, 2, 1], [32, 2, 1], [32, 1, 1]]
LOSSES = ("independent", "distill", "hierarchical")
# Controls for reading the comparison. With SGD and coupled weight decay, scaling the whole loss by c is the
# same run as lr * c and weight_decay / c, so each control is a plain run of the trainer:
# * independent_half: L^I alone at the weight the distilled runs give it, 0.5 * L^I (lr 0.05, wd 1e-3):
#   how much of their gap is only the halved label term;
# * hierarchical_full: L^I + 0.5 * L^HD = 1.5 * (2/3 L^I + 1/3 L^HD) (alpha 1/3, lr 0.15, wd 3.33e-4):
#   distillation added on top of the full label term instead of taking half of it.
CONTROLS = {
    "independent_half": {"kind": "independent", "alpha": 0.5, "lr": 0.05, "weight_decay": 1e-3},
    "hierarchical_full": {"kind": "hierarchical", "alpha": 1 / 3, "lr": 0.15, "weight_decay": 5e-4 / 1.5},
}


def run_one(loss: str, args: argparse.Namespace) -> dict:
    import torch

    from hne_edge.train.config import TrainConfig
    from hne_edge.train.engine import fit
    from hne_edge.train.evaluation import evaluate_checkpoint

    torch.set_num_threads(args.threads)
    out = Path(args.out) / loss
    run = CONTROLS.get(loss, {"kind": loss, "alpha": 0.5, "lr": 0.1, "weight_decay": 5e-4})
    config = TrainConfig.from_dict({
        "data": {"name": "npz", "data_dir": str(args.data), "val_split": 0.1, "limit": args.limit},
        "model": {"name": "hne_tiny", "overrides": {"blocks": BLOCKS}},
        "loss": {"kind": run["kind"], "alpha": run["alpha"], "temperature": 2.0},
        "optim": {"epochs": args.epochs, "batch_size": 128, "lr": run["lr"], "momentum": 0.9,
                  "weight_decay": run["weight_decay"], "schedule": "cosine"},
        "seed": args.seed, "out": str(out), "threads": args.threads, "quiet": False,
    })
    start = time.time()
    done = (out / "checkpoint.pt").exists()
    fit(config, resume=done)
    metrics = evaluate_checkpoint(out / "checkpoint.pt", out)
    metrics["train_wall_s"] = time.time() - start
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def summarize(args: argparse.Namespace) -> None:
    from hne_edge.train.evaluation import plot_metrics

    runs = [json.loads((Path(args.out) / loss / "metrics.json").read_text()) for loss in args.losses]
    plot_metrics(runs, args.out, labels=list(args.losses))
    n_all = [r["n"] for r in runs[0]["anytime"]]
    epochs = sorted({r.get("epoch") for r in runs})
    lines = [f"Epochs trained: {', '.join(map(str, epochs))} (of --epochs {args.epochs}); {runs[0]['num_images']} validation images.", "",
             "| n | MMACs | " + " | ".join(f"acc {l}" for l in args.losses) + " | " + " | ".join(f"std {l}" for l in args.losses) + " |",
             "|---" * (2 + 2 * len(runs)) + "|"]
    for i, n in enumerate(n_all):
        lines.append(f"| {n} | {runs[0]['anytime'][i]['macs'] / 1e6:.2f} | "
                     + " | ".join(f"{100 * r['anytime'][i]['accuracy']:.2f}" for r in runs) + " | "
                     + " | ".join(f"{r['anytime'][i]['diversity']:.3f}" for r in runs) + " |")
    lines += ["", "| loss | NLL n=1 | NLL n=16 | ECE n=1 | ECE n=16 | mean leaf acc | wall (s) |", "|---|---|---|---|---|---|---|"]
    for loss, r in zip(args.losses, runs):
        leaf = sum(x["accuracy"] for x in r["leaves"]) / len(r["leaves"])
        a = r["anytime"]
        lines.append(f"| {loss} | {a[0]['nll']:.3f} | {a[-1]['nll']:.3f} | {a[0]['ece']:.3f} | {a[-1]['ece']:.3f} | "
                     f"{100 * leaf:.2f} | {r.get('train_wall_s', float('nan')):.0f} |")
    text = "\n".join(lines)
    (Path(args.out) / "summary.md").write_text(text + "\n")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "cifar10_train.npz"))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="train on this many of the 45k training images")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(REPO / "runs" / "cifar_losses"))
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES + tuple(CONTROLS))
    p.add_argument("--parallel", action="store_true", help="one process per loss (1 thread each)")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--eval-only", action="store_true",
                   help="evaluate the runs' current checkpoints (whatever epoch they reached) and summarise")
    args = p.parse_args()
    if args.eval_only:
        from hne_edge.train.evaluation import evaluate_checkpoint

        for loss in args.losses:
            evaluate_checkpoint(Path(args.out) / loss / "checkpoint.pt", Path(args.out) / loss)
    elif not args.summary_only:
        if args.parallel and len(args.losses) > 1:
            base = [sys.executable, __file__, "--data", args.data, "--epochs", str(args.epochs), "--seed", str(args.seed),
                    "--threads", str(args.threads), "--out", args.out]
            if args.limit:
                base += ["--limit", str(args.limit)]
            procs = []
            for loss in args.losses:
                Path(args.out, loss).mkdir(parents=True, exist_ok=True)
                log = open(Path(args.out, loss, "stdout.log"), "a")
                procs.append(subprocess.Popen(base + ["--losses", loss], stdout=log, stderr=subprocess.STDOUT))
            codes = [proc.wait() for proc in procs]
            if any(codes):
                sys.exit(f"a run failed: exit codes {dict(zip(args.losses, codes))}")
        else:
            for loss in args.losses:
                run_one(loss, args)
    if len(args.losses) > 1 or args.summary_only or args.eval_only:
        summarize(args)


if __name__ == "__main__":
    main()
