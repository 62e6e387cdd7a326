"""Tree-aware cost accounting: MACs and parameters per node and per anytime prefix.

FLOPs are reported as multiply-accumulates (MACs), the convention of the
anytime-inference literature (MSDNet, HNE): one multiply-add counts once.
Only convolutions (including the 1x1 "linear" layers) are counted;
BatchNorm folds into them at export and activations are free.

For a prefix of ``n`` leaves every shared node is counted once; an
independent ensemble of the same ``n`` networks pays for every path in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .hne import HNE

__all__ = ["NodeCost", "TreeCost", "tree_cost", "conv_macs"]


@dataclass(frozen=True)
class NodeCost:
    id: str
    macs: int
    params: int
    input_shape: tuple[int, ...]  # per sample, (C, H, W)
    output_shape: tuple[int, ...]  # per sample: (C, H, W), or (classes,) for leaves


@dataclass(frozen=True)
class TreeCost:
    """Costs of one model at one input size."""

    model: str
    input_shape: tuple[int, int, int]
    nodes: dict[str, NodeCost]
    path_macs: tuple[int, ...]  # per leaf, depth-first order
    prefix_macs: tuple[int, ...]  # index n-1: MACs of the first n leaves, shared nodes once
    independent_macs: tuple[int, ...]  # index n-1: MACs of the same n networks run separately
    params: int  # whole tree
    path_params: int  # one network (leaf 0's path)

    @property
    def total_macs(self) -> int:
        return self.prefix_macs[-1]

    @property
    def ratio(self) -> float:
        """R: cost of N independent networks / cost of the tree."""
        return self.independent_macs[-1] / self.prefix_macs[-1]

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "input_shape": list(self.input_shape),
            "mac_convention": "1 multiply-add = 1 MAC (FLOPs in the anytime-inference literature)",
            "params": self.params,
            "path_params": self.path_params,
            "path_macs": list(self.path_macs),
            "total_macs": self.total_macs,
            "ratio": self.ratio,
            "nodes": [
                {
                    "id": c.id,
                    "macs": c.macs,
                    "params": c.params,
                    "input_shape": list(c.input_shape),
                    "output_shape": list(c.output_shape),
                }
                for c in self.nodes.values()
            ],
            "anytime": [
                {"n": n + 1, "macs": self.prefix_macs[n], "independent_macs": self.independent_macs[n]}
                for n in range(len(self.prefix_macs))
            ],
        }


def conv_macs(conv: nn.Conv2d, output: torch.Tensor) -> int:
    """MACs of one sample through ``conv`` given its output."""
    kh, kw = conv.kernel_size
    per_output = (conv.in_channels // conv.groups) * kh * kw
    return int(output[0].numel()) * per_output


@torch.no_grad()
def tree_cost(model: HNE, input_size: int | tuple[int, int] | None = None) -> TreeCost:
    """Measure every node by running its standalone module on one sample."""
    config = model.config
    if input_size is None:
        h = w = config.input_size
    elif isinstance(input_size, int):
        h = w = input_size
    else:
        h, w = input_size
    tree = model.tree
    x_image = torch.zeros(1, config.in_chans, h, w)
    outputs: dict[str, torch.Tensor] = {}
    nodes: dict[str, NodeCost] = {}
    for node in tree.nodes:  # breadth-first: parents before children
        module = model.node_module(node.id).eval()
        x = x_image if node.parent is None else outputs[node.parent]
        macs = 0

        def hook(mod: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            nonlocal macs
            macs += conv_macs(mod, out)

        handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, nn.Conv2d)]
        y = module(x)
        for h_ in handles:
            h_.remove()
        if not node.is_leaf:
            outputs[node.id] = y
        nodes[node.id] = NodeCost(
            id=node.id,
            macs=macs,
            params=sum(p.numel() for p in module.parameters()),
            input_shape=tuple(x.shape[1:]),
            output_shape=tuple(y.shape[1:]),
        )
    path_macs = tuple(sum(nodes[n].macs for n in tree.path(leaf)) for leaf in range(tree.num_leaves))
    prefix, independent, running = [], [], 0
    for segment in tree.segments:
        running += sum(nodes[n].macs for n in segment.nodes)
        prefix.append(running)
        independent.append(sum(path_macs[: segment.leaf + 1]))
    return TreeCost(
        model=config.name,
        input_shape=(config.in_chans, h, w),
        nodes=nodes,
        path_macs=path_macs,
        prefix_macs=tuple(prefix),
        independent_macs=tuple(independent),
        params=sum(p.numel() for p in model.parameters()),
        path_params=sum(nodes[n].params for n in tree.path(0)),
    )


def _m(macs: int) -> str:
    return f"{macs / 1e6:,.2f}M"


def format_cost(cost: TreeCost, tree) -> str:
    """Human-readable per-node table and anytime cost curve."""
    lines = [
        f"{cost.model}: input {'x'.join(map(str, cost.input_shape))}, {tree.num_leaves} leaves, "
        f"branching {tree.branching}",
        f"params {cost.params:,} (one network: {cost.path_params:,})   "
        f"MACs one path {_m(cost.path_macs[0])}, whole tree {_m(cost.total_macs)}, R = {cost.ratio:.3f}",
        "(MACs: multiply-accumulates; 1 MAC = 1 FLOP in the anytime-inference literature)",
        "",
        f"{'node':<8} {'parent':<8} {'in':>14} {'out':>14} {'MACs':>12} {'params':>10}",
    ]
    for node in tree.nodes:
        c = cost.nodes[node.id]
        lines.append(
            f"{node.id:<8} {node.parent or 'image':<8} {'x'.join(map(str, c.input_shape)):>14} "
            f"{'x'.join(map(str, c.output_shape)):>14} {_m(c.macs):>12} {c.params:>10,}"
        )
    lines += ["", f"{'n':>3} {'HNE MACs':>12} {'independent':>12} {'saving':>7}"]
    for n, (tree_macs, ind_macs) in enumerate(zip(cost.prefix_macs, cost.independent_macs), start=1):
        lines.append(f"{n:>3} {_m(tree_macs):>12} {_m(ind_macs):>12} {ind_macs / tree_macs:>6.2f}x")
    return "\n".join(lines)
