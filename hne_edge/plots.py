"""Pictures the tool makes of itself (matplotlib, imported lazily; torch-free)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .tree import TreeSpec

__all__ = ["plot_tree"]


def plot_tree(
    tree: TreeSpec,
    path: str | os.PathLike,
    node_macs: Mapping[str, int] | None = None,
    title: str | None = None,
) -> Path:
    """Draw the tree: blocks left to right, leaves numbered in depth-first (anytime) order.

    The first leaf's path is highlighted: it is what a one-leaf anytime answer costs.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = tree.num_leaves
    y = {}
    for node in tree.nodes:  # a node sits at the middle of the leaves below it
        y[node.id] = -(node.leaves[0] + node.leaves[-1]) / 2
    first = set(tree.path(0))
    fig, ax = plt.subplots(figsize=(2.0 + 1.6 * tree.num_blocks, 1.0 + 0.32 * n))
    ax.plot([-0.8], [-(n - 1) / 2], marker="s", color="0.3", markersize=10)
    ax.annotate("image", (-0.8, -(n - 1) / 2), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8)
    for node in tree.nodes:
        px, py = (node.depth - 1, y[node.parent]) if node.parent else (-0.8, -(n - 1) / 2)
        on_first = node.id in first
        ax.plot([px, node.depth], [py, y[node.id]], color="tab:red" if on_first else "0.6", lw=2 if on_first else 1, zorder=1)
    for node in tree.nodes:
        on_first = node.id in first
        ax.scatter([node.depth], [y[node.id]], s=60, color="tab:red" if on_first else "tab:blue", zorder=2)
        label = node.id
        if node_macs is not None:
            label += f"\n{node_macs[node.id] / 1e6:.2f}M"
        if node.is_leaf:
            ax.annotate(f"leaf {node.leaves[0] + 1}", (node.depth, y[node.id]), textcoords="offset points",
                        xytext=(8, -3), fontsize=7)
        elif len(node.leaves) >= n / 2 or tree.num_blocks <= 3:
            ax.annotate(label, (node.depth, y[node.id]), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    ax.set_xticks(range(tree.num_blocks), [f"block {d}\n{tree.width(d)} node{'s' if tree.width(d) > 1 else ''}"
                                           for d in range(tree.num_blocks)], fontsize=8)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(-1.2, tree.num_blocks - 0.2)
    ax.set_title(title or f"HNE tree, branching {tree.branching}: {n} networks; red = the first leaf's path", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
