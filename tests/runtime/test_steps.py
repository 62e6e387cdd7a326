"""Steps of several leaves: plans "subtrees" and "fused", and the mixed runner, on the fake numpy backend with a
virtual clock (every prefix against independently computed paths, budgets, sessions, cancel, Agreement, the
choice between a whole subtree and its leaves). The same plans on real files: tests/runtime/test_runner_bundle.py."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.errors import InputError
from hne_edge.runtime import Agreement, AnytimeRunner
from hne_edge.tree import TreeSpec
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle, reference_leaf_logits

CLASSES = 4
ALL = ("segments", "subtrees", "fused", "first")


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("steps") / "b", branching=(1, 2, 2, 2, 2), classes=CLASSES, plans=ALL)


def fake_runner(bundle, plan, cost=None, call_cost=None, **kw):
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost, call_cost)
    kw.setdefault("warmup", 0)
    return AnytimeRunner(bundle, backend=backend, plan=plan, load_profile=False, **kw), backend


def images(batch=2, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, C, H, W)).astype(np.float32)


class Forced:
    """A cost model that makes a mixed runner take exactly the big steps in ``take`` (every step predicted
    at 1 s, those at 0 s and the others above their leaves), and records what it observes."""

    def __init__(self, runner, take):
        steps = runner.steps
        self.pred = [0.0 if j in take else (1.0 if s["kind"] == "leaf" else 1e9) for j, s in enumerate(steps)]
        self.known = [True] * len(steps)
        self.base = self.pred  # medians: the same
        self.seen = []

    def observe(self, step, seconds):
        self.seen.append(step)

    def for_batch(self, batch):
        return self


# -- numerics: every stop, every schedule ---------------------------------------------------------------


@pytest.mark.parametrize("plan", ["subtrees", "fused", "mixed"])
@pytest.mark.parametrize("branching", [(1, 2, 2), (1, 2, 2, 2, 2), (1, 4, 2), (2, 2), (3, 1, 2), (1, 1, 4)])
def test_every_stop_equals_independent_paths(tmp_path, plan, branching):
    b = make_fake_bundle(tmp_path / "b", branching=branching, classes=CLASSES, plans=ALL)
    runner, backend = fake_runner(b, plan)
    tree = TreeSpec(branching)
    x = images(3)
    ref = reference_leaf_logits(tree, x, CLASSES)
    want = {"subtrees": tuple(u.end for u in tree.subtree_units), "fused": (tree.num_leaves,)}
    assert runner.stops == want.get(plan, tuple(range(1, tree.num_leaves + 1)))
    for n in runner.stops:
        r = runner.run(x, max_leaves=n)
        assert r.leaves == n
        np.testing.assert_allclose(r.leaf_logits, ref[:n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r.logits, ref[:n].mean(0), rtol=1e-5, atol=1e-5)
    session = runner.start(x)
    while session.step():
        assert session.leaves in runner.stops
    np.testing.assert_allclose(session.result().leaf_logits, ref, rtol=1e-5, atol=1e-5)


def test_every_mixed_schedule_computes_each_node_once_and_every_leaf_right(bundle16):
    runner, backend = fake_runner(bundle16, "mixed")
    tree, x = runner.tree, images(2)
    ref = reference_leaf_logits(tree, x, CLASSES)
    big = [j for j, s in enumerate(runner.steps) if s["kind"] != "leaf"]
    assert [runner.steps[j]["leaves"] for j in big] == [(2, 4), (4, 8), (8, 16), (0, 16)]
    for k in range(len(big) + 1):
        for take in itertools.combinations(big, k):
            runner.cost = Forced(runner, set(take))
            for n in range(1, 17):
                backend.calls.clear()
                r = runner.run(x, max_leaves=n)
                np.testing.assert_allclose(r.leaf_logits, ref[:n], rtol=1e-5, atol=1e-5)
                assert sorted(backend.calls) == sorted(tree.prefix_nodes(n))  # each node of the prefix, once
                # the schedule: a big step is taken where it starts and ends within n (the tree: only a full run)
                taken = [(lo, hi) for lo, hi, _ in r.step_ms]
                want, pos = [], 0
                while pos < n:
                    nxt = next((runner.steps[j]["leaves"] for j in take if runner.steps[j]["leaves"][0] == pos
                                and runner.steps[j]["leaves"][1] <= n), (pos, pos + 1))  # fmt: skip
                    want.append(nxt)
                    pos = nxt[1]
                assert taken == want, (take, n)
            session = runner.start(x)  # a session: may be cancelled or refined, so never the whole tree
            session.refine()
            assert (0, 16) not in [(lo, hi) for lo, hi, _ in session.result().step_ms]
            np.testing.assert_allclose(session.result().leaf_logits, ref, rtol=1e-5, atol=1e-5)


# -- limits at step granularity ---------------------------------------------------------------------------


def test_max_and_min_leaves_round_to_the_plans_stops(bundle16):
    runner, backend = fake_runner(bundle16, "subtrees")
    x = images(1)
    assert runner.run(x, max_leaves=7).leaves == 4  # down: never more than asked
    assert runner.run(x, max_leaves=7).stopped_by == "max_leaves"
    assert runner.run(x, min_leaves=3, budget_ms=1e-6).leaves == 4  # up: at least what was asked
    with pytest.raises(InputError, match=r"min_leaves=5 and max_leaves=7: plan 'subtrees' stops only at 1, 2, 4, 8, 16 leaves"):
        runner.run(x, min_leaves=5, max_leaves=7)
    fused, _ = fake_runner(bundle16, "fused")
    with pytest.raises(InputError, match=r"max_leaves=8: plan 'fused' stops only at 16 leaves"):
        fused.run(x, max_leaves=8)
    assert fused.run(x).leaves == 16 and fused.first_leaf_file is None  # the first-leaf file is not its business
    with pytest.raises(InputError, match=r"max_leaves: received 17; expected an int in 1..16"):
        runner.run(x, max_leaves=17)


def test_budget_starts_a_subtree_only_if_its_predicted_cost_fits(bundle16):
    runner, backend = fake_runner(bundle16, "subtrees", cost=lambda node, batch: 0.001)
    for _ in range(10):
        runner.run(images(1))
    # unit costs: leaf 0's chain 5 ms, then subtrees of 1, 3, 7, 15 nodes
    np.testing.assert_allclose(runner.predicted_ms(1), [5, 1, 3, 7, 15], rtol=1e-9)
    for budget, leaves in [(5.5, 1), (6.01, 2), (8.99, 2), (9.01, 4), (16.01, 8), (30.99, 8), (31.01, 16)]:
        r = runner.run(images(1), budget_ms=budget)
        assert (r.leaves, r.met_budget) == (leaves, True), budget
        assert r.elapsed_ms == pytest.approx(sum([5, 1, 3, 7, 15][: leaves.bit_length()]))
    r = runner.run(images(1), budget_ms=9.01)
    assert [(lo, hi) for lo, hi, _ in r.step_ms] == [(0, 1), (1, 2), (2, 4)]
    np.testing.assert_allclose(r.leaf_ms, [5, 1, 1.5, 1.5])  # a step's time split over its leaves


def test_session_steps_cancel_and_agreement_act_at_step_boundaries(bundle16):
    runner, backend = fake_runner(bundle16, "subtrees")
    session = runner.start(images(1))
    assert session.step() and session.leaves == 1
    assert session.step() and session.leaves == 2
    assert session.refine(max_leaves=7).leaves == 4
    assert session.cached_nodes == ("b0.0", "b1.0")  # what the subtrees of leaves 4-7 and 8-15 read
    assert session.refine().leaves == 16 and not session.step()
    seen = []
    r = runner.run(images(2), stop_when=lambda ll: seen.append(ll.shape[0]) or ll.shape[0] >= 3)
    assert (r.leaves, r.stopped_by, seen) == (4, "stop_when", [1, 2, 4])
    r = runner.run(images(1), stop_when=Agreement(min_leaves=2, vote=0.01))
    assert r.leaves == 2 and r.stopped_by == "stop_when"
    # cancel from another thread while a subtree runs: the session stops when that subtree is done
    session = runner.start(images(1))
    session.step()
    backend.gate = threading.Event()
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", session.refine()), daemon=True)
    worker.start()
    assert backend.entered.wait(10)  # inside the subtree of leaf 1
    session.cancel()
    backend.gate.set()
    worker.join(10)
    assert (box["r"].leaves, box["r"].stopped_by) == (2, "cancelled")


def test_mixed_keeps_every_leaf_for_a_stop_rule_and_a_session_never_takes_the_whole_tree(bundle16):
    runner, backend = fake_runner(bundle16, "mixed")
    runner.cost = Forced(runner, {j for j, s in enumerate(runner.steps) if s["kind"] != "leaf"})
    seen = []
    r = runner.run(images(1), stop_when=lambda ll: seen.append(ll.shape[0]) and False)
    assert r.leaves == 16 and seen == list(range(1, 16))  # leaf by leaf: the rule saw every prefix
    backend.files.clear()
    assert runner.run(images(1)).leaves == 16 and backend.files == ["onnx/fp32/fused/tree.onnx"]
    backend.files.clear()
    assert runner.run(images(1), max_leaves=15).leaves == 15 and "onnx/fp32/fused/tree.onnx" not in backend.files
    backend.files.clear()
    runner.start(images(1)).refine()
    assert backend.files == [f"onnx/fp32/segments/leaf0{i}.onnx" for i in (0, 1)] + [
        f"onnx/fp32/subtrees/unit0{i}.onnx" for i in (2, 3, 4)]  # fmt: skip


# -- the choice is the cost model's: a subtree slower than its leaves is never taken ----------------------


@pytest.mark.parametrize("subtree_speed", [0.5, 2.0])
def test_mixed_takes_a_big_step_only_where_it_measures_faster(bundle16, subtree_speed):
    """Each call costs 1 ms plus 1 ms per node, times ``subtree_speed`` for a subtree or the tree (grouped
    convolutions that run faster, or slower, than the same nodes one leaf at a time)."""

    def call_cost(unit, batch):
        return 0.001 + (0.001 * len(unit.nodes) * (subtree_speed - 1) if unit.num_leaves > 1 else 0.0)

    runner, backend = fake_runner(bundle16, "mixed", cost=lambda node, batch: 0.001, call_cost=call_cost)
    prof = runner.profile(warmup=0, repeats=3, save=False)
    assert len(prof.batches[1]["leaves"]) == len(runner.steps)  # every step measured, on its route
    for budget in (None, 12.0, 40.0, 1000.0):
        backend.files.clear()
        r = runner.run(images(1), budget_ms=budget)
        big = [f for f in backend.files if "subtrees" in f or "fused" in f]
        assert bool(big) == (subtree_speed < 1), (budget, backend.files)
        assert r.met_budget


# -- deadlines against an oracle, on recorded timings (virtual clock) ---------------------------------------


RECORDED = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "steps_hne_resnet_small_ort_cpu_b1.json"


def replay(bundle, plan, times, names, frames, seed=0):
    """``plan`` on the fake backend, each call costing its recorded time in frame ``k`` (virtual clock): profiled
    on frames 0-99 (each call draws one), then ``frames`` budgeted frames drawn from 100 on. Returns per frame
    (k, budget, result) and the runner."""
    runner, backend = fake_runner(bundle, plan, cost=lambda node, batch: 0.0)
    column = {f"onnx/fp32/{name}": j for j, name in enumerate(names)}
    column.update({"onnx/fp32/subtrees/unit00.onnx": 0, "onnx/fp32/subtrees/unit01.onnx": 1})  # leaf 0, leaf 1
    column["onnx/fp32/first/leaf00.onnx"] = 0  # not recorded: leaf 0's time (a frame ending after leaf 0 runs it)
    frame, draw, rng = {"k": 0}, np.random.default_rng(seed), np.random.default_rng(seed + 1)
    real = lambda unit, batch: times[frame["k"], column[unit.name]]  # noqa: E731
    backend.call_cost = lambda unit, batch: (frame.__setitem__("k", int(draw.integers(100))), real(unit, batch))[1]
    runner.profile(warmup=0, repeats=30, save=False)
    backend.call_cost = real
    first, full = np.median(times[:, 0]), np.median(times[:, :16].sum(1))
    out = []
    for _ in range(frames):
        frame["k"] = k = int(rng.integers(100, len(times)))
        budget = rng.uniform(first, full)
        out.append((k, budget, runner.run(images(1), budget_ms=budget * 1e3)))
    return out, runner


def test_mixed_deadlines_against_the_oracle_on_recorded_timings(bundle16):
    """Every step's time, frame by frame, as measured on ONNX Runtime (benchmarks/record_steps.py: hne_resnet_small,
    batch 1, every route of the mixed program): the runner plays frame k on a virtual clock; the oracles
    (program.best_leaves) know all of frame k's times. Budgets uniform between the first leaf and the full tree
    leaf by leaf (the deadline benchmark's). Issue 21's targets: misses <= 1%, leaves >= 95% of the oracle's
    (leaf by leaf, the benchmark's oracle). Against an oracle that also knows when a whole subtree or the tree
    fits, the cost model's p99 margin costs more on big steps: BENCHMARKS.md reports both."""
    import json

    from hne_edge.runtime.program import best_leaves

    data = json.loads(RECORDED.read_text())
    times = np.asarray(data["frames_ms"]) / 1e3  # (frames, steps): seconds
    names = [s["name"] for s in data["steps"]]
    frames = 1000
    mixed, runner = replay(bundle16, "mixed", times, names, frames)
    assert [s["name"].split("fp32/")[-1] for s in runner.steps] == names  # the recorded steps are this program's
    program = runner._program
    leaf_by_leaf = program.routes()[0]
    misses = sum(not r.met_budget and not r.overran_min_leaves for _, _, r in mixed)
    leaves = sum(r.leaves for _, _, r in mixed)
    oracle = sum(best_leaves(leaf_by_leaf, times[k], b) for k, b, _ in mixed)
    oracle_all = sum(best_leaves(program, times[k], b) for k, b, _ in mixed)
    assert misses <= 0.01 * frames, misses
    assert leaves >= 0.95 * oracle, (leaves, oracle)
    assert oracle_all > oracle and leaves >= 0.8 * oracle_all, (leaves, oracle_all)
    assert sum(any(hi - lo > 1 for lo, hi, _ in r.step_ms) for _, _, r in mixed) > 0.3 * frames  # it uses subtrees
    # the same frames and budgets leaf by leaf: mixing evaluates more leaves
    segments, _ = replay(bundle16, "segments", times, names, frames)
    assert [(k, b) for k, b, _ in segments] == [(k, b) for k, b, _ in mixed]
    assert leaves > sum(r.leaves for _, _, r in segments)
