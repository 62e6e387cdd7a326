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
