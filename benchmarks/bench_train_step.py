"""Training step time: the fused grouped HNE vs per-node execution of the same tree.

Both paths hold the same weights and compute the same leaf logits:

* fused: ``HNE.forward``, one grouped-convolution network for the whole tree
  (what ``hne_edge.train.fit`` uses);
* per-node: every tree node as its own module (``HNE.node_module``), run
  breadth-first so each node runs once on its parent's activation, leaves
  stacked in depth-first order.

One step = forward, hierarchical loss (L^I + L^HD), backward, SGD update.
Steps of the two paths alternate, so background load hits both alike; we
report the median of ``--steps`` timed steps after ``--warmup`` untimed ones.

    nice .venv/bin/python benchmarks/bench_train_step.py --model hne_resnet_small --batch 128 --threads 2
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hne_edge.models import create_model  # noqa: E402
from hne_edge.train.losses import hne_loss  # noqa: E402


class PerNodeHNE(nn.Module):
    """The tree as separate node modules, evaluated breadth-first (each node once)."""

    def __init__(self, fused) -> None:
        super().__init__()
        self.tree = fused.tree
        self.nodes = nn.ModuleDict({n.id.replace(".", "_"): fused.node_module(n.id) for n in self.tree.nodes})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts: dict[str, torch.Tensor] = {}
        logits: dict[str, torch.Tensor] = {}
        for node in self.tree.nodes:  # breadth-first: parents before children
            y = self.nodes[node.id.replace(".", "_")](x if node.parent is None else acts[node.parent])
            (logits if node.is_leaf else acts)[node.id] = y
        return torch.stack([logits[leaf] for leaf in self.tree.leaf_order], dim=1)  # (B, N, classes)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hne_resnet_small")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="append the markdown result to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fused = create_model(args.model)
    per_node = PerNodeHNE(fused)
    size = fused.config.input_size
    x = torch.randn(args.batch, fused.config.in_chans, size, size)
    y = torch.randint(0, fused.config.num_classes, (args.batch,))
    with torch.no_grad():  # same function, else the comparison means nothing
        diff = (fused.eval()(x[:8]) - per_node.eval()(x[:8])).abs().max().item()
    assert diff < 1e-4, f"per-node logits differ from fused by {diff}"
    paths = {"fused": fused.train(), "per-node": per_node.train()}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in paths.items()}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(args.warmup + args.steps):
        for name, model in paths.items():
            start = time.perf_counter()
            loss = hne_loss("hierarchical", model(x), y, fused.tree)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            opts[name].step()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"### Training step, {args.model}, batch {args.batch}, {fused.config.input_size}x{fused.config.input_size}",
        "",
        f"Machine: {_cpu_name()}, {os.cpu_count()} cores (shared), torch {torch.__version__}, "
        f"{args.threads} threads, load average at the end {load:.1f}. One step = forward + L^I/L^HD loss + backward + SGD. "
        f"Median of {args.steps} steps after {args.warmup} warm-up, the two paths alternating.",
        "",
        "| path | median step (s) | min (s) | max (s) | images/s |",
        "|---|---|---|---|---|",
    ]
    for name in paths:
        v = times[name]
        lines.append(f"| {name} | {med[name]:.3f} | {min(v):.3f} | {max(v):.3f} | {args.batch / med[name]:.0f} |")
    lines += ["", f"per-node / fused = {med['per-node'] / med['fused']:.2f}x; logits agree to {diff:.1e}.", ""]
    text = "\n".join(lines)
    print(text)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + f"\nCommand: `nice .venv/bin/python {' '.join(sys.argv)}`\n\n")


if __name__ == "__main__":
    main()
