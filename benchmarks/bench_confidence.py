"""Confidence stop (issue 5, item 6): what ``Agreement`` saves in leaves/latency and costs in accuracy.

    .venv/bin/python benchmarks/bench_confidence.py --out benchmarks/results/runtime_confidence.md

Trains hne_tiny on the bundled digits (``hne-edge train``, default recipe)
unless ``--checkpoint`` is given, exports it (ONNX segments, batch 1), and
on the held-out validation split runs every frame (batch 1) through the
full tree once: each rule's stop point is then replayed exactly on those
leaf logits (a rule sees the same logits the scheduler would give it), and
the real latency of ``run(x, stop_when=rule)`` is measured on every frame.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "hne_bench_confidence"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.checkpoint) if args.checkpoint else work / "train" / "checkpoint.pt"
    if not ckpt.exists():
        subprocess.run([sys.executable, "-m", "hne_edge", "train", "--out", str(work / "train")], check=True)

    from hne_edge.exporters import export_onnx
    from hne_edge.runtime import Agreement, AnytimeRunner
    from hne_edge.train.checkpoint import model_from_checkpoint
    from hne_edge.train.config import TrainConfig
    from hne_edge.train.data import load_data

    model, state = model_from_checkpoint(ckpt)
    bundle = work / "bundle"
    if not (bundle / "manifest.json").exists():
        export_onnx(model, bundle, class_names=state["class_names"], normalization=state["normalization"],
                    plan="segments", batch=(1, 1, 1), torch_weights=False, force=True)
    cfg = TrainConfig.from_dict(state["config"])
    data = load_data(cfg.data, seed=cfg.seed)
    val = data.val
    images = val.images.permute(0, 2, 3, 1).numpy()  # N, H, W, C uint8
    labels = val.labels.numpy()

    rules = {
        "Agreement(min_leaves=2)": Agreement(min_leaves=2),
        "Agreement(min_leaves=3)": Agreement(min_leaves=3),
        "Agreement(min_leaves=4)": Agreement(min_leaves=4),
        "Agreement(min_leaves=2, margin=0.5)": Agreement(min_leaves=2, margin=0.5),
        "Agreement(min_leaves=4, vote=0.75, margin=0.3)": Agreement(min_leaves=4, vote=0.75, margin=0.3),
    }
    with AnytimeRunner(bundle, threads=args.threads, load_profile=False) as runner:
        N = runner.num_leaves
        xs = [runner.preprocess(im) for im in images]
        all_ll = np.stack([runner.run(x).leaf_logits[:, 0] for x in xs])  # (frames, N, C)
        prefix_pred = (np.cumsum(all_ll, axis=1)).argmax(-1)  # (frames, N): prediction of the first n leaves
        acc_n = (prefix_pred == labels[:, None]).mean(0)
        rows = []
        t_full = []
        for name, rule in rules.items():
            used = np.full(len(xs), N)
            for f in range(len(xs)):
                for i in range(1, N):
                    if rule(all_ll[f, :i, None]):
                        used[f] = i
                        break
            acc = float((prefix_pred[np.arange(len(xs)), used - 1] == labels).mean())
            times = []
            for k, x in enumerate(xs):  # real latency, interleaved with the full tree
                t0 = time.perf_counter()
                r = runner.run(x, stop_when=rule)
                times.append(time.perf_counter() - t0)
                assert r.leaves == used[k]
                t0 = time.perf_counter()
                runner.run(x)
                t_full.append(time.perf_counter() - t0)
            mean_leaves = float(used.mean())
            n_same = int(round(mean_leaves))
            rows.append((name, mean_leaves, acc, float(np.mean(times)) * 1e3, float(np.median(times)) * 1e3, n_same, float(acc_n[n_same - 1])))
    full_ms = float(np.mean(t_full)) * 1e3
    lines = [
        "## Confidence stop (issue 5): Agreement on a trained hne_tiny (digits)",
        "",
        f"`python benchmarks/bench_confidence.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}` - checkpoint {ckpt.name} "
        f"(hne-edge train default recipe), {len(xs)} validation frames, batch 1, ONNX Runtime CPU, threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.1f}. Full tree: {N} leaves, accuracy {acc_n[-1]:.4f}, mean {full_ms:.2f} ms. "
        f"Fixed-n accuracy: " + ", ".join(f"n={n + 1}: {acc_n[n]:.4f}" for n in (0, 1, 3, 7, 15)) + ".",
        "",
        "| rule | mean leaves | accuracy | Δ vs full | mean ms | median ms | fixed n≈mean: accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, ml, acc, mean_ms, med_ms, n_same, acc_same in rows:
        lines.append(f"| {name} | {ml:.2f} | {acc:.4f} | {acc - acc_n[-1]:+.4f} | {mean_ms:.2f} ({mean_ms / full_ms:.0%} of full) | {med_ms:.2f} | n={n_same}: {acc_same:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
