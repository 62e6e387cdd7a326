"""Deadlines on recorded and GPU-like step timings (virtual clock), the plan-achievable oracle, and the batch model.

Traces (``tests/data/steps_*.json``, the format of ``benchmarks/record_steps.py``): frame ``r`` holds every step's
time of the mixed program of hne_resnet_small, and optionally ``entry_ms[r]``, a run()'s own time before its first
step (input check, upload). ``steps_hne_resnet_small_ort_cpu_b1.json`` was recorded on ONNX Runtime CPU;
``steps_hne_resnet_small_gpu_like_b1.json`` is built by ``benchmarks/gpu_like_steps.py`` from the H200's figures
(first leaf 0.62 ms, whole tree in one graph 1.24 ms, launch-bound, heavy tails, phases, modes, a 0.06 ms upload);
a real GPU's recording (the acceptance run's ``record-steps`` stage) is replayed the same way once it is here.
The fake backend computes the tree; each call costs its recorded time in frame ``k`` of the virtual clock.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.program import best_leaves
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_TRACE = DATA / "steps_hne_resnet_small_ort_cpu_b1.json"
GPU_LIKE = DATA / "steps_hne_resnet_small_gpu_like_b1.json"
PROFILE_FRAMES = 100  # frames 0-99 feed the profile; budgeted frames are drawn from the rest


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("deadlines") / "b", branching=(1, 2, 2, 2, 2), classes=4,
                            plans=("segments", "subtrees", "fused"))  # fmt: skip


class Trace:
    """A steps_*.json trace: ``times[k, j]`` seconds of recorded step ``j`` in frame ``k``, ``entry[k]`` seconds."""

    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.path = path
        self.names = [s["name"] for s in data["steps"]]
        self.times = np.asarray(data["frames_ms"]) / 1e3
        self.entry = np.asarray(data.get("entry_ms", [0.0] * len(self.times))) / 1e3

    def column(self, unit_name: str) -> int:
        """The recorded step a fake file's call costs: its own, or (plan subtrees) leaf 0's / leaf 1's chain."""
        name = unit_name.split("fp32/")[-1]
        return {"subtrees/unit00.onnx": 0, "subtrees/unit01.onnx": 1}.get(name, self.names.index(name) if name in self.names else -1)

    def full_ms(self, plan: str) -> float:
        """The median of the plan's unbudgeted full run, entry included (the top of the benchmarks' budgets)."""
        cols = {"segments": range(16), "subtrees": [0, 1, *(self.names.index(f"subtrees/unit0{i}.onnx") for i in (2, 3, 4))],
                "mixed": [self.names.index("fused/tree.onnx")], "fused": [self.names.index("fused/tree.onnx")]}[plan]  # fmt: skip
        return float(np.median(self.times[:, list(cols)].sum(1) + self.entry))

    def first_ms(self) -> float:
        return float(np.median(self.times[:, 0] + self.entry))


def replay(bundle, plan, trace: Trace, frames: int, budgets=None, seed: int = 0, profile_repeats: int = 30, **runner_kw):
    """``plan`` on the fake backend, every call costing its recorded time in frame ``k`` (virtual clock), the image's
    upload costing frame ``k``'s entry: profiled on frames 0-99 (each call draws one), then ``frames`` budgeted frames
    drawn from 100 on, budgets uniform in ``budgets`` (seconds; default: as bench_gpu.py, from the first leaf to the
    plan's own full tree, both as run() pays them). Returns [(k, budget, result)], the runner."""
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost=lambda node, batch: 0.0)
    runner = AnytimeRunner(bundle, backend=backend, plan=plan, load_profile=False, warmup=0, **runner_kw)
    frame, draw, rng = {"k": 0}, np.random.default_rng(seed), np.random.default_rng(seed + 1)
    columns = {r.name: trace.column(r.name) for r in runner._runners}
    real = lambda unit, batch: trace.times[frame["k"], columns[unit.name]]  # noqa: E731
    backend.call_cost = lambda unit, batch: (frame.__setitem__("k", int(draw.integers(PROFILE_FRAMES))), real(unit, batch))[1]
    runner.profile(warmup=0, repeats=profile_repeats, save=False)
    backend.call_cost = real
    backend.upload_cost = lambda batch: trace.entry[frame["k"]]
    lo, hi = budgets or (trace.first_ms(), trace.full_ms(plan))
    out = []
    x = np.zeros((1, C, H, W), np.float32)
    for _ in range(frames):
        frame["k"] = k = int(rng.integers(PROFILE_FRAMES, len(trace.times)))
        budget = rng.uniform(lo, hi)
        out.append((k, budget, runner.run(x, budget_ms=budget * 1e3)))
    return out, runner


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
    tree]. Replaying GPU timings the same way: <= 1%. And what met its budget, an oracle paying the same upload
    fits too."""
    trace = Trace(path)
    frames = 1000
    results, runner = replay(bundle16, plan, trace, frames)
    assert misses(results) <= 0.01 * frames, misses(results)
    program = runner._program
    for k, budget, r in results[:300]:  # what met its budget, an oracle paying the same upload fits too
        if r.met_budget:
            assert r.leaves <= best_leaves(program, step_times(runner, trace, k), budget - trace.entry[k])


def test_the_cause_a_run_pays_its_upload_before_the_forced_first_step(bundle16, monkeypatch):
    """What made the GPU's frames miss: a run()'s upload and checks (0.07 ms on a GPU, ~0 on a CPU) are in the
    budget but were in no prediction, so the forced first step was judged to fit a budget just above the first
    leaf, overran by the upload, and counted as a miss (a budget the run could not meet whatever it chose). The
    same replay with the cost model's entry prediction off misses several times as often, nearly all of the
    misses one-leaf frames; with it, what remains is the step predictions' own tail."""
    from hne_edge.runtime.cost_model import _BatchModel

    trace, frames = Trace(GPU_LIKE), 2000
    with_entry = misses(replay(bundle16, "mixed", trace, frames, seed=1)[0])
    monkeypatch.setattr(_BatchModel, "observe_entry", lambda self, seconds: None)  # entry stays predicted at 0
    results, _ = replay(bundle16, "mixed", trace, frames, seed=1)
    missed = [r for _, _, r in results if not r.met_budget and not r.overran_min_leaves]
    assert with_entry <= 0.01 * frames and len(missed) > max(0.005 * frames, 3 * with_entry), (len(missed), with_entry)
    assert sum(r.leaves == 1 for r in missed) >= 0.8 * len(missed)


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
