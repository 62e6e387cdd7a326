"""compile_program: the depth-first schedule from a tree and units alone (no backend, no bundle)."""

from __future__ import annotations

import pytest

from hne_edge.bundle import TensorSpec
from hne_edge.errors import BundleError
from hne_edge.runtime.backends.base import Runner, Unit
from hne_edge.runtime.program import compile_program
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


def shape(calls):
    return [[(c.name, c.src, c.dsts) for c in leaf] for leaf in calls]


def test_segments_plan_one_call_per_leaf_with_its_exports():
    runners = segment_units()
    p = compile_program(TREE, runners)
    assert p.slots == SLOT and p.logits_slot == LOGITS and p.num_slots == 9 and p.num_leaves == 4
    assert shape(p.calls) == [
        [("seg0", 0, (1, 2, LOGITS))],
        [("seg1", 2, (LOGITS,))],
        [("seg2", 1, (3, LOGITS))],
        [("seg3", 3, (LOGITS,))],
    ]
    assert [c.run for leaf in p.calls for c in leaf] == [r.run_impl for r in runners]
    # the last call of a final leaf writes only the logits
    assert shape(p.finals) == [[("seg0", 0, (LOGITS,))], [("seg1", 2, (LOGITS,))], [("seg2", 1, (LOGITS,))], [("seg3", 3, (LOGITS,))]]
    # after leaf i, drop the nodes whose last leaf is i (and the logits): at most the current path is held
    assert p.drops == ((4, LOGITS), (2, 5, LOGITS), (6, LOGITS), (1, 3, 7, LOGITS))
    assert not p.first_leaf


def test_nodes_plan_chains_one_call_per_node_and_reuses_the_path():
    p = compile_program(TREE, node_units())
    assert shape(p.calls) == [
        [("b0.0", 0, (1,)), ("b1.0", 1, (2,)), ("b2.0", 2, (LOGITS,))],
        [("b2.1", 2, (LOGITS,))],
        [("b1.1", 1, (3,)), ("b2.2", 3, (LOGITS,))],
        [("b2.3", 3, (LOGITS,))],
    ]
    assert shape(p.finals) == shape(p.calls)  # node files of leaves export nothing to skip
    assert p.drops == ((4, LOGITS), (2, 5, LOGITS), (6, LOGITS), (1, 3, 7, LOGITS))


def test_first_leaf_file_replaces_only_leaf_0_final():
    first = unit("first", ["b0.0", "b1.0", "b2.0"], None, [], 0)
    p = compile_program(TREE, segment_units(), first)
    assert p.first_leaf
    assert shape(p.finals)[0] == [("first", 0, (LOGITS,))]
    assert shape(p.calls)[0] == [("seg0", 0, (1, 2, LOGITS))]  # a frame that goes on still runs the exporting segment


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
