"""The stream scheduler's done-callbacks: run per stream, each stream on a thread of its own (:class:`Callbacks`).

A callback is user code: it runs off the scheduler's worker and deadline watcher, and on a thread started by the
thread that registered it, so with that thread's nice, cores and scheduling policy.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable

__all__ = ["Callbacks", "MAX_CALLBACK_LANES"]

MAX_CALLBACK_LANES = 64  # streams whose done-callbacks run on threads of their own at once; beyond, they share one
LOGGER = logging.getLogger("hne_edge.runtime.streams")  # the scheduler's log: where its users look


class _Lane:
    __slots__ = ("queue", "wake", "thread", "running", "expected")

    def __init__(self, lock: threading.Lock) -> None:
        self.queue: deque = deque()
        self.wake = threading.Condition(lock)  # its own: a put wakes its lane's thread only
        self.thread: threading.Thread | None = None
        self.running = False  # inside a callback now
        self.expected = 0  # callbacks registered and not yet put: the lane's thread waits for them


class Callbacks:
    """Done-callbacks, run per stream (a *lane*) in the order its frames were answered, each lane on a daemon thread
    of its own, started when its first callback is registered and ended once it has had nothing to run or expect for
    ``LINGER_S`` (a camera's lane lives as long as the camera; a thread per callback cost ~0.1 ms each at 2,400
    frames a second): a callback that blocks holds its own stream's later callbacks only. A callback wakes its own
    lane's thread only (one condition for all woke every lane's thread at each of 240 results a second). Beyond
    ``MAX_CALLBACK_LANES`` lanes at once, new ones share one. An exception in a callback is logged, as
    ``concurrent.futures`` does; so is a ``SystemExit`` or ``KeyboardInterrupt`` (``sys.exit()`` in a callback ended
    its lane's thread, marked running: the stream's later callbacks never ran and ``close()`` waited forever).

    A lane's thread is started at the registration of a callback (:meth:`expect`, in the registering thread) and
    lives while callbacks are expected: a thread inherits its creator's nice, cores and scheduling policy, and
    started by the worker or the watcher at an answer, the users' callbacks ran at the scheduler's raised weight
    on the worker's cores (issue 39: three of eight lanes at 300 fps, beside the worker)."""

    SHARED = -1
    LINGER_S = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # close() waits on it for the lanes' callbacks
        self._lanes: dict[int, _Lane] = {}
        self._on_shared: dict[int, int] = {}  # lanes sent to the shared one: their callbacks expected or not yet run
        self._waiting: set[threading.Thread] = set()  # threads inside wait(): a lane's is not waited for

    def expect(self, lane: int) -> int:
        """A callback will be put on ``lane``: its thread started now, by the calling thread, unless running.
        Returns the lane it goes to: the shared one beyond ``MAX_CALLBACK_LANES``, and while the lane has callbacks
        there (a lane of its own would run the next before them)."""
        with self._lock:
            ln = self._lanes.get(lane)
            full = len(self._lanes) >= MAX_CALLBACK_LANES
            if ln is None and lane != self.SHARED and (lane in self._on_shared or full):
                self._on_shared[lane] = self._on_shared.get(lane, 0) + 1
                lane = self.SHARED
                ln = self._lanes.get(lane)
            if ln is None:
                ln = self._lanes[lane] = _Lane(self._lock)
                ln.thread = threading.Thread(target=self._drain, args=(lane, ln), daemon=True,
                                             name=f"hne-edge-streams-callbacks-{lane}")  # fmt: skip
                ln.thread.start()
            ln.expected += 1
            return lane

    def put(self, lane: int, fn: Callable[[Future], object], handle: Future, own: int) -> None:
        """Run ``fn(handle)`` on ``lane``, what :meth:`expect` answered for lane ``own``."""
        with self._lock:
            ln = self._lanes[lane]  # kept while expected
            ln.expected -= 1
            ln.queue.append((fn, handle, own))
            ln.wake.notify()

    def _drain(self, lane: int, ln: _Lane) -> None:
        queue = ln.queue
        while True:
            with self._lock:
                ln.running = False
                if not queue:
                    self._idle.notify_all()  # close() may wait for this lane's callbacks to be done
                    if not ln.wake.wait_for(lambda: queue, self.LINGER_S) and not ln.expected:
                        del self._lanes[lane]
                        return
                    if not queue:  # callbacks expected: waits on
                        continue
                fn, handle, own = queue.popleft()
                ln.running = True
            try:
                fn(handle)
            except BaseException:  # sys.exit() included: the lane goes on (a thread would end silently)
                LOGGER.exception("exception calling callback for %r", handle)
            if lane != own:
                with self._lock:  # that lane's callbacks on this one: one fewer
                    left = self._on_shared.pop(own) - 1
                    if left:
                        self._on_shared[own] = left

    def lanes(self) -> set[int]:
        """The lanes with a thread or with callbacks on the shared one: a stream keeps its number while it has one."""
        with self._lock:
            return set(self._lanes) | set(self._on_shared)

    def busy(self) -> int:
        """Lanes with callbacks to run or running."""
        with self._lock:
            return sum(1 for ln in self._lanes.values() if ln.queue or ln.running)

    def wait(self, timeout: float | None) -> bool:
        """Wait until every lane has run its callbacks, but the calling thread's own (close() from a callback) and,
        from a callback, those of lanes whose callback waits here too: two cameras' callbacks that each closed the
        scheduler waited for each other, forever. Any other thread waits for them all. False on timeout."""
        me = threading.current_thread()
        with self._lock:
            lane = any(ln.thread is me for ln in self._lanes.values())
            if lane:
                self._waiting.add(me)
                self._idle.notify_all()  # a callback waiting for this one's: it need not
            try:
                return self._idle.wait_for(lambda: all(ln.thread is me or lane and ln.thread in self._waiting
                                                       for ln in self._lanes.values() if ln.queue or ln.running),
                                           timeout)
            finally:
                self._waiting.discard(me)
