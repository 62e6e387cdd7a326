"""Several cameras, one device: frames of many streams, each with its own deadline, on one bundle.

    from hne_edge.runtime import AnytimeRunner, StreamScheduler

    with AnytimeRunner("bundle/") as runner, StreamScheduler(runner, budget_ms=33.0) as streams:
        handle = streams.submit("front", runner.preprocess(image))   # from any thread; returns at once
        r = handle.result()                                           # a StreamResult
        r.logits, r.leaves, r.met_deadline, r.stopped_by              # "complete", "deadline", "cancelled", "rejected"

One worker thread owns the runner (its backend, its lock) for the scheduler's life: a frame is one
:class:`~.session.AnytimeSession` (the runner's slot cache and leaf logits), and every step runs through the
session's own pieces (:func:`~.session.step_together`: one frame, or several frames' rows stacked into one
call). ``submit`` checks the image, admits or rejects the frame at once and returns a :class:`FrameHandle` (a
``concurrent.futures.Future``: ``result(timeout)``, ``add_done_callback``, ``cancel()``). Every frame gets
exactly one :class:`StreamResult`: its leaves, its logits (the mean of its leaf logits: the runner's prefix
mean), whether its deadline was met and why it stopped. ``close()`` lets the frames pending finish (by their
deadlines) or, with ``cancel=True``, stops them at their next step boundary; either way each gets its result.
A second thread answers at its deadline every frame that has a leaf and is still pending - waiting for a step,
or inside one (the worker cannot answer while it waits for the device): what it has by then, handed out by then.

**The policy** (admission, EDF over first leaves, slack by value per millisecond, stacking across streams)
is stated in :mod:`.stream_policy`, whose :func:`admit` and :func:`decide` the worker calls.

Time: deadlines are absolute values of the backend's clock (``time.perf_counter()`` for the real backends),
as for :meth:`AnytimeRunner.run`; ``budget_ms`` counts from the ``submit`` call.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from ..errors import HNEError, InputError
from .cost_model import profile_measures
from .callbacks import Callbacks
from .inputs import check_input
from .program import Program
from .result import AnytimeResult
from .runner import AnytimeRunner
from .session import RunnerClosedError, check_count, check_stop_at, step_together
from .stalls import STALL_FLOOR_S, SteadyWindow
from .stream_policy import (ArrivalRate, Decision, Pending, accuracy_by_n, admission, admit, decide, expected_accuracy,
                            gain_curve, late_end, one_call, read_accuracy, saturated)  # fmt: skip
from .weight import ACTIVE_S, MAX_NICE, MIN_NICE, nice_for_streams, set_thread_nice, supported, thread_nice

__all__ = [
    "StreamScheduler",
    "StreamResult",
    "FrameHandle",
    "Pending",
    "Decision",
    "admit",
    "decide",
    "accuracy_by_n",
    "gain_curve",
    "read_accuracy",
    "expected_accuracy",
    "STOP_REASONS",
]

INF = math.inf
#: why a frame's evaluation stopped
STOP_REASONS = ("complete", "deadline", "cancelled", "rejected")
LATE = ("reject", "run")
LAG_WINDOW = 128  # the scheduler's own recent lags (its time per call, its hand-outs, its watcher's wake-ups) kept
GUARD_MS = 1.0  # see StreamScheduler's guard_ms
MAX_GUARD_MS = 1000.0
MAX_WAIT_S = 60.0  # the deadline watcher looks again at least this often: a far deadline is a long wait, not a
# timeout past threading.TIMEOUT_MAX (an OverflowError there closed the scheduler for every stream)
MAX_STREAM_IDS = 4096  # stream ids remembered at once; beyond, those with no frame pending are forgotten
LOGGER = logging.getLogger(__name__)
_RESULT_REASON = {"deadline": "budget"}  # the runner's word in AnytimeResult.stopped_by


# -- results and handles -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StreamResult:
    """One frame's outcome. ``result`` is the :class:`AnytimeResult` of its leaves (None: it has none - rejected,
    or cancelled before its first); ``logits`` their mean, exactly as ``AnytimeRunner.run`` returns it.

    ``stopped_by``: "complete" (every leaf), "deadline" (no further step could end by it, or add anything),
    "cancelled", "rejected" (admission control: its first leaf could not end in time - at submit, or, admitted,
    once it no longer could even at the medians while other frames waited, with ``late="reject"``).
    ``met_deadline``: it has a leaf and was answered by its deadline (``finished``, when the scheduler handed it
    to the handle, ``<= deadline``; the scheduler plans for the time that takes (callbacks run after, on the
    stream's thread), as ``AnytimeRunner.run`` returning by it). ``late``: its first leaf ran although predicted to miss
    (``late="run"``, or its prediction grew after admission). ``submitted`` / ``deadline`` / ``finished`` (its
    delivery) are clock seconds; ``batched``: how many frames each of its steps' calls ran for (1: alone).
    """

    stream: Hashable
    frame: int  # the scheduler's count of submissions, from 0
    stopped_by: str
    met_deadline: bool
    late: bool
    submitted: float
    deadline: float
    finished: float
    result: AnytimeResult | None = field(default=None, repr=False)
    batched: tuple[int, ...] = ()

    @property
    def leaves(self) -> int:
        return 0 if self.result is None else self.result.leaves

    @property
    def logits(self) -> np.ndarray | None:
        """(rows, classes): the mean of its leaf logits; None without a leaf."""
        return None if self.result is None else self.result.logits

    @property
    def predictions(self) -> np.ndarray | None:
        return None if self.result is None else self.result.predictions

    @property
    def latency_ms(self) -> float:
        """From ``submit`` to its result."""
        return (self.finished - self.submitted) * 1e3

    @property
    def leaves_on_time(self) -> int:
        """The leaves its answer had by its deadline (0 when it was late, rejected or had none)."""
        return self.leaves if self.met_deadline else 0

    def to_dict(self) -> dict:
        return {"stream": self.stream if isinstance(self.stream, (str, int)) else repr(self.stream), "frame": self.frame,
                "leaves": self.leaves, "stopped_by": self.stopped_by, "met_deadline": self.met_deadline, "late": self.late,
                "latency_ms": round(self.latency_ms, 6), "batched": list(self.batched),
                "predictions": None if self.result is None else self.result.predictions.tolist()}  # fmt: skip


class FrameHandle(Future):
    """A submitted frame: a ``concurrent.futures.Future`` of its :class:`StreamResult` (``result(timeout)``,
    ``done()``, ``add_done_callback``; ``concurrent.futures.wait`` / ``as_completed`` take it).

    ``cancel()`` stops the frame at its next step boundary: it still gets a result (``stopped_by ==
    "cancelled"``, with the leaves already done), so ``result()`` never raises ``CancelledError``. It returns
    False when the frame already had its result. A handle is *running* from its submit: ``Future.cancel(handle)``,
    the base class's, answers False as for any running future.

    ``add_done_callback(fn)``: ``fn(handle)`` runs on a thread of the frame's stream (one per stream with callbacks
    to run, in the order its frames were answered), never on the scheduler's own threads: a callback that blocks
    holds its own stream's later callbacks, not the other streams' frames. That thread is started by the thread
    that registers (so it has that thread's nice, cores and policy: the user's, not the scheduler's weight). On a
    handle already done it runs at once in the calling thread, as ``Future``'s. ``close()`` waits for the
    callbacks of the frames it answered."""

    def __init__(self, scheduler: "StreamScheduler", stream: Hashable, frame: int, lane: int = -1) -> None:
        super().__init__()
        self.stream, self.frame = stream, frame
        self._scheduler = scheduler
        self._lane = lane
        # running from its submit (it is being scheduled): Future's own cancel, which generic code holding it as a
        # plain Future calls, answers False as for any running future, rather than cancel it behind the scheduler
        self.set_running_or_notify_cancel()

    def cancel(self) -> bool:
        return self._scheduler._cancel(self.frame)

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        if self.done():
            super().add_done_callback(fn)  # at once, in this thread
            return
        callbacks = self._scheduler._callbacks
        own = self._lane
        lane = callbacks.expect(own)  # its thread started here, by the registering thread, if not running
        super().add_done_callback(lambda handle: callbacks.put(lane, fn, handle, own))

    def __repr__(self) -> str:
        return f"<FrameHandle stream={self.stream!r} frame={self.frame} {'done' if self.done() else 'pending'}>"


class _Frame:
    __slots__ = ("key", "stream", "sid", "handle", "image", "rows", "submitted", "deadline", "budget_ms", "late",
                 "session", "batched", "last_leaf", "cancelled", "running", "answered")  # fmt: skip

    def __init__(self, key, stream, sid, handle, image, rows, submitted, deadline, budget_ms, late) -> None:
        self.key, self.stream, self.sid, self.handle, self.image, self.rows = key, stream, sid, handle, image, rows
        self.submitted, self.deadline, self.budget_ms, self.late = submitted, deadline, budget_ms, late
        self.session: Any = None
        self.batched: list[int] = []
        self.last_leaf = INF
        self.cancelled = False
        self.running = False
        self.answered = False  # answered at its deadline by the watcher (maybe while its step runs)

    @property
    def leaves(self) -> int:
        return 0 if self.session is None else self.session.leaves


# -- the scheduler -------------------------------------------------------------------------------------


class StreamScheduler:
    """Frames of several streams, each with its own deadline, on one runner (see the module docstring).

    Args:
        runner: an :class:`AnytimeRunner` (the scheduler's worker owns it until ``close()``; closing the runner
            first waits for that), or a bundle path: a runner is opened with ``runner_options`` and closed with
            the scheduler.
        budget_ms: the deadline of a frame submitted without one, in ms from its ``submit``.
        accuracy: the bundle's accuracy after ``n`` leaves (:func:`gain_curve`; a file path: :func:`read_accuracy`);
            None: a leaf is worth one.
        late: "reject" (default): a frame whose first leaf cannot end by its deadline is rejected at once, and an
            admitted one whose first leaf no longer can, even at the medians, while other frames wait, is taken
            back (answered "rejected"); "run": it runs late, flagged.
        batching: stack frames waiting at the same step into one call where the cost model says it is cheaper.
            Backends whose handles cannot be stacked (``Backend.row_batching`` False) never do.
        max_rows: the most rows one call stacks (default: the bundle's max batch).
        guard_ms: every answer is planned this much before its deadline, beyond the hand-out lags the scheduler
            measures (admission, the worker's last step, the watcher's wake-up): what no window of lags shows, a
            thread woken late or the interpreter's lock held, handed answers out 0-1 ms late at 8 cameras
            (``benchmarks/bench_streams.py``: at 0, 0.5 and 1 ms, 0.9%, 0.3% and 0.1% of the frames missed, 1
            thread; 1.4%, 0.5% and 0.2% with 2). 0: none.
        profile: when the runner's cost profile has not measured the bundle's min batch and ``max_rows`` rows (nor
            sizes around them: :func:`~.cost_model.profile_measures`), measure those first
            (``runner.profile(batch_sizes=..., warmup=3, repeats=20, save=False)``, kept beside the profile's
            sizes): a deadline needs a prediction, a batch size nothing measured is never stacked, and an
            extrapolated one is a guess an overload's first stacked calls miss by.
        nice: the weight of the scheduler's two threads (its worker, its deadline watcher) on a CPU shared with
            other work (:mod:`.weight`). "streams" (default): the nice whose kernel weight is one ordinary thread's
            per stream that submitted in the last second - the share of the CPU K runners would have had, followed
            as cameras come and go; where a lower nice is not permitted (no ``CAP_SYS_NICE``, ``ulimit -e``) they
            keep the nice they were created with, logged once. An int (-20 to 19): that nice for the scheduler's
            life, warned when refused. None: left as created. Linux only (elsewhere nothing is changed).
    """

    def __init__(
        self,
        runner: AnytimeRunner | str | os.PathLike,
        *,
        budget_ms: float | None = None,
        accuracy: Sequence[float] | Mapping[int, float] | str | os.PathLike | None = None,
        late: str = "reject",
        batching: bool = True,
        max_rows: int | None = None,
        guard_ms: float = GUARD_MS,
        profile: bool = True,
        nice: int | str | None = "streams",
        **runner_options: Any,
    ) -> None:
        self._owns = not isinstance(runner, AnytimeRunner)
        if not self._owns and runner_options:
            raise InputError(f"StreamScheduler: received runner options {sorted(runner_options)} with an AnytimeRunner; "
                             "expected them only with a bundle path")  # fmt: skip
        if late not in LATE:
            raise InputError(f"late: received {late!r}; expected one of {list(LATE)}")
        if budget_ms is not None:
            check_stop_at(0.0, budget_ms, None)  # the one check of a budget
        if not (isinstance(guard_ms, (int, float)) and not isinstance(guard_ms, bool) and 0 <= guard_ms <= MAX_GUARD_MS):
            raise InputError(f"guard_ms: received {guard_ms!r}; expected a number of ms from 0 to {MAX_GUARD_MS}")
        nice_int = isinstance(nice, int) and not isinstance(nice, bool) and MIN_NICE <= nice <= MAX_NICE
        if not (nice is None or nice_int or isinstance(nice, str) and nice == "streams"):
            raise InputError(f"nice: received {_shown(nice)}; expected \"streams\", None or an int from {MIN_NICE} to "
                             f"{MAX_NICE}")  # fmt: skip
        self._closing = True  # until the worker runs
        self._worker: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        runner = AnytimeRunner(runner, **runner_options) if self._owns else runner
        try:
            self.runner = runner
            self.budget_ms = budget_ms
            self.late = late
            self.guard_ms = float(guard_ms)
            spec = runner.input_spec
            lo, _, hi = spec.batch
            self.max_rows = hi if max_rows is None else check_count(max_rows, "max_rows", lo, hi)
            self.batching = bool(batching) and runner.backend.row_batching and self.max_rows > lo
            self._min_rows = lo
            if isinstance(accuracy, (str, os.PathLike)):
                accuracy = read_accuracy(accuracy)
            self.gain = gain_curve(accuracy, runner.num_leaves)
            sizes = sorted({lo, self.max_rows if self.batching else lo})
            unmeasured = [b for b in sizes if not profile_measures(runner.profile_data, b)]
            if profile and unmeasured:
                runner.profile(batch_sizes=unmeasured, warmup=3, repeats=20, save=False)
            # admission plans stacked calls of every size from an overload's first frames: a cost model built inside
            # submit cost it 0.8 ms (13 ms for all sizes), and a submitting thread that falls behind holds the worker
            for rows in range(lo, self.max_rows + 1):
                runner.cost.for_batch(rows)
        except BaseException:
            if self._owns:
                runner.close()
            raise
        self._program: Program = runner._program
        self._clock = runner.backend.clock
        self._concat, self._split = runner.backend.concat_rows, runner.backend.split_rows
        # one lock, two conditions: the worker waits on _cond (new frames, cancels, answers taken from its plan),
        # the watcher on _watch_wake (first leaves done). One condition for both woke the watcher at every admitted
        # frame (up to 2,400 a second at 300 fps) for nothing: a frame without a leaf is not the watcher's
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._watch_wake = threading.Condition(lock)
        self._frames: dict[int, _Frame] = {}
        self._busy_until = -INF
        self._count = 0
        self._cancel_all = False
        self._error: BaseException | None = None
        # the scheduler's own lags, steady parts only: a stall among them is the runner's stall model's (one model
        # for the device, the host and the scheduler: runtime/stalls.py), not a lag every plan would carry
        stalls, q = runner.cost.stalls, runner.quantile
        self._gaps = SteadyWindow(q, LAG_WINDOW, stalls, STALL_FLOOR_S)  # the worker's own seconds per call (see _run)
        self._overhead = (0.0, 0.0)  # their median and quantile
        self._busy_margin = 0.0  # the running call's prediction beyond its median
        self._ready_at = self._clock()  # when the worker last became free to work (a step ended, or it woke)
        self.busy_seconds = 0.0  # time spent in steps (the device's busy time, as the worker sees it)
        self.calls = 0  # step calls run
        self.stacked_calls = 0  # of which for several frames
        self._answer_lateness = SteadyWindow(q, LAG_WINDOW, stalls, STALL_FLOOR_S)  # how late the watcher's answers came
        self._handout = SteadyWindow(q, LAG_WINDOW, stalls, STALL_FLOOR_S)  # the worker's: from deciding to handed out
        self._sids: dict[Hashable, int] = {}  # each stream id's number (see _stream_id)
        # the threads' weight (runtime/weight.py): "streams" follows the streams seen in the last ACTIVE_S seconds
        self._nice_mode = nice if supported() else None
        self._nice_base = thread_nice() if self._nice_mode is not None else 0
        self.nice: int | None = None if self._nice_mode is None else self._nice_base  # its threads' (None: not set)
        self.nice_refused: str | None = None  # why a lower nice was refused (the first time)
        self._active: dict[int, float] = {}  # stream number -> its last submit, for "streams"
        self._recount_at = -INF
        self._arrivals = ArrivalRate(self._clock())  # rows submitted a second lately (saturation: stream_policy, 1)
        self._callbacks = Callbacks()
        self._worker = threading.Thread(target=self._work, name="hne-edge-streams", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="hne-edge-streams-deadlines", daemon=True)
        # the worker owns the runner (its backend and caches) until it ends; taken here, so a runner another thread
        # is running fails this constructor (ConcurrentUseError) instead of starting a scheduler whose worker is dead
        runner._acquire()
        runner._owner = self._worker
        self._closing = False
        self._warmed = threading.Event()  # set by the worker once it may serve (see _work)
        self._worker.start()
        self._warmed.wait()
        if self._error is not None:  # its warm-up failed: the worker ended; nothing was submitted yet
            runner._release()
            if self._owns:
                runner.close()
            raise self._error
        self._watcher.start()
        if self._nice_mode is not None:  # its slice at once; a nice below the base for "streams" at their submits
            with self._cond:
                self._set_nice(self._nice_base if self._nice_mode == "streams" else self._nice_mode)

    # -- the API -----------------------------------------------------------------------------------------
    def submit(self, stream: Hashable, x: np.ndarray, deadline: float | None = None, *,
               budget_ms: float | None = None) -> FrameHandle:  # fmt: skip
        """Queue frame ``x`` (normalised NCHW, batch first, as ``runner.run`` takes it; copied, so the caller may
        reuse it) of ``stream`` with ``deadline`` (absolute clock seconds) or ``budget_ms`` (from now; the
        scheduler's ``budget_ms`` when neither is given). Admitted or rejected at once (see the module docstring);
        returns its :class:`FrameHandle`. Safe from any thread."""
        t0 = self._clock()
        if deadline is None and budget_ms is None:
            budget_ms = self.budget_ms
            if budget_ms is None:
                raise InputError("submit: received no deadline and no budget_ms; expected one of them (or "
                                 "StreamScheduler(budget_ms=...))")  # fmt: skip
        stop_at, budget = check_stop_at(t0, budget_ms, deadline)
        _check_stream(stream)
        x = check_input(x, self.runner.input_spec)
        rows = x.shape[0]
        if rows > self.max_rows:
            raise InputError(f"x: received {rows} rows; expected at most max_rows={self.max_rows}")
        image = np.array(x, copy=True)  # the caller may reuse x (a camera buffer)
        rejected = None
        with self._cond:
            if self._closing:
                raise RunnerClosedError("StreamScheduler is closed" + (f" (its worker failed: {self._error})" if self._error
                                        else "") + "; create a new one")  # fmt: skip
            key = self._count
            self._count += 1
            sid = self._stream_id(stream)
            if self._nice_mode == "streams":
                self._weigh(sid, t0)
            handle = FrameHandle(self, stream, key, sid)
            frame = _Frame(key, stream, sid, handle, image, rows, t0, stop_at, budget, False)
            waiting, ahead = [], []
            queued_rows, own_queued = rows, False
            lag, handout_stall = self._lags(self._handout)  # planned to end by the deadline less the hand-out
            for f in self._frames.values():
                if f.leaves == 0 and not f.running:
                    (ahead if f.late else waiting).append(Pending(f.key, f.deadline - lag, 0, f.rows, f.late))
                    queued_rows += f.rows
                    own_queued |= f.sid == sid
            now = self._clock()
            running = self._busy_until > -INF
            start, me = self._free_at(now), Pending(key, stop_at - lag, 0, rows, False)
            rate = self._arrivals.add(t0, rows)
            if own_queued and queued_rows > self.max_rows:  # one call's worth waits (stream_policy, 1): refused unplanned
                promise = None
            elif self._beyond_one_call(rate, start, waiting, me, ahead):  # at saturation, from every stream: unplanned
                promise = None
            else:
                promise = admission(start, waiting, me, self._program, self._model, self.max_rows, self.batching,
                                    self._overhead, max(self._busy_margin if running else 0.0, handout_stall),
                                    ahead)  # fmt: skip
            if promise is None:
                queued = bool(waiting or ahead)  # a first leaf not yet started (then the frame's late end is moot)
                if self.late == "reject" and (stop_at <= now or (self._frames or running) and (
                        queued or late_end(start, (), me, self._program, self._model, self._overhead) > me.deadline)):
                    rejected = StreamResult(stream, key, "rejected", False, False, t0, stop_at, now)
                else:  # late="run", no first leaf waits and it makes it at its median, or nothing else is pending
                    frame.late = True
            if rejected is None:
                self._frames[key] = frame
                self._cond.notify()  # the worker (a frame without a leaf is nothing the watcher watches)
        if rejected is not None:
            handle.set_result(rejected)
        return handle

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Accept no more frames; let the pending ones finish (by their deadlines) or, with ``cancel``, stop them at
        their next step boundary. Every frame gets its result. Waits for the worker (at most ``timeout`` s: then
        :class:`TimeoutError`), which then releases the runner (and closes it when it opened it). Idempotent."""
        with self._cond:
            self._closing = True
            self._cancel_all = self._cancel_all or cancel
            self._cond.notify_all()
            self._watch_wake.notify_all()
        worker = self._worker
        if worker is None or worker is threading.current_thread():  # from the worker itself: it ends by itself
            return
        start = time.monotonic()
        worker.join(timeout)
        if worker.is_alive():
            pending = len(self._frames)
            raise TimeoutError(f"StreamScheduler.close: {pending} frame(s) still pending after {timeout} s" if pending
                               else f"StreamScheduler.close: its worker still ending after {timeout} s")
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        if not self._callbacks.wait(left):
            raise TimeoutError(f"StreamScheduler.close: done-callbacks of {self._callbacks.busy()} stream(s) still "
                               f"running after {timeout} s")  # fmt: skip

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def pending(self) -> int:
        """Frames submitted and not yet delivered."""
        return len(self._frames)

    def __enter__(self) -> "StreamScheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"StreamScheduler({self.runner!r}, late={self.late!r}, batching={self.batching}, max_rows={self.max_rows}; "
                f"{len(self._frames)} pending{', closed' if self._closing else ''})")  # fmt: skip

    # -- internals (the worker holds the runner; state changes under self._cond) --------------------------
    def _stream_id(self, stream: Hashable) -> int:
        """The number of ``stream`` (checked by :func:`_check_stream`): ids that are equal (1, 1.0, True) are one
        stream, as a dict sees them. Frames compare these numbers, never the user's objects. Under the lock."""
        sids = self._sids
        try:
            sid = sids.get(stream)
            if sid is None:
                if len(sids) >= MAX_STREAM_IDS:  # forget the ids no pending frame has, nor a callback to run
                    live = self._callbacks.lanes()  # (a new number is a new lane: it would run before those)
                    kept = {s: n for s, n in sids.items() if n in live}
                    kept.update((f.stream, f.sid) for f in self._frames.values())
                    self._sids = sids = kept
                sid = sids[stream] = self._count  # the frame's own number: unique
        except Exception as exc:  # its == or hash raised against another id's
            raise InputError(f"stream: received {_shown(stream)}, whose comparison with stream ids already seen raised "
                             f"{type(exc).__name__}; expected a hashable id (a str, an int, or a tuple of them)") from None  # fmt: skip
        return sid

    def _weigh(self, sid: int, now: float) -> None:
        """Note a submit of stream ``sid``; when the streams active in the last ``ACTIVE_S`` seconds changed in
        number, give the threads their weight (counted again at a new stream, else at most every 0.25 s). Under
        the lock."""
        active = self._active
        new = sid not in active
        if not new or len(active) < MAX_STREAM_IDS:  # (beyond, the weight is -20's already)
            active[sid] = now
        if not new and now < self._recount_at:
            return
        self._recount_at = now + 0.25
        for s in [s for s, t in active.items() if t < now - ACTIVE_S]:
            del active[s]
        nice = nice_for_streams(len(active), self._nice_base)
        if nice != self.nice:
            self._set_nice(nice)

    def _set_nice(self, nice: int) -> None:
        """Give the worker and the watcher ``nice``; a refusal is said once (logged for "streams", warned for an
        int the caller asked for). Under the lock."""
        if self.nice_refused is not None and nice < self.nice:
            return  # refused before: asking again each recount would say nothing new
        refused = set_thread_nice([t.native_id for t in (self._worker, self._watcher) if t is not None], nice)
        if refused is None:
            self.nice = nice
            return
        self.nice_refused = refused
        if self._nice_mode == "streams":
            LOGGER.info("StreamScheduler: %s; its threads keep nice %s", refused, self.nice)
        else:
            warnings.warn(f"StreamScheduler(nice={nice}): {refused}; its threads keep nice {self.nice}",
                          RuntimeWarning, stacklevel=3)  # fmt: skip

    def _beyond_one_call(self, rate: float, start: float, waiting: list[Pending], frame: Pending,
                         ahead: list[Pending]) -> bool:  # fmt: skip
        """Whether, at saturation (``rate`` rows a second lately), ``frame`` would wait for more than the one call of
        first leaves rule 1 lets wait from every stream (stream_policy's docstring): then it is refused, unplanned.
        Under the lock."""
        if not (waiting or ahead) or not self._saturated(rate):
            return False
        return not one_call(start, waiting, frame, self._program, self._model, self.max_rows, self.batching,
                            self._overhead, ahead)  # fmt: skip

    def _saturated(self, rate: float) -> bool:
        """Whether ``rate`` rows a second keep the device busy with first leaves alone (stream_policy, 1)."""
        return saturated(rate, self._program, self._model, self.max_rows, self.batching, self._overhead, self._min_rows)

    def _model(self, rows: int) -> Any:
        """The cost model at ``rows``, as the policy reads it. Every batch size follows the machine's speed and
        stalls together (the stall model is shared), so a stacked size the scheduler runs now and then needs no
        view of its own."""
        return self.runner.cost.for_batch(rows)

    def _free_at(self, now: float) -> float:
        """When the device is next free, as admission plans it: the running call's median end; for a call already past
        it, as far past it again. How long a stall lasts no one knows; how far past its end it has run is the best
        guess of how far it will. Planned as if it ended now, the frames submitted during a 56 ms stall were
        admitted one after another, and every one missed (bench_streams at 300 fps)."""
        due = self._busy_until
        return now if due == -INF else due if now <= due else now + (now - due)

    def _cancel(self, key: int) -> bool:
        with self._cond:
            frame = self._frames.get(key)
            if frame is None:
                return False
            frame.cancelled = True
            self._cond.notify_all()
            return True

    def _deliver(self, frame: _Frame, reason: str, now: float) -> tuple[Future, Any]:
        """(its handle, its StreamResult or the exception that stands for it)."""
        session, leaves = frame.session, frame.leaves
        met = leaves > 0 and frame.last_leaf <= frame.deadline and now <= frame.deadline
        try:
            result = None
            if session is not None:
                session.settle(met, frame.budget_ms, _RESULT_REASON.get(reason, reason), now - frame.submitted)
                if leaves:
                    result = session.result()
            return frame.handle, StreamResult(frame.stream, frame.key, reason, met, frame.late, frame.submitted,
                                              frame.deadline, now, result, tuple(frame.batched))  # fmt: skip
        except Exception as exc:  # e.g. non-finite logits: the frame's outcome is that error
            return frame.handle, exc

    def _sweep(self, out: list) -> None:
        """Deliver the cancelled frames not inside a step (all of them when closing with cancel)."""
        now = None
        for key in [k for k, f in self._frames.items() if (f.cancelled or self._cancel_all) and not f.running]:
            now = self._clock() if now is None else now
            out.append(self._deliver(self._frames.pop(key), "cancelled", now))

    def _work(self) -> None:
        runner, out = self.runner, []  # the runner acquired for this thread by the constructor
        try:  # graphs that serve only the thread that captured them (ONNX Runtime CUDA) are captured here too
            if runner.backend.graphs_per_thread:
                runner._warm({b: 1 for b in runner._warm_sizes()})
        except BaseException as exc:
            self._error = exc
            return
        finally:
            self._warmed.set()
        try:
            while True:
                run = None
                with self._cond:
                    while True:
                        self._sweep(out)
                        if self._frames or self._closing or out:
                            break
                        self._cond.wait()
                        self._ready_at = self._clock()  # idle until now: the wait is not the worker's overhead
                    if not self._frames and self._closing and not out:
                        break
                    if self._frames and not out:  # results first: a hand-out never waits for a step planned after it
                        now = self._clock()
                        lag, handout_stall = self._lags(self._handout)  # every answer must be handed out by then
                        overload = self._saturated(self._arrivals.rate(now))  # first leaves first (stream_policy, 1)
                        decision = decide(now, [Pending(f.key, f.deadline - lag, f.leaves, f.rows, f.late) for f in self._frames.values()],
                                          self._program, self._model, self.gain, self.max_rows, self.batching,
                                          self._overhead, self.late == "reject", handout_stall, overload)  # fmt: skip
                        for key in decision.doomed:
                            self._frames[key].late = True
                        for key in decision.drop:  # admitted, and nothing can answer it in time now: taken back
                            out.append(self._deliver(self._frames.pop(key), "rejected", now))
                        for key in decision.finish:
                            out.append(self._deliver(self._frames.pop(key), "deadline", now))
                        if decision.step >= 0 and not out:
                            run = (decision.step, [self._frames[k] for k in decision.frames])
                            for f in run[1]:
                                f.running = True
                            self._busy_until = now + (decision.median if decision.median < INF else 0.0)
                            self._busy_margin = max(0.0, decision.seconds - decision.median) if decision.seconds < INF else 0.0
                decided = [v.finished for _, v in out if isinstance(v, StreamResult)]
                _hand_out(out, self._clock)
                if decided:  # how long after its decision an answer is in the caller's hands
                    end = self._clock()
                    with self._cond:
                        self._handout.push(end - min(decided))
                if run is not None:
                    self._run(*run, out)
        except BaseException as exc:  # a bug: every pending frame gets it, no one waits forever
            self._fail(exc, out)
        finally:
            with self._cond:
                self._watch_wake.notify_all()  # the watcher: nothing is left to watch
            runner._release()
            if self._owns:
                runner.close()

    def _run(self, j: int, frames: list[_Frame], out: list) -> None:
        error = None
        seconds, warm = 0.0, True
        try:
            runner = self.runner
            for f in frames:
                if f.session is None:
                    f.session = runner._session(runner._upload(f.image), f.rows)
                    f.image = None
            # the worker's own time since its last step ended (or it woke): results handed out,
            # the lock, deciding, uploading. Counted from the decision only, it read a median of 0.5 ms at 300 fps
            # where the whole gap was 1.1 ms (bench_streams): the plans ran behind their predictions.
            gap = self._clock() - self._ready_at
            cold = getattr(runner.backend, "cold_calls", 0)
            seconds = step_together([f.session for f in frames], j, self._concat, self._split)
            warm = getattr(runner.backend, "cold_calls", 0) == cold  # a capture's time is no sample of the step
        except Exception as exc:  # the backend failed this call: its frames' outcome
            error = exc
        now = self._ready_at = self._clock()
        with self._cond:
            self._busy_until = -INF
            self.busy_seconds += seconds
            self.calls += 1
            self.stacked_calls += len(frames) > 1
            if error is None and warm:
                self.runner.cost.for_batch(sum(f.rows for f in frames)).observe(j, seconds)
                self._gaps.push(gap)
                self._overhead = (self._gaps.median(), self._gaps.quantile())
            if any(not f.batched for f in frames):  # a first leaf: a deadline the watcher now watches
                self._watch_wake.notify_all()
            for f in frames:
                f.running = False
                if f.answered:  # answered at its deadline while this step ran: the watcher delivered it
                    continue
                if error is not None:
                    del self._frames[f.key]
                    out.append((f.handle, error))
                    continue
                f.batched.append(len(frames))
                f.last_leaf = now
                if f.leaves >= self._program.num_leaves:
                    out.append(self._deliver(self._frames.pop(f.key), "complete", now))

    def _watch(self) -> None:
        """Answer at its deadline every frame with a leaf still pending (waiting for a step, or inside one): the
        worker waits for the device and cannot. Wakes as far ahead of the deadline as its answers lately came
        after the time it woke for (waking, building them, handing them out: its quantile over the last
        ``LAG_WINDOW`` rounds that were not stalls), so the answer is handed out by the deadline. A frame answered
        inside a step leaves the worker's hands: the step's leaf is not part of its answer."""
        out: list = []
        try:
            while True:
                with self._cond:
                    while True:
                        if self._closing and not self._frames:
                            return
                        now = self._clock()
                        ahead = sum(self._lags(self._answer_lateness))  # it runs no step: its lag's stall counts whole
                        due = min((f.deadline for f in self._frames.values() if f.leaves and not f.cancelled), default=INF)
                        if now >= due - ahead:
                            break
                        self._watch_wake.wait(MAX_WAIT_S if due == INF else min(due - ahead - now, MAX_WAIT_S))
                    for key in [k for k, f in self._frames.items() if f.leaves and not f.cancelled and f.deadline - ahead <= now]:
                        frame = self._frames.pop(key)
                        frame.answered = True
                        out.append(self._answer(frame, self._clock()))
                    if out:
                        self._cond.notify_all()  # the worker: frames gone from its plan
                _hand_out(out, self._clock)  # (callbacks included: the answer is in the caller's hands after them)
                end = self._clock()
                with self._cond:
                    self._answer_lateness.push(max(0.0, end - (due - ahead)))
        except BaseException as exc:  # a bug: every pending frame gets it, no one waits forever
            self._fail(exc, out)

    def _lags(self, window: SteadyWindow) -> tuple[float, float]:
        """How long before a deadline an answer must be decided: (the lag ``window``'s steady quantile plus
        ``guard_ms``, the stall it plans for beyond that). Its stalls are the stall model's - one pause, a collection
        or the interpreter's lock held 5 ms, is an event of the machine, not a lag every later answer plans for -
        unless they come on more than 1 % of the answers (:meth:`SteadyWindow.planned`); then the second part is
        that stall: the worker and admission charge it as the plans' one stall (``decide``'s ``margin``), the
        watcher, which runs no step, adds both. The one home of that rule. Under the lock: both threads read both
        windows."""
        steady, stall = window.planned_parts()
        return steady + self.guard_ms * 1e-3, stall

    def _answer(self, frame: _Frame, now: float) -> tuple[Future, Any]:
        """The watcher's :meth:`_deliver`: its leaves so far, the session left to a step that may be running."""
        met = now <= frame.deadline
        try:
            result = frame.session.answer_now(met, frame.budget_ms, _RESULT_REASON["deadline"], now - frame.submitted)
            return frame.handle, StreamResult(frame.stream, frame.key, "deadline", met, frame.late, frame.submitted,
                                              frame.deadline, now, result, tuple(frame.batched))  # fmt: skip
        except Exception as exc:  # e.g. non-finite logits: the frame's outcome is that error
            return frame.handle, exc

    def _fail(self, exc: BaseException, out: list | None = None) -> None:
        out = out if out is not None else []
        with self._cond:
            self._closing = True
            self._error = exc
            error = exc if isinstance(exc, Exception) else HNEError(f"the stream scheduler's worker stopped: {exc!r}")
            for f in self._frames.values():
                f.answered = True  # a step still running for it (the watcher failed) hands out nothing more
            out.extend((f.handle, error) for f in self._frames.values())
            self._frames.clear()
        _hand_out(out)


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_stream(stream: Any) -> None:
    """A stream id must be hashable and equal to itself (its ``==`` a bool): the scheduler groups a stream's frames
    by it. A numpy array's ``==`` is an array, whose truth raises: while its frame was pending, every other stream's
    submit raised."""
    try:
        hash(stream)
        same = stream == stream
        ok = isinstance(same, (bool, np.bool_)) and bool(same)
    except Exception as exc:
        ok, why = False, f" ({type(exc).__name__})"
    else:
        why = "" if ok else " (not equal to itself)"
    if not ok:
        raise InputError(f"stream: received {type(stream).__name__} {_shown(stream)}{why}; expected a hashable id "
                         "equal to itself (a str, an int, or a tuple of them)")  # fmt: skip


def _hand_out(out: list, clock: Callable[[], float] | None = None) -> None:
    """Set each handle's result (or exception), outside the lock: callbacks run here and may submit. With ``clock``
    a result's ``finished`` is the moment it is set - its logits built, in the caller's hands - and ``met_deadline``
    holds only if that is by its deadline (stamped when it was decided, a frame answered a moment late counted as
    met, where a runner's ``run`` returning late does not); its :class:`AnytimeResult` says the same. Each entry
    leaves ``out`` as it is handed out, and a handle its holder completed itself (``Future.set_result``) is passed
    over: one frame's handle never makes the others' answers fail (:meth:`StreamScheduler._fail` gets the rest)."""
    while out:
        handle, value = out.pop(0)
        if not isinstance(value, BaseException) and clock is not None:
            now = clock()
            met = value.met_deadline and now <= value.deadline
            if value.result is not None:  # the scheduler's own until now (a copy would build its logits again)
                value.result.elapsed_ms = (now - value.submitted) * 1e3
                value.result.met_budget = value.result.met_budget and met
            value = replace(value, finished=now, met_deadline=met)
        try:
            if isinstance(value, BaseException):
                handle.set_exception(value)
            else:
                handle.set_result(value)
        except InvalidStateError:  # done by its holder: theirs stands
            pass
