"""AnytimeSession: the one loop, driven directly over a compiled program (no runner, no bundle)."""

from __future__ import annotations

import numpy as np
import pytest

from hne_edge.runtime.profiler import unit_timer
from hne_edge.runtime.program import compile_program
from hne_edge.runtime.session import UNOBSERVED, AnytimeSession, NoResultError

from test_program import TREE, node_units, segment_units

CLASSES = 3
COST = {"b0.0": 1.0, "b1.0": 0.5, "b1.1": 0.25, "b2.0": 0.125, "b2.1": 0.0625, "b2.2": 0.03125, "b2.3": 0.015625}


class Clock:
    def __init__(self):
        self.t = 10.0

    def __call__(self):
        return self.t


def value(node):  # a node's "activation": the sum of the node numbers on its path (independent of any cache)
    path = [node]
    while TREE.node(path[-1]).parent is not None:
        path.append(TREE.node(path[-1]).parent)
    return float(sum(int(n.split(".")[1]) + 10 * int(n[1]) for n in path))


def wire(runners, clock, log):
    """Make the placeholder runners compute: each adds its nodes' numbers and costs COST[node] of virtual time."""
    for r in runners:
        def run(inputs, r=r):
            h = inputs[0]
            acts = {}
            for n in r.unit.nodes:
                h = h + int(n.split(".")[1]) + 10 * int(n[1])
                acts[n] = h
                clock.t += COST[n]
            log.append(r.name)
            return tuple(np.full((2, CLASSES), h, np.float32) if t.name == "logits" else acts[t.node] for t in r.unit.outputs)

        r.run_impl = run
        r.run_logits_impl = lambda inputs, run=run: run(inputs)[-1]
    return runners


def session(runners, clock, model=UNOBSERVED):
    program = compile_program(TREE, runners)
    return AnytimeSession(program, 0.0, 2, num_classes=CLASSES, class_names=("a", "b", "c"), model=model,
                          clock=clock, to_host=np.asarray, guard=(lambda: None, lambda: None))  # fmt: skip


@pytest.mark.parametrize("units", [segment_units, node_units])
def test_the_loop_computes_every_leaf_from_its_path(units):
    clock, log = Clock(), []
    s = session(wire(units(), clock, log), clock)
    s.advance(clock(), None, None, 4, 4)
    leaves = [seg.nodes[-1] for seg in TREE.segments]
    assert s.result().leaf_logits[:, 0, 0].tolist() == [value(n) for n in leaves]
    assert s.leaf_seconds == [sum(COST[n] for n in seg.nodes) for seg in TREE.segments]  # each node computed once
    assert s.cached_nodes == () and s.done


@pytest.mark.parametrize("units", [segment_units, node_units])
def test_timing_hook_sees_each_unit_call_in_depth_first_order_and_changes_nothing(units):
    clock, log = Clock(), []
    plain = session(wire(units(), clock, log), clock)
    plain.advance(clock(), None, None, 4, 4)
    calls_plain = list(log)

    clock, log, seen = Clock(), [], []

    def hook(call, inputs):
        t0 = clock()
        outs = call.run(inputs)
        seen.append((call.name, clock() - t0))
        return outs

    hooked = session(wire(units(), clock, log), clock)
    hooked.advance(clock(), None, None, 4, 4, on_unit=hook)
    assert [name for name, _ in seen] == calls_plain == log
    assert dict(seen) == {r.name: sum(COST[n] for n in r.unit.nodes) for r in units()}
    np.testing.assert_array_equal(hooked.result().leaf_logits, plain.result().leaf_logits)


def test_profiler_unit_timer_records_synchronized_unit_times():
    class Backend:
        clock = Clock()
        syncs = 0

        def synchronize(self):
            Backend.syncs += 1

    backend, log = Backend(), []
    runners = wire(segment_units(), backend.clock, log)
    samples = {r.name: [] for r in runners}
    s = session(runners, backend.clock)
    s.advance(backend.clock(), None, None, 4, 4, on_unit=unit_timer(backend, samples))
    assert samples == {"seg0": [1.625], "seg1": [0.0625], "seg2": [0.28125], "seg3": [0.015625]}
    assert Backend.syncs == 4


def test_a_budget_stops_before_the_leaf_that_would_not_fit_and_is_recorded():
    class Model:
        pred = [1.7, 0.1, 0.3, 0.1]
        seen = []

        def observe(self, leaf, seconds):
            self.seen.append((leaf, seconds))

    clock, model = Clock(), Model()
    s = session(wire(segment_units(), clock, []), clock, model)
    with pytest.raises(NoResultError, match="no leaf evaluated yet"):
        s.result()
    t0 = clock()
    s.advance(t0, t0 + 1.8, 1800.0, 4, 1)  # leaf 0 (1.625) + leaf 1 (predicted 0.1) fit; leaf 2 (0.3) does not
    r = s.result()
    assert (r.leaves, r.stopped_by, r.met_budget, r.budget_ms) == (2, "budget", True, 1800.0)
    assert model.seen == [(0, 1.625), (1, 0.0625)]
    assert s.cached_nodes == ("b0.0",)  # only what leaves 2 and 3 still need
