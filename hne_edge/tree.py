"""The tree spec: the single source of truth for the shape of an HNE.

An HNE has B+1 blocks. Block ``d`` is evaluated by ``branching[0] * ... *
branching[d]`` parallel nodes; each node of block ``d-1`` feeds
``branching[d]`` children of block ``d``. The image is the (virtual) parent
of the block-0 nodes, so ``branching[0] > 1`` gives a forest: the
independent-ensemble baseline.

    hne          = TreeSpec((1, 2, 2, 2, 2))   # shared root, binary splits, 16 leaves
    independent  = TreeSpec((16, 1, 1, 1, 1)) # 16 separate networks
    multi_branch = TreeSpec((1, 1, 1, 16, 1)) # shared backbone, 16 heads

Node ids are ``"b{depth}.{index}"``; node ``(d, i)`` has parent
``(d-1, i // branching[d])``. Visiting children in index order makes the
depth-first leaf order equal to the index order of the last block, so the
first leaf is always ``b{B}.0`` and the sub-ensemble of size ``n`` is the
first ``n`` leaves.

This module is pure Python (no torch, no numpy): the models, the trainer,
the exporters and the edge runtime all read the same spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from .errors import InputError, short_repr

__all__ = [
    "Node", "Segment", "SubtreeUnit", "TreeSpec", "hne_tree", "independent_tree", "multi_branch_tree", "TREE_PRESETS", "parse_tree",
    "resolve_tree", "MAX_LEAVES", "MAX_BLOCKS",
]

# Bounds on what a file may ask for. An HNE has tens of leaves (the paper: 16); 1024 leaves of even the
# smallest zoo model is hours of training, and the spec's node tables stay a few MB at these bounds.
MAX_LEAVES = 1024
MAX_BLOCKS = 32


@dataclass(frozen=True)
class Node:
    """One block instance of the tree: the weights of one branch of block ``depth``."""

    id: str
    depth: int
    index: int
    parent: str | None  # None: the node reads the image
    children: tuple[str, ...]
    leaves: tuple[int, ...]  # positions (in depth-first order) of the leaves below this node

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class Segment:
    """The nodes that leaf ``leaf`` needs beyond what the previous leaves computed.

    Evaluating leaves depth-first, leaf ``i`` reuses the activations of the
    nodes it shares with leaf ``i-1`` and computes ``nodes`` (a chain, root
    side first). ``input`` is the cached activation the chain starts from
    (``None``: the image). ``exports`` are the chain's inner nodes whose
    activations later leaves will read, so they must be kept.
    """

    leaf: int
    nodes: tuple[str, ...]
    input: str | None
    exports: tuple[str, ...]


@dataclass(frozen=True)
class SubtreeUnit:
    """One call of plan "subtrees": leaf 0's chain (``index`` 0) or one whole subtree after it.

    Depth-first, the leaves after leaf 0 come in whole subtrees: for each depth
    ``d`` from B down to 0, the siblings ``b{d}.1 .. b{d}.{f-1}`` of leaf 0's
    ancestor ``b{d}.0`` (``f = branching[d]``), each read from leaf 0's ancestor
    at depth ``d-1`` (the image for ``d = 0``: the other trees of a forest).
    For the paper's binary tree that is one subtree per depth, of 1, 2, 4, ...,
    N/2 leaves: B + 1 units, stopping points n = 1, 2, 4, ..., N.

    ``nodes``: unit 0 leaf 0's path (root side first); a subtree its nodes
    block by block (parents before children, each block's nodes in index
    order: the branch order of the fused model's grouped convolutions).
    ``exports`` (unit 0 only): the path's activations later units read.
    """

    index: int
    root: str  # the first node it computes (unit 0: b0.0; else the subtree's root)
    nodes: tuple[str, ...]
    input: str | None  # the cached activation it reads (None: the image)
    first_leaf: int  # depth-first position of its first leaf
    num_leaves: int  # leaves it adds: first_leaf .. first_leaf + num_leaves - 1
    exports: tuple[str, ...] = ()

    @property
    def end(self) -> int:
        """The ensemble size once this unit is done (a stopping point)."""
        return self.first_leaf + self.num_leaves


def node_id(depth: int, index: int) -> str:
    return f"b{depth}.{index}"


@dataclass(frozen=True)
class TreeSpec:
    """Branching factor per block; everything else is derived.

    Args:
        branching: ``branching[d]`` is how many children each node of block
            ``d-1`` has in block ``d`` (for ``d = 0``: how many networks read
            the image). The paper's HNE is ``(1, 2, 2, 2, 2)``.
    """

    branching: tuple[int, ...]
    _nodes: dict[str, Node] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        branching = tuple(self.branching) if not isinstance(self.branching, tuple) else self.branching
        if len(branching) == 0:
            raise InputError("TreeSpec.branching must have one factor per block (at least one block); received ()")
        bad = [(d, f) for d, f in enumerate(branching) if not isinstance(f, int) or isinstance(f, bool) or f < 1]
        if bad:
            raise InputError(
                f"TreeSpec.branching must hold positive integers, one per block; received {short_repr(branching)} "
                f"(invalid at block(s) {', '.join(f'{d}: {short_repr(f, 40)}' for d, f in bad[:5])}"
                f"{f' and {len(bad) - 5} more' if len(bad) > 5 else ''})"
            )
        # bounds before anything is built: a file naming a 2^30-leaf tree must fail here, not in the allocator
        if len(branching) > MAX_BLOCKS:
            raise InputError(
                f"TreeSpec.branching has {len(branching)} blocks; expected at most {MAX_BLOCKS} "
                f"(received {short_repr(branching)})"
            )
        leaves = 1
        for f in branching:
            leaves *= f
            if leaves > MAX_LEAVES:
                raise InputError(
                    f"TreeSpec.branching {short_repr(branching)} has more than {MAX_LEAVES} leaves (the product of "
                    f"the branching factors); expected at most {MAX_LEAVES}"
                )
        object.__setattr__(self, "branching", branching)
        object.__setattr__(self, "_nodes", self._build_nodes())

    # -- sizes -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """B + 1."""
        return len(self.branching)

    @property
    def last_block(self) -> int:
        """B: the depth of the leaves."""
        return len(self.branching) - 1

    def width(self, depth: int) -> int:
        """Number of nodes (parallel branches) in block ``depth``."""
        return math.prod(self.branching[: depth + 1])

    @property
    def num_leaves(self) -> int:
        """N: the number of networks in the ensemble."""
        return self.width(self.last_block)

    # -- nodes -------------------------------------------------------------
    def _build_nodes(self) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        last = len(self.branching) - 1
        for depth in range(len(self.branching)):
            below = math.prod(self.branching[depth + 1 :])  # leaves under each node of this block
            for index in range(math.prod(self.branching[: depth + 1])):
                parent = None if depth == 0 else node_id(depth - 1, index // self.branching[depth])
                children = (
                    ()
                    if depth == last
                    else tuple(
                        node_id(depth + 1, index * self.branching[depth + 1] + k)
                        for k in range(self.branching[depth + 1])
                    )
                )
                nodes[node_id(depth, index)] = Node(
                    id=node_id(depth, index),
                    depth=depth,
                    index=index,
                    parent=parent,
                    children=children,
                    leaves=tuple(range(index * below, (index + 1) * below)),
                )
        return nodes

    @property
    def nodes(self) -> list[Node]:
        """All nodes, block by block (breadth-first)."""
        return list(self._nodes.values())

    def node(self, node_id_: str) -> Node:
        try:
            return self._nodes[node_id_]
        except KeyError:
            raise KeyError(f"unknown node id {node_id_!r}; this tree has ids b0.0 .. {self.leaf_order[-1]}") from None

    @cached_property
    def leaf_order(self) -> tuple[str, ...]:
        """Leaf ids in depth-first order: the order anytime inference evaluates them."""
        return tuple(node_id(self.last_block, i) for i in range(self.num_leaves))

    def path(self, leaf: int) -> tuple[str, ...]:
        """Node ids from the first block to leaf number ``leaf`` (depth-first position)."""
        if not 0 <= leaf < self.num_leaves:
            raise IndexError(f"leaf must be in 0..{self.num_leaves - 1}; received {leaf}")
        ids = [self.leaf_order[leaf]]
        while (parent := self._nodes[ids[-1]].parent) is not None:
            ids.append(parent)
        return tuple(reversed(ids))

    def prefix_nodes(self, n: int) -> tuple[str, ...]:
        """Every node the first ``n`` leaves need, each once, in evaluation order."""
        self._check_n(n)
        seen: list[str] = []
        for segment in self.segments[:n]:
            seen.extend(segment.nodes)
        return tuple(seen)

    @cached_property
    def segments(self) -> tuple[Segment, ...]:
        """The per-leaf chains of depth-first evaluation (see :class:`Segment`)."""
        segments = []
        previous: tuple[str, ...] = ()
        for leaf in range(self.num_leaves):
            path = self.path(leaf)
            shared = 0
            while shared < len(previous) and previous[shared] == path[shared]:
                shared += 1
            chain = path[shared:]
            exports = tuple(
                nid for nid in chain[:-1] if self._nodes[nid].leaves[-1] > leaf
            )  # inner nodes with leaves still to come
            segments.append(
                Segment(leaf=leaf, nodes=chain, input=path[shared - 1] if shared else None, exports=exports)
            )
            previous = path
        return tuple(segments)

    @cached_property
    def subtree_units(self) -> tuple[SubtreeUnit, ...]:
        """The units of plan "subtrees", in depth-first order (see :class:`SubtreeUnit`).

        A factor ``f > 2`` gives ``f - 1`` sibling subtrees at that depth, one unit each (stops after each
        of them, e.g. ``(1, 4, 2)``: n = 1, 2, 4, 6, 8); siblings sharing an input are not merged into one
        call, so every unit is exactly one node's subtree. A forest (``branching[0] > 1``) ends with its
        other trees, each read from the image.
        """
        path0 = self.path(0)
        subtrees: list[SubtreeUnit] = []
        for depth in range(self.last_block, -1, -1):
            for k in range(1, self.branching[depth]):  # b{depth}.k: child k of leaf 0's ancestor at depth-1
                root = self._nodes[node_id(depth, k)]
                nodes = tuple(
                    node_id(d, k * w + i)
                    for d in range(depth, self.num_blocks)
                    for w in (math.prod(self.branching[depth + 1 : d + 1]),)
                    for i in range(w)
                )
                subtrees.append(
                    SubtreeUnit(len(subtrees) + 1, root.id, nodes, root.parent, root.leaves[0], len(root.leaves))
                )
        read = {u.input for u in subtrees}
        first = SubtreeUnit(0, path0[0], path0, None, 0, 1, tuple(n for n in path0[:-1] if n in read))
        units = (first, *subtrees)
        assert all(a.end == b.first_leaf for a, b in zip(units, units[1:])) and units[-1].end == self.num_leaves
        return units

    # -- sub-ensembles -----------------------------------------------------
    @cached_property
    def ensemble_sizes(self) -> tuple[int, ...]:
        """The nested sub-ensembles that are whole subtrees: the paper's y^b sizes.

        For the binary HNE these are 1, 2, 4, ..., N (n = 2^b). Any prefix size
        n in 1..N is a valid anytime stop; these are the ones the structured
        and hierarchical-distillation losses supervise.
        """
        sizes = {math.prod(self.branching[d + 1 :]) for d in range(self.num_blocks)}
        sizes.add(self.num_leaves)
        return tuple(sorted(sizes))

    def _check_n(self, n: int) -> None:
        if not 1 <= n <= self.num_leaves:
            raise InputError(f"ensemble size n must be in 1..{self.num_leaves}; received {n}")

    # -- serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        return {"branching": list(self.branching)}

    @classmethod
    def from_dict(cls, data: dict) -> "TreeSpec":
        if not isinstance(data, dict) or set(data) != {"branching"} or not isinstance(data["branching"], (list, tuple)):
            raise InputError(f"a tree spec is {{'branching': [...]}}; received {short_repr(data)}")
        return cls(tuple(data["branching"]))

    def describe(self, label: "Callable[[Node], str] | None" = None) -> str:
        """An ASCII drawing of the tree, one node a line, depth-first.

        ``label(node)`` gives the text after each node id (default: the leaves below it).
        """
        lines = []

        def default(node: Node) -> str:
            return f"leaf {node.leaves[0]}" if node.is_leaf else f"leaves {node.leaves[0]}-{node.leaves[-1]}"

        label = label or default

        def walk(nid: str, prefix: str, last: bool) -> None:
            node = self._nodes[nid]
            lines.append(f"{prefix}{'└─ ' if last else '├─ '}{nid}  {label(node)}")
            for k, child in enumerate(node.children):
                walk(child, prefix + ("   " if last else "│  "), k == len(node.children) - 1)

        roots = [n.id for n in self.nodes if n.depth == 0]
        lines.append("image")
        for k, root in enumerate(roots):
            walk(root, "", k == len(roots) - 1)
        return "\n".join(lines)


def hne_tree(levels: int = 4) -> TreeSpec:
    """The paper's binary HNE: a shared root and ``levels`` binary splits (N = 2^levels)."""
    return TreeSpec((1,) + (2,) * levels)


def independent_tree(num_blocks: int = 5, num_leaves: int = 16) -> TreeSpec:
    """Baseline: ``num_leaves`` separate networks (every path splits at block 0)."""
    return TreeSpec((num_leaves,) + (1,) * (num_blocks - 1))


def multi_branch_tree(num_blocks: int = 5, split_block: int = 3, num_leaves: int = 16) -> TreeSpec:
    """Baseline: a shared backbone for blocks ``0..split_block-1``, then ``num_leaves`` branches."""
    if not 0 < split_block < num_blocks:
        raise InputError(f"split_block must be in 1..{num_blocks - 1}; received {split_block}")
    return TreeSpec(tuple(num_leaves if d == split_block else 1 for d in range(num_blocks)))


# The named trees a model's ``tree`` option accepts; the paper's baselines come from the same entrypoints.
TREE_PRESETS = ("hne", "independent", "multi_branch")


def parse_tree(value: "str | tuple[int, ...] | list[int] | TreeSpec | None", name: str = "tree"):
    """The one parser of a ``tree`` option (CLI ``--tree``, YAML ``model.overrides.tree``).

    ``"hne"`` / ``"independent"`` / ``"multi_branch"`` stay names, ``"1,2,2,2,2"`` (or a list) becomes a tuple
    of branching factors, a :class:`TreeSpec` or ``None`` passes through; the factors themselves are checked
    by :class:`TreeSpec` once the model's number of blocks is known. ``name`` is what errors call the option.
    """
    if value is None or isinstance(value, TreeSpec) or value in TREE_PRESETS:
        return value
    try:
        parts = value.split(",") if isinstance(value, str) else list(value)
        factors = tuple(int(v) for v in parts)
        if not factors or any(isinstance(v, (bool, float)) for v in parts):
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(
            f"{name}: received {short_repr(value)}; expected {', '.join(TREE_PRESETS)} or branching factors like 1,2,2,2,2"
        ) from None
    return factors


def resolve_tree(value, num_blocks: int) -> TreeSpec:
    """``value`` (anything :func:`parse_tree` accepts) as the spec of a model with ``num_blocks`` blocks."""
    tree = parse_tree(value)
    if isinstance(tree, TreeSpec):
        return tree
    if isinstance(tree, tuple):
        return TreeSpec(tree)
    if tree == "hne":
        return hne_tree(num_blocks - 1)
    if tree == "independent":
        return independent_tree(num_blocks)
    if tree == "multi_branch":
        return multi_branch_tree(num_blocks, split_block=num_blocks - 2)
    raise InputError(f"tree: received {short_repr(value)}; expected {', '.join(TREE_PRESETS)} or branching factors")
