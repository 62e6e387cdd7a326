"""compile_program: the depth-first schedule from a tree and units alone (no backend, no bundle)."""

from __future__ import annotations

import pytest

from hne_edge.bundle import TensorSpec
from hne_edge.errors import BundleError
from hne_edge.runtime.backends.base import Runner, Unit
from hne_edge.runtime.program import choose, compile_program
from hne_edge.tree import TreeSpec

TREE = TreeSpec((1, 2, 2))  # b0.0 -> b1.0 -> {b2.0, b2.1}; b0.0 -> b1.1 -> {b2.2, b2.3}


class Named(Runner):
    """Records nothing, runs nothing: compile_program must never call a runner."""

    def run_impl(self, inputs):
        raise AssertionError(f"compile_program called {self.name}")

    def run_logits_impl(self, inputs):
        raise AssertionError(f"compile_program called {self.name}")


def unit(name, nodes, src, exports, leaf):
    spec = lambda node, logits=False: TensorSpec("logits" if logits else f"act_{node}", node, "float32", ())  # noqa: E731
    outs = tuple(spec(e) for e in exports) + ((spec(nodes[-1], logits=True),) if leaf is not None else ())
    kind, key = ("segment", leaf) if name.startswith(("seg", "first")) else ("node", nodes[0])
    return Named(Unit(name=name, nodes=tuple(nodes), leaf=leaf, inputs=(spec(src),), outputs=outs, macs=1, kind=kind, key=key))


# slots by hand: image 0, then the nodes breadth-first, then the logits
SLOT = {None: 0, "b0.0": 1, "b1.0": 2, "b1.1": 3, "b2.0": 4, "b2.1": 5, "b2.2": 6, "b2.3": 7}
LOGITS = 8


def segment_units():
    return [
        unit("seg0", ["b0.0", "b1.0", "b2.0"], None, ["b0.0", "b1.0"], 0),
        unit("seg1", ["b2.1"], "b1.0", [], 1),
        unit("seg2", ["b1.1", "b2.2"], "b0.0", ["b1.1"], 2),
        unit("seg3", ["b2.3"], "b1.1", [], 3),
    ]


def node_units():
    leaf_of = {"b2.0": 0, "b2.1": 1, "b2.2": 2, "b2.3": 3}
    parent = {"b0.0": None, "b1.0": "b0.0", "b1.1": "b0.0", "b2.0": "b1.0", "b2.1": "b1.0", "b2.2": "b1.1", "b2.3": "b1.1"}
    return [unit(n, [n], parent[n], [] if n in leaf_of else [n], leaf_of.get(n)) for n in parent]


def shape(steps, field="calls"):
    return [[(c.name, c.src, c.dsts) for c in getattr(step, field)] for step in steps]


def test_segments_plan_one_call_per_leaf_with_its_exports():
    runners = segment_units()
    p = compile_program(TREE, runners)
    assert p.slots == SLOT and p.logits_slot == LOGITS and p.num_slots == 9 and p.num_leaves == 4
    assert shape(p.steps) == [
        [("seg0", 0, (1, 2, LOGITS))],
        [("seg1", 2, (LOGITS,))],
        [("seg2", 1, (3, LOGITS))],
        [("seg3", 3, (LOGITS,))],
    ]
    assert [c.run for step in p.steps for c in step.calls] == [r.run_impl for r in runners]
    assert [(s.lo, s.hi, s.several, s.kind) for s in p.steps] == [(i, i + 1, False, "leaf") for i in range(4)]
    assert p.at == (0, 1, 2, 3) and p.path == (0, 1, 2, 3) and p.stops == (1, 2, 3, 4) and p.alts is None
    # the last call of a final step writes only the logits
    assert shape(p.steps, "final") == [[("seg0", 0, (LOGITS,))], [("seg1", 2, (LOGITS,))], [("seg2", 1, (LOGITS,))], [("seg3", 3, (LOGITS,))]]
    # after leaf i, drop the cached nodes whose last leaf is i (and the logits): at most the current path is held
    assert [s.drops for s in p.steps] == [(LOGITS,), (2, LOGITS), (LOGITS,), (1, 3, LOGITS)]
    assert not p.first_leaf


def test_nodes_plan_chains_one_call_per_node_and_reuses_the_path():
    p = compile_program(TREE, node_units())
    assert shape(p.steps) == [
        [("b0.0", 0, (1,)), ("b1.0", 1, (2,)), ("b2.0", 2, (LOGITS,))],
        [("b2.1", 2, (LOGITS,))],
        [("b1.1", 1, (3,)), ("b2.2", 3, (LOGITS,))],
        [("b2.3", 3, (LOGITS,))],
    ]
    assert shape(p.steps, "final") == shape(p.steps)  # node files of leaves export nothing to skip
    assert [s.drops for s in p.steps] == [(LOGITS,), (2, LOGITS), (LOGITS,), (1, 3, LOGITS)]


def test_first_leaf_file_replaces_only_leaf_0_final():
    first = unit("first", ["b0.0", "b1.0", "b2.0"], None, [], 0)
    p = compile_program(TREE, segment_units(), first)
    assert p.first_leaf
    assert shape(p.steps, "final")[0] == [("first", 0, (LOGITS,))]
    assert shape(p.steps)[0] == [("seg0", 0, (1, 2, LOGITS))]  # a frame that goes on still runs the exporting segment


def test_a_missing_unit_is_named():
    with pytest.raises(BundleError, match=r"no model file starts at node b1\.1 \(needed by leaf 2\)"):
        compile_program(TREE, segment_units()[:2] + segment_units()[3:])


def test_a_unit_with_the_wrong_input_is_named():
    units = segment_units()
    units[1] = unit("seg1", ["b2.1"], "b0.0", [], 1)
    with pytest.raises(BundleError, match=r"seg1 computes \['b2.1'\] from b0.0; leaf 1 needs \['b2.1'\] from b1.0"):
        compile_program(TREE, units)


def test_a_chain_that_does_not_end_in_logits_is_refused():
    units = segment_units()
    units[3] = unit("seg3", ["b2.3"], "b1.1", ["b2.3"], None)
    with pytest.raises(BundleError, match="leaf 3: the last model file of its chain does not output logits last"):
        compile_program(TREE, units)


# -- steps of several leaves: plans "subtrees" and "fused", and the mixed program ----------------------


def subtree_units():
    """Plan "subtrees" of TREE: leaf 0's chain, then b2.1 (leaf 1) and b1.1's whole subtree (leaves 2, 3)."""
    spec = lambda node, shape: TensorSpec("logits", node, "float32", shape)  # noqa: E731
    units = []
    for u in TREE.subtree_units:
        r = unit(f"unit{u.index}", u.nodes, u.input, u.exports, u.first_leaf)
        outs = r.unit.outputs if u.index == 0 else (spec(u.root, ("batch", u.num_leaves, 3)),)
        units.append(Named(Unit(name=r.name, nodes=u.nodes, leaf=u.first_leaf, inputs=r.unit.inputs, outputs=outs, macs=1,
                                kind="subtree", key=u.index, num_leaves=u.num_leaves)))  # fmt: skip
    return units


def tree_unit():
    nodes = tuple(n.id for n in TREE.nodes)
    return Named(Unit(name="tree", nodes=nodes, leaf=0, inputs=(TensorSpec("image", None, "float32", ()),),
                      outputs=(TensorSpec("logits", None, "float32", ("batch", 4, 3)),), macs=7, kind="tree", key=None,
                      num_leaves=4))  # fmt: skip


def test_subtrees_plan_one_step_per_unit_stopping_at_the_sub_ensembles():
    p = compile_program(TREE, subtree_units())
    assert shape(p.steps) == [
        [("unit0", 0, (1, 2, LOGITS))],
        [("unit1", 2, (LOGITS,))],
        [("unit2", 1, (LOGITS,))],  # b1.1's subtree reads b0.0 and keeps nothing of its own
    ]
    assert [(s.lo, s.hi, s.several) for s in p.steps] == [(0, 1, False), (1, 2, True), (2, 4, True)]
    assert p.at == (0, 1, 2, -1) and p.stops == (1, 2, 4) and p.path == (0, 1, 2)
    assert [s.drops for s in p.steps] == [(LOGITS,), (2, LOGITS), (1, LOGITS)]
    assert shape(p.steps, "final")[0] == [("unit0", 0, (LOGITS,))]
    assert (p.stop_at_most(3), p.stop_at_least(3), p.stop_at_most(0)) == (2, 4, 0)


def test_fused_plan_is_one_step_of_every_leaf():
    p = compile_program(TREE, [tree_unit()])
    assert shape(p.steps) == [[("tree", 0, (LOGITS,))]] and p.stops == (4,) and p.at == (0, -1, -1, -1)
    assert p.steps[0].several and p.steps[0].kind == "tree" and p.steps[0].drops == (LOGITS,)


def mixed():
    return compile_program(TREE, segment_units(), alternatives=[*subtree_units()[2:], tree_unit()])


def test_mixed_program_offers_the_bigger_steps_where_they_start():
    p = mixed()
    assert [(s.name, s.lo, s.hi, s.kind) for s in p.steps] == [
        ("seg0", 0, 1, "leaf"), ("seg1", 1, 2, "leaf"), ("seg2", 2, 3, "leaf"), ("seg3", 3, 4, "leaf"),
        ("unit2", 2, 4, "subtree"), ("tree", 0, 4, "tree"),
    ]  # fmt: skip
    assert p.at == (0, 1, 2, 3) and p.alts == ((5,), (), (4,), ()) and p.path == (0, 1, 2, 3) and p.stops == (1, 2, 3, 4)
    # the warm-up and the profiler walk each route, so every step runs
    assert [r.path for r in p.routes()] == [(0, 1, 2, 3), (0, 1, 4), (5,)]
    assert [r.stops for r in p.routes()] == [(1, 2, 3, 4), (1, 2, 4), (4,)]


PRED = [1.0, 0.2, 0.3, 0.3, 0.5, 1.5]  # seg0..seg3, b1.1's subtree (0.5 < 0.3 + 0.3), the tree (1.5 < 1.8)


@pytest.mark.parametrize(
    "n, now, stop_at, pred, n_stop, n_min, whole, subtrees, want",
    [
        (2, 0.0, None, PRED, 4, 1, False, True, 4),  # no budget: the subtree, measured cheaper than its leaves
        (2, 0.0, 0.55, PRED, 4, 1, False, True, 4),  # it fits the budget
        (2, 0.0, 0.45, PRED, 4, 1, False, True, 2),  # it does not: leaf by leaf (leaf 2 fits 0.3)
        (2, 0.0, 0.45, PRED, 4, 4, False, True, 4),  # ... unless min_leaves forces all of its leaves anyway
        (2, 0.0, None, PRED[:4] + [0.7, 1.5], 4, 1, False, True, 2),  # slower than its leaves (0.6): never
        (2, 0.0, None, PRED, 3, 1, False, True, 2),  # max_leaves=3 ends inside it
        (2, 0.0, None, PRED, 4, 1, False, False, 2),  # a stop rule sees every leaf
        (0, 0.0, None, PRED, 4, 1, True, True, 5),  # the whole tree: a run() nothing can cancel or stop early
        (0, 0.0, 1.6, PRED, 4, 1, True, True, 5),
        (0, 0.0, 1.4, PRED, 4, 1, True, True, 0),  # the tree does not fit: leaf 0 (the budget check is the loop's)
        (0, 0.0, None, PRED, 4, 1, False, True, 0),  # a session (may be cancelled or refined): leaf by leaf
        (0, 0.0, None, PRED[:5] + [1.9], 4, 1, True, True, 0),  # the tree measured slower than its leaves
    ],
)
def test_choose_is_the_one_rule_of_a_mixed_program(n, now, stop_at, pred, n_stop, n_min, whole, subtrees, want):
    assert choose(mixed(), n, now, stop_at, pred, None, None, n_stop, n_min, whole, subtrees) == want
    assert choose(mixed(), n, now, stop_at, pred, pred, [True] * 6, n_stop, n_min, whole, subtrees) == want


def test_choose_compares_speeds_by_medians_and_budgets_by_predictions():
    """A big step's prediction carries one stall allowance where many small ones carry one each, and the
    tail margins differ: speeds are compared by the measured medians, so a slower big step is never taken."""
    median = [0.10, 0.02, 0.03, 0.03, 0.07, 0.20]  # the subtree (0.07) is slower than its leaves (0.06)
    pred = [0.5, 0.1, 0.15, 0.15, 0.25, 0.4]  # ... though its prediction (0.25) is below theirs (0.3)
    assert choose(mixed(), 2, 0.0, None, pred, median, None, 4, 1, False, True) == 2
    assert choose(mixed(), 0, 0.0, None, pred, median, None, 4, 1, True, True) == 0  # the tree: 0.20 > 0.18
    median[4] = 0.05
    assert choose(mixed(), 2, 0.0, None, pred, median, None, 4, 1, False, True) == 4
    assert choose(mixed(), 2, 0.0, 0.2, pred, median, None, 4, 1, False, True) == 2  # but 0.25 does not fit 0.2


def test_choose_measures_what_it_has_not_before_comparing():
    known = [True, True, False, False, False, True]  # leaves 2, 3 and their subtree never ran at this batch size
    assert choose(mixed(), 2, 0.0, None, PRED, PRED, known, 4, 1, False, True) == 4  # the big step first
    assert choose(mixed(), 2, 0.0, 0.45, PRED, PRED, known, 4, 1, False, True) == 2  # if it fits
    known[4] = True
    assert choose(mixed(), 2, 0.0, None, PRED, PRED, known, 4, 1, False, True) == 2  # then its leaves, to compare
    known[2] = known[3] = True
    assert choose(mixed(), 2, 0.0, None, PRED, PRED, known, 4, 1, False, True) == 4


def test_a_mixed_program_needs_a_per_leaf_base_and_steps_that_read_what_is_held():
    with pytest.raises(BundleError, match="needs a per-leaf base walk"):
        compile_program(TREE, subtree_units(), alternatives=[tree_unit()])
    wrong = subtree_units()[2]
    wrong = Named(wrong.unit.__class__(**{**wrong.unit.__dict__, "inputs": (TensorSpec("act_b1.0", "b1.0", "float32", ()),)}))
    with pytest.raises(BundleError, match=r"unit2 computes .* from b1.0; subtree unit 2 is .* from b0.0"):
        compile_program(TREE, segment_units(), alternatives=[wrong])
    with pytest.raises(BundleError, match=r"the units add leaves \[\(0, 1\), \(2, 4\)\]; expected consecutive ranges"):
        compile_program(TREE, [subtree_units()[0], subtree_units()[2]])


def test_a_step_reading_an_activation_no_earlier_step_kept_is_refused():
    units = segment_units()
    units[0] = unit("seg0", ["b0.0", "b1.0", "b2.0"], None, ["b1.0"], 0)  # b0.0 not exported, leaf 2 reads it
    with pytest.raises(BundleError, match=r"seg2 reads b0.0, which the session does not hold before leaf 2"):
        compile_program(TREE, units)


def test_best_leaves_is_the_oracle_over_every_schedule():
    from hne_edge.runtime.program import best_leaves

    p = mixed()
    t = [1.0, 0.2, 0.3, 0.3, 0.5, 1.5]  # seg0..seg3, b1.1's subtree, the tree
    assert [best_leaves(p, t, b) for b in (0.5, 1.0, 1.2, 1.5, 1.69, 1.7, 1.8)] == [1, 1, 2, 4, 4, 4, 4]
    assert best_leaves(p, t, 1.49) == 2  # the tree needs 1.5, three leaves 1.0 + 0.2 + 0.3
    assert best_leaves(p, t, 1.55, whole=False) == 3  # the subtree (to 4) needs 1.7
    assert best_leaves(p, t, 1.7, whole=False) == 4
    assert best_leaves(compile_program(TREE, subtree_units()), [1.0, 0.2, 0.5], 1.6) == 2  # no stop at 3


def test_best_leaves_split_is_an_upper_bound_that_stops_inside_steps():
    """``split=True``: a step's time spread evenly over its leaves, stopping anywhere - the old benchmark oracle, which
    credits stops no plan can make. Leaf by leaf it is the oracle; with multi-leaf steps it is above it."""
    from hne_edge.runtime.program import best_leaves

    p = mixed()
    t = [1.0, 0.2, 0.3, 0.3, 0.5, 1.5]  # seg0..seg3, b1.1's subtree (2 leaves, 0.25 each), the tree (0.375 each)
    assert best_leaves(p, t, 1.49) == 2 and best_leaves(p, t, 1.49, split=True) == 3  # 3 tree leaves: 1.125 s
    assert best_leaves(p, t, 0.8, split=True) == 2  # two leaves of the tree: 0.75 s (no plan stops there)
    sub = compile_program(TREE, subtree_units())
    assert best_leaves(sub, [1.0, 0.2, 0.5], 1.6) == 2 and best_leaves(sub, [1.0, 0.2, 0.5], 1.6, split=True) == 3
    seg = compile_program(TREE, segment_units())
    for budget in (0.5, 1.1, 1.3, 1.6, 2.0):
        assert best_leaves(seg, t[:4], budget) == best_leaves(seg, t[:4], budget, split=True)
