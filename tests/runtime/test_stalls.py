"""Stalls are not costs (issue 39): the stall model (hne_edge/runtime/stalls.py) on its own, and the runner's budgets
on a virtual clock through the three kinds of trouble a device meets - isolated stalls of 50-1,500 ms, a 10x
slowdown lasting seconds, and pre-emption by a neighbour at 2x oversubscription - each with the number of frames
within which budgets recover, as stated in the module docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.runtime import AnytimeRunner
from hne_edge.runtime.stalls import HORIZON_S, MIN_STALLS, SHIFT_WINDOW, STALL_RATIO, Speed, Stalls, SteadyWindow
from runtime_fakes import C, H, W, FakeBackend, FakeClock, make_fake_bundle

NODE_S = 25e-6  # 31 nodes: the full tree of 16 leaves takes 0.775 ms
PERIOD_S = 1 / 30  # a camera's frame period: the clock moves on to the next arrival between frames


# -- the model ------------------------------------------------------------------------------------------------


def test_the_allowance_is_the_equations_slack():
    """p = 1 - exp(-rate d) for a call of steady cost d; the allowance a is the smallest recent stall size with
    p * P(size > a) <= miss_rate: computed here from the definition, independently of the module."""
    clock = FakeClock()
    stalls = Stalls(clock)
    sizes = [0.004, 0.006, 0.008, 0.010, 0.012, 0.014, 0.016, 0.018, 0.020, 0.022]
    for s in sizes:
        stalls.work(0.01)  # 10 ms of steady work between stalls: 100 stalls a second of work
        stalls.stall(s)
    rate = stalls.rate()
    assert rate == pytest.approx(len(sizes) / 0.1)
    for d, miss in [(1e-3, 0.01), (5e-4, 0.01), (1e-3, 0.05), (1e-4, 0.01)]:
        p = 1 - math.exp(-rate * d)
        want = 0.0 if p <= miss else min(a for a in sizes if p * sum(s > a for s in sizes) / len(sizes) <= miss)
        assert stalls.allowance(d, miss) == pytest.approx(want), (d, miss)


def test_an_isolated_stall_is_no_pattern_and_a_burst_ends():
    clock = FakeClock()
    stalls = Stalls(clock)
    stalls.work(0.01)
    stalls.stall(1.5)  # one 1.5 s stall: however long, one event
    assert stalls.count < MIN_STALLS and stalls.allowance(1e-3, 0.01) == 0.0
    for _ in range(5):  # five in 5 ms of work: a pattern
        stalls.stall(0.02)
        stalls.work(1e-3)
    assert stalls.allowance(1e-3, 0.01) > 0
    clock.t += HORIZON_S * math.log(stalls.count / MIN_STALLS) + 1e-3  # their weight decays below MIN_STALLS
    assert stalls.allowance(1e-3, 0.01) == 0.0


def test_a_burst_ends_once_the_quiet_since_its_last_stall_is_improbable_at_its_rate():
    clock = FakeClock()
    stalls = Stalls(clock)
    for _ in range(10):
        stalls.stall(0.02)
        stalls.work(1e-3)  # 1,000 a second of work
    assert stalls.allowance(1e-3, 0.01) > 0
    stalls.work(math.log(1e3) / stalls.rate() * 1.01)  # quiet work in which 999 in 1,000 such bursts would stall
    assert stalls.allowance(1e-3, 0.01) == 0.0


def test_a_slowdown_is_the_machines_speed_within_49_calls_its_end_within_16_and_its_first_calls_no_stalls():
    stalls = Stalls(FakeClock())
    speed = Speed(0.99, stalls)
    for _ in range(SHIFT_WINDOW):
        speed.split(1e-3, 1e-3)
    assert speed.slow == 1.0
    calls = 0
    while speed.slow < 9:
        speed.split(1e-2, 1e-3)  # every call 10x
        calls += 1
    assert calls <= SHIFT_WINDOW - (SHIFT_WINDOW - 1) // 4 and speed.slow == pytest.approx(10.0)
    assert stalls.count == 0 and not stalls.sizes  # its first calls were the slowdown, not stalls
    calls = 0
    while speed.slow > 1.1:
        speed.split(1e-3, 1e-3)
        calls += 1
    assert calls <= (SHIFT_WINDOW - 1) // 4 + 1


def test_stalls_on_up_to_half_the_calls_leave_the_speed_alone():
    stalls = Stalls(FakeClock())
    speed = Speed(0.99, stalls)
    rng = np.random.default_rng(0)
    for _ in range(400):
        stalled = rng.random() < 0.5
        u, was = speed.split(1e-3 * (1 + rng.uniform(0, 0.05)) + (0.02 if stalled else 0.0), 1e-3)
        assert was == stalled
    assert speed.slow < 1.1 and speed.noise < 1.1


@pytest.mark.parametrize("share", [0.0, 0.005, 0.03, 0.2])
def test_a_lag_is_planned_past_its_stalls_only_when_they_come_on_over_1_percent_of_the_answers(share):
    """A lag met once an answer (a hand-out, a watcher's wake-up): planned at ``a``, the smallest recent value with
    P(lag > a) <= 1 % - counted here over the window's values, stalls included, independently of the module."""
    window = SteadyWindow(0.99, 128, Stalls(FakeClock()), floor=2e-4)
    rng = np.random.default_rng(1)
    values = []
    for i in range(600):
        stalled = rng.random() < share and i >= 8
        v = 1e-4 * (1 + rng.uniform(0, 0.2)) + (rng.uniform(2e-3, 15e-3) if stalled else 0.0)
        window.push(v)
        values.append(v)
    last = values[-128:]
    want = min(a for a in last if sum(v > a for v in last) <= 0.01 * len(last))
    steady = window.quantile()
    assert steady < 2e-4  # the steady quantile never holds a stall
    assert window.planned() == pytest.approx(max(steady, want))
    if sum(v > 1e-3 for v in last) <= 1:  # isolated (at most one in the window): the steady quantile, as before
        assert window.planned() == steady
    if share >= 0.03:
        assert window.planned() > 2e-3  # planned past the stalls while they come



@pytest.mark.parametrize("seen, stalled", [(20, (10,)), (60, (30,)), (40, (10, 20, 30))])
def test_a_window_not_yet_full_counts_the_answers_it_has_not_seen_as_steady(seen, stalled):
    """Early in a window's life (fewer than 1 / (1 - q) values) the q quantile of what it holds is its maximum: one
    1 s stall among 20 values was planned in full by every answer until 100 more came. Planned as if the window were
    full, the answers not yet seen steady: an isolated stall changes nothing, three in 40 (over 1 % of a full window)
    are still planned for. The expectation is counted over the full window here, independently of the module."""
    size = 128
    window = SteadyWindow(0.99, size, Stalls(FakeClock()), floor=2e-4)
    rng = np.random.default_rng(2)
    values = [1e-4 * (1 + rng.uniform(0, 0.2)) + (1.0 + stalled.index(i) if i in stalled else 0.0) for i in range(seen)]
    for v in values:
        window.push(v)
    steady = window.quantile()
    full = values + [steady] * (size - seen)  # the answers not seen yet: steady
    want = min(a for a in full if sum(v > a for v in full) <= 0.01 * size)
    assert window.planned() == pytest.approx(max(steady, want))
    if len(stalled) == 1:
        assert window.planned() == steady  # as before the stall
    else:
        assert window.planned() >= 1.0  # stalls on more than 1 % of the answers: planned for

# -- the runner's budgets on a virtual clock --------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle16(tmp_path_factory):
    return make_fake_bundle(tmp_path_factory.mktemp("stalls") / "b", branching=(1, 2, 2, 2, 2), classes=4)


def frame():
    return np.zeros((1, C, H, W), np.float32)


def runner_on(bundle, cost):
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost)
    return AnytimeRunner(bundle, backend=backend, load_profile=False, warmup=0), backend


def camera(runner, backend, frames, budget_ms, before=None):
    """``frames`` frames of a 30 fps camera under ``budget_ms``: [(leaves, met)]; ``before(i)`` runs ahead of frame i."""
    out = []
    for i in range(frames):
        start = backend.clock.t
        if before is not None:
            before(i)
        r = runner.run(frame(), budget_ms=budget_ms)
        out.append((r.leaves, r.met_budget))
        backend.clock.t = max(backend.clock.t, start + PERIOD_S)
    return out


@pytest.mark.parametrize("stall_ms", [50, 200, 1500])
def test_isolated_stalls_cost_the_frame_they_strike_and_no_other(bundle16, stall_ms):
    """One stall of 50-1,500 ms every 90 frames (3 s) on a random node: the frame it strikes misses; every other
    frame runs every leaf under a budget of 2x the full tree - recovery within 0 frames. Before the stall model, two
    such stalls among the last 128 calls set every prediction to 16x its median."""
    rng = np.random.default_rng(stall_ms)
    hit: dict[str, float] = {}
    runner, backend = runner_on(bundle16, lambda node, batch: NODE_S + hit.pop(node, 0.0))
    nodes = [n.id for n in runner.tree.nodes]
    camera(runner, backend, 30, 2 * 31 * NODE_S * 1e3)  # learn

    def maybe_stall(i):
        if i % 90 == 45:
            hit[nodes[int(rng.integers(len(nodes)))]] = stall_ms / 1e3

    out = camera(runner, backend, 450, 2 * 31 * NODE_S * 1e3, maybe_stall)
    struck = {i for i in range(450) if i % 90 == 45}
    assert all(n == 16 and met for i, (n, met) in enumerate(out) if i not in struck), out


def test_a_10x_slowdown_lasting_seconds_is_learned_without_a_miss_and_forgotten_within_a_frame(bundle16):
    """Every node 10x slower for 3 s (90 frames; contention, a throttled clock), against a budget that fits the
    full tree 6x at full speed. Until the speed shifts (49 calls: about 6 frames of 8 steps) the slow calls are
    stalls, whose allowance keeps the budgets; then every step is 10x, the steps not run since too. It misses no
    budget after its first frame and runs what fits (the 10x tree does not); the frame after it ends runs every
    leaf again."""
    slow = {"on": False}
    runner, backend = runner_on(bundle16, lambda node, batch: NODE_S * (10 if slow["on"] else 1))
    budget_ms = 6 * 31 * NODE_S * 1e3
    camera(runner, backend, 30, budget_ms)
    slow["on"] = True
    during = camera(runner, backend, 90, budget_ms)
    slow["on"] = False
    after = camera(runner, backend, 30, budget_ms)
    assert all(met for _, met in during[1:]), during[:10]  # its first frame may meet the start of it
    assert 5 <= np.mean([n for n, _ in during[2:]]) < 16  # what fits at 10x: about 6 of 10 tree-lengths
    assert [n for n, _ in after[1:]] == [16] * 29 and all(met for _, met in after), after[:5]


class Timeslices:
    """A busy neighbour on the same core at 2x oversubscription: the core alternates ``slice_s`` of ours with
    ``slice_s`` of theirs (the phase drawn per frame: a scheduler's slices do not follow our frames). A call of
    work ``w`` started at ``t`` ends when ``w`` of our slices have passed."""

    def __init__(self, clock, slice_s=4e-3, seed=0):
        self.clock, self.slice_s, self.rng = clock, slice_s, np.random.default_rng(seed)
        self.phase = 0.0

    def new_frame(self, _i=None):
        self.phase = float(self.rng.uniform(0, 2 * self.slice_s))

    def __call__(self, node, batch):
        s = self.slice_s
        t, left = self.clock.t, NODE_S
        pos = (t + self.phase) % (2 * s)
        if pos >= s:  # theirs: wait for ours
            t, pos = t + 2 * s - pos, 0.0
        if left <= s - pos:
            return t + left - self.clock.t
        left -= s - pos  # the rest of ours, then theirs, then ours again (a node is far shorter than a slice)
        return t + (s - pos) + s + left - self.clock.t


@pytest.mark.parametrize("budget_ms, leaves", [(10.0, 8), (4.0, 1)])
def test_preemption_at_2x_oversubscription_misses_at_most_1_percent_beyond_the_forced_leaves(bundle16, budget_ms,
                                                                                                leaves):  # fmt: skip
    """4 ms slices of a busy neighbour: about half of the frames start inside its slice, and a call straddling
    one's start waits 4 ms (a stall). Under a 10 ms budget (the whole tree, 0.8 ms, and one slice fit) the runner
    runs at least half the leaves; under 4 ms (where a slice met by an optional leaf is a miss) it keeps its optional
    leaves clear of one: at most 1 % of the frames miss beyond those whose forced first leaf met a slice (an
    issue-39 audit: at 10 ms alone no frame could miss, whatever the runner did; at 4 ms without the stall
    allowance 36 of 600 did)."""
    m = read_manifest(bundle16)
    backend = FakeBackend(m.tree, m.num_classes)
    slices = Timeslices(backend.clock)
    backend.cost = slices
    runner = AnytimeRunner(bundle16, backend=backend, load_profile=False, warmup=0)
    camera(runner, backend, 60, budget_ms, slices.new_frame)
    out = camera(runner, backend, 600, budget_ms, slices.new_frame)
    misses = sum(not met for _, met in out)
    forced = sum(not met and n == 1 for n, met in out)
    assert misses - forced <= 0.01 * len(out), (misses, forced)
    assert np.mean([n for n, _ in out]) >= leaves, np.mean([n for n, _ in out])


# -- the stream scheduler's lags ------------------------------------------------------------------------------


def test_one_pause_in_a_young_schedulers_hand_out_changes_no_later_frame(tmp_path):
    """A 1 s pause of the worker while it hands a frame out (a collection, a pre-emption), 20 frames into a
    scheduler's life: every frame after it was cut to one leaf and ran late, and a second camera's frames were
    rejected, for 89 frames (its hand-out window planned the stall in full until 100 more came). An isolated stall
    changes nothing: the frames after it run as the frames before it."""
    from concurrent.futures import Future

    from hne_edge.runtime.streams import StreamScheduler

    bundle = make_fake_bundle(tmp_path / "b", branching=(1, 2, 2, 2, 2), classes=4, batch=(1, 1, 8),
                              plans=("segments",))  # fmt: skip
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, lambda node, batch: 1e-4)  # the full tree in ~3 ms
    runner = AnytimeRunner(bundle, backend=backend, plan="segments", load_profile=False, warmup=0)

    def pause(_handle):
        backend.clock.t += 1.0

    with StreamScheduler(runner, budget_ms=10.0, guard_ms=0.0) as streams:
        before = [streams.submit("cam", frame()).result(10) for _ in range(20)]
        handle = streams.submit("cam", frame())
        Future.add_done_callback(handle, pause)  # the base class's, as generic code calls it: runs in the hand-out
        handle.result(10)
        after = [streams.submit("cam", frame()).result(10) for _ in range(20)]
        pairs = []
        for _ in range(10):
            a, b = streams.submit("cam0", frame()), streams.submit("cam1", frame())
            pairs += [a.result(10), b.result(10)]
    assert [r.leaves for r in before] == [16] * 20 and not any(r.late for r in before)
    assert [r.leaves for r in after] == [16] * 20, [r.leaves for r in after]
    assert not any(r.late for r in after + pairs)
    assert not any(r.stopped_by == "rejected" for r in pairs) and all(r.leaves >= 1 for r in pairs)
