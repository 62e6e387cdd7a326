"""No input of one stream stops the others (issue 42, items 6-8): a far deadline, a stream id that cannot be
compared, a done-callback that blocks. Each was reproduced here before it was fixed: the first closed the scheduler
for every stream (an OverflowError in the deadline watcher's wait), the second made every other stream's submit
raise, the third held the worker (another stream's 100 ms frame answered at 1,952 ms)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hne_edge.errors import InputError
from hne_edge.runtime.streams import StreamScheduler
from test_streams import CLASSES, bundle, frame, scheduler  # noqa: F401 - the module's bundle fixture

__all__ = ["bundle"]


@pytest.mark.parametrize("far", [{"deadline": 1e10}, {"budget_ms": 1e13}, {"budget_ms": 1e300}])
def test_a_far_deadline_is_a_long_deadline_and_every_stream_goes_on(bundle, far):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    with streams:
        backend.gate = threading.Event()  # the far frame waits for its first leaf while the watcher sleeps
        options = {"deadline": backend.clock() + far["deadline"]} if "deadline" in far else far
        slow = streams.submit("far", frame(0), **options)
        backend.gate.set()
        assert slow.result(10).stopped_by == "complete"
        time.sleep(0.05)  # the watcher's wait for that frame's deadline, where it overflowed
        near = streams.submit("near", frame(1)).result(10)
        assert near.stopped_by == "complete" and near.met_deadline and not streams.closed
    assert slow.result(0).met_deadline


def test_a_new_scheduler_on_the_same_runner_after_a_far_deadline_starts_alive(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    streams.submit("far", frame(0), deadline=backend.clock() + 1e10).result(10)
    time.sleep(0.05)
    streams.close()
    again = StreamScheduler(runner, budget_ms=50.0, guard_ms=0.0)
    with again:
        assert again.submit("a", frame(1)).result(10).leaves == 16


class _Angry:
    """A stream id whose == raises (as a numpy array's truth value does)."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise ValueError("no comparisons, please")


@pytest.mark.parametrize("stream", [np.zeros(3), [1, 2], {"cam": 1}, _Angry()],
                         ids=["numpy-array", "list", "dict", "eq-raises"])  # fmt: skip
def test_a_stream_id_that_cannot_be_compared_is_refused_at_submit_and_the_others_go_on(bundle, stream):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    with streams:
        backend.gate = threading.Event()
        try:
            other = streams.submit("cam0", frame(0))  # pending while the bad id comes
            with pytest.raises(InputError, match=r"stream: received .*; expected a hashable id"):
                streams.submit(stream, frame(1))
            again = streams.submit("cam0", frame(2))  # the same stream, a frame waiting: compares ids
        finally:
            backend.gate.set()
        assert other.result(10).leaves == 16 and again.result(10).leaves == 16
        assert streams.pending == 0


def test_ids_that_are_equal_are_one_stream(bundle):
    """1 and 1.0 and True hash and compare equal: one stream, as a dict sees them (one call's worth waits per stream)."""
    streams, runner, backend = scheduler(bundle, budget_ms=50.0, max_rows=2)
    with streams:
        backend.gate = threading.Event()
        first = streams.submit("run", frame(0))  # in the worker's step, held by the gate
        backend.entered.wait(10)
        try:
            waiting = [streams.submit(k, frame(2)) for k in (1, 1.0)]  # two rows of stream 1 wait: max_rows
            third = streams.submit(True, frame(3))  # stream 1 again, with a call's worth waiting: refused
            assert third.done() and third.result(0).stopped_by == "rejected"
        finally:
            backend.gate.set()
        assert first.result(10).leaves == 16 and all(h.result(10).leaves for h in waiting)


def test_a_blocking_callback_holds_only_its_own_stream(bundle):
    """Stream "slow"'s callback blocks for 2 s; the other stream's frames are answered (and their callbacks run) while
    it blocks, by their deadlines."""
    streams, runner, backend = scheduler(bundle, budget_ms=100.0)
    release = threading.Event()
    seen: list[str] = []
    try:
        streams.submit("slow", frame(0)).add_done_callback(lambda h: release.wait(5))
        time.sleep(0.05)  # its result is out and its callback blocks
        handles = [streams.submit("fast", frame(k)) for k in range(1, 4)]
        for h in handles:
            h.add_done_callback(lambda h: seen.append(h.stream))
        results = [h.result(2) for h in handles]  # before the fix: after the blocked callback, 5 s later
        assert all(r.met_deadline and r.leaves == 16 for r in results)
        give_up = time.monotonic() + 2
        while len(seen) < 3 and time.monotonic() < give_up:
            time.sleep(0.01)
        assert seen == ["fast"] * 3  # their callbacks too, while the other one still blocks
        assert not release.is_set()
    finally:
        release.set()
        streams.close(timeout=10)


def test_callbacks_of_one_stream_run_in_order_and_close_waits_for_them(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    order: list[int] = []
    with streams:
        for k in range(6):
            streams.submit("cam", frame(k)).add_done_callback(lambda h: (time.sleep(0.01), order.append(h.frame)))
    assert order == sorted(order) and len(order) == 6  # close() (the with) returned after the last callback


def test_a_callback_that_raises_is_logged_and_the_scheduler_goes_on(bundle, caplog):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    with streams:
        streams.submit("a", frame(0)).add_done_callback(lambda h: 1 / 0)
        assert streams.submit("a", frame(1)).result(10).leaves == 16
    assert "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("cameras", [2, 3])
def test_callbacks_of_several_streams_that_each_close_the_scheduler_all_return(bundle, cameras):
    """Each camera's callback stops serving (close() is idempotent and may be called from a callback): each close
    waited for the other lanes' callbacks, themselves inside close() - every one of them hung (a review, 3 of 3)."""
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    returned: list[str] = []

    def stop(handle):
        streams.close()
        returned.append(handle.stream)

    backend.gate = threading.Event()  # both frames pending when their callbacks are registered
    handles = [streams.submit(f"cam{k}", frame(k)) for k in range(cameras)]
    for h in handles:
        h.add_done_callback(stop)
    backend.gate.set()
    streams.close(timeout=10)  # raised TimeoutError: "done-callbacks of 2 stream(s) still running"
    assert sorted(returned) == [f"cam{k}" for k in range(cameras)]


@pytest.mark.parametrize("exit_with", [SystemExit(0), KeyboardInterrupt()])
def test_a_callback_that_exits_is_logged_and_its_stream_goes_on(bundle, caplog, exit_with):
    """sys.exit() in a callback ended its lane's thread with the lane marked running: the stream's later callbacks
    never ran and close() never returned (the guide's with-block hung)."""
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    after: list[int] = []

    def leave(handle):
        raise exit_with

    with streams:
        streams.submit("a", frame(0)).add_done_callback(leave)
        streams.submit("a", frame(1)).add_done_callback(lambda h: after.append(h.frame))
        assert streams.submit("b", frame(2)).result(10).leaves == 16
        streams.close(timeout=10)
    assert after == [1] and type(exit_with).__name__ in caplog.text


def test_close_that_times_out_says_what_it_waited_for(bundle):
    streams, runner, backend = scheduler(bundle, budget_ms=50.0)
    backend.gate = threading.Event()
    streams.submit("a", frame(0))
    with pytest.raises(TimeoutError, match=r"1 frame\(s\) still pending"):
        streams.close(timeout=0.01)
    backend.gate.set()
    streams.close(timeout=10)
    idle, _, _ = scheduler(bundle, budget_ms=50.0)
    try:  # nothing pending: the worker was still ending (it said "0 frame(s) still pending")
        idle.close(timeout=0)
    except TimeoutError as exc:
        assert "0 frame" not in str(exc) and "worker" in str(exc)
    idle.close(timeout=10)


def test_a_frame_cancelled_through_futures_own_cancel_stops_no_other_stream(bundle):
    """``concurrent.futures.Future.cancel(handle)`` - generic code holding a handle as a plain Future - set the
    handle CANCELLED behind the scheduler: its hand-out then raised ``InvalidStateError`` in the worker, which gave
    every other stream's pending frame that error and closed the scheduler. A handle is running from its submit (a
    frame is being scheduled), so Future's own cancel answers False, as it does for any running future;
    ``handle.cancel()`` is the scheduler's."""
    from concurrent.futures import Future

    streams, runner, backend = scheduler(bundle, budget_ms=100.0)
    with streams:
        backend.gate = threading.Event()
        try:
            others = [streams.submit(f"cam{k}", frame(k)) for k in range(3)]
            handle = streams.submit("bad", frame(9))
            assert Future.cancel(handle) is False and handle.running() and not handle.cancelled()
        finally:
            backend.gate.set()
        assert all(h.result(10).leaves >= 1 for h in others + [handle])
        assert not streams.closed and streams.submit("later", frame(4)).result(10).leaves == 16


def test_a_handle_done_behind_the_schedulers_back_is_passed_over_and_the_others_are_answered(bundle):
    """Whatever completed a handle before its hand-out (``Future.set_result`` called by its holder), the hand-out
    skips it and answers the rest: it gave them the ``InvalidStateError`` and closed the scheduler."""
    from concurrent.futures import Future

    streams, runner, backend = scheduler(bundle, budget_ms=100.0, batching=False)
    with streams:
        backend.gate = threading.Event()
        try:
            handles = [streams.submit(f"cam{k}", frame(k)) for k in range(3)]
            Future.set_result(handles[1], "the holder's own")
        finally:
            backend.gate.set()
        assert handles[1].result(10) == "the holder's own"
        assert handles[0].result(10).leaves >= 1 and handles[2].result(10).leaves >= 1
        assert not streams.closed and streams.submit("later", frame(4)).result(10).leaves == 16


def test_a_streams_callbacks_stay_in_order_when_the_scheduler_forgets_ids(bundle, monkeypatch):
    """Past ``MAX_STREAM_IDS`` ids the scheduler forgets the ids no pending frame has; a stream whose callback was
    still running got a new number, so a lane of its own, and its next callback ran before the one still running."""
    import hne_edge.runtime.streams as streams_module

    monkeypatch.setattr(streams_module, "MAX_STREAM_IDS", 4)
    streams, runner, backend = scheduler(bundle, budget_ms=100.0)
    release, order = threading.Event(), []
    with streams:
        backend.gate = threading.Event()
        try:
            first = streams.submit("cam", frame(0))
            first.add_done_callback(lambda h: (release.wait(5), order.append("first")))
        finally:
            backend.gate.set()
        first.result(10)
        for k in range(8):  # ids enough to be forgotten, "cam" with none pending
            streams.submit(f"other{k}", frame(k)).result(10)
        backend.gate = threading.Event()
        try:
            second = streams.submit("cam", frame(1))
            second.add_done_callback(lambda h: order.append("second"))
        finally:
            backend.gate.set()
        second.result(10)
        time.sleep(0.1)
        release.set()
    assert order == ["first", "second"]


def test_a_stream_on_the_shared_lane_keeps_its_callbacks_in_order(monkeypatch):
    """Beyond ``MAX_CALLBACK_LANES`` lanes a stream's callback goes to the shared lane; when the lanes ended, its
    next callback got a lane of its own and ran while the first still ran there. It stays on the shared lane while
    it has a callback there."""
    from concurrent.futures import Future

    from hne_edge.runtime import callbacks as callbacks_module

    monkeypatch.setattr(callbacks_module, "MAX_CALLBACK_LANES", 2)
    monkeypatch.setattr(callbacks_module.Callbacks, "LINGER_S", 0.02)
    lanes = callbacks_module.Callbacks()
    busy, x_first, order = threading.Event(), threading.Event(), []

    def run(lane: int, fn) -> None:
        f: Future = Future()
        to = lanes.expect(lane)
        f.add_done_callback(lambda h: lanes.put(to, fn, h, lane))
        f.set_result(None)

    for lane in (0, 1):  # the lanes a camera may have at once, each blocked
        run(lane, lambda h: busy.wait(5))
    run(7, lambda h: (x_first.wait(5), order.append("first")))  # camera 7: on the shared lane
    busy.set()
    give_up = time.monotonic() + 5
    while lanes.busy() > 1 and time.monotonic() < give_up:  # lanes 0 and 1 done, and ended
        time.sleep(0.01)
    time.sleep(0.1)
    run(7, lambda h: order.append("second"))
    time.sleep(0.1)
    x_first.set()
    assert lanes.wait(5) and order == ["first", "second"]
    assert 7 not in lanes.lanes()  # both ran on the shared lane, and it keeps no count of them
