"""The stream scheduler's weight on a shared CPU (issue 39): its worker and watcher run at the nice whose kernel
weight is one ordinary thread's per active stream - the share the K runners it replaces would have had."""

from __future__ import annotations

import math
import os
import re
import threading

import pytest

from hne_edge.errors import InputError
from hne_edge.runtime import weight
from hne_edge.runtime.streams import StreamScheduler
from test_streams import batch_cost, bundle, frame, scheduler  # noqa: F401 - the module's bundle fixture

__all__ = ["bundle"]

# the kernel's CFS weights for nice -20..0 (kernel/sched/core.c, sched_prio_to_weight): the independent reference
KERNEL_WEIGHT = {-20: 88761, -19: 71755, -18: 56483, -17: 46273, -16: 36291, -15: 29154, -14: 23254, -13: 18705,
                 -12: 14949, -11: 11916, -10: 9548, -9: 7620, -8: 6100, -7: 4904, -6: 3906, -5: 3121, -4: 2501,
                 -3: 1991, -2: 1586, -1: 1277, 0: 1024}  # fmt: skip


def _may_lower_nice() -> str | None:
    """None when this process may lower a thread's nice, else why not (the tests that need it skip)."""
    if not weight.supported():
        return "per-thread nice values are Linux's"
    result = []

    def probe():
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) - 1)
        except OSError as exc:
            result.append(f"lowering a nice is not permitted here ({exc}): needs CAP_SYS_NICE or RLIMIT_NICE")

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return result[0] if result else None


def _nices(streams: StreamScheduler) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in (streams._worker, streams._watcher)]


@pytest.mark.parametrize("k", range(1, 101))
def test_k_streams_get_the_nice_whose_kernel_weight_is_k_threads(k):
    want = min(KERNEL_WEIGHT, key=lambda n: abs(math.log(KERNEL_WEIGHT[n] / (1024 * k))))
    assert weight.nice_for_streams(k) == want


def test_the_nice_counts_from_the_base_and_stays_in_the_kernels_range():
    assert weight.nice_for_streams(8, base=5) == -4
    assert weight.nice_for_streams(8, base=-15) == -20
    assert weight.nice_for_streams(0) == weight.nice_for_streams(1) == 0


@pytest.mark.skipif(_may_lower_nice() is not None, reason=str(_may_lower_nice()))
def test_the_worker_and_watcher_weigh_as_many_threads_as_active_streams_and_go_back_when_they_leave(bundle):
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    with streams:
        assert _nices(streams) == [base, base]  # no stream yet: one thread's weight, as created
        for cam in range(4):
            streams.submit(f"cam{cam}", frame(cam)).result(10)
        assert streams.nice == base - 6 and _nices(streams) == [base - 6] * 2  # 4 threads' weight: 3906 / 1024
        for cam in range(4, 8):
            streams.submit(f"cam{cam}", frame(cam)).result(10)
        assert _nices(streams) == [base - 9] * 2  # 8: 7620 / 1024
        backend.clock.t += weight.ACTIVE_S + 0.5  # every camera silent for over a second; one comes back
        streams.submit("cam0", frame(9)).result(10)
        assert _nices(streams) == [base, base]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller's own thread untouched


@pytest.mark.skipif(_may_lower_nice() is not None, reason=str(_may_lower_nice()))
def test_an_int_nice_holds_for_the_schedulers_life_and_none_leaves_the_threads_alone(bundle):
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    streams, _, _ = scheduler(bundle, budget_ms=50.0, nice=max(-20, base - 2))
    with streams:
        for cam in range(8):
            streams.submit(cam, frame(cam)).result(10)
        assert _nices(streams) == [max(-20, base - 2)] * 2
    streams, _, _ = scheduler(bundle, budget_ms=50.0, nice=None)
    with streams:
        for cam in range(8):
            streams.submit(cam, frame(cam)).result(10)
        assert _nices(streams) == [base, base] and streams.nice is None  # not the scheduler's to say


def test_a_refused_nice_is_said_once_and_every_frame_is_still_served(bundle, monkeypatch, caplog):
    if not weight.supported():
        pytest.skip("per-thread nice values are Linux's")
    calls = []

    def refuse(tid, value):
        calls.append(value)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(weight, "_set", refuse)
    with caplog.at_level("INFO", logger="hne_edge.runtime.streams"):
        streams, _, _ = scheduler(bundle, budget_ms=50.0)
    with streams, caplog.at_level("INFO", logger="hne_edge.runtime.streams"):
        results = [streams.submit(f"cam{k}", frame(k)).result(10) for k in range(8)]
    assert all(r.stopped_by == "complete" for r in results)
    assert "CAP_SYS_NICE" in streams.nice_refused and len(calls) == 1  # asked once, not at every new stream
    assert sum("CAP_SYS_NICE" in r.getMessage() for r in caplog.records) == 1
    with pytest.warns(RuntimeWarning, match=r"StreamScheduler\(nice=-5\): setting its threads' nice to -5 was refused"):
        streams, _, _ = scheduler(bundle, budget_ms=50.0, nice=-5)
    with streams:
        assert streams.submit("a", frame(0)).result(10).stopped_by == "complete"


def _slice_ns(tid: int) -> int | None:
    """The thread's time slice by sched_getattr (an independent read), or None where it cannot be read."""
    import ctypes
    import platform

    number = {"x86_64": 315, "aarch64": 275}.get(platform.machine())
    if number is None:
        return None
    buf = (ctypes.c_uint64 * 8)()
    if ctypes.CDLL(None, use_errno=True).syscall(number, tid, buf, 48, 0) != 0:
        return None
    return buf[3]  # size+policy (8 bytes), flags (8), nice+priority (8), then sched_runtime


@pytest.mark.skipif(_may_lower_nice() is not None, reason=str(_may_lower_nice()))
def test_the_threads_ask_for_the_shortest_slice_and_a_real_time_thread_is_left_alone(bundle):
    streams, _, _ = scheduler(bundle, budget_ms=50.0)
    with streams:
        slices = [_slice_ns(t.native_id) for t in (streams._worker, streams._watcher)]
    release = os.uname().release
    version = tuple(int(p) for p in re.findall(r"\d+", release)[:2])
    if None in slices or slices[0] != weight.SLICE_NS and version < (6, 12):
        pytest.skip(f"this kernel ({release}) keeps no slice of a fair thread before Linux 6.12: read {slices}")
    assert slices == [weight.SLICE_NS] * 2

    made = {}

    def make():  # a scheduler made from a SCHED_FIFO thread: its threads inherit the policy, and keep it
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        made["streams"] = scheduler(bundle, budget_ms=50.0)[0]

    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        pytest.skip(f"SCHED_FIFO not permitted here ({exc})")
    t = threading.Thread(target=make)
    t.start()
    t.join()
    with made["streams"] as streams:
        for cam in range(8):
            streams.submit(cam, frame(cam)).result(10)
        assert [os.sched_getscheduler(t.native_id) for t in (streams._worker, streams._watcher)] == [os.SCHED_FIFO] * 2


@pytest.mark.parametrize("nice", [-21, 20, True, 1.5, "high", "Streams", [0]])
def test_a_nice_that_is_no_nice_is_refused_before_anything_starts(bundle, nice):
    threads = threading.active_count()
    with pytest.raises(InputError, match=r"nice: received .*; expected \"streams\", None or an int from -20 to 19"):
        scheduler(bundle, budget_ms=50.0, nice=nice)
    assert threading.active_count() == threads


def _gated_cost():
    """(an open gate, a step cost that waits at it): with the gate cleared, the worker holds its step while the test
    submits and registers."""
    gate = threading.Event()
    gate.set()

    def cost(node, batch):
        gate.wait(10)
        return batch_cost(node, batch)

    return gate, cost


@pytest.mark.skipif(_may_lower_nice() is not None, reason=str(_may_lower_nice()))
def test_done_callbacks_run_like_the_thread_that_registered_them_not_at_the_schedulers_weight(bundle):
    """A stream's callback thread starts in the thread that registers its first callback, so it has that thread's nice
    and cores. Started by the worker (or the watcher) when it answered, it had theirs: the users' callbacks ran at the
    scheduler's raised weight, on the cores the worker was pinned to (at 300 fps beside the worker)."""
    me = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, me)
    cores = sorted(os.sched_getaffinity(0))
    gate, cost = _gated_cost()
    seen: list[tuple[int, set]] = []
    try:
        os.sched_setaffinity(0, cores[:1])  # the worker and the watcher start on the first core
        streams, _, _ = scheduler(bundle, budget_ms=50.0, nice=max(-20, base - 3), cost=cost)
        os.sched_setaffinity(0, cores[1:] or cores)  # the cameras' thread elsewhere
        with streams:
            gate.clear()
            for cam in range(3):
                handle = streams.submit(f"cam{cam}", frame(cam))
                handle.add_done_callback(lambda h: seen.append((os.getpriority(os.PRIO_PROCESS, 0),
                                                                 os.sched_getaffinity(0))))  # fmt: skip
            gate.set()
    finally:
        gate.set()
        os.sched_setaffinity(0, cores)
    assert len(seen) == 3
    assert all(nice == base for nice, _ in seen), seen  # not the worker's base - 3
    assert all(where == set(cores[1:] or cores) for _, where in seen), seen


def test_admitting_a_frame_wakes_the_worker_and_not_the_deadline_watcher(bundle):
    """The watcher answers frames with a leaf at their deadlines; a frame just admitted has none. It was woken at
    every admission (one condition for both threads: 2,400 times a second at 300 fps, each a wake-up on the
    cameras' core and a turn of the interpreter's lock). It is woken when a first leaf is done."""
    gate, cost = _gated_cost()
    streams, _, _ = scheduler(bundle, budget_ms=1e3, cost=cost)
    woken = []
    wake = streams._watch_wake.notify_all
    streams._watch_wake.notify_all = lambda: (woken.append(1), wake())
    with streams:
        gate.clear()
        try:
            handles = [streams.submit(f"cam{k}", frame(k)) for k in range(5)]
            quiet = not any(h.done() for h in handles) and not woken  # admitted, none with a leaf: it sleeps on
        finally:
            gate.set()
        assert quiet
        assert all(h.result(10).leaves > 0 for h in handles)
    assert woken  # first leaves done (and the close): it was woken for them


@pytest.mark.parametrize("method", ["fifo", "runners"])
def test_the_benchmarks_baselines_are_weighed_as_the_scheduler_is(bundle, method):
    """bench_streams compares serving policies beside busy neighbours: a FIFO worker serving K cameras at nice 0
    against the scheduler's worker at K cameras' weight measured the weight, not the policy (a fairness audit: at
    4 cameras beside 6 loops, FIFO weighted as the scheduler served 0.61-0.62 where at nice 0 it served 0.58-0.61).
    Each baseline's serving thread gets the scheduler's rule - the FIFO worker the nice of its K cameras, a runner's
    thread its one camera's - and ``nice=None`` leaves them as created."""
    reason = _may_lower_nice()
    if reason:
        pytest.skip(reason)
    from hne_edge.bundle import read_manifest
    from hne_edge.runtime import AnytimeRunner
    from hne_edge.runtime.bench import camera_arrivals, replay_streams
    from runtime_fakes import FakeBackend

    m = read_manifest(bundle)
    seen: list[int] = []

    def open_runner():
        runner = AnytimeRunner(bundle, backend=FakeBackend(m.tree, m.num_classes, batch_cost), plan="segments",
                               load_profile=False, warmup=0)  # fmt: skip
        run = runner.run

        def noting(*args, **kwargs):
            seen.append((weight.thread_nice(), _slice()))  # the serving thread's, as it runs a frame
            return run(*args, **kwargs)

        runner.run = noting
        return runner

    base, default_slice = weight.thread_nice(), _slice()
    probe: list = []
    t = threading.Thread(target=lambda: (weight.set_thread_nice([threading.get_native_id()], base),
                                         probe.append(_slice())))  # fmt: skip
    t.start()
    t.join()
    honoured = probe[0] == weight.SLICE_NS  # the short slice: Linux 6.12+ shows it in se.slice
    frames = frame(0)
    arrivals = camera_arrivals(4, 30.0, 0.2, None, 0.0, seed=0)
    replay_streams(method, open_runner, frames, arrivals)
    k = 4 if method == "fifo" else 1
    assert seen and {nice for nice, _ in seen} == {weight.nice_for_streams(k, base)}
    if honoured:
        assert {slice_ns for _, slice_ns in seen} == {weight.SLICE_NS}
    seen.clear()
    replay_streams(method, open_runner, frames, arrivals, nice=None)
    assert {nice for nice, _ in seen} == {base} and (not honoured or {s for _, s in seen} == {default_slice})


def _slice() -> int | None:
    """The calling thread's time slice in ns (``se.slice`` of /proc/thread-self/sched), None where not shown."""
    try:
        text = open("/proc/thread-self/sched").read()
    except OSError:
        return None
    found = re.search(r"^se\.slice\s*:\s*(\d+)", text, re.M)
    return int(found.group(1)) if found else None
