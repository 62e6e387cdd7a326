"""Scheduler, sessions, budgets, cancel/concurrency and input checks - on a fake numpy backend with a virtual clock."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from hne_edge.errors import BackendUnavailable, InputError
from hne_edge.runtime import (
    Agreement,
    AnytimeRunner,
    ConcurrentUseError,
    CostModel,
    RunnerClosedError,
    create_backend,
)
from hne_edge.runtime import profile_file
from hne_edge.runtime.bench import frame_oracles
from hne_edge.tree import TreeSpec
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle, reference_leaf_logits

CLASSES = 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("fake") / "b", branching=(1, 2, 2), classes=CLASSES)


@pytest.fixture(scope="module")
def big_bundle(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("fake16") / "b", branching=(1, 2, 2, 2, 2), classes=CLASSES)


def fake_runner(bundle, plan="segments", cost=None, **kw):
    from hne_edge.bundle import read_manifest

    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost)
    kw.setdefault("warmup", 0)
    return AnytimeRunner(bundle, backend=backend, plan=plan, load_profile=False, **kw), backend


def images(batch=2, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, C, H, W)).astype(np.float32)


# -- numerics and caching -----------------------------------------------------------------------------


@pytest.mark.parametrize("plan", ["segments", "nodes"])
def test_first_leaf_file_runs_frames_that_stop_after_leaf_0(tmp_path, plan):
    b = make_fake_bundle(tmp_path / "b", classes=CLASSES, plans=("segments", "nodes", "first"))
    x = images(2)
    ref = reference_leaf_logits(TreeSpec((1, 2, 2)), x, CLASSES)
    runner, backend = fake_runner(b, plan)
    assert backend.active == len(runner._runners) + 1  # the first-leaf file has its own (active) runner
    assert runner.first_leaf_file == "onnx/fp32/first/leaf00.onnx"
    r = runner.run(x, max_leaves=1)
    assert backend.files == ["onnx/fp32/first/leaf00.onnx"]
    np.testing.assert_allclose(r.logits, ref[0], rtol=1e-5, atol=1e-6)
    assert not runner.cost.for_batch(2).known[0]  # its cheaper time is not a sample of leaf 0's segment
    # frames that go on, and sessions (which may go on), run leaf 0's exporting file(s)
    backend.files.clear()
    r = runner.run(x, max_leaves=2)
    assert "onnx/fp32/first/leaf00.onnx" not in backend.files
    np.testing.assert_allclose(r.leaf_logits, ref[:2], rtol=1e-5, atol=1e-6)
    backend.files.clear()
    runner.start(x).step()
    assert "onnx/fp32/first/leaf00.onnx" not in backend.files
    runner.close()
    assert backend.active == 0
    # opted out: leaf 0's segment / nodes even for max_leaves=1
    runner, backend = fake_runner(b, plan, first_leaf=False)
    runner.run(x, max_leaves=1)
    assert "onnx/fp32/first/leaf00.onnx" not in backend.files and backend.active == len(runner._runners)
    assert runner.first_leaf_file is None


def test_a_budget_that_holds_no_step_after_leaf_0_runs_the_first_leaf_file(tmp_path):
    """Issue 40: a run() whose budget holds leaf 0 but no step after it stops after leaf 0 whatever it runs, so it
    runs the export-free first-leaf file (here 3 ms against leaf 0's exporting segment's 4 ms): a budget between the
    two is met, not overrun. Not while a step involved is unmeasured, nor for a session (it may go on), nor when
    min_leaves forces more; and its time is no sample of leaf 0's segment."""
    b = make_fake_bundle(tmp_path / "b", classes=CLASSES, plans=("segments", "first"))
    x = images(1)
    ref = reference_leaf_logits(TreeSpec((1, 2, 2)), x, CLASSES)
    first = "onnx/fp32/first/leaf00.onnx"
    runner, backend = fake_runner(b, cost=lambda node, batch: 0.001)
    backend.call_cost = lambda unit, batch: 0.0 if unit.name == first else 0.001  # an exported output costs
    backend.files.clear()
    r = runner.run(x, budget_ms=3.5)  # nothing measured yet: leaf 0's segment, learned (a forced overrun)
    assert first not in backend.files and (r.leaves, r.met_budget, r.overran_min_leaves) == (1, False, True)
    for _ in range(5):
        runner.run(x)
    model = runner.cost.for_batch(1)
    samples = len(model.times[0])
    for budget in (3.5, 5.0):  # leaf 0's segment (4 ms) does not fit 3.5; after it, leaf 1 (2 ms) fits neither
        backend.files.clear()
        r = runner.run(x, budget_ms=budget)
        assert backend.files == [first] and (r.leaves, r.met_budget, r.stopped_by) == (1, True, "budget"), budget
        assert r.elapsed_ms == pytest.approx(3.0) and len(model.times[0]) == samples
        np.testing.assert_allclose(r.logits, ref[0], rtol=1e-5, atol=1e-6)
        # the benchmarks' oracle prices leaf 0's step at its own time, not the file's (which would fit leaf 1 in 5 ms)
        assert frame_oracles(runner, x, r, budget)["oracle"] == 1
    backend.files.clear()
    assert runner.run(x, budget_ms=6.5).leaves == 2 and first not in backend.files  # leaf 1 fits: the segment
    backend.files.clear()
    r = runner.run(x, budget_ms=3.5, min_leaves=2)
    assert r.leaves == 2 and first not in backend.files
    backend.files.clear()
    assert runner.start(x).refine(budget_ms=3.5).leaves == 1 and first not in backend.files  # a session may go on


@pytest.mark.parametrize("plan", ["segments", "nodes"])
@pytest.mark.parametrize("branching", [(1, 2, 2), (1, 2, 2, 2, 2), (3, 1, 2), (1, 1, 4)])
def test_every_prefix_equals_independent_paths(tmp_path, plan, branching):
    b = make_fake_bundle(tmp_path / "b", branching=branching, classes=CLASSES)
    runner, _ = fake_runner(b, plan)
    x = images(3)
    ref = reference_leaf_logits(TreeSpec(branching), x, CLASSES)
    for n in range(1, runner.num_leaves + 1):
        r = runner.run(x, max_leaves=n)
        assert r.leaves == n
        np.testing.assert_allclose(r.leaf_logits, ref[:n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r.logits, ref[:n].mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r.probs.sum(-1), 1.0, rtol=1e-5)
        assert r.predictions.shape == (3,)
    assert r.stopped_by == "complete" and r.met_budget


@pytest.mark.parametrize("plan", ["segments", "nodes"])
def test_each_node_computed_once_and_cache_bounded_by_depth(big_bundle, plan):
    runner, backend = fake_runner(big_bundle, plan)
    tree = runner.tree
    session = runner.start(images(1))
    assert session.cached_nodes == ()
    for leaf in range(tree.num_leaves):
        assert session.step() is True
        cached = session.cached_nodes
        # only nodes of the current path whose subtree still has leaves to evaluate
        assert set(cached) <= set(tree.path(leaf))
        assert all(tree.node(n).leaves[-1] > leaf for n in cached)
        assert len(cached) <= tree.last_block
    assert session.step() is False and session.done
    assert sorted(backend.calls) == sorted(n.id for n in tree.nodes)  # every node exactly once
    assert backend.calls == list(tree.prefix_nodes(tree.num_leaves))  # in depth-first order


def test_session_result_before_any_leaf_is_a_clear_error(bundle):
    runner, _ = fake_runner(bundle)
    session = runner.start(images())
    with pytest.raises(RuntimeError, match="no leaf evaluated yet"):
        session.result()


def test_interrupt_and_resume_matches_uninterrupted(big_bundle):
    runner, backend = fake_runner(big_bundle)
    x = images(2)
    ref = reference_leaf_logits(runner.tree, x, CLASSES)
    session = runner.start(x)
    session.step()
    session.step()
    r2 = session.result()
    assert r2.leaves == 2 and r2.stopped_by == "step"
    np.testing.assert_allclose(r2.logits, ref[:2].mean(0), rtol=1e-5, atol=1e-6)
    r5 = session.refine(max_leaves=5)
    assert r5.leaves == 5 and r5.stopped_by == "max_leaves"
    np.testing.assert_allclose(r5.logits, ref[:5].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r2.logits, ref[:2].mean(0), rtol=1e-5, atol=1e-6)  # earlier result unchanged
    r16 = session.refine()
    assert r16.leaves == 16 and r16.stopped_by == "complete"
    np.testing.assert_allclose(r16.logits, ref.mean(0), rtol=1e-5, atol=1e-6)
    assert len(backend.calls) == len(runner.tree.nodes)  # resuming recomputed nothing
    assert session.step() is False
    assert session.refine().leaves == 16


def test_refine_under_budget_continues_from_cache(bundle):
    runner, backend = fake_runner(bundle, cost=lambda node, batch: 0.001)  # 1 ms per node
    for _ in range(10):  # learn the costs (deterministic: scale 1.0)
        runner.run(images(1))
    session = runner.start(images(1))
    session.step()  # leaf 0: 3 nodes
    # leaves 1, 2, 3 cost 1, 2, 1 ms
    r = session.refine(budget_ms=2.5)
    assert r.leaves == 2 and r.stopped_by == "budget" and r.met_budget
    r = session.refine(budget_ms=3.0)
    assert r.leaves == 4 and r.stopped_by == "complete" and r.met_budget


# -- budgets and deadlines (virtual clock: exact) -------------------------------------------------------


def warm(runner, n=10):
    for _ in range(n):
        runner.run(images(1))


def test_budget_starts_a_leaf_only_if_its_predicted_cost_fits(bundle):
    runner, backend = fake_runner(bundle, cost=lambda node, batch: 0.001)
    # leaf costs: 3, 1, 2, 1 ms (tree (1,2,2), 1 ms per node)
    # no profile: the forced first leaf calibrates ms/MAC, the rest is predicted from MACs (x1.5 while cold)
    first = runner.run(images(1), budget_ms=4.4)
    assert first.leaves == 1 and first.stopped_by == "budget"
    assert runner.run(images(1), budget_ms=100).leaves == 4
    warm(runner)
    np.testing.assert_allclose(runner.predicted_ms(1), [3, 1, 2, 1], rtol=1e-9)
    for budget, leaves in [(2.0, 1), (3.01, 1), (4.01, 2), (5.99, 2), (6.01, 3), (6.5, 3), (7.01, 4), (100, 4)]:
        r = runner.run(images(1), budget_ms=budget)
        assert r.leaves == leaves, (budget, r.leaves)
        assert r.met_budget == (budget > 3) and r.overran_min_leaves == (budget < 3)
        assert r.elapsed_ms == pytest.approx(sum([3, 1, 2, 1][:leaves]))
        assert r.budget_ms == pytest.approx(budget)


def test_deadline_is_absolute_clock_time_and_earlier_of_both_wins(bundle):
    runner, backend = fake_runner(bundle, cost=lambda node, batch: 0.001)
    warm(runner)
    r = runner.run(images(1), deadline=backend.clock.t + 0.0045)
    assert r.leaves == 2 and r.met_budget
    r = runner.run(images(1), deadline=backend.clock.t + 0.0045, budget_ms=100)
    assert r.leaves == 2
    r = runner.run(images(1), deadline=backend.clock.t + 1.0, budget_ms=3.5)
    assert r.leaves == 1


def test_forced_min_leaves_overrun_is_reported(bundle):
    runner, _ = fake_runner(bundle, cost=lambda node, batch: 0.001)
    warm(runner)
    r = runner.run(images(1), budget_ms=1.0, min_leaves=2)
    assert r.leaves == 2 and not r.met_budget and r.overran_min_leaves
    r = runner.run(images(1), budget_ms=1.0)
    assert r.leaves == 1 and not r.met_budget and r.overran_min_leaves


def test_a_preempted_forced_leaf_is_a_miss_not_a_forced_one(bundle):
    """Issue 20 item 9: the demo counted pre-emptions as forced misses (2 at a 2.663 ms budget, first leaf 0.103 ms).

    Forced means the budget was shorter than the forced leaves: here leaf 0 is predicted at 3 ms."""
    stall = {"ms": 0.0}
    runner, _ = fake_runner(bundle, cost=lambda node, batch: 0.001 + (stall["ms"] / 1e3 if node == "b0.0" else 0))
    warm(runner)
    stall["ms"] = 7.0  # the process is pre-empted for 7 ms inside leaf 0 of this frame
    r = runner.run(images(1), budget_ms=5.0)
    assert r.leaves == 1 and r.elapsed_ms == pytest.approx(10.0) and not r.met_budget and not r.overran_min_leaves
    stall["ms"] = 0.0
    warm(runner, 30)
    r = runner.run(images(1), budget_ms=2.0)  # shorter than the first leaf: forced
    assert r.leaves == 1 and not r.met_budget and r.overran_min_leaves


@pytest.mark.filterwarnings("ignore:this machine is too busy")  # the next test's subject
def test_a_loaded_machine_misses_budgets_that_fit_the_first_leaf_without_calling_them_forced(tmp_path):
    """Reproduces issue 28: under CPU load the mixed plan labelled misses "forced: the budget was shorter than the
    minimum leaves" at budgets of 1-4x the fused tree's median, when the first leaf's median was 0.07 ms. The
    first leaf's prediction carries the loaded machine's tail margin (up to the whole tree plus itself); forced
    means the budget is shorter than what the forced leaves take 9 times in 10 (their own p90), and that is not it."""
    b = make_fake_bundle(tmp_path / "b", classes=CLASSES, plans=("segments", "subtrees", "fused"))
    rng = np.random.default_rng(0)
    load = {"on": False}

    def cost(node, batch):  # 0.02 ms a node (leaf 0: 0.06 ms, the tree: 0.14 ms); loaded: one node in 40 pre-empted
        return 2e-5 * (12.0 if load["on"] and rng.random() < 0.025 else 1.0)

    runner, _ = fake_runner(b, plan="mixed", cost=cost)
    runner.profile(batch_sizes=(1,), warmup=2, repeats=20, save=False)
    levels = runner.profile_data.batches[1]["levels"]
    first, full = levels[0]["median_ms"], levels[-1]["median_ms"]
    load["on"] = True
    for budget in (full, 2 * full, 4 * full):
        results = [runner.run(images(1), budget_ms=budget) for _ in range(200)]
        # (the stall model keeps these budgets now: issue 39; a miss, where one comes, is the load's)
        assert sum(r.overran_min_leaves for r in results) == 0, budget  # none of them for want of budget
    short = [runner.run(images(1), budget_ms=first / 2) for _ in range(20)]
    assert all(r.overran_min_leaves for r in short)  # shorter than the first leaf itself: forced, every one


def test_a_machine_too_busy_for_its_budgets_is_said_once_with_the_slowdown(tmp_path):
    """Reproduces issue 28: the segments plan at twice the profiled tree missed 24 % of frames at load 15-18 on 2
    cores, silently, frame after frame. Now one warning says so, with the measured slowdown against the profile;
    a quiet machine says nothing, nor do budgets shorter than the first leaf (forced misses: the budget's fault)."""
    import warnings

    b = make_fake_bundle(tmp_path / "b", classes=CLASSES)
    rng = np.random.default_rng(0)
    stalls = {"p": 0.0}  # the chance that a node's process is pre-empted (30x its time)
    runner, _ = fake_runner(b, cost=lambda node, batch: 1e-4 * (30.0 if rng.random() < stalls["p"] else 1.0))
    runner.profile(batch_sizes=(1,), warmup=2, repeats=20, save=False)
    levels = runner.profile_data.batches[1]["levels"]
    first, full = levels[0]["median_ms"], levels[-1]["median_ms"]

    def frames(budget_ms: float, n: int) -> tuple[list, list[str]]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            results = [runner.run(images(1), budget_ms=budget_ms) for _ in range(n)]
        return results, [str(w.message) for w in said]

    results, said = frames(first / 2, 100)
    assert all(not r.met_budget for r in results) and said == []  # forced, every one: nothing to say of the machine
    assert frames(2 * full, 100)[1] == []  # quiet: every frame in time
    stalls["p"] = 0.1
    results, said = frames(2 * full, 300)
    missed = sum(not r.met_budget for r in results)
    assert missed > 60, missed  # frame after frame
    assert len(said) == 1, said
    assert said[0].startswith(f"this machine is too busy to keep its budgets (the last: {2 * full:.3g} ms): ")
    assert "frames missed budgets that fit their forced leaves; those frames took a median " in said[0], said
    assert "x what the profile measured for their steps" in said[0] and "said once per runner" in said[0], said


def test_a_plan_that_cannot_stop_within_the_budget_says_so_once(tmp_path):
    """Reproduces issue 28: `run --plan fused` with a budget it cannot meet ran all 16 leaves of every frame, missing
    each, without a word. The result says the miss was forced, and one warning says why and what stops in time."""
    import warnings

    b = make_fake_bundle(tmp_path / "b", classes=CLASSES, plans=("segments", "fused"))
    runner, _ = fake_runner(b, plan="fused", cost=lambda node, batch: 1e-3)  # the tree: 7 ms
    warm(runner)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        results = [runner.run(images(1), budget_ms=2.0) for _ in range(5)]
        fits = runner.run(images(1), budget_ms=20.0)
    assert all(r.leaves == 4 and not r.met_budget and r.overran_min_leaves for r in results)
    assert fits.met_budget and fits.leaves == 4
    assert [str(w.message) for w in said] == [
        "plan 'fused' stops only at 4 leaves, so a frame runs 4 leaves at least (1 asked): a budget of 2 ms cannot hold "
        "them (this frame took 7 ms and missed it; every such frame will); plan 'segments' or 'mixed' stops within a "
        "budget"]


def test_unexpectedly_slow_leaf_is_a_miss_not_an_overrun_and_is_learned(bundle):
    slow = {"on": False}
    runner, _ = fake_runner(bundle, cost=lambda node, batch: 0.004 if slow["on"] and node == "b2.1" else 0.001)
    warm(runner)
    slow["on"] = True
    r = runner.run(images(1), budget_ms=4.5)  # leaf 1 predicted 1 ms, takes 4
    assert r.leaves == 2 and not r.met_budget and not r.overran_min_leaves
    before = runner.predicted_ms(1)[1]
    warm(runner, 20)
    assert runner.predicted_ms(1)[1] > before  # online update


def test_deadline_simulation_meets_targets(big_bundle):
    """1000 frames, per-node costs with log-normal noise, budgets uniform in [first leaf, full tree]."""
    rng = np.random.default_rng(0)
    nodes = [n.id for n in TreeSpec((1, 2, 2, 2, 2)).nodes]
    base = {n: 0.001 * (1 + 0.5 * TreeSpec((1, 2, 2, 2, 2)).node(n).depth) for n in nodes}
    frame = {"costs": None}
    runner, backend = fake_runner(big_bundle, cost=lambda node, batch: frame["costs"][node])
    tree = runner.tree
    full = sum(base.values())
    first = sum(base[n] for n in tree.segments[0].nodes)
    misses = leaves = oracle = 0
    for k in range(1100):
        noise = rng.lognormal(0.0, 0.1, size=len(nodes)) * (1.5 if rng.random() < 0.02 else 1.0)
        frame["costs"] = {n: base[n] * z for n, z in zip(nodes, noise)}
        budget = rng.uniform(first, full) * 1e3
        r = runner.run(images(1), budget_ms=budget)
        if k < 100:  # warm-up frames learn the costs
            continue
        misses += (not r.met_budget) and not r.overran_min_leaves
        true = np.cumsum([sum(frame["costs"][n] for n in seg.nodes) for seg in tree.segments]) * 1e3
        oracle += max(1, int((true <= budget).sum()))
        leaves += r.leaves
    assert misses <= 10, misses
    assert leaves >= 0.9 * oracle, (leaves, oracle)


def test_budget_argument_errors(bundle):
    runner, _ = fake_runner(bundle)
    for kwargs, match in [
        ({"budget_ms": -1}, "budget_ms: received -1; expected a positive"),
        ({"budget_ms": float("nan")}, "budget_ms: received nan"),
        ({"deadline": "soon"}, "deadline: received 'soon'; expected an absolute time.perf_counter"),
        ({"max_leaves": 0}, r"max_leaves: received 0; expected an int in 1..4"),
        ({"max_leaves": 5}, r"max_leaves: received 5"),
        ({"min_leaves": 0}, r"min_leaves: received 0; expected an int in 1\.\.4"),  # one range, as at 5 (issue 28)
        ({"min_leaves": 3, "max_leaves": 2}, "expected min_leaves <= max_leaves"),
    ]:
        with pytest.raises(InputError, match=match):
            runner.run(images(), **kwargs)


def test_plausible_wrong_arguments_are_one_line_input_errors_before_any_work(bundle):
    """A string quantile, one int for a list of batch sizes, no profile, min_leaves=0 in refine, options beside a
    built backend: each an InputError naming what was received, never a TypeError or a silently dropped option."""
    from hne_edge.bundle import read_manifest

    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes)
    with pytest.raises(InputError, match=r"quantile: received '0.9'; expected a number in \[0.5, 1\)"):
        AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0, quantile="0.9")
    assert backend.files == []  # refused before any unit ran
    with pytest.raises(InputError, match=r"spinning, threads: received with a built backend \(FakeBackend\); expected"):
        AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0, threads=1, spinning=True)
    runner, _ = fake_runner(bundle)
    for call, match in [
        (lambda: runner.profile(batch_sizes=4, save=False), r"batch_sizes: received 4; expected a list of batch sizes"),
        (lambda: runner.warmup(4), r"batch_sizes: received 4; expected a list of batch sizes"),
        (lambda: runner.use_profile(None), r"use_profile: received None; expected a Profile"),
        (lambda: runner.start(images()).refine(budget_ms=1e-3, min_leaves=0),
         r"min_leaves: received 0; expected an int in 1\.\.4"),
    ]:  # fmt: skip
        with pytest.raises(InputError, match=match):
            call()


def test_a_budget_or_deadline_too_large_for_a_float_is_an_input_error_and_a_huge_float_is_a_long_one(bundle):
    """`budget_ms=10**400` (an int no float holds) raised OverflowError from run() and from the stream scheduler's
    submit(); both check a budget in one place (session.check_stop_at)."""
    from hne_edge.runtime.streams import StreamScheduler

    runner, _ = fake_runner(bundle)
    for kwargs, match in [({"budget_ms": 10**400}, r"budget_ms: received an int of about 401 digits; expected a positive finite number"),
                          ({"deadline": 10**5000}, r"deadline: received an int of about 5001 digits; expected an absolute")]:  # fmt: skip
        with pytest.raises(InputError, match=match):
            runner.run(images(), **kwargs)
        with StreamScheduler(runner) as streams, pytest.raises(InputError, match=match):
            streams.submit("cam", images(1), **kwargs)
    for kwargs in ({"budget_ms": 1e300}, {"deadline": 1e300}, {"budget_ms": float(2**1000)}):  # finite: a long budget
        r = runner.run(images(), **kwargs)
        assert r.leaves == runner.num_leaves and r.met_budget and json.dumps(r.to_dict(), allow_nan=False)


# -- confidence stop ------------------------------------------------------------------------------------


def test_stop_when_is_called_between_leaves(big_bundle):
    runner, _ = fake_runner(big_bundle)
    seen = []
    r = runner.run(images(2), stop_when=lambda ll: seen.append(ll.shape[0]) or ll.shape[0] >= 3)
    assert r.leaves == 3 and r.stopped_by == "stop_when" and seen == [1, 2, 3]
    r = runner.run(images(2), stop_when=lambda ll: True, min_leaves=4)
    assert r.leaves == 4  # min_leaves wins


def test_agreement_rule():
    agree = np.array([[[3.0, 0, 0]], [[2.0, 1, 0]]], dtype=np.float32)  # (2 leaves, 1 sample, 3 classes)
    split = np.array([[[3.0, 0, 0]], [[0.0, 3, 0]]], dtype=np.float32)
    assert Agreement(min_leaves=2)(agree)
    assert not Agreement(min_leaves=2)(agree[:1])  # too few leaves
    assert not Agreement(min_leaves=2)(split)
    assert Agreement(min_leaves=2, vote=0.5)(split)
    assert not Agreement(min_leaves=2, margin=0.9)(agree)  # top1 - top2 ~ 0.6
    assert Agreement(min_leaves=2, margin=0.5)(agree)
    assert not Agreement(min_leaves=2, max_std=0.1)(agree)
    assert Agreement(min_leaves=2, max_std=1.0)(agree)
    batch = np.concatenate([agree, split], axis=1)  # every sample must agree
    assert not Agreement(min_leaves=2)(batch)
    with pytest.raises(ValueError, match="vote must be in"):
        Agreement(vote=0)


def _first_agreement(leaf_logits: np.ndarray, min_leaves: int, vote: float) -> int:
    """By hand: the first n >= min_leaves at which, for every sample, >= vote of the n leaves pick the
    n-leaf ensemble's class (None: never)."""
    for n in range(min_leaves, leaf_logits.shape[0] + 1):
        top = leaf_logits[:n].mean(0).argmax(-1)  # (batch,)
        share = (leaf_logits[:n].argmax(-1) == top).mean(0)  # (batch,)
        if (share >= vote).all():
            return n
    return None


@pytest.mark.parametrize("seed, min_leaves, vote", [(0, 2, 0.5), (4, 2, 0.5), (0, 3, 0.75), (1, 3, 0.75), (2, 3, 0.75)])
def test_agreement_in_runner_saves_leaves(big_bundle, seed, min_leaves, vote):
    """The runner stops at the first leaf where the rule holds, found by hand on the reference logits (here
    after 2, 8, 3 and 4 of 16 leaves; the last input never agrees): a rule that never stops early fails."""
    runner, _ = fake_runner(big_bundle)
    x = images(1, seed=seed)
    ref = reference_leaf_logits(runner.tree, x, CLASSES)
    expected = _first_agreement(ref, min_leaves, vote)
    r = runner.run(x, stop_when=Agreement(min_leaves=min_leaves, vote=vote))
    if expected is None:
        assert r.leaves == 16 and r.stopped_by == "complete"
    else:
        assert r.leaves == expected < 16 and r.stopped_by == "stop_when"
    np.testing.assert_allclose(r.leaf_logits, ref[: r.leaves], rtol=1e-5, atol=1e-6)


def test_uncertainty_fields(big_bundle):
    runner, _ = fake_runner(big_bundle)
    r1 = runner.run(images(3), max_leaves=1)
    assert (r1.uncertainty.logit_std == 0).all() and (r1.uncertainty.vote_entropy == 0).all()
    r = runner.run(images(3))
    u = r.uncertainty
    assert u.logit_std.shape == (3,) and (u.logit_std > 0).all()
    assert ((u.vote_entropy >= 0) & (u.vote_entropy <= np.log(CLASSES) + 1e-6)).all()
    assert ((u.agreement > 0) & (u.agreement <= 1)).all()
    d = r.to_dict()
    assert len(d["samples"]) == 3 and d["samples"][0]["label"].startswith("c")
    json.dumps(d)


# -- cancel, concurrency, lifecycle ---------------------------------------------------------------------


def test_cancel_from_another_thread_stops_at_the_next_leaf_boundary(big_bundle):
    runner, backend = fake_runner(big_bundle)
    session = runner.start(images(1))
    backend.gate = threading.Event()
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", session.refine()), daemon=True)
    worker.start()
    assert backend.entered.wait(10)  # the worker is inside leaf 0
    session.cancel()
    backend.gate.set()
    worker.join(10)
    r = box["r"]
    assert r.leaves == 1 and r.stopped_by == "cancelled"
    assert session.cancelled and session.done and session.step() is False
    assert session.result().leaves == 1  # kept what was done


def test_concurrent_use_is_refused_with_a_clear_error(bundle):
    runner, backend = fake_runner(bundle)
    backend.gate = threading.Event()
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", runner.run(images(1))), name="worker-A", daemon=True)
    worker.start()
    assert backend.entered.wait(10)
    with pytest.raises(ConcurrentUseError, match=r"busy: received a call from thread 'MainThread' while thread 'worker-A'"):
        runner.run(images(1))
    with pytest.raises(ConcurrentUseError, match="one runner per thread"):
        runner.start(images(1))
    backend.gate.set()
    worker.join(10)
    assert box["r"].leaves == 4  # the first call was not disturbed
    backend.gate = None
    assert runner.run(images(1)).leaves == 4  # usable again


def test_close_releases_everything_and_use_after_close_is_an_error(bundle):
    runner, backend = fake_runner(bundle)
    session = runner.start(images(1))
    session.step()
    assert backend.active == runner.num_leaves
    with runner:
        pass
    assert backend.active == 0 and backend.closed and runner.closed
    runner.close()  # idempotent
    with pytest.raises(RunnerClosedError, match="closed"):
        runner.run(images(1))
    with pytest.raises(RunnerClosedError, match="closed"):
        session.step()
    assert session.result().leaves == 1
    assert "closed" in repr(runner)


def test_unknown_backend_and_device_and_plan(bundle):
    with pytest.raises(BackendUnavailable, match=r"received backend 'tpu'; expected one of"):
        AnytimeRunner(bundle, backend="tpu")
    with pytest.raises(BackendUnavailable, match=r"received device 'npu'; expected one of \['cpu', 'cuda'\] or 'cuda:N'"):
        create_backend("onnxruntime", device="npu")
    with pytest.raises(InputError, match=r"plan: received 'weights'; expected one of"):
        AnytimeRunner(bundle, plan="weights")


def test_a_built_backend_with_another_device_is_refused_and_the_default_device_is_its_own(bundle):
    with pytest.raises(InputError, match=r"device: received 'cuda'; expected the built backend's device 'cpu'"):
        fake_runner(bundle, device="cuda")
    runner, backend = fake_runner(bundle)  # no device given: the backend's, whichever it is
    assert runner.device == backend.device == "cpu"


# -- the input boundary ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, match",
    [
        ([[0.0]], r"received builtins.list; expected a numpy.ndarray"),
        (np.zeros((1, C, H, W), np.float64), r"received dtype float64; expected float32"),
        (np.zeros((1, C, H, W), np.uint8), r"received dtype uint8; expected float32; uint8 images: use runner.preprocess"),
        (np.zeros((C, H, W), np.float32), r"received shape \(3, 4, 4\) \(rank 3\); expected rank 4.*x\[None\]"),
        (np.zeros((1, 1, H, W), np.float32), r"received 1 channels .* expected 3"),
        (np.zeros((1, H, W, C), np.float32), r"received 4 channels .*NHWC\?"),
        (np.zeros((1, C, 5, W), np.float32), r"received spatial size 5x4; expected 4x4"),
        (np.zeros((9, C, H, W), np.float32), r"received batch size 9; expected 1..8"),
        (np.full((1, C, H, W), np.nan, np.float32), r"received 48 non-finite value\(s\)"),
    ],
)
def test_input_checked_once_at_the_boundary(bundle, x, match):
    runner, backend = fake_runner(bundle)
    with pytest.raises(InputError, match=match):
        runner.run(x)
    with pytest.raises(InputError, match=match):
        runner.start(x)
    assert backend.calls == []


def test_preprocess(bundle):
    runner, _ = fake_runner(bundle)
    img = np.random.default_rng(0).integers(0, 256, (H, W, C), dtype=np.uint8)
    x = runner.preprocess(img)
    assert x.shape == (1, C, H, W) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(x[0], (img.transpose(2, 0, 1) / 255.0 - 0.5) / 0.25, rtol=1e-6, atol=1e-6)
    assert runner.preprocess(np.stack([img, img])).shape == (2, C, H, W)
    assert runner.preprocess([img, img, img]).shape == (3, C, H, W)
    assert runner.run(x).leaves == 4
    with pytest.raises(InputError, match=r"received dtype float32; expected uint8"):
        runner.preprocess(img.astype(np.float32))
    with pytest.raises(InputError, match=r"received images of 5x4; expected 4x4"):
        runner.preprocess(np.zeros((5, W, C), np.uint8))
    with pytest.raises(InputError, match=r"received shape \(4, 4, 2\); expected \(H, W, 3\)"):
        runner.preprocess(np.zeros((H, W, 2), np.uint8))


def test_preprocess_reads_a_3d_array_one_way_or_refuses_naming_the_shapes():
    """Issue 42: an RGB image (H, W, 3) given to a grayscale bundle was read as 8 grayscale frames of 8x3 (N, H, W) and
    refused with "resize first". A 3-d array is one image when its last axis is the bundle's channels, a grayscale
    batch (N, H, W) when its last two axes are the bundle's size; an RGB(A) image for a grayscale bundle is refused
    naming its shape, and so is an array that reads either way."""
    from hne_edge.bundle import InputSpec
    from hne_edge.runtime import preprocess

    def spec(c: int, h: int, w: int) -> InputSpec:
        return InputSpec("images", ("batch", c, h, w), "float32", "NCHW", (0.5,) * c, (0.25,) * c, (1, 1, 16))

    gray, rgb = spec(1, 8, 8), spec(3, 8, 8)
    image = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    assert preprocess(image, rgb).shape == (1, 3, 8, 8)  # one HWC frame
    assert preprocess(image[..., :1], gray).shape == (1, 1, 8, 8)  # (H, W, 1): one grayscale frame
    assert preprocess(np.zeros((5, 8, 8), np.uint8), gray).shape == (5, 1, 8, 8)  # (N, H, W): a grayscale batch
    assert preprocess(np.zeros((8, 8), np.uint8), gray).shape == (1, 1, 8, 8)
    with pytest.raises(InputError, match=r"received shape \(8, 8, 3\): one 8x8 image with 3 channels; this bundle takes "
                                         r"1 channel \(grayscale, \(H, W\) or \(N, H, W\)\); convert it to grayscale"):
        preprocess(image, gray)
    square = spec(1, 3, 3)  # (3, 3, 3) is one 3x3 RGB image or three 3x3 grayscale frames
    with pytest.raises(InputError, match=r"received shape \(3, 3, 3\), which reads as one 3x3 image with 3 channels or "
                                         r"as 3 grayscale 3x3 frames; this bundle takes 1 channel: pass grayscale frames "
                                         r"as \(N, 3, 3, 1\)"):
        preprocess(np.zeros((3, 3, 3), np.uint8), square)
    assert preprocess(np.zeros((8, 8, 8), np.uint8), gray).shape == (8, 1, 8, 8)  # 8 channels is no image: 8 frames


def test_runner_validates_inputs_polygraphy_style(bundle):
    runner, _ = fake_runner(bundle)
    unit_runner = runner._runners[0]
    with pytest.raises(InputError, match="received 2 input"):
        unit_runner.run([images(1), images(1)])
    with pytest.raises(InputError, match=r"input tensor image \| received dtype float64; expected float32"):
        unit_runner.run([images(1).astype(np.float64)])
    with pytest.raises(InputError, match=r"received shape \(1, 3, 4\); expected"):
        unit_runner.run([images(1)[..., 0]])
    assert len(unit_runner.run([images(1)])) == 3  # act_b0.0, act_b1.0, logits
    unit_runner.release()
    with pytest.raises(RuntimeError, match="not active"):
        unit_runner.run([images(1)])


# -- cost model -------------------------------------------------------------------------------------------


def test_profile_saved_next_to_bundle_and_reloaded(tmp_path):
    b = make_fake_bundle(tmp_path / "b", classes=CLASSES)
    runner, backend = fake_runner(b, cost=lambda node, batch: 0.001 * batch)
    prof = runner.profile(batch_sizes=(1, 4), warmup=2, repeats=5)
    path = b / "profiles" / "cpu-fake-segments-fp32.json"
    assert runner.profile_path == path and path.is_file()
    data = json.loads(path.read_text())
    assert set(data["batch_sizes"]) == {"1", "4"}
    leaves1 = data["batch_sizes"]["1"]["leaves"]
    assert [round(leaf["median_ms"], 6) for leaf in leaves1] == [3, 1, 2, 1]
    assert data["batch_sizes"]["4"]["levels"][-1]["median_ms"] == pytest.approx(28)
    assert len(data["batch_sizes"]["1"]["units"]) == 4
    assert prof.leaf_medians_s(4) == pytest.approx([0.012, 0.004, 0.008, 0.004])
    # a new runner loads it and predicts from it before any frame
    runner2, _ = fake_runner(b, cost=lambda node, batch: 0.001)
    runner2 = AnytimeRunner(b, backend=FakeBackend(runner.tree, CLASSES), load_profile=True, warmup=0)
    assert runner2.profile_status.startswith("loaded")
    np.testing.assert_allclose(runner2.predicted_ms(1), [3, 1, 2, 1])
    np.testing.assert_allclose(runner2.predicted_ms(2), [6, 2, 4, 2])  # interpolated between 1 and 4
    np.testing.assert_allclose(runner2.predicted_ms(8), [24, 8, 16, 8])  # extrapolated linearly
    # another variant does not match
    runner3 = AnytimeRunner(b, backend=FakeBackend(runner.tree, CLASSES), plan="nodes", warmup=0)
    assert runner3.profile_data is None


def test_profile_falls_back_to_user_cache_when_bundle_is_read_only(tmp_path, monkeypatch):
    b = make_fake_bundle(tmp_path / "b", classes=CLASSES)
    monkeypatch.setenv("HNE_EDGE_CACHE", str(tmp_path / "cache"))
    real = profile_file.atomic_write_json

    def refuse_bundle(path, data):
        if str(path).startswith(str(b)):
            raise PermissionError(13, "Permission denied")
        real(path, data)

    monkeypatch.setattr(profile_file, "atomic_write_json", refuse_bundle)
    runner, _ = fake_runner(b)
    with pytest.warns(UserWarning, match="is not writable.*saved the profile to"):
        runner.profile(warmup=0, repeats=3)
    assert str(runner.profile_path).startswith(str(tmp_path / "cache"))
    assert "not writable" in runner.profile_status
    runner2 = AnytimeRunner(b, backend=FakeBackend(runner.tree, CLASSES), warmup=0)
    assert runner2.profile_path == runner.profile_path


def test_without_profile_predicts_from_macs_after_the_forced_first_leaf():
    model = CostModel([300, 100, 200, 100])
    bm = model.for_batch(1)
    assert all(np.isinf(bm.pred))  # nothing known: only forced leaves
    bm.observe(0, 0.003)
    np.testing.assert_allclose(bm.pred, np.array([3, 1, 2, 1]) * 1e-3 * 1.5)  # MACs, cold margin
    for _ in range(10):
        for i, t in enumerate([0.003, 0.001, 0.002, 0.001]):
            bm.observe(i, t)
    np.testing.assert_allclose(bm.pred, [0.003, 0.001, 0.002, 0.001], rtol=1e-6)


def test_cost_model_quantile_tracks_noise():
    rng = np.random.default_rng(0)
    model = CostModel([1], quantile=0.95)
    bm = model.for_batch(1)
    for _ in range(500):
        bm.observe(0, 0.001 * rng.lognormal(0, 0.2))
    # p95 of lognormal(0, 0.2) is exp(0.329) = 1.39 x the median
    assert 1.2e-3 < bm.pred[0] < 1.6e-3


def test_warmup_runs_the_tree_without_feeding_the_cost_model(bundle):
    runner, backend = fake_runner(bundle, warmup=2)
    assert len(backend.calls) == 2 * len(runner.tree.nodes)
    assert all(np.isinf(runner.predicted_ms(1)))


def test_result_reports_each_leaf_time(bundle):
    runner, _ = fake_runner(bundle, cost=lambda node, batch: 0.001)
    r = runner.run(images(1))
    np.testing.assert_allclose(r.leaf_ms, [3, 1, 2, 1])


def test_closed_session_keeps_its_result_and_says_why(bundle):
    runner, _ = fake_runner(bundle)
    session = runner.start(images(1))
    session.step()
    session.close()
    assert session.done and session.cached_nodes == ()
    r = session.refine()
    assert r.leaves == 1 and r.stopped_by == "closed"
    fresh = runner.start(images(1))
    fresh.close()
    with pytest.raises(RunnerClosedError, match="session is closed and has no leaf"):
        fresh.refine()


def test_the_first_frame_imports_nothing(tiny_bundle):
    """A module imported on the first frame is a stall on it: the input check read ``np.ma`` (to refuse masked
    arrays), which imports numpy.ma, 50 ms of a 1.4 ms first leaf (bench_streams: the first step of every
    replay). In a fresh interpreter, as an application starts."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from hne_edge.runtime import AnytimeRunner\n"
        f"r = AnytimeRunner({str(tiny_bundle.bundle_dir)!r}, backend='onnxruntime', plan='segments', warmup=1)\n"
        "before = set(sys.modules)\n"
        "s = r.input_spec\n"
        "r.run(np.zeros((1, s.channels, *s.spatial), np.float32), max_leaves=1)\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
