"""The stream scheduler on the fake backend (numpy tree, virtual clock): results, admission, batching across
streams, cancel / close, concurrency; and its pure policy (admit, decide) on hand-made states."""

from __future__ import annotations

import math
import random
import threading
import time

import numpy as np
import pytest

from hne_edge.bundle import read_manifest
from hne_edge.errors import InputError
from hne_edge.runtime import AnytimeRunner, ConcurrentUseError, RunnerClosedError
from hne_edge.runtime.streams import Pending, StreamScheduler, admit
from runtime_fakes import C, H, W, FakeBackend, make_fake_bundle, reference_leaf_logits

CLASSES = 4
INF = math.inf


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """16 leaves; plans segments, subtrees and fused (mixed runs all three); batch 1..8."""
    return make_fake_bundle(tmp_path_factory.mktemp("streams") / "b", branching=(1, 2, 2, 2, 2), classes=CLASSES,
                            batch=(1, 1, 8), plans=("segments", "subtrees", "fused"))  # fmt: skip


def batch_cost(node, batch):  # virtual seconds per node: a call of 8 rows costs 1.7x one row (stacking pays)
    return 1e-4 * (1 + 0.1 * (batch - 1))


def scheduler(bundle, plan="segments", cost=batch_cost, **options):
    options.setdefault("guard_ms", 0.0)  # a virtual clock has no thread to wake late: the plans' arithmetic exact
    m = read_manifest(bundle)
    backend = FakeBackend(m.tree, m.num_classes, cost)
    runner = AnytimeRunner(bundle, backend=backend, plan=plan, load_profile=False, warmup=0)
    return StreamScheduler(runner, **options), runner, backend


def frame(seed):
    return np.random.default_rng(seed).standard_normal((1, C, H, W)).astype(np.float32)


def check_logits(result, x, tree):
    """The float64-free reference: every path computed on its own, no cache; the mean of the leaves it got."""
    ref = reference_leaf_logits(tree, x, CLASSES)
    np.testing.assert_allclose(result.result.leaf_logits, ref[: result.leaves], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.logits, ref[: result.leaves].mean(0), rtol=1e-5, atol=1e-6)


# -- results -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", ["segments", "mixed"])
def test_frames_of_several_streams_are_stacked_and_each_gets_its_prefix_mean(bundle, plan):
    streams, runner, backend = scheduler(bundle, plan, budget_ms=8.0)
    tree = runner.tree
    with streams:
        backend.gate = threading.Event()  # hold the worker inside a profile-free step: frames queue up
        xs = [frame(k) for k in range(6)]
        handles = [streams.submit(f"cam{k % 3}", x) for k, x in enumerate(xs)]
        backend.gate.set()
        results = [h.result(10) for h in handles]
    for r, x, k in zip(results, xs, range(6)):
        assert r.stream == f"cam{k % 3}" and r.frame == k
        assert r.met_deadline and r.stopped_by in ("complete", "deadline") and 1 <= r.leaves <= 16
        assert max(r.batched) > 1  # at least one of its steps ran in one call with other streams' frames
        check_logits(r, x, tree)
    assert streams.stacked_calls > 0 and runner.closed is False  # the runner is the caller's: left open


def test_a_runner_given_is_owned_by_the_worker_until_close_and_a_path_is_opened_and_closed(bundle):
    streams, runner, _ = scheduler(bundle, budget_ms=5.0)
    with pytest.raises(ConcurrentUseError, match="hne-edge-streams"):
        runner.run(frame(0))
    streams.close()
    assert runner.run(frame(0)).leaves == 16  # released by close()
    own = StreamScheduler(bundle, budget_ms=50.0, backend=FakeBackend(runner.tree, CLASSES), load_profile=False, warmup=0)
    assert own.submit(0, frame(1)).result(10).leaves >= 1
    own.close()
    assert own.runner.closed


# -- admission, deadlines ------------------------------------------------------------------------------


def test_admission_rejects_at_once_what_the_first_leaves_cannot_fit_and_every_admitted_frame_meets_its_deadline(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=1.0, batching=False)
    first = runner.cost.predict_step(0, 1)  # leaf 0: its chain of 5 nodes, 0.5 ms
    with streams:
        backend.gate = threading.Event()
        handles = [streams.submit(k, frame(k)) for k in range(6)]  # all at once: 1 ms fits two first leaves
        rejected = [h for h in handles if h.done()]
        assert rejected, "rejections are delivered at once, before the worker runs anything"
        backend.gate.set()
        results = [h.result(10) for h in handles]
    kept = [r for r in results if r.stopped_by != "rejected"]
    assert 1 <= len(kept) <= int(1e-3 / first) and len(kept) + len(rejected) == 6
    for r in results:
        if r.stopped_by == "rejected":
            assert r.leaves == 0 and r.logits is None and not r.met_deadline and r.result is None
        else:
            assert r.met_deadline and r.leaves >= 1


def test_late_run_runs_what_admission_would_reject_and_flags_it(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=1.0, batching=False, late="run")
    with streams:
        backend.gate = threading.Event()
        handles = [streams.submit(k, frame(k)) for k in range(6)]
        assert not any(h.done() for h in handles)
        backend.gate.set()
        results = [h.result(10) for h in handles]
    late = [r for r in results if r.late]
    assert late and all(r.leaves >= 1 and not r.met_deadline and r.stopped_by == "deadline" for r in late)
    assert all(r.met_deadline for r in results if not r.late)
    for r, k in zip(results, range(6)):
        check_logits(r, frame(k), runner.tree)


def test_submit_checks_its_arguments_in_one_line(bundle):
    streams, runner, _ = scheduler(bundle, max_rows=4)
    with streams:
        with pytest.raises(InputError, match="received no deadline and no budget_ms"):
            streams.submit(0, frame(0))
        with pytest.raises(InputError, match="budget_ms: received -1"):
            streams.submit(0, frame(0), budget_ms=-1)
        with pytest.raises(InputError, match="received 5 rows; expected at most max_rows=4"):
            streams.submit(0, np.zeros((5, C, H, W), np.float32), budget_ms=5)
        with pytest.raises(InputError, match="received batch size 9; expected 1..8"):
            streams.submit(0, np.zeros((9, C, H, W), np.float32), budget_ms=5)
        with pytest.raises(InputError):
            streams.submit(0, np.zeros((1, C, H, W + 1), np.float32), budget_ms=5)
    with pytest.raises(RunnerClosedError, match="StreamScheduler is closed"):
        streams.submit(0, frame(0), budget_ms=5)
    with pytest.raises(InputError, match="late: received 'drop'"):
        StreamScheduler(runner, late="drop")
    for bad in (-0.1, math.nan, "1", True):
        with pytest.raises(InputError, match=r"guard_ms: received .*; expected a number of ms from 0 to 1000"):
            StreamScheduler(runner, guard_ms=bad)


# -- cancel and close ----------------------------------------------------------------------------------


def test_cancel_keeps_the_leaves_done_and_a_cancel_after_the_result_is_refused(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    with streams:
        backend.gate = threading.Event()
        a, b = streams.submit("a", frame(1)), streams.submit("b", frame(2))
        assert b.cancel()  # before its first leaf: no leaf, no logits
        backend.gate.set()
        ra, rb = a.result(10), b.result(10)
        assert not a.cancel() and not b.cancel()
    assert rb.stopped_by == "cancelled" and rb.leaves in (0, 1) and not b.cancelled()
    assert ra.stopped_by == "complete" and ra.leaves == 16
    check_logits(ra, frame(1), runner.tree)


@pytest.mark.parametrize("cancel", [False, True])
def test_close_finishes_or_cancels_what_is_pending_with_a_result_for_every_frame(bundle, cancel):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    backend.gate = threading.Event()
    handles = [streams.submit(k, frame(k)) for k in range(4)]
    backend.entered.wait(10)
    closer = threading.Thread(target=streams.close, kwargs={"cancel": cancel}, daemon=True)
    closer.start()
    time.sleep(0.05)
    backend.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    results = [h.result(0) for h in handles]
    if cancel:
        assert all(r.stopped_by == "cancelled" and r.leaves <= 1 for r in results)
    else:
        assert all(r.stopped_by == "complete" and r.leaves == 16 for r in results)


def test_a_backend_error_is_the_frames_outcome_and_the_others_go_on(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0, batching=False)
    cost = backend.cost

    def fail_once(node, batch, state={"n": 0}):
        if node == "b4.5" and not state["n"]:  # leaf 5's node, in the first frame that reaches it
            state["n"] += 1
            raise RuntimeError("device lost")
        return cost(node, batch)

    backend.cost = fail_once
    with streams:
        a = streams.submit(0, frame(0))
        with pytest.raises(RuntimeError, match="device lost"):
            a.result(10)
        assert streams.submit(1, frame(1)).result(10).leaves == 16


def test_a_callback_may_submit_and_close(bundle):
    streams, runner, _ = scheduler(bundle, budget_ms=20.0)
    seen = []

    def again(handle):
        seen.append(handle.result())
        if len(seen) == 1:
            streams.submit(1, frame(1)).add_done_callback(again)
        else:
            streams.close()  # from the worker's thread: no self-join

    streams.submit(0, frame(0)).add_done_callback(again)
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    streams.close()
    assert len(seen) == 2 and streams.closed


def test_eight_threads_a_thousand_cancels_and_a_close_mid_run_give_every_frame_exactly_one_result(bundle):
    """Concurrent submits from 8 threads, 1,000 random cancels, close() while frames are pending: every accepted
    frame gets exactly one result (its callback runs once), none wrong, nothing hangs."""
    streams, runner, backend = scheduler(bundle, budget_ms=2.0)
    tree = runner.tree
    accepted: list[tuple] = []
    calls: dict[int, int] = {}
    lock = threading.Lock()
    cancels = [0]
    images = [frame(k) for k in range(16)]

    def count(handle):
        with lock:
            calls[id(handle)] = calls.get(id(handle), 0) + 1

    def producer(seed):
        rng = random.Random(seed)
        mine = []
        while True:
            k = rng.randrange(16)
            try:
                h = streams.submit(seed, images[k], budget_ms=rng.uniform(0.5, 4.0))
            except RunnerClosedError:
                break
            h.add_done_callback(count)
            mine.append((h, k))
            if rng.random() < 0.5:
                with lock:
                    if cancels[0] >= 1000:
                        continue
                    cancels[0] += 1
                rng.choice(mine[-50:])[0].cancel()  # pending or done: either is fine
            if rng.random() < 0.1:
                time.sleep(0)
        with lock:
            accepted.extend(mine)

    threads = [threading.Thread(target=producer, args=(s,), daemon=True) for s in range(8)]
    try:
        for t in threads:
            t.start()
        give_up = time.monotonic() + 60
        while cancels[0] < 1000 and time.monotonic() < give_up:
            time.sleep(0.01)
        gate = backend.gate = threading.Event()  # the worker stops inside its next step: close comes mid-run
        backend.entered.clear()
        assert backend.entered.wait(30) and streams.pending > 0
        opener = threading.Timer(0.05, gate.set)
        opener.daemon = True
        opener.start()
        streams.close(timeout=60)
    finally:
        if backend.gate is not None:
            backend.gate.set()
        streams.close(cancel=True, timeout=60)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert cancels[0] == 1000 and len(accepted) >= 1000
    reasons = {}
    for h, k in accepted:
        r = h.result(0)  # done: close() returned after the worker delivered everything
        reasons[r.stopped_by] = reasons.get(r.stopped_by, 0) + 1
        assert calls[id(h)] == 1
        if r.leaves:
            check_logits(r, images[k], tree)
    assert set(reasons) <= {"complete", "deadline", "cancelled", "rejected"} and reasons.get("cancelled")


def test_a_frame_predicted_to_miss_on_an_idle_device_runs_late_so_the_cost_model_measures_again(bundle):
    """A stall learned as a step's cost (a loaded machine) makes every first leaf look too slow; rejecting them all
    would measure nothing and never learn otherwise. With nothing else pending, the frame runs, flagged late."""
    streams, runner, backend = scheduler(bundle, budget_ms=1.0, batching=False)
    model = runner.cost.for_batch(1)
    with streams:
        model.pred[0] = model.base[0] = 1.0  # as if leaf 0 had been learned at 1 s (its median too)
        backend.gate = threading.Event()
        first = streams.submit(0, frame(0))
        second = streams.submit(1, frame(1))  # the first is pending: this one is rejected
        assert second.done() and second.result().stopped_by == "rejected"
        backend.gate.set()
        r = first.result(10)
    assert r.late and r.leaves >= 1 and r.met_deadline  # it ran (and, at its true cost, made it)


def wait_until(condition, timeout=10.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(1e-3)


def test_a_frame_that_can_make_it_at_the_medians_runs_late_instead_of_being_rejected(bundle):
    """Its first leaf's quantile (a stall-polluted prediction) misses the deadline, its median does not: rejected it
    would be worth nothing for sure; run (after the on-time first leaves, flagged late) it gets its answer."""
    streams, runner, backend = scheduler(bundle, budget_ms=50.0, batching=False)
    model = runner.cost.for_batch(1)
    with streams:
        backend.gate = threading.Event()
        first = streams.submit(0, frame(0))
        wait_until(lambda: any(f.running for f in streams._frames.values()))  # the first is in its step: none waits
        model.pred[0] = 1.0  # its quantile 1 s; its median as measured
        second = streams.submit(1, frame(1))
        assert not second.done()
        backend.gate.set()
        r = second.result(10)
        first.result(10)
    assert r.stopped_by != "rejected" and r.late and r.leaves >= 1


def test_late_frames_queued_leave_no_room_so_an_overload_is_rejected_not_queued(bundle):
    """Every first leaf predicted to miss (a 1 s quantile), each 0.5 ms at its median, 2 ms deadlines, the device
    held: the frame that finds it idle and the next (no first leaf waiting, in reach at the medians) run late; the
    rest are rejected at once, not queued behind them (bench_streams at 300 fps: p50 latency 2.4 s)."""
    streams, runner, backend = scheduler(bundle, budget_ms=2.0, batching=False)
    model = runner.cost.for_batch(1)
    with streams:
        streams.submit(0, frame(0), budget_ms=1e3).result(10)  # every step measured
        backend.gate = threading.Event()
        model.pred[0] = 1.0
        handles = [streams.submit(k, frame(k)) for k in range(10)]
        rejected = [h for h in handles if h.done() and h.result().stopped_by == "rejected"]
        backend.gate.set()
        results = [h.result(10) for h in handles]
    assert 1 <= 10 - len(rejected) <= 4 and len(rejected) >= 6, [r.stopped_by for r in results]
    assert all(r.late for r in results if r.stopped_by != "rejected")


def test_a_frame_submitted_after_its_deadline_is_rejected_even_on_an_idle_device(bundle):
    """A camera thread that fell behind submits frames already past their deadline: on an idle device the rule
    that runs a frame predicted to miss (so the cost model measures again) does not run those: nothing can make
    it (bench_streams at 300 fps: 477 such frames answered 0.7 s late)."""
    streams, runner, backend = scheduler(bundle, budget_ms=1e3, batching=False)
    with streams:
        streams.submit(0, frame(0)).result(10)
        r = streams.submit(1, frame(1), deadline=backend.clock() - 1e-3).result(10)
    assert r.stopped_by == "rejected" and r.leaves == 0


def test_the_workers_time_between_steps_counts_as_its_overhead_uploads_included(bundle):
    """The worker's own time between two steps (deciding, handing results out, a frame's upload) is its overhead
    per call (the plan charges every call its median, and one call its quantile). Counted from the decision only,
    it missed the hand-out and the lock: 0.5 ms at 300 fps where the whole gap was 1.1 ms, and the plans ran behind
    their predictions. Here each image's upload takes 0.1 ms of the (virtual) clock; a gap far over the others
    (a pre-emption) would be a stall, the stall model's (runtime/stalls.py), not an overhead every call plans for."""
    streams, runner, backend = scheduler(bundle, budget_ms=1e3, batching=False)
    with streams:
        backend.gate = threading.Event()  # all six queue: each first leaf's upload comes between two steps
        handles = [streams.submit(k, frame(k)) for k in range(6)]
        backend.upload_cost = lambda batch: 1e-4
        backend.gate.set()
        wait_until(lambda: streams.pending == 0)
        median, quantile = streams._overhead
    assert 0.99e-4 <= quantile < 1.2e-4 and 0 <= median < 1e-5  # 5 gaps of 96 held an upload


def test_a_stacked_size_follows_the_speed_its_one_row_calls_measure(bundle):
    """A stacked size runs too seldom to learn the machine's state; the speed is one for every batch size
    (runtime/stalls.py), so a slowdown the one-row calls show (every call 10x) lifts the stacked size at once, and
    stalls on one call in ten do not (they are events: the medians stay). Before the stall model, a view of each
    stacked size carried the one-row calls' load and margin (issue 27), and before that their stall ratio (16x):
    a 7 ms stack of 16 first leaves predicted at 116 ms (bench_streams at 300 fps)."""
    streams, runner, _ = scheduler(bundle, budget_ms=1e3)
    with streams:  # no frame: the worker waits, the cost models are the test's
        one, eight = runner.cost.for_batch(1), runner.cost.for_batch(8)
        b1, b8 = one.base[0], eight.base[0]
        for i in range(300):  # one call in ten stalled 10 ms
            one.observe(0, b1 + (10e-3 if i % 10 == 9 else 0.0))
            one.observe(1, one.base[1])
        assert runner.cost.for_batch(8).base[0] < 1.2 * b8 and one.base[0] < 1.2 * b1
        steps = [one.base[j] for j in range(len(one.base))]
        for _ in range(6):  # then every call of every step 10x: a slowdown, not stalls
            for j, b in enumerate(steps):
                one.observe(j, 10 * b)
        assert runner.cost.for_batch(8).base[0] > 8 * b8 and streams._model(8).pred[0] > 8 * b8


def test_admission_keeps_the_stall_allowance_while_stalls_keep_coming_and_admits_again_once_they_end(bundle):
    """One queue carries one margin: the largest of its calls' noise plus the stall allowance (runtime/stalls.py).
    While 20 ms stalls strike its calls often, a frame whose first leaf fits behind the queue at the medians but
    not with a stall's allowance is refused on time (with no first leaf waiting it runs late, flagged, as policy
    item 1 says); once they stop (their weight decays below MIN_STALLS: HORIZON_S x
    ln(count / MIN_STALLS) of the clock, 2.3 s for 20 stalls), the same frame is admitted again. An isolated stall,
    however long, changes nothing: the frame after a 1.5 s stall is admitted as before."""
    from hne_edge.runtime.stalls import HORIZON_S, MIN_STALLS

    streams, runner, backend = scheduler(bundle, budget_ms=1e3, batching=False)
    stalls = runner.cost.stalls

    def behind_a_running_frame(key: int):
        """Submit ``key`` with a budget of three first leaves and 5 ms while another frame holds the device."""
        backend.gate = threading.Event()
        try:
            streams.submit(-key, frame(1))  # holds the device: what follows queues behind it
            wait_until(lambda: any(f.running for f in streams._frames.values()))
            return streams.submit(key, frame(key), budget_ms=(3 * first + 5e-3) * 1e3)
        finally:
            backend.gate.set()  # (a failure above must not leave the worker held)
            backend.gate = None
            wait_until(lambda: streams.pending == 0)

    with streams:
        assert streams.submit("warm", frame(0)).result(10).stopped_by == "complete"
        first = runner.cost.median_step(0, 1)
        stalls.work(1e-3)
        stalls.stall(1.5)  # one stall, 1.5 s: no pattern
        r = behind_a_running_frame(2).result(10)
        assert not r.late and r.stopped_by != "rejected"
        for _ in range(20):  # then 20 stalls of 20 ms in 2 ms of work: a pattern
            stalls.stall(0.02)
            stalls.work(1e-4)
        r = behind_a_running_frame(3).result(10)  # refused on time; no first leaf waits, so it runs late, flagged
        assert r.late or r.stopped_by == "rejected"
        backend.clock.t += HORIZON_S * math.log(stalls.count / MIN_STALLS) + 1e-3  # they stopped: decayed
        r = behind_a_running_frame(4).result(10)
        assert not r.late and r.stopped_by != "rejected"


def test_a_call_running_past_its_median_end_is_expected_to_run_as_far_past_it_again(bundle):
    """Admission plans from when the device is next free. A call already past its median end has stalled, for
    a time no one knows; planned as if it ended now, every frame submitted during a 56 ms stall was admitted
    and missed (bench_streams at 300 fps). It is expected to run as far past that end again."""
    streams, runner, backend = scheduler(bundle, budget_ms=1e3, batching=False)
    with streams:
        assert streams.submit(0, frame(0)).result(10).stopped_by == "complete"  # the cost model measured
        first_leaf = runner.cost.predict_step(0, 1)
        backend.gate = threading.Event()
        try:
            streams.submit(1, frame(1))  # holds the device
            wait_until(lambda: any(f.running for f in streams._frames.values()))
            fits = streams.submit(2, frame(2), budget_ms=4 * first_leaf * 1e3)
            assert not fits.done()  # admitted: the running call is due
            backend.clock.t = streams._busy_until + 4 * first_leaf  # now 4 first leaves past its median end
            refused = streams.submit(3, frame(3), budget_ms=4.5 * first_leaf * 1e3)  # 4 + its own 1 do not fit
            assert refused.done() and refused.result().stopped_by == "rejected"
            assert not streams.submit(4, frame(4), budget_ms=12 * first_leaf * 1e3).done()  # 4 + 1 fit in 12
        finally:
            backend.gate.set()


def test_a_stream_with_a_frame_waiting_is_refused_while_a_full_call_of_first_leaves_waits(bundle):
    """An overload (8 cameras at 300 fps) queued 30-60 first leaves: more than one stacked call of rows adds no
    throughput, only waiting, and a stall then struck every frame queued. A frame is refused when its stream
    already has a frame waiting for its first leaf and the first leaves waiting, its own counted, exceed one
    call's rows (``max_rows``); a stream with none waiting is planned as always, and the queue drains."""
    streams, runner, backend = scheduler(bundle, budget_ms=1e3)
    assert streams.max_rows == 8
    with streams:
        assert streams.submit("warm", frame(0)).result(10).stopped_by == "complete"  # the cost model measured
        backend.gate = threading.Event()
        try:
            streams.submit("hold", frame(1))  # holds the device
            wait_until(lambda: any(f.running for f in streams._frames.values()))
            queued = [streams.submit(k // 2, frame(k)) for k in range(8)]  # streams 0-3, two frames each: 8 rows
            assert not any(h.done() for h in queued)  # one full call waits: admitted
            crowded = streams.submit(0, frame(8))  # stream 0 has frames waiting and 9 rows > 8
            assert crowded.done() and crowded.result().stopped_by == "rejected"
            fresh = streams.submit(7, frame(9))  # stream 7 has none waiting: planned, admitted (1 s budget)
            assert not fresh.done()
        finally:
            backend.gate.set()
        results = [h.result(10) for h in (*queued, fresh)]
        assert all(r.stopped_by == "complete" and r.met_deadline for r in results)
        assert streams.submit(0, frame(10)).result(10).stopped_by == "complete"  # drained: stream 0 admitted again


def test_at_saturation_one_call_of_first_leaves_waits_from_every_stream_and_runs_first(bundle, monkeypatch):
    """8 cameras at 300 fps filled the queue to the edge of every deadline: no stack can form there (it would delay
    its earliest member), and every frame queued is Python at each submit and each call - the worker waited for
    the interpreter's lock 45-58 % of its call time and 5-12 % of the admitted frames ran late (bench_streams).
    Where the rows arriving alone keep the device busy, a frame that would not run in one call with the first
    leaves waiting is refused, unplanned, from any stream, and the worker runs first leaves before refinements.
    Here (virtual clock, 10 ms a node, a first leaf of 8 rows 85 ms: 94 rows a second fill the device) the device
    is held: at 10 rows a second 10 frames queue, planned and admitted; at 1,000 rows a second the first frames
    are admitted until the rate is read, then every frame is refused, its 5 s budget notwithstanding."""
    import hne_edge.runtime.streams as streams_module

    decided = []
    real_decide = streams_module.decide
    monkeypatch.setattr(streams_module, "decide", lambda *a, **k: decided.append(a[-1]) or real_decide(*a, **k))
    streams, runner, backend = scheduler(bundle, cost=lambda node, batch: 1e-2 * (1 + 0.1 * (batch - 1)), budget_ms=5e3)
    with streams:
        assert streams.submit("warm", frame(0)).result(10).stopped_by == "complete"
        backend.gate = threading.Event()
        try:
            held = streams.submit("hold", frame(1))
            wait_until(lambda: any(f.running for f in streams._frames.values()))
            slow = []
            for k in range(10):
                backend.clock.t += 0.1
                slow.append(streams.submit(f"slow{k}", frame(2 + k)))
            assert not any(h.done() for h in slow)  # more than one call waits, and the plan admits each
            fast = []
            for k in range(40):
                backend.clock.t += 1e-3
                fast.append(streams.submit(f"fast{k}", frame(20 + k)))
            refused = [h.done() and h.result().stopped_by == "rejected" for h in fast]
            assert not any(refused[:5]) and all(refused[-20:]), refused
            del decided[:]
        finally:
            backend.gate.set()
        admitted = [h.result(10) for h in (held, *slow, *(h for h, r in zip(fast, refused) if not r))]
        assert all(r.met_deadline and r.leaves >= 1 for r in admitted)
    assert decided[0] is True  # the first decision after the hold: at saturation (its rows arrived 1 ms apart)


def test_a_frame_inside_a_step_at_its_deadline_is_answered_then_with_the_leaves_it_has(bundle):
    """The worker waits for the device and cannot answer while it does: a frame whose deadline comes during a
    step (its own or another frame's) was handed out after the step, late, and counted met because its last
    leaf had ended in time (bench_streams, 8 cameras: 40 of 776 frames counted met were handed out 3 ms late,
    27 ms at worst). The watcher answers it at its deadline with the leaves it has; the step's leaf is not
    part of the answer, and the frame gets no second result when the step ends."""
    streams, runner, backend = scheduler(bundle, batching=False)
    registered, hold = threading.Event(), threading.Event()
    watched: list = []

    class Gate:  # holds the worker until the frame is registered, then lets it run until the frame has a leaf
        def wait(self, timeout):
            registered.wait(timeout)
            if watched[0].leaves >= 1:
                hold.wait(timeout)

    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).stopped_by == "complete"
        backend.gate = Gate()
        x = frame(1)
        handle = streams.submit(0, x, budget_ms=1e3)
        f = streams._frames[handle.frame]  # its first call waits for `registered`
        watched.append(f)
        registered.set()
        try:
            wait_until(lambda: f.running and f.leaves >= 1)
            leaves = f.leaves
            backend.clock.t = f.deadline  # the step holds the device at the frame's deadline
            r = handle.result(5)
            assert r.stopped_by == "deadline" and r.met_deadline and r.finished <= r.deadline
            assert r.leaves == leaves
            check_logits(r, x, read_manifest(bundle).tree)
        finally:
            hold.set()
        later = streams.submit(1, frame(2), budget_ms=1e3)  # the worker went on: the step's end answered no one
        assert later.result(10).stopped_by == "complete" and handle.result() is r


def test_a_slow_callback_is_no_hand_out_lag(bundle):
    """An answer counts when it is in the caller's hands (``met_deadline``, as ``runner.run`` returning). Callbacks
    run on their stream's own thread (issue 42), not between the worker's steps: one that takes 0.2 s of the
    (virtual) clock delays no other frame's hand-out, and a frame whose first leaf fits its budget with 0.1 s to
    spare is still admitted on time after it."""
    streams, runner, backend = scheduler(bundle, batching=False)
    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).stopped_by == "complete"
        first_leaf = runner.cost.predict_step(0, 1)
        budget_ms = (first_leaf + 0.1) * 1e3  # room for its first leaf and 0.1 s
        done = threading.Event()
        slow = streams.submit(1, frame(2), budget_ms=1e3)
        slow.add_done_callback(lambda h: (setattr(backend.clock, "t", backend.clock.t + 0.2), done.set()))
        slow.result(10)
        done.wait(10)
        assert streams._handout.quantile(1.0) < 0.1
        r = streams.submit(2, frame(3), budget_ms=budget_ms).result(10)
        assert not r.late and r.met_deadline


def test_an_answer_counts_when_it_is_in_the_callers_hands_not_when_it_was_decided(bundle, monkeypatch):
    """``finished`` / ``met_deadline`` are the hand-out's, as ``runner.run`` returning is the runners' (the
    benchmark's baselines are timed so): a frame decided before its deadline whose answer (its logits' mean) is
    built after it counts as late. Here the result takes 0.2 s of the virtual clock against a 0.1 s budget with
    room to spare; stamped at the decision, it counted as met."""
    from hne_edge.runtime.session import AnytimeSession

    streams, runner, backend = scheduler(bundle, batching=False)
    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).met_deadline
        build = AnytimeSession.result

        def slow_result(session):
            backend.clock.t += 0.2
            return build(session)

        monkeypatch.setattr(AnytimeSession, "result", slow_result)
        first_leaf = runner.cost.predict_step(0, 1)
        handle = streams.submit(1, frame(1), budget_ms=(first_leaf + 0.1) * 1e3)
        r = handle.result(10)
        assert r.leaves >= 1 and r.finished > r.deadline and not r.met_deadline
        # the AnytimeResult it carries says the same (it said met_budget True, elapsed at the decision)
        assert not r.result.met_budget and r.result.elapsed_ms == pytest.approx(r.latency_ms)


def test_a_hand_out_stall_is_charged_once_with_the_steps_stalls_not_on_top_of_them(bundle):
    """Hand-outs stalled on over 1 % of the answers (a woken thread waiting for a core beside busy loops) are
    planned for; the same stalls feed the step's allowance. One stall strikes a frame's sequence - its steps or
    its hand-out - so it is charged once: subtracted from every deadline on top of the steps' allowance, it took
    13 ms of 33 twice and one camera beside six busy loops stopped at 2.5 leaves where one runner took 9. Here
    (virtual clock) 4 of 64 hand-outs stalled 50 ms: a frame with room for its whole tree, one 50 ms stall and
    30 ms more runs every leaf, on time; charged twice, it could not even be admitted."""
    stall = 0.05
    streams, runner, backend = scheduler(bundle, batching=False)
    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).stopped_by == "complete"
        with streams._cond:
            for k in range(64):
                streams._handout.push(stall if k % 16 == 15 else 0.0)
            lag, handout_stall = streams._lags(streams._handout)
            assert streams._model(1).allowance(1e-4) == pytest.approx(stall)  # the steps' allowance: the same stall
            tree = sum(streams._model(1).base)  # its steps' medians (their predictions carry the allowance)
        assert lag == 0.0 and handout_stall == pytest.approx(stall)
        r = streams.submit(1, frame(1), budget_ms=(tree + stall + 0.03) * 1e3).result(10)
        assert not r.late and r.met_deadline and r.stopped_by == "complete" and r.leaves == 16


def test_the_guard_moves_admission_and_the_watchers_answer_that_much_before_each_deadline(bundle):
    """What no window of lags shows (a thread woken late, the interpreter's lock) made answers 0.0-1 ms late
    at 8 cameras (bench_streams, 1 thread: 15 of 1,200 frames): ``guard_ms`` plans every answer that much
    earlier. Here 0.1 s of the virtual clock: a frame whose first leaf fits its budget only without the guard
    runs late, and a frame inside a step is answered 0.1 s before its deadline."""
    streams, runner, backend = scheduler(bundle, batching=False, guard_ms=100.0)
    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).stopped_by == "complete"
        first_leaf = runner.cost.predict_step(0, 1)
        assert streams.submit(0, frame(1), budget_ms=(first_leaf + 0.2) * 1e3).result(10).met_deadline
        assert streams.submit(1, frame(2), budget_ms=(first_leaf + 0.05) * 1e3).result(10).late

        registered, hold = threading.Event(), threading.Event()
        watched: list = []

        class Gate:  # holds the worker until the frame is registered, then from its second step on
            def wait(self, timeout):
                registered.wait(timeout)
                if watched[0].leaves >= 1:
                    hold.wait(timeout)

        backend.gate = Gate()
        handle = streams.submit(2, frame(3), budget_ms=1e3)
        f = streams._frames[handle.frame]
        watched.append(f)
        registered.set()
        try:
            wait_until(lambda: f.running and f.leaves >= 1)
            backend.clock.t = f.deadline - 0.1 + 1e-6  # inside the guard: answered now
            r = handle.result(5)
            assert r.stopped_by == "deadline" and r.met_deadline and r.finished < r.deadline - 0.099
        finally:
            hold.set()


def test_submit_builds_no_cost_model_and_admission_promises_what_a_plan_at_the_medians_says(bundle):
    """An overload's first frames plan stacked calls of every size: each cost model built inside ``submit`` cost
    0.8 ms there (13 ms in all), and a submitting thread that falls behind holds the interpreter from the
    worker. The scheduler builds them first. And one plan serves admission and its promise: the promise is the
    end ``first_leaf_end`` plans at the medians, on any queue."""
    from hne_edge.runtime.cost_model import CostModel
    from hne_edge.runtime.stream_policy import admission, first_leaf_end

    streams, runner, backend = scheduler(bundle)
    built = []
    new_model = CostModel._new_model
    CostModel._new_model = lambda self, batch: built.append(batch) or new_model(self, batch)
    try:
        with streams:
            for k in range(20):
                streams.submit(k % 4, frame(k), budget_ms=5.0)
    finally:
        CostModel._new_model = new_model
    assert built == [], f"submit built cost models for {sorted(set(built))} rows"

    rng = random.Random(0)
    model = streams._model
    program = streams._program
    first_leaf = runner.cost.median_step(0, 1)
    admitted = 0
    for trial in range(300):
        waiting = [Pending(k, rng.uniform(0, 30) * first_leaf, 0, rng.choice((1, 1, 2, 3)), False) for k in range(rng.randrange(12))]
        me = Pending(99, rng.uniform(0, 30) * first_leaf, 0, rng.choice((1, 2)), False)
        margin = rng.choice((0.0, first_leaf, 4 * first_leaf))
        promise = admission(0.0, waiting, me, program, model, 8, True, 0.0, margin)
        assert (promise is not None) == admit(0.0, waiting, me, program, model, 8, True, 0.0, margin)
        if promise is not None:
            admitted += 1
            assert promise == pytest.approx(first_leaf_end(0.0, waiting, me, program, model, 8, True, 0.0))
    assert 30 < admitted < 270  # both outcomes met


def test_without_a_profile_a_batch_size_is_predicted_from_the_calls_that_ran(bundle):
    """``profile=False`` and a runner with no profile: every batch size's cost model learns from its own calls,
    and a batch size's floor reads the one-row calls' learned medians, not a profile's entry that does not exist
    (a ratio against it once divided by zero in the worker, and every frame got that error)."""
    streams, runner, backend = scheduler(bundle, budget_ms=1e3, profile=False)
    with streams:
        one_row = [streams.submit(k, frame(k)) for k in range(3)]  # one-row calls: the reference is learned
        assert all(h.result(10).leaves == 16 for h in one_row)
        for k in range(3):  # frames of two images: their size learned, then predicted against the one-row calls
            r = streams.submit("pair", np.concatenate([frame(10 + k), frame(20 + k)])).result(10)
            assert r.stopped_by == "complete" and r.leaves == 16, r
        assert runner.cost.for_batch(1).known[0] and runner.cost.for_batch(2).known[0]


def superlinear_cost(node, batch):  # virtual seconds per node, growing faster than the rows (a CPU's caches)
    return 1e-4 * batch**1.5


def test_a_stacked_size_the_profile_only_extrapolates_is_measured_when_the_scheduler_opens(bundle):
    """A profile of 1 and 2 rows predicts an 8-row call by extrapolation (their slope), short of what it costs here;
    the scheduler stacks 8 rows from an overload's first frames, so it measures them when it opens, and keeps the
    profile's sizes beside them. (A CPU profile of 1-8 rows predicted 16 rows at 5.7 ms that took 8.3-14 ms: at 8
    cameras x 300 fps the first stacked calls' frames missed, 3-27 of them a run, until the model learned it.)"""
    m = read_manifest(bundle)
    runner = AnytimeRunner(bundle, backend=FakeBackend(m.tree, m.num_classes, superlinear_cost), load_profile=False,
                           warmup=0)  # fmt: skip
    runner.profile(batch_sizes=(1, 2), warmup=0, repeats=3, save=False)
    leaf0 = 5 * superlinear_cost("b0.0", 8)  # the first leaf: a chain of 5 nodes
    assert runner.cost.median_step(0, 8) < 0.7 * leaf0  # the guess the scheduler must not plan on
    with StreamScheduler(runner, budget_ms=1e3, max_rows=8, guard_ms=0.0) as streams:
        assert sorted(runner.profile_data.batches) == [1, 2, 8]
        assert runner.cost.median_step(0, 8) == pytest.approx(leaf0, rel=1e-6)
        assert streams.submit(0, frame(0)).result(10).leaves == 16


def test_a_profile_that_measured_around_every_stacked_size_is_used_as_it_is(bundle):
    """Sizes between two measured ones are interpolated from measurements: the scheduler opens without measuring."""
    m = read_manifest(bundle)
    runner = AnytimeRunner(bundle, backend=FakeBackend(m.tree, m.num_classes, superlinear_cost), load_profile=False,
                           warmup=0)  # fmt: skip
    profile = runner.profile(batch_sizes=(1, 8), warmup=0, repeats=3, save=False)
    with StreamScheduler(runner, budget_ms=1e3, max_rows=4, guard_ms=0.0):
        assert runner.profile_data is profile  # 4 rows lie between two measured sizes: nothing measured again


@pytest.mark.parametrize("stall_s", [0.05, 1.5])
def test_a_stall_inside_a_first_leaf_rejects_no_later_frame(bundle, stall_s):
    """One call of a first leaf meets a 50 ms or 1.5 s stall (a capture on a GPU, a pre-emption, a collection); the
    frames after it, each with room for a few first leaves, are admitted on time and meet their deadlines: an
    isolated stall changes no prediction and no admission (runtime/stalls.py). The stall is armed once the
    scheduler has opened (an issue-39 audit: armed before, it struck the scheduler's own measurement at open, and
    the test passed with the stall model switched off)."""
    hit = {"left": 0}

    def cost(node, batch):
        if node == "b4.0" and hit["left"]:  # a node of leaf 0, once
            hit["left"] = 0
            return stall_s
        return batch_cost(node, batch)

    streams, runner, backend = scheduler(bundle, cost=cost, batching=False)
    with streams:
        assert streams.submit("warm", frame(0), budget_ms=1e3).result(10).stopped_by == "complete"
        hit["left"] = 1
        stalled = streams.submit("s", frame(1), budget_ms=5e3).result(10)
        assert not hit["left"] and stalled.stopped_by == "complete" and stalled.latency_ms >= 1e3 * stall_s, stalled
        results = [streams.submit(k % 4, frame(k), budget_ms=20.0).result(10) for k in range(12)]
    assert all(r.stopped_by != "rejected" and r.met_deadline and not r.late for r in results), results
