"""The tree spec: ids, parents, depth-first order, segments, baselines, validation."""

from __future__ import annotations

import math

import pytest

from hne_edge.tree import TreeSpec, hne_tree, independent_tree, multi_branch_tree


def brute_force_dfs_leaves(tree: TreeSpec) -> list[str]:
    """Independent reference: recursive DFS over the children lists."""
    out: list[str] = []

    def visit(nid: str) -> None:
        node = tree.node(nid)
        if node.is_leaf:
            out.append(nid)
        for child in node.children:
            visit(child)

    for root in [n.id for n in tree.nodes if n.depth == 0]:
        visit(root)
    return out


@pytest.mark.parametrize(
    "branching", [(1, 2, 2, 2, 2), (16, 1, 1, 1, 1), (1, 1, 1, 16, 1), (1, 3, 2), (2, 2), (1,), (3,)]
)
def test_structure(branching):
    tree = TreeSpec(branching)
    assert tree.num_leaves == math.prod(branching)
    assert len(tree.nodes) == sum(tree.width(d) for d in range(len(branching)))
    assert list(tree.leaf_order) == brute_force_dfs_leaves(tree)
    assert tree.leaf_order[0] == f"b{len(branching) - 1}.0"  # first leaf is always the same
    for node in tree.nodes:
        for child in node.children:
            assert tree.node(child).parent == node.id
            assert tree.node(child).depth == node.depth + 1
        if node.parent is not None:
            assert node.id in tree.node(node.parent).children
    # each path walks parent links from the leaf to a root
    for leaf in range(tree.num_leaves):
        path = tree.path(leaf)
        assert len(path) == tree.num_blocks
        assert tree.node(path[0]).parent is None
        assert all(tree.node(b).parent == a for a, b in zip(path, path[1:]))


def test_hne_segments_and_prefix():
    tree = hne_tree(4)
    segs = tree.segments
    assert segs[0].nodes == ("b0.0", "b1.0", "b2.0", "b3.0", "b4.0") and segs[0].input is None
    assert segs[1].nodes == ("b4.1",) and segs[1].input == "b3.0"
    assert segs[2].nodes == ("b3.1", "b4.2") and segs[2].input == "b2.0"
    assert segs[8].nodes == ("b1.1", "b2.2", "b3.4", "b4.8") and segs[8].input == "b0.0"
    # leaf 0 must keep every inner node of its path; the last leaf keeps nothing
    assert segs[0].exports == ("b0.0", "b1.0", "b2.0", "b3.0")
    assert segs[15].exports == ()
    # every node is computed exactly once over the whole traversal
    all_nodes = [n for s in segs for n in s.nodes]
    assert sorted(all_nodes) == sorted(n.id for n in tree.nodes)
    # each segment's input was exported by an earlier segment
    exported: set[str] = set()
    for s in segs:
        assert s.input is None or s.input in exported
        exported |= set(s.exports)
    # prefix of n leaves = union of their paths
    for n in range(1, 17):
        union = {nid for leaf in range(n) for nid in tree.path(leaf)}
        assert set(tree.prefix_nodes(n)) == union
    assert tree.ensemble_sizes == (1, 2, 4, 8, 16)


def test_cached_path_is_bounded_by_depth():
    """Simulate the runtime's cache: live activations never exceed the tree depth."""
    tree = hne_tree(4)
    cache: dict[str, int] = {}
    for seg in tree.segments:
        if seg.input is not None:
            assert seg.input in cache
        depth_in = -1 if seg.input is None else tree.node(seg.input).depth
        cache = {k: v for k, v in cache.items() if v <= depth_in}  # drop the abandoned branch
        for nid in seg.exports:
            cache[nid] = tree.node(nid).depth
        assert len(cache) <= tree.num_blocks - 1


def test_baselines():
    ind = independent_tree()
    assert ind.branching == (16, 1, 1, 1, 1)
    assert all(len(s.nodes) == 5 and s.input is None for s in ind.segments)
    assert ind.ensemble_sizes == (1, 16)
    mb = multi_branch_tree()
    assert mb.branching == (1, 1, 1, 16, 1)
    assert mb.segments[1].nodes == ("b3.1", "b4.1") and mb.segments[1].input == "b2.0"


@pytest.mark.parametrize(
    "branching, match",
    [
        ((), "at least one block"),
        ((1, 0, 2), r"received \(1, 0, 2\).*block\(s\) 1: 0"),
        ((1, -2), r"block\(s\) 1: -2"),
        ((1, 2.0), "positive integers"),
    ],
)
def test_invalid_specs(branching, match):
    with pytest.raises(ValueError, match=match):
        TreeSpec(branching)


def test_round_trip_and_errors():
    tree = hne_tree(3)
    assert TreeSpec.from_dict(tree.to_dict()) == tree
    with pytest.raises(ValueError, match="branching"):
        TreeSpec.from_dict({"branches": [1, 2]})
    with pytest.raises(KeyError, match="unknown node id 'b9.0'"):
        tree.node("b9.0")
    with pytest.raises(IndexError, match="leaf must be in 0..7; received 8"):
        tree.path(8)
    with pytest.raises(ValueError, match="1..8; received 0"):
        tree.prefix_nodes(0)
    with pytest.raises(ValueError, match="split_block"):
        multi_branch_tree(5, split_block=0)


def descendants(tree: TreeSpec, nid: str) -> list[str]:
    """Independent reference: every node under ``nid`` (itself included) by recursion over the children lists."""
    return [nid] + [d for child in tree.node(nid).children for d in descendants(tree, child)]


def test_hne_subtree_units_are_the_papers_sub_ensembles():
    tree = hne_tree(4)
    units = tree.subtree_units
    assert [(u.root, u.input, u.first_leaf, u.num_leaves) for u in units] == [
        ("b0.0", None, 0, 1), ("b4.1", "b3.0", 1, 1), ("b3.1", "b2.0", 2, 2), ("b2.1", "b1.0", 4, 4), ("b1.1", "b0.0", 8, 8),
    ]  # fmt: skip
    assert [u.end for u in units] == [1, 2, 4, 8, 16] == list(tree.ensemble_sizes)  # B + 1 calls, stops at y^b
    assert units[0].nodes == tree.path(0) and units[0].exports == ("b0.0", "b1.0", "b2.0", "b3.0")
    assert units[2].nodes == ("b3.1", "b4.2", "b4.3")  # block by block, each block in branch order


@pytest.mark.parametrize(
    "branching, ends",
    [
        ((1, 2, 2, 2, 2), [1, 2, 4, 8, 16]),
        ((1, 4, 2), [1, 2, 4, 6, 8]),  # a factor 4: three sibling subtrees of 2 leaves, one unit each
        ((1, 1, 4), [1, 2, 3, 4]),
        ((2, 2), [1, 2, 4]),  # a forest: the second tree reads the image
        ((3, 1, 2), [1, 2, 4, 6]),
        ((16, 1, 1, 1, 1), list(range(1, 17))),  # independent networks: one unit per network
        ((1, 1, 1, 16, 1), list(range(1, 17))),
        ((1,), [1]),
    ],
)
def test_subtree_units_cover_the_tree_once_in_depth_first_order(branching, ends):
    tree = TreeSpec(branching)
    units = tree.subtree_units
    assert [u.end for u in units] == ends and [u.index for u in units] == list(range(len(units)))
    assert sorted(n for u in units for n in u.nodes) == sorted(n.id for n in tree.nodes)  # each node once
    dfs = brute_force_dfs_leaves(tree)
    for u in units[1:]:
        assert sorted(u.nodes) == sorted(descendants(tree, u.root))  # a whole subtree
        assert [n for n in u.nodes if tree.node(n).is_leaf] == dfs[u.first_leaf : u.end]  # its leaves, in order
        depths = [tree.node(n).depth for n in u.nodes]
        assert depths == sorted(depths)  # parents before children
        assert u.input == tree.node(u.root).parent and u.exports == ()
        assert u.input is None or u.input in units[0].exports  # read from leaf 0's path, exported by unit 0
    assert set(units[0].exports) == {u.input for u in units[1:]} - {None}  # exactly what later units read
