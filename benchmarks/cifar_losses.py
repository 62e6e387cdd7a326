"""L^I vs L^D vs L^HD on real CIFAR-10, under both loss weightings, same budget, same seed, on a CPU or a GPU.

Each run is a plain `hne_edge.train.fit` run of the paper's CIFAR recipe (SGD 0.1, momentum 0.9,
cosine, batch 128, wd 5e-4) shortened to --epochs. Runs are named LOSS[@WEIGHTING][+NORMALIZE]
(``hierarchical`` uses the default ``paper`` weighting; ``hierarchical@mean-t2`` the hne-edge 0.1
convention; ``hierarchical+label`` the paper's objective divided by (1 - alpha), ``loss.normalize:
label``; see hne_edge/train/losses.py), or one of the CONTROLS below.

    # CPU, the slim 53k-parameter model of RESULTS.md, 8 epochs, three runs side by side:
    nice .venv/bin/python benchmarks/cifar_losses.py --epochs 8 --parallel \
        --runs independent distill hierarchical distill@mean-t2 hierarchical@mean-t2
    # CPU, three seeds, the paper's objective against L^I and against it divided by (1 - alpha) (RESULTS.md):
    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/cifar_losses.py --data pool40k.npz --test-data test10k.npz \
        --val-split 0 --limit 2500 --epochs 30 --seeds 0 1 2 --parallel --jobs 2 \
        --runs independent hierarchical hierarchical+label
    # GPU, the paper's model and schedule, scored on your own held-out test set:
    python benchmarks/cifar_losses.py --model hne_resnet_small --device cuda --epochs 200 --val-split 0 \
        --test-data cifar10_test.npz --parallel --threads 4

Each run is resumable (re-running continues from OUT/<run>/checkpoint.pt). Writes
OUT/{<run>/metrics.json, <run>/test_metrics.json, summary.md, *.png}; with --test-data the summary
is the paper's table (accuracy at 1/2/4/8/16 leaves) with the paper's figures beside it.
--parallel starts one process per run with --threads CPU threads each, so several runs can share
one machine or one GPU without starving each other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hne_edge.train.config import NORMALIZATIONS, WEIGHTINGS  # noqa: E402 - torch-free; the names a config accepts

# The slim model of RESULTS.md: (channels, stride, repeats) per tree block, 32 -> 16 -> 16 -> 8 -> 4 -> 4.
SLIM_BLOCKS = [[16, 2, 1], [16, 1, 1], [32, 2, 1], [32, 2, 1], [32, 1, 1]]
LOSSES = ("independent", "distill", "hierarchical")
# Controls for reading the comparison. With SGD and coupled weight decay, scaling the whole loss by c is the
# same run as lr * c and weight_decay / c, so each control is a plain run of the trainer:
# * independent_half: L^I alone at the weight the distilled runs give it, 0.5 * L^I (lr 0.05, wd 1e-3):
#   how much of their gap is only the halved label term;
# * hierarchical_full: L^I + 0.5 * L^HD(mean-t2) = 1.5 * (2/3 L^I + 1/3 L^HD) (alpha 1/3, lr 0.15, wd 3.33e-4):
#   distillation added on top of the full label term instead of taking half of it.
CONTROLS = {
    "independent_half": {"kind": "independent", "alpha": 0.5, "lr": 0.05, "weight_decay": 1e-3},
    "hierarchical_full": {"kind": "hierarchical", "alpha": 1 / 3, "lr": 0.15, "weight_decay": 5e-4 / 1.5,
                          "weighting": "mean-t2"},
}
# Ruiz & Verbeek (AAAI 2021), CIFAR, L^HD, test accuracy (%) at 1/2/4/8/16 leaves after 200 epochs.
PAPER = {
    ("cifar10", "hne_resnet_small"): (92.7, 93.1, 93.4, 94.1, 94.3),
    ("cifar100", "hne_resnet_small"): (71.1, 71.7, 73.4, 74.5, 75.3),
    ("cifar10", "hne_resnet"): (94.6, 94.9, 95.1, 95.5, 95.6),
    ("cifar100", "hne_resnet"): (76.1, 77.2, 78.0, 79.0, 79.8),
}


def run_spec(name: str) -> dict:
    """The loss settings of run ``name`` (LOSS[@WEIGHTING][+NORMALIZE] or a control)."""
    if name in CONTROLS:
        return {"weighting": "paper", "normalize": "none", **CONTROLS[name]}
    rest, _, normalize = name.partition("+")
    kind, _, weighting = rest.partition("@")
    if kind not in LOSSES or (weighting and weighting not in WEIGHTINGS) or (normalize and normalize not in NORMALIZATIONS):
        raise SystemExit(f"run {name!r}: expected LOSS[@WEIGHTING][+NORMALIZE] with LOSS in {LOSSES}, WEIGHTING in "
                         f"{WEIGHTINGS} and NORMALIZE in {NORMALIZATIONS}, or a control in {tuple(CONTROLS)}")
    return {"kind": kind, "alpha": 0.5, "lr": 0.1, "weight_decay": 5e-4, "weighting": weighting or "paper",
            "normalize": normalize or "none"}


def run_one(name: str, args: argparse.Namespace) -> dict:
    import torch

    from hne_edge.train.config import TrainConfig
    from hne_edge.train.engine import fit
    from hne_edge.train.evaluation import evaluate_checkpoint

    torch.set_num_threads(args.threads)
    out = Path(args.out) / name
    run = run_spec(name)
    model = {"name": "hne_tiny", "overrides": {"blocks": SLIM_BLOCKS}} if args.model == "slim" else {"name": args.model}
    config = TrainConfig.from_dict({
        "data": {"name": "npz", "data_dir": str(args.data), "val_split": args.val_split, "limit": args.limit},
        "model": model,
        "loss": {"kind": run["kind"], "alpha": run["alpha"], "temperature": 2.0, "weighting": run["weighting"],
                 "normalize": run["normalize"]},
        "optim": {"epochs": args.epochs, "batch_size": 128, "lr": run["lr"], "momentum": 0.9,
                  "weight_decay": run["weight_decay"], "schedule": "cosine"},
        "seed": args.seed, "out": str(out), "threads": args.threads, "quiet": False, "device": args.device,
        "eval_every": max(1, args.epochs // 4),
    })
    start = time.time()
    done = (out / "checkpoint.pt").exists()
    fit(config, resume=done)
    wall = time.time() - start
    metrics = None
    if args.val_split > 0:
        metrics = evaluate_checkpoint(out / "checkpoint.pt", out, device=args.device)
        metrics["train_wall_s"] = wall
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if args.test_data:
        test = evaluate_checkpoint(out / "checkpoint.pt", out / "test", test_data=args.test_data, device=args.device)
        test["train_wall_s"] = wall
        (out / "test_metrics.json").write_text(json.dumps(test, indent=1))
        metrics = metrics or test
    return metrics


def _table(runs: list[str], results: list[dict], paper: tuple | None, what: str) -> list[str]:
    sizes = [n for n in (1, 2, 4, 8, 16) if n <= results[0]["num_leaves"]]
    head = "| run | " + " | ".join(f"n={n}" for n in sizes) + " | std n=16 | mean leaf |"
    lines = [f"{what}: accuracy (%) of the first n leaves", "", head, "|---" * (len(sizes) + 3) + "|"]
    for name, r in zip(runs, results):
        acc = {row["n"]: row["accuracy"] for row in r["anytime"]}
        leaf = sum(x["accuracy"] for x in r["leaves"]) / len(r["leaves"])
        lines.append(f"| {name} | " + " | ".join(f"{100 * acc[n]:.2f}" for n in sizes)
                     + f" | {r['anytime'][-1]['diversity']:.3f} | {100 * leaf:.2f} |")
    if paper:
        lines.append("| paper, L^HD, 200 epochs | " + " | ".join(f"{v:.1f}" for v in paper[: len(sizes)]) + " | | |")
    return lines


def summarize(args: argparse.Namespace) -> None:
    from hne_edge.plots import plot_metrics

    out = Path(args.out)
    lines = []
    for file, what in (("metrics.json", "validation split"), ("test_metrics.json", f"test set {args.test_data}")):
        have = [name for name in args.runs if (out / name / file).exists()]
        if not have:
            continue
        results = [json.loads((out / name / file).read_text()) for name in have]
        paper = PAPER.get(("cifar100" if results[0]["num_classes"] == 100 else "cifar10", args.model)) \
            if file == "test_metrics.json" else None
        epochs = sorted({r.get("epoch") for r in results})
        lines += _table(have, results, paper, f"{what}, {results[0]['num_images']} images, epochs {epochs}") + [""]
        if file == "metrics.json":
            plot_metrics(results, out, labels=have)
    walls = [json.loads((out / n / "metrics.json").read_text()).get("train_wall_s") for n in args.runs
             if (out / n / "metrics.json").exists()]
    if walls:
        lines.append("train wall time (s): " + ", ".join(f"{w:.0f}" for w in walls if w))
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    print(text)


def summarize_seeds(args: argparse.Namespace, seeds: list[int]) -> None:
    """OUT/summary.md: every run's accuracy at n = 1, 2, 4, 8, 16 as mean ± std across seeds, then per seed."""
    out = Path(args.out)
    lines = []
    for file, what in (("metrics.json", "validation split"), ("test_metrics.json", f"test set {args.test_data}")):
        found = {(name, seed): json.loads((out / f"seed{seed}" / name / file).read_text())
                 for name in args.runs for seed in seeds if (out / f"seed{seed}" / name / file).exists()}
        if not found:
            continue
        first = next(iter(found.values()))
        sizes = [n for n in (1, 2, 4, 8, 16) if n <= first["num_leaves"]]

        def acc(r: dict, n: int) -> float:
            return 100 * next(row["accuracy"] for row in r["anytime"] if row["n"] == n)

        lines += [f"{what}, {first['num_images']} images: accuracy (%) of the first n leaves, mean ± std across seeds "
                  "(sample std, n - 1)", "",
                  "| run | seeds | " + " | ".join(f"n={n}" for n in sizes) + " |", "|---" * (len(sizes) + 2) + "|"]
        for name in args.runs:
            have = [found[name, seed] for seed in seeds if (name, seed) in found]
            if not have:
                continue
            cells = []
            for n in sizes:
                values = [acc(r, n) for r in have]
                mean = sum(values) / len(values)
                std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else float("nan")
                cells.append(f"{mean:.2f} ± {std:.2f}")
            lines.append(f"| {name} | {len(have)} | " + " | ".join(cells) + " |")
        lines += ["", "per seed:", "", "| run | seed | " + " | ".join(f"n={n}" for n in sizes) + " | std n=16 | epoch |",
                  "|---" * (len(sizes) + 4) + "|"]
        for (name, seed), r in found.items():
            lines.append(f"| {name} | {seed} | " + " | ".join(f"{acc(r, n):.2f}" for n in sizes)
                         + f" | {r['anytime'][-1]['diversity']:.3f} | {r.get('epoch')} |")
        lines.append("")
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "cifar10_train.npz"))
    p.add_argument("--test-data", default=None, help="an .npz test set (x: N,H,W,C uint8; y: N) to score every run on")
    p.add_argument("--model", default="slim", help="slim (53k-parameter hne_tiny, CPU budgets) or a zoo model")
    p.add_argument("--device", default="cpu", help="cpu | cuda[:i] | auto")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=None, help="the seed of every run (default 0); writes OUT/<run>")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="repeat every run for each seed (weights, training subset, batches): OUT/seed<S>/<run>, "
                        "and OUT/summary.md with the mean ± std across seeds")
    p.add_argument("--val-split", type=float, default=0.1, help="held out of --data for validation (0: none)")
    p.add_argument("--limit", type=int, default=None, help="train on this many of the training images")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--out", default=str(REPO / "runs" / "cifar_losses"))
    p.add_argument("--runs", "--losses", nargs="+", default=list(LOSSES),
                   help=f"LOSS[@WEIGHTING][+NORMALIZE] (LOSS in {LOSSES}, WEIGHTING in {WEIGHTINGS}, NORMALIZE in "
                        f"{NORMALIZATIONS}), or {tuple(CONTROLS)}")
    p.add_argument("--parallel", action="store_true", help="one process per run (--threads each)")
    p.add_argument("--jobs", type=int, default=None, help="with --parallel: at most this many runs at once (default: all)")
    p.add_argument("--summary-only", action="store_true")
    args = p.parse_args()
    for name in args.runs:
        run_spec(name)
    if args.val_split <= 0 and not args.test_data:
        raise SystemExit("--val-split 0 needs --test-data: otherwise nothing would be evaluated")
    if args.seed is not None and args.seeds is not None:
        raise SystemExit("--seed and --seeds contradict each other: give one")
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"--jobs: received {args.jobs}; expected >= 1")
    seeds = args.seeds or [args.seed or 0]

    def for_seed(seed: int) -> argparse.Namespace:  # one seed's runs: OUT/<run>, or OUT/seed<S>/<run> under --seeds
        out = Path(args.out) / f"seed{seed}" if args.seeds else Path(args.out)
        return argparse.Namespace(**{**vars(args), "seed": seed, "out": str(out)})

    if not args.summary_only:
        tasks = [(seed, name) for seed in seeds for name in args.runs]
        if args.parallel and len(tasks) > 1:
            base = [sys.executable, __file__, "--data", args.data, "--epochs", str(args.epochs),
                    "--threads", str(args.threads), "--model", args.model, "--device", args.device,
                    "--val-split", str(args.val_split)]
            base += ["--limit", str(args.limit)] if args.limit else []
            base += ["--test-data", args.test_data] if args.test_data else []

            def launch(task: tuple[int, str]) -> int:
                seed, name = task
                out = Path(for_seed(seed).out)
                out.mkdir(parents=True, exist_ok=True)
                # beside the run folder, not in it: training takes only an empty folder or a run to resume
                with open(out / f"{name}.log", "a") as log:
                    return subprocess.call(base + ["--seed", str(seed), "--out", str(out), "--runs", name],
                                           stdout=log, stderr=subprocess.STDOUT)

            with ThreadPoolExecutor(args.jobs or len(tasks)) as pool:  # threads only wait on the processes
                codes = list(pool.map(launch, tasks))
            if any(codes):
                failed = [f"{Path(for_seed(seed).out) / name}.log" for (seed, name), c in zip(tasks, codes) if c]
                sys.exit(f"a run failed: exit codes {dict(zip(tasks, codes))}; see {', '.join(failed)}")
        else:
            for seed, name in tasks:
                run_one(name, for_seed(seed))
    for seed in seeds:
        if Path(for_seed(seed).out).is_dir():
            summarize(for_seed(seed))
    if args.seeds:
        summarize_seeds(args, seeds)


if __name__ == "__main__":
    main()
