"""Deadlines on recorded and GPU-like step timings (virtual clock), the plan-achievable oracle, and the batch model.

Traces (``tests/data/steps_*.json``, the format of ``benchmarks/record_steps.py``): frame ``r`` holds every step's
time of the mixed program of hne_resnet_small, and optionally ``entry_ms[r]``, a run()'s own time before its first
step (input check, upload), ``update_ms[r]``, one update of the cost model (what a run() does after each step it
times) and ``first_ms[r]``, the export-free first-leaf file. ``steps_hne_resnet_small_ort_cpu_b1.json`` was
recorded on ONNX Runtime CPU; ``steps_hne_resnet_small_gpu_like_b1.json`` was built by
``gpu_like_steps.py`` (4aa8883, retired: CHANGELOG.md) from the first H200 run's figures; ``steps_hne_resnet_small_torch_cuda_b{1,16}.json``
were recorded on an NVIDIA H200 by the acceptance run's ``record-steps`` stage (2026-11-26 23:38 UTC, commit 13a352c,
load average 35-57 on its 16 CPUs; 224 and 20 frames). The fake backend computes the tree; each call costs its
recorded time in frame ``k`` of the virtual clock, the upload the frame's entry and each cost-model update its
``update_ms`` (``UPDATE_S`` for traces recorded without it).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.program import best_leaves
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_TRACE = DATA / "steps_hne_resnet_small_ort_cpu_b1.json"
GPU_LIKE = DATA / "steps_hne_resnet_small_gpu_like_b1.json"
H200_B1 = DATA / "steps_hne_resnet_small_torch_cuda_b1.json"
H200_B16 = DATA / "steps_hne_resnet_small_torch_cuda_b16.json"
PROFILE_FRAMES = 100  # frames 0-99 feed the profile; budgeted frames are drawn from the rest (a short trace: half each)
# One cost-model update's host time where a trace did not record it: 3x its median on this project's 2-core machine
# (_BatchModel.observe: 9 us median, 43 us p99 at load 2-6), for a GPU host busier than that (the H200's: load 35-57)
UPDATE_S = 30e-6
# the first-leaf file / leaf 0's chain where a trace did not record the file: the H200 run's standalone network
# (0.543 ms, bench_gpu) over leaf 0's chain (0.615 ms, record_steps), same image, same GPU
FIRST_LEAF_SHARE = 0.88


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("deadlines") / "b", branching=(1, 2, 2, 2, 2), classes=4,
                            plans=("segments", "subtrees", "fused", "first"))  # fmt: skip


class Trace:
    """A steps_*.json trace: ``times[k, j]`` seconds of recorded step ``j`` in frame ``k``; ``entry[k]``,
    ``update[k]`` and ``first[k]`` seconds (recorded, or their stand-ins: 0, ``UPDATE_S``, ``FIRST_LEAF_SHARE``).

    Frames ``0 .. profile_frames - 1`` feed the profile and the rest the budgeted frames: ``PROFILE_FRAMES`` of them,
    or half a trace shorter than twice that (:attr:`short`; a one-frame trace serves both). Budgeted frames are drawn
    with replacement from the rest (resampled, not cycled: a recording is one run's frames, in no order that a replay
    should repeat), so a 20-frame trace (the H200's batch 16) replays its last 10 frames about 100 times each in 1000
    frames: its miss rate says less than a long trace's, and the tests that replay it say so."""

    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.path = path
        self.names = [s["name"] for s in data["steps"]]
        self.times = np.asarray(data["frames_ms"]) / 1e3
        frames = len(self.times)
        self.entry = np.asarray(data.get("entry_ms", [0.0] * frames)) / 1e3
        self.update = np.asarray(data.get("update_ms", [UPDATE_S * 1e3] * frames)) / 1e3
        self.first = np.asarray(data["first_ms"]) / 1e3 if "first_ms" in data else self.times[:, 0] * FIRST_LEAF_SHARE
        if frames == 0:
            raise ValueError(f"{path.name}: no frames in frames_ms; expected at least one recorded frame")
        self.profile_frames = max(1, min(PROFILE_FRAMES, frames // 2))
        self.budgeted = range(self.profile_frames if frames > 1 else 0, frames)  # the frames budgets are drawn from
        self.short = frames < 2 * PROFILE_FRAMES  # fewer frames than a replay wants: some replayed many times

    def draw(self, rng) -> int:
        """A budgeted frame, drawn with replacement."""
        return self.budgeted[int(rng.integers(len(self.budgeted)))]

    def describe(self) -> str:
        """The trace as an assertion message names it (a short one says how short)."""
        note = f"; short: {len(self.times)} frames, budgets drawn from {len(self.budgeted)}" if self.short else ""
        return f"{self.path.name}{note}"

    def column(self, unit_name: str) -> int:
        """The recorded step a fake file's call costs: its own, or (plan subtrees) leaf 0's / leaf 1's chain
        (-2: the first-leaf file, :attr:`first`)."""
        name = unit_name.split("fp32/")[-1]
        special = {"subtrees/unit00.onnx": 0, "subtrees/unit01.onnx": 1, "first/leaf00.onnx": -2}
        return special.get(name, self.names.index(name) if name in self.names else -1)

    def cost(self, k: int, column: int) -> float:
        return self.first[k] if column == -2 else self.times[k, column]

    def full_ms(self, plan: str) -> float:
        """The median of the plan's unbudgeted full run, entry included."""
        cols = {"segments": range(16), "subtrees": [0, 1, *(self.names.index(f"subtrees/unit0{i}.onnx") for i in (2, 3, 4))],
                "mixed": [self.names.index("fused/tree.onnx")], "fused": [self.names.index("fused/tree.onnx")]}[plan]  # fmt: skip
        return float(np.median(self.times[:, list(cols)].sum(1) + self.entry))

    def first_ms(self) -> float:
        return float(np.median(self.times[:, 0] + self.entry))


def replay(bundle, plan, trace: Trace, frames: int, budgets=None, seed: int = 0, profile_repeats: int = 10,
           paired: int = 30, queued: bool = False, **runner_kw):  # fmt: skip
    """``plan`` on the fake backend as ``benchmarks/bench_gpu.py`` runs it, every call costing its recorded time in
    frame ``k`` (virtual clock), the image's upload frame ``k``'s entry and each cost-model update its ``update``:
    profiled on the trace's profile frames (each call draws one), then ``paired`` unbudgeted full runs and first-leaf
    runs (bench_gpu's paired timings: the medians are its budget range), then ``frames`` budgeted frames resampled
    from the rest, budgets uniform in ``budgets`` (seconds; default bench_gpu's: from the first-leaf run to the full
    run, as measured here). ``profile_repeats``: the acceptance run's bench-gpu stage's. Returns [(k, budget, result)],
    the runner."""
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, batch: 0.0)
    backend.queued = queued
    runner = AnytimeRunner(bundle, backend=backend, plan=plan, load_profile=False, warmup=0, **runner_kw)
    frame, draw, rng = {"k": 0}, np.random.default_rng(seed), np.random.default_rng(seed + 1)
    columns = {r.name: trace.column(r.name) for r in [*runner._runners, runner._first_runner] if r is not None}
    real = lambda unit, batch: trace.cost(frame["k"], columns[unit.name])  # noqa: E731
    backend.call_cost = lambda unit, batch: (frame.__setitem__("k", int(draw.integers(trace.profile_frames))), real(unit, batch))[1]
    runner.profile(warmup=0, repeats=profile_repeats, save=False)
    backend.call_cost = real
    backend.upload_cost = lambda batch: trace.entry[frame["k"]]
    time_updates(runner.cost.for_batch(1), backend.clock, lambda: trace.update[frame["k"]])  # the host's, per update
    x = np.zeros((1, C, H, W), np.float32)

    def elapsed(**kw) -> float:
        frame["k"] = trace.draw(rng)
        return runner.run(x, **kw).elapsed_ms / 1e3

    full_first = [(elapsed(), elapsed(max_leaves=1)) for _ in range(paired)]
    lo, hi = budgets or (statistics.median(f for _, f in full_first), statistics.median(f for f, _ in full_first))
    lo, hi = min(lo, hi), max(hi, 1.5 * min(lo, hi))  # as bench_gpu.deadlines
    out = []
    for _ in range(frames):
        frame["k"] = k = trace.draw(rng)
        budget = rng.uniform(lo, hi)
        out.append((k, budget, runner.run(x, budget_ms=budget * 1e3)))
    return out, runner


def time_updates(model, clock, seconds: Callable[[], float]) -> None:
    """Charge each of ``model``'s updates (``observe``: host work after a step) ``seconds()`` of the virtual clock."""
    update = model.observe

    def timed_update(step: int, took: float) -> None:
        update(step, took)
        clock.t += seconds()

    model.observe = timed_update


def misses(results) -> int:
    """Frames over budget that the budget did not force (the forced first step predicted to fit)."""
    return sum(not r.met_budget and not r.overran_min_leaves for _, _, r in results)


def step_times(runner, trace: Trace, k: int) -> list[float]:
    """Frame ``k``'s true time of every step of the runner's program (what the oracle knows)."""
    return [trace.times[k, trace.column(s["name"])] for s in runner.steps]


# -- GPU deadlines: the run's own work before its first step is in the budget ---------------------------------


# every GPU trace here: the built one, and recordings of real GPUs (record_steps.py --device cuda) once added
GPU_TRACES = sorted({*DATA.glob("steps_*gpu*.json"), *DATA.glob("steps_*cuda*.json")})


@pytest.mark.parametrize("path", GPU_TRACES, ids=[p.stem for p in GPU_TRACES])
@pytest.mark.parametrize("plan", ["subtrees", "mixed"])
def test_gpu_deadlines_miss_at_most_1_percent(bundle16, plan, path):
    """Issue 26: on the H200, subtrees missed 2-4% and mixed 4-8% of budgets uniform in [first leaf, the plan's full
    tree]; on its second run mixed at batch 1 still missed 6.0%. Replaying GPU timings the same way (the recorded
    ones, every cost-model update paid on the virtual clock): <= 1%. And what met its budget, an oracle paying the
    same upload fits too."""
    trace = Trace(path)
    frames = 1000
    results, runner = replay(bundle16, plan, trace, frames)
    assert misses(results) <= 0.01 * frames, (misses(results), trace.describe())
    program = runner._program
    for k, budget, r in results[:300]:  # what met its budget, an oracle paying the same upload fits too
        if r.met_budget:
            assert r.leaves <= best_leaves(program, step_times(runner, trace, k), budget - trace.entry[k])


def test_the_cause_a_run_pays_its_upload_before_the_forced_first_step(bundle16, monkeypatch):
    """What made the GPU's frames miss: a run()'s upload and checks (0.07 ms on a GPU, ~0 on a CPU) are in the
    budget but were in no prediction, so the forced first step was judged to fit a budget just above the first
    leaf, overran by the upload, and counted as a miss (a budget the run could not meet whatever it chose). The
    same replay with the cost model's entry prediction off misses several times as often, nearly all of the
    misses one-leaf frames; with it, what remains is the step predictions' own tail. (Without the first-leaf file:
    a one-leaf frame that runs it, issue 40, costs 12% less here, which hides part of what the entry does.)"""
    from hne_edge.runtime.cost_model import _BatchModel

    trace, frames = Trace(GPU_LIKE), 2000
    with_entry = misses(replay(bundle16, "mixed", trace, frames, seed=1, first_leaf=False)[0])
    monkeypatch.setattr(_BatchModel, "observe_entry", lambda self, seconds: None)  # entry stays predicted at 0
    results, _ = replay(bundle16, "mixed", trace, frames, seed=1, first_leaf=False)
    missed = [r for _, _, r in results if not r.met_budget and not r.overran_min_leaves]
    assert with_entry <= 0.01 * frames and len(missed) > max(0.005 * frames, 3 * with_entry), (len(missed), with_entry)
    assert sum(r.leaves == 1 for r in missed) >= 0.8 * len(missed)


def wrap_up(monkeypatch, seconds: float) -> None:
    """Charge every run()'s work after its last step (building its answer; on a busy host, more) ``seconds`` of
    the fake backend's virtual clock."""
    from hne_edge.runtime.session import AnytimeSession

    loop = AnytimeSession._loop

    def loop_then_wrap_up(self, *args, **kwargs):
        out = loop(self, *args, **kwargs)
        self._clock.t += seconds
        return out

    monkeypatch.setattr(AnytimeSession, "_loop", loop_then_wrap_up)


def test_the_work_after_the_last_step_leaves_room_in_every_decision_on_the_h200_trace(bundle16, monkeypatch):
    """The second H200 run (2026-11-26, bench_gpu, mixed, batch 1) missed 6.0% of its budgets (12 of 200 frames, 9 of
    them one-leaf), where the replay of its recorded steps, charging nothing after a run's last step, missed under 1%.
    A run's own work after its last step (then that step's cost-model update, ``_BatchModel.observe``: 9 us median,
    43 us p99 on this project's 2-core machine, more on a host at the H200's load of 57 on 16 CPUs; since that update
    waits for the next frame, the answer's wrap-up) is in the budget, and the last decision comes before it. Replaying
    the recorded trace with 60 us of work after each run's last step and that work left out of every decision
    (``observe_exit`` off: the exit stays predicted at 0) misses about as often as the H200 did (with the update as
    that work: 3.6-4.9%, seeds 0-1), though not with its signature: a third of these misses are one-leaf frames, three
    quarters on the H200, where the run's own warning (frames at 1.2x their profile) says the host's load took part.
    With the exit learned and left room for: <= 1%, and fewer frames over budget in all (not the misses relabelled
    forced)."""
    from hne_edge.runtime.cost_model import _BatchModel

    trace, frames = Trace(H200_B1), 1000
    wrap_up(monkeypatch, 60e-6)

    def over(results):  # (misses, frames over budget whether forced or not)
        return misses(results), sum(not r.met_budget for _, _, r in results)

    fixed = over(replay(bundle16, "mixed", trace, frames, first_leaf=False)[0])  # (the first-leaf file hides part of it)
    monkeypatch.setattr(_BatchModel, "observe_exit", lambda self, seconds: None)  # exit stays predicted at 0
    before = over(replay(bundle16, "mixed", trace, frames, first_leaf=False)[0])
    assert before[0] >= 0.025 * frames and fixed[0] <= 0.01 * frames, (before, fixed)
    assert fixed[1] < before[1], (before, fixed)


@pytest.mark.parametrize("kept", [1, 3, 20])
def test_a_trace_shorter_than_a_replay_wants_is_replayed_with_what_it_has(bundle16, tmp_path, kept):
    """The H200's batch-16 recording holds 20 frames (its record-steps stage ran out of time), fewer than the 100
    profile frames and the budgeted frames a replay wants: half of them feed the profile and budgets are drawn from
    the other half (a one-frame trace: the same frame), and the trace says it is short, not an IndexError."""
    data = json.loads(H200_B1.read_text())
    data["frames_ms"], data["entry_ms"] = data["frames_ms"][:kept], data["entry_ms"][:kept]
    path = tmp_path / f"steps_short_{kept}.json"
    path.write_text(json.dumps(data))
    trace = Trace(path)
    results, _ = replay(bundle16, "mixed", trace, 30, profile_repeats=3, paired=3)
    assert trace.short and f"short: {kept} frames" in trace.describe()
    assert {k for k, _, _ in results} <= set(range(kept // 2 if kept > 1 else 0, kept)) and len(results) == 30
    assert all(r.leaves >= 1 for _, _, r in results)


def test_the_exit_prediction_is_learned_from_runs_and_leaves_room_in_every_decision(bundle16, monkeypatch):
    """The cost model learns a run()'s time after its last step (its quantile); a step starts only when it and that
    time fit, and a budget that holds the forced leaf but not the exit after it labels the overrun as forced."""
    m = read_manifest(bundle16)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, batch: 0.001)
    runner = AnytimeRunner(bundle16, plan="segments", backend=backend, load_profile=False, warmup=0, first_leaf=False)
    x = np.zeros((1, C, H, W), np.float32)
    runner.run(x)  # every leaf measured, and the exit (0 here: nothing after the last step costs virtual time)
    model = runner.cost.for_batch(1)
    wrap_up(monkeypatch, 0.0004)  # 0.4 ms of work after each run's last step
    for _ in range(8):  # (past the cost model's cold margin: exact times, exact predictions)
        runner.run(x, max_leaves=2)
    assert model.exit == pytest.approx(0.0004)
    # leaf 0 (5 nodes) 5 ms, leaf 1 (1 node) 1 ms, then 0.4 ms: 6 ms with leaf 1 would end at 6.4 ms
    r = runner.run(x, budget_ms=6.2)
    assert (r.leaves, r.met_budget) == (1, True)
    r = runner.run(x, budget_ms=6.6)
    assert (r.leaves, r.met_budget) == (2, True)
    r = runner.run(x, budget_ms=5.2)  # leaf 0 fits, the work after it does not: forced, not a miss
    assert (r.leaves, r.met_budget, r.overran_min_leaves) == (1, False, True)


def test_the_entry_prediction_is_learned_from_runs_and_judges_the_forced_step(bundle16):
    """The cost model learns a run()'s time before its first step (its quantile), and a budget that cannot hold the
    upload and the forced leaf at their predictions labels the overrun as forced, not as a miss."""
    m = read_manifest(bundle16)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, batch: 0.001, upload_cost=lambda batch: 0.0005)
    runner = AnytimeRunner(bundle16, backend=backend, load_profile=False, warmup=0)
    x = np.zeros((1, C, H, W), np.float32)
    for _ in range(5):
        runner.run(x)
    model = runner.cost.for_batch(1)
    assert model.entry == pytest.approx(0.0005) and model.pred[0] == pytest.approx(0.005)
    r = runner.run(x, budget_ms=5.2)  # leaf 0 (5 nodes: 5 ms) fits alone, not after the 0.5 ms upload
    assert (r.leaves, r.met_budget, r.overran_min_leaves) == (1, False, True)
    r = runner.run(x, budget_ms=5.6)
    assert (r.leaves, r.met_budget, r.overran_min_leaves) == (1, True, False)
    session = runner.start(x)  # a session uploaded in start(): refine's budget holds no upload
    assert session.refine(budget_ms=5.2).met_budget


# -- a GPU's calls return once queued: the host's work between steps overlaps the device's ----------------------


@pytest.mark.parametrize("queued", [False, True], ids=["calls return when done (a CPU)", "return once queued (a GPU)"])
def test_a_steps_update_is_made_while_the_next_step_runs(bundle16, queued):
    """A step's cost-model update (host work: 9 us median on this project's 2-core machine, more on a busy GPU host)
    is made once the next step's calls are issued, and a run()'s last step's once the next frame's first step's are.
    On a GPU they return once queued and ``to_host`` waits for the device, so every update overlaps the device's work:
    a frame of 16 one-leaf steps takes its calls' device time alone, where it took 16 updates more. Where calls
    return when done (a CPU) each update is in the time of the step issued before it: 16 a frame, the first in its
    first step, none after its last. The timeline by its equation: every call C seconds, every update U < C."""
    call_s, update_s = 200e-6, 30e-6
    m = read_manifest(bundle16)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, batch: 0.0, call_cost=lambda unit, batch: call_s)
    backend.queued = queued
    runner = AnytimeRunner(bundle16, backend=backend, plan="segments", load_profile=False, warmup=0, first_leaf=False)
    x = np.zeros((1, C, H, W), np.float32)
    runner.run(x)  # every step measured once
    model = runner.cost.for_batch(1)
    time_updates(model, backend.clock, lambda: update_s)
    runner.run(x)  # its last step's update waits for the next frame
    calls = len(backend.files)
    r = runner.run(x)
    calls = len(backend.files) - calls
    assert r.leaves == 16 and calls >= 16
    updates = 0 if queued else 16
    assert r.elapsed_ms / 1e3 == pytest.approx(calls * call_s + updates * update_s, rel=1e-6)
    assert runner.cost.deferred is not None and runner.cost.for_batch(1) is model and runner.cost.deferred is None


# leaves vs the plan-achievable oracle on the H200's traces (replayed, calls that return once queued; the mean of
# seeds 0-2) at least: 6646314, each update between the steps and the last before the answer, reached 0.87 / 0.72 /
# 0.57 (batch 1) and 0.90 / 0.81 / 0.67 (batch 16) for segments / subtrees / mixed; measured since: 0.96 / 0.86 /
# 0.71 and 0.99 / 0.97 / 0.93 (a seed moves a plan's figure by up to 0.03)
OVERLAP_FLOOR = {"b1": {"segments": 0.93, "subtrees": 0.80, "mixed": 0.65},
                 "b16": {"segments": 0.96, "subtrees": 0.92, "mixed": 0.85}}  # fmt: skip


@pytest.mark.parametrize("path", [H200_B1, H200_B16], ids=["b1", "b16"])
def test_on_a_gpu_the_overlapped_updates_buy_leaves_within_the_same_misses(bundle16, path):
    """The H200's recorded steps replayed on a fake whose calls return once queued, each update charged 30 us of
    host time (``UPDATE_S``), budgets uniform in [first leaf, full tree] (1000 frames, three seeds): with every update
    made while a step runs on the device, each plan reaches at least ``OVERLAP_FLOOR`` of the plan-achievable oracle's
    leaves (about half of the way from where it stood to where it is now) and misses <= 1 % in every replay. What the
    updates cost was lost in narrow windows: one more leaf fits the H200's budgets in 0.03-0.1 ms more, the oracle pays
    no host work, and the whole tree (mixed) fits only the top few percent of the range."""
    trace, frames = Trace(path), 1000
    floor = OVERLAP_FLOOR[path.stem.rsplit("_", 1)[-1]]
    for plan in ("segments", "subtrees", "mixed"):
        shares = []
        for seed in range(3):
            results, runner = replay(bundle16, plan, trace, frames, seed=seed, queued=True)
            assert misses(results) <= 0.01 * frames, (plan, seed, misses(results), trace.describe())
            oracle = sum(best_leaves(runner._program, step_times(runner, trace, k), budget - trace.entry[k])
                         for k, budget, _ in results)  # fmt: skip
            shares.append(sum(r.leaves for _, _, r in results) / oracle)
        assert statistics.mean(shares) >= floor[plan], (plan, shares, trace.describe())


# -- the oracle: the best the plan could have done, vs the even-split upper bound -----------------------------


@pytest.mark.parametrize("path", [CPU_TRACE, GPU_LIKE], ids=["ort_cpu", "gpu_like"])
def test_the_plan_achievable_oracle_and_the_even_split_bound_on_recorded_timings(bundle16, path):
    """best_leaves stops only where the plan can stop and takes only its real steps; ``split=True`` spreads a step's
    time over its leaves and stops anywhere (the old bench_gpu oracle: an upper bound). Leaf by leaf they agree; for
    plans with multi-leaf steps the bound is never below the oracle and, where a 16-leaf call costs a few 1-leaf
    calls (the GPU), far above it."""
    trace = Trace(path)
    rng = np.random.default_rng(0)
    gaps = {}
    for plan in ("segments", "subtrees", "mixed"):
        m = read_manifest(bundle16)
        runner = AnytimeRunner(bundle16, backend=FakeBackend(m.tree, m.num_classes), plan=plan, load_profile=False, warmup=0)
        program = runner._program
        lo, hi = trace.first_ms(), trace.full_ms(plan)  # as the benchmarks draw them
        oracle = bound = 0
        for k in rng.integers(0, len(trace.times), 300):
            seconds = step_times(runner, trace, k)
            budget = rng.uniform(lo, hi)
            a, b = best_leaves(program, seconds, budget), best_leaves(program, seconds, budget, split=True)
            assert 1 <= a <= b <= 16 and a in runner.stops
            oracle, bound = oracle + a, bound + b
        gaps[plan] = bound / oracle
    assert gaps["segments"] == 1.0, gaps  # (measured: subtrees 1.38 / 1.35, mixed 1.26 / 2.81 on the CPU / GPU-like)
    assert gaps["subtrees"] > 1.2 and gaps["mixed"] > 1.1, gaps
    if path == GPU_LIKE:  # the fused tree costs 2x the first leaf: splitting it credits half the tree at half its cost
        assert gaps["mixed"] > 2.0, gaps


# -- the profile's batch dimension ---------------------------------------------------------------------------


def _flat_runner(tmp_path, cost_of_batch, batch=(1, 8, 16)):
    b = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2), classes=4, batch=batch)
    m = read_manifest(b)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, n: cost_of_batch(n), call_cost=lambda unit, n: 0.0002)
    return AnytimeRunner(b, backend=backend, load_profile=False, warmup=0), backend


@pytest.mark.parametrize("slope", [0.0, 1.0], ids=["flat (a launch-bound GPU)", "linear (a CPU)"])
def test_a_profile_at_the_min_and_opt_batch_predicts_the_max_within_20_percent(tmp_path, slope):
    """profile() measures the bundle's min and opt batch sizes by default; between them it interpolates and beyond
    them it follows their measured slope, never an assumed one: a flat-cost backend (a GPU's launch-bound units)
    is predicted flat, a linear one linear; each within 20% of what batch 16 then measures."""
    runner, _ = _flat_runner(tmp_path, lambda n: 0.001 * (1 + slope * (n - 1)))
    prof = runner.profile(warmup=0, repeats=5, save=False)
    assert sorted(prof.batches) == [1, 8]
    predicted = [runner.cost.median_step(j, 16) for j in range(len(runner.steps))]
    measured = runner.profile(batch_sizes=(16,), warmup=0, repeats=5, save=False).leaf_medians_s(16)
    np.testing.assert_allclose(predicted, measured, rtol=0.2)
    assert runner.cost.predict_step(0, 16) >= runner.cost.median_step(0, 16) > 0


def test_one_profiled_batch_size_is_not_extrapolated(tmp_path):
    """With one batch size measured nothing says how cost grows with batch: a bigger batch is learned online (as
    without a profile: the first leaf's time prices the others by their MACs until each is measured), not
    predicted 16x the profiled one (a CPU's slope, 41x off on the H200) nor flat (a GPU's, 10x off on a CPU)."""
    runner, _ = _flat_runner(tmp_path, lambda n: 0.001)
    runner.profile(batch_sizes=(1,), warmup=0, repeats=5, save=False)
    assert runner.cost.predict_step(1, 16) == float("inf") and runner.cost.median_step(1, 16) == 0.0
    assert runner.cost.predict_step(1, 4) == float("inf")
    x = np.zeros((16, C, H, W), np.float32)
    r = runner.run(x, budget_ms=100)
    assert r.met_budget and runner.cost.median_step(1, 16) == pytest.approx(r.step_ms[1][2] / 1e3)
