"""The fused HNE model and its per-node / per-segment views.

``HNE`` runs every branch of a block at once with grouped convolutions
(see :mod:`hne_edge.models.layers`). At each split the feature maps are
replicated along channels and the number of branches multiplies by the
block's branching factor.

``HNE.node_module(id)`` cuts one tree node out as a standalone module with
only that node's weights; chaining node modules along a path reproduces the
fused model's logits for that leaf. ``HNE.subtree_module(root)`` cuts out a
whole subtree, still fused (grouped convolutions over its branches), and
``HNE.unit_module(i)`` is unit ``i`` of plan "subtrees". Exporters and the
PyTorch runtime backend use these views; the trainer uses the fused model.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..limits import check_memory
from ..tree import Segment, SubtreeUnit
from .configs import HNEConfig, MobileNetV2HNEConfig, ResNetHNEConfig, config_from_dict
from .layers import copy_branch_weights, replicate_branches

__all__ = [
    "HNEConfig",
    "ResNetHNEConfig",
    "MobileNetV2HNEConfig",
    "HNE",
    "NodeModule",
    "SegmentModule",
    "SubtreeModule",
    "config_from_dict",
    "model_weight_bytes",
]


class HNE(nn.Module):
    """A Hierarchical Neural Ensemble, fused: one grouped network for the whole tree.

    ``forward(x)`` returns the logits of every leaf, ``(batch, N, classes)``,
    in depth-first leaf order.
    """

    def __init__(self, config: HNEConfig) -> None:
        super().__init__()
        check_memory(model_weight_bytes(config), f"{config.name}'s weights",  # before one weight is allocated
                     hint="ask for a smaller model (fewer classes, narrower or fewer blocks) or free memory")  # fmt: skip
        self.config = config
        self.tree = config.tree
        self.blocks, self.head = _build_parts(config)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                if m.bias is not None:  # classifier / fc layers
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.zeros_(m.bias)
                else:
                    # torch's fan_out of a grouped convolution counts every branch's outputs: a block of 2^d branches
                    # starts 2^(-d/2) the scale of its path built alone. A BatchNorm follows each such convolution (the
                    # function is the same), but SGD's first steps are ~2^d larger against the deeper weights. Kept:
                    # on digits (15 epochs, 2 seeds) it beat a per-branch fan_out at n = 1 and 16; CIFAR unmeasured.
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def num_leaves(self) -> int:
        return self.tree.num_leaves

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = 1
        for depth, block in enumerate(self.blocks):
            factor = self.tree.branching[depth]
            x = replicate_branches(x, branches, factor)  # (B, branches*factor*C, H, W)
            branches *= factor
            x = block(x)
        return self.head(x)  # (B, N, classes)

    # -- per-node views ----------------------------------------------------
    def node_module(self, node_id: str) -> "NodeModule":
        """Standalone module for one tree node, weights sliced (copied) from the fused model."""
        node = self.tree.node(node_id)
        block = copy_branch_weights(self.blocks[node.depth], self.config.build_block(node.depth, 1), node.index)
        head = copy_branch_weights(self.head, self.config.build_head(1), node.index) if node.is_leaf else None
        return self._like_self(NodeModule(node_id, block, head))

    def _like_self(self, module: nn.Module) -> nn.Module:
        """A view built (in float32, on the CPU) as this model is: its device, dtype (a float64 or bfloat16 model's
        views ran float32 weights on its activations) and train/eval mode."""
        param = next(self.parameters())
        return module.to(device=param.device, dtype=param.dtype).train(self.training)

    def node_modules(self) -> dict[str, "NodeModule"]:
        return {node.id: self.node_module(node.id) for node in self.tree.nodes}

    def path_module(self, leaf: int) -> nn.Sequential:
        """One network of the ensemble (root to leaf ``leaf``) as a plain ``nn.Sequential``."""
        return nn.Sequential(*(self.node_module(nid) for nid in self.tree.path(leaf)))

    def segment_module(self, segment: Segment | int) -> "SegmentModule":
        """The chain of nodes leaf ``segment`` adds in depth-first order, as one module."""
        if isinstance(segment, int):
            segment = self.tree.segments[segment]
        return SegmentModule(segment, [self.node_module(nid) for nid in segment.nodes])

    def subtree_module(self, root: str) -> "SubtreeModule":
        """The whole subtree under node ``root``, fused: its parent's activation in, its leaves' logits out.

        The nodes of a subtree are a contiguous range of branches in every block below it (``root.index * w``
        .. ``(root.index + 1) * w - 1`` for ``w`` of its nodes in that block), so each block is the fused
        block built for ``w`` branches with those rows of the weights (:func:`copy_branch_weights`).
        """
        node = self.tree.node(root)
        blocks, width = [], 1
        for depth in range(node.depth, self.tree.num_blocks):
            width *= 1 if depth == node.depth else self.tree.branching[depth]
            blocks.append(copy_branch_weights(self.blocks[depth], self.config.build_block(depth, width), node.index))
        head = copy_branch_weights(self.head, self.config.build_head(width), node.index)
        return self._like_self(SubtreeModule(self.tree.branching, node.depth, blocks, head))

    def unit_module(self, unit: SubtreeUnit | int) -> nn.Module:
        """Unit ``unit`` of plan "subtrees" (``tree.subtree_units``): leaf 0's chain with its exports (a
        :class:`SegmentModule`), or a later unit's :meth:`subtree_module`. Both return a tuple of outputs."""
        if isinstance(unit, int):
            unit = self.tree.subtree_units[unit]
        if unit.index == 0:
            chain = Segment(leaf=0, nodes=unit.nodes, input=None, exports=unit.exports)
            return SegmentModule(chain, [self.node_module(nid) for nid in unit.nodes])
        return self.subtree_module(unit.root)


def _build_parts(config: HNEConfig) -> tuple[nn.ModuleList, nn.Module]:
    """The fused blocks (one per depth, every branch of it) and the head of all leaves."""
    tree = config.tree
    blocks = nn.ModuleList(config.build_block(depth, tree.width(depth)) for depth in range(tree.num_blocks))
    return blocks, config.build_head(tree.num_leaves)


@functools.lru_cache(maxsize=32)
def _weight_bytes(config: HNEConfig) -> int:
    with torch.device("meta"):  # shapes only: nothing is allocated (and no normal_ init, slow on meta)
        blocks, head = _build_parts(config)
    return sum(t.numel() * t.element_size() for m in (blocks, head) for t in (*m.parameters(), *m.buffers()))


def model_weight_bytes(config: HNEConfig) -> int:
    """Bytes of every parameter and buffer of ``HNE(config)``, counted without allocating them."""
    try:
        return _weight_bytes(config)
    except TypeError:  # an unhashable config (a list where a tuple belongs): count without the cache
        return _weight_bytes.__wrapped__(config)


class NodeModule(nn.Module):
    """One tree node: parent activation (or image) in, activation out; leaves output logits ``(B, classes)``."""

    def __init__(self, node_id: str, block: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.node_id = node_id
        self.block = block
        self.head = head

    @property
    def is_leaf(self) -> bool:
        return self.head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(x)
        return x if self.head is None else self.head(x)[:, 0]


class SegmentModule(nn.Module):
    """A chain of node modules run as one call.

    Returns a tuple: the activations of ``segment.exports`` (in that order),
    then the leaf's logits.
    """

    def __init__(self, segment: Segment, nodes: list[NodeModule]) -> None:
        super().__init__()
        self.segment = segment
        self.nodes = nn.ModuleList(nodes)
        self._export_at = [i for i, nid in enumerate(segment.nodes) if nid in segment.exports]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = []
        for i, node in enumerate(self.nodes):
            x = node(x)
            if i in self._export_at:
                outputs.append(x)
        outputs.append(x)
        return tuple(outputs)


class SubtreeModule(nn.Module):
    """A subtree of the fused model as one module: ``forward(x)`` returns ``(logits,)``, logits of shape
    ``(B, leaves, classes)`` in depth-first order (the fused model's head layout).

    ``x`` is the activation of the root's parent (one branch), or the image for a root in block 0.
    """

    def __init__(self, branching: tuple[int, ...], depth: int, blocks: list[nn.Module], head: nn.Module) -> None:
        super().__init__()
        self.factors = (1,) + tuple(branching[depth + 1 :])  # the root itself is one branch
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        branches = 1
        for factor, block in zip(self.factors, self.blocks):
            x = replicate_branches(x, branches, factor)  # (B, branches*factor*C, H, W)
            branches *= factor
            x = block(x)
        return (self.head(x),)  # (B, leaves, classes)
