"""One frame's anytime evaluation: the one depth-first loop over a compiled :class:`~.program.Program`.

A session holds a frame's state: the cached activations of the current
path, the leaf logits so far, and the cancel flag. Everything that
evaluates leaves goes through :meth:`AnytimeSession.advance` -
``AnytimeRunner.run``, ``refine``, ``step``, the warm-up and the profiler
(which times each unit through the ``on_unit`` hook).

The loop advances step by step (:class:`~.program.Step`: one leaf, a whole
subtree or the whole tree). Budgets, ``cancel()``, ``stop_when`` and
``min_leaves`` / ``max_leaves`` act at step boundaries: a session stops only
at the program's ``stops`` (every n for plans "segments", "nodes" and
"mixed"; 1, 2, 4, ..., N for "subtrees"), so ``max_leaves`` is rounded down
and ``min_leaves`` up to one. A mixed program's choice at a boundary is
:func:`~.program.choose`'s.

The loop only indexes the program's steps ``(calls of (run, input slot,
output slots), ...)``: no validation, no dict building, no allocation beyond
what the backend returns. A step is two pieces: :func:`run_step` (its calls on
a cache) and ``_absorb`` (its logits into the leaf logits, the slots it frees
dropped, the position moved on). The stream scheduler (:mod:`.streams`) runs
the same pieces for several sessions at once (:func:`step_together`: their
rows stacked into one call, the kept slots split back), so a frame's cache
follows the same rules whichever way its steps ran.

Time: every time value (``deadline``, the budget, the cost model) is in
seconds of the backend's clock, ``time.perf_counter()`` for the real
backends.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import HNEError, InputError
from .program import Call, Program, Step, choose, ends_after_leaf_0, step_io
from .result import AnytimeResult

__all__ = [
    "AnytimeSession",
    "NoResultError",
    "NonFiniteResult",
    "RunnerClosedError",
    "SessionCancelled",
    "UnitHook",
    "check_batch_sizes",
    "check_count",
    "check_limits",
    "check_stop_at",
    "run_step",
    "step_together",
]

#: ``on_unit(call, inputs) -> outputs``: runs ``call.run(inputs)`` (e.g. timing it) in place of the loop.
UnitHook = Callable[[Call, tuple[Any, ...]], Sequence[Any]]


class RunnerClosedError(HNEError, RuntimeError):
    """The runner (or the session's runner) was closed."""


class NoResultError(HNEError, RuntimeError):
    """A session was asked for a result before any leaf was evaluated."""


class SessionCancelled(NoResultError):
    """``cancel()`` came before the session's first leaf, so it has no result (and evaluates nothing more)."""


class NonFiniteResult(HNEError, FloatingPointError):
    """The evaluated leaves' logits (or their mean) are not finite: an answer would be NaN, never a prediction.

    The input check lets only finite values in; a finite input far outside the normalised range can still
    overflow float32 inside the model, and a bundle's weights may be NaN (re-hashed into its manifest).
    """


def _leaf_seconds(steps: list[tuple[int, int, int, float]]) -> list[float]:
    """Each leaf's seconds of ``steps`` (``steps_taken``' rows): a step's time split evenly over its leaves."""
    out: list[float] = []
    for _, lo, hi, t in steps:
        out += [t / (hi - lo)] * (hi - lo)
    return out


def check_finite_result(result: AnytimeResult) -> AnytimeResult:
    """``result``, once its leaves' logits and their mean are finite; else :class:`NonFiniteResult` naming the first
    leaf that is not (the one check of what comes out, as :func:`~.inputs.check_input` is of what goes in)."""
    leaves = result.leaf_logits
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing mean is reported below, not warned about
        mean = result.logits
    if np.isfinite(leaves).all() and np.isfinite(mean).all():
        return result
    bad = ~np.isfinite(leaves).all(axis=-1)  # (leaves, batch)
    what = "their mean overflows float32 for"
    count, total = int((~np.isfinite(mean).all(axis=-1)).sum()), leaves.shape[1]
    if bad.any():
        leaf = int(np.flatnonzero(bad.any(axis=1))[0])
        what, count = f"leaf {leaf} computed non-finite logits (NaN/Inf) for", int(bad[leaf].sum())
    raise NonFiniteResult(
        f"no result from {result.leaves} leaves: {what} {count} of {total} sample(s); expected finite logits "
        "(an input far outside the normalised range overflows the model, or the bundle's weights are not finite: "
        "hne-edge verify --checkpoint compares the bundle with its checkpoint)"
    )


# -- argument checks (at the boundary) ---------------------------------------------------------------


def check_count(value: Any, name: str, lo: int, hi: int) -> int:
    if type(value) is int and lo <= value <= hi:  # the common case, fast
        return value
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not lo <= value <= hi:
        raise InputError(f"{name}: received {value!r}; expected an int in {lo}..{hi}")
    return int(value)


def check_batch_sizes(value: Any, lo: int, hi: int) -> list[int]:
    """A list of batch sizes (``warmup``, ``profile``), each in the bundle's range ``lo..hi``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InputError(f"batch_sizes: received {_received(value)}; expected a list of batch sizes in {lo}..{hi}")
    return [check_count(b, "batch_sizes[]", lo, hi) for b in value]


def check_stop_at(t0: float, budget_ms: float | None, deadline: float | None) -> tuple[float | None, float | None]:
    """(absolute stop time or None, the budget in ms that leaves from ``t0`` or None): the one check of a budget
    and a deadline (``run``, the stream scheduler's ``submit``). A number no float holds (``10**400``) is an
    InputError, not an OverflowError; a huge finite one is a long budget (the budget returned stays finite)."""
    stop_at = None
    if budget_ms is not None:
        ms = _finite_float(budget_ms)
        if ms is None or not ms > 0:
            raise InputError(f"budget_ms: received {_received(budget_ms)}; expected a positive finite number of milliseconds")
        stop_at = t0 + ms / 1e3
    if deadline is not None:
        at = _finite_float(deadline)
        if at is None:
            raise InputError(f"deadline: received {_received(deadline)}; expected an absolute time.perf_counter() value")
        stop_at = at if stop_at is None else min(stop_at, at)
    return stop_at, (None if stop_at is None else min((stop_at - t0) * 1e3, _FLOAT_MAX))


_FLOAT_MAX = float.fromhex("0x1.fffffffffffffp+1023")  # sys.float_info.max


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None: not a real number (a bool neither), NaN/inf, or too large for a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    try:
        out = float(value)
    except OverflowError:  # an int (or Fraction) beyond 1.8e308
        return None
    return out if math.isfinite(out) else None


def _received(value: Any) -> str:
    """``value`` for an error message: an int no float holds by its size (repr of 10**5000 itself raises)."""
    from ..errors import short_repr  # noqa: PLC0415 - an error's path only

    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
        return f"an int of about {int(value.bit_length() * 0.30103) + 1} digits"
    return short_repr(value)


def check_limits(program: Program, max_leaves: int | None, min_leaves: int, plan: str = "") -> tuple[int, int]:
    """(leaves to stop at, leaves forced), checked against each other and the tree, and rounded to the
    program's stops: ``max_leaves`` down, ``min_leaves`` up (a step's leaves come together)."""
    n = program.num_leaves
    n_stop = n if max_leaves is None else check_count(max_leaves, "max_leaves", 1, n)
    n_min = check_count(min_leaves, "min_leaves", 1, n)  # a result needs a leaf: run() and refine() alike
    if n_min > n_stop:
        raise InputError(f"min_leaves: received {n_min} with max_leaves={n_stop}; expected min_leaves <= max_leaves")
    if len(program.stops) == n:  # every n is a stop (per-leaf and mixed programs): the common case, fast
        return n_stop, n_min
    stop, forced = program.stop_at_most(n_stop), program.stop_at_least(n_min)
    if stop == 0 or forced > stop:
        asked = f"max_leaves={max_leaves}" if forced <= n_stop else f"min_leaves={min_leaves} and max_leaves={max_leaves}"
        raise InputError(
            f"{asked}: plan {plan or 'of this runner'} stops only at {', '.join(map(str, program.stops))} leaves; "
            "expected a stop within the limits (plan 'segments' or 'mixed' stops at every leaf)"
        )
    return stop, forced


# -- a step's pieces: run its calls on a cache, absorb its logits (the loop's, and the stream scheduler's) ------


def run_step(cache: list[Any], step: Step, final: bool = False) -> None:
    """Run ``step``'s unit calls on ``cache`` (slot-indexed, see :mod:`.program`); ``final``: the frame ends with this
    step, so its last call returns only the logits. The one place a step's calls run."""
    for run, src, dsts, _ in step.final if final else step.calls:
        outs = run((cache[src],))
        for d, o in zip(dsts, outs):
            cache[d] = o


def step_together(
    sessions: Sequence["AnytimeSession"],
    j: int,
    concat: Callable[[list[Any]], Any],
    split: Callable[[Any, list[int]], Sequence[Any]],
) -> float:
    """Step ``j`` of several sessions in one call; returns its wall time (seconds, up to the logits on the host).

    Every session must be at the step's first leaf (``leaves == steps[j].lo``), with its cache. The slots the
    step reads (:func:`~.program.step_io`) are stacked by rows (``concat``), the step runs once on that stacked
    cache, the slots it keeps are split back into each session's cache (``split`` by each one's rows) and each
    session absorbs its rows of the logits, exactly as its own loop would after running the step alone. One
    session runs on its own cache (no stacking). The step's last leaf being the tree's last, its final calls
    run (nothing reads the exports after it).
    """
    first = sessions[0]
    program, to_host, clock = first._program, first._to_host, first._clock
    step = program.steps[j]
    final = step.hi >= program.num_leaves
    t0 = clock()
    if len(sessions) == 1:
        cache = first._cache
        run_step(cache, step, final)
        logits = to_host(cache[program.logits_slot])
        seconds = clock() - t0
        first._absorb(j, logits, seconds)
        return seconds
    reads, keeps = step_io(step)
    cache: list[Any] = [None] * program.num_slots
    for slot in reads:
        cache[slot] = concat([s._cache[slot] for s in sessions])
    run_step(cache, step, final)
    logits = to_host(cache[program.logits_slot])
    rows = [s.batch for s in sessions]
    if not final:
        for slot in keeps:
            for s, part in zip(sessions, split(cache[slot], rows)):
                s._cache[slot] = part
    seconds = clock() - t0
    for s, part in zip(sessions, np.split(logits, np.cumsum(rows)[:-1])):
        s._absorb(j, part, seconds)
    return seconds


class _Unobserved:
    """The cost model of warm-up and profiling passes: predicts nothing, learns nothing."""

    pred = None
    entry = exit = 0.0

    @staticmethod
    def observe(step: int, seconds: float) -> None:
        pass

    @staticmethod
    def observe_entry(seconds: float) -> None:
        pass

    @staticmethod
    def observe_exit(seconds: float) -> None:
        pass


UNOBSERVED = _Unobserved()


class AnytimeSession:
    """One frame's anytime evaluation: interrupt, inspect, resume.

    Created by :meth:`AnytimeRunner.start`. ``step()`` adds the next step (one
    leaf; a whole subtree for plan "subtrees"), ``refine(budget_ms=...)`` adds
    steps under a budget, ``result()`` is valid once a leaf is evaluated,
    ``cancel()`` (any thread) stops the evaluation at the next step boundary
    and keeps what was done; a
    cancelled session evaluates nothing more. A session cancelled before its
    first leaf has no result: ``refine()`` and ``result()`` raise
    :class:`SessionCancelled` (an :class:`~hne_edge.errors.HNEError`).
    ``close()`` frees the cache.

    The session owns a copy of the input made by ``start(x)``: the caller may
    reuse ``x`` (a camera buffer) at once.

    Args (given by the runner):
        program: the compiled schedule; handle: the uploaded image; batch: its batch size.
        num_classes, class_names: of the bundle.
        model: the cost model for this batch (``pred`` list per step, ``observe(step, seconds)``).
        plan: the runner's plan name (for error messages).
        clock: the backend's clock (seconds); to_host: the backend's blocking download.
        guard: ``(acquire, release)`` of the runner's one-call-at-a-time lock.
        cold_calls: the backend's count of calls that paid a one-off (a graph's capture, a shape's first run): a
            step across which it moved is not a sample of the step's cost, nor a stall.
    """

    def __init__(
        self,
        program: Program,
        handle: Any,
        batch: int,
        *,
        num_classes: int,
        class_names: Sequence[str],
        model: Any,
        clock: Callable[[], float],
        to_host: Callable[[Any], np.ndarray],
        guard: tuple[Callable[[], None], Callable[[], None]],
        plan: str = "",
        cold_calls: Callable[[], int] = lambda: 0,
    ) -> None:
        self._program = program
        self._plan = plan
        self._cold_calls = cold_calls
        self._num_leaves = program.num_leaves
        self.batch = batch
        self._class_names = class_names
        self._model = model
        self._clock, self._to_host = clock, to_host
        self._acquire, self._release = guard
        self._cache: list[Any] | None = [None] * program.num_slots
        self._cache[0] = handle
        self._leaf_logits = np.empty((self._num_leaves, batch, num_classes), dtype=np.float32)
        # what results and stop rules see: read-only, so an app's in-place edit raises instead of changing an answer
        # (steps write only the leaves after those already handed out); no copy per step
        self._shown = self._leaf_logits.view()
        self._shown.flags.writeable = False
        self._step_s = [0.0] * self._num_leaves  # by the position a step started at: its wall time
        self._taken = [-1] * self._num_leaves  # ... and which step it was
        self._next = 0
        self._cancelled = False
        self._elapsed = 0.0
        self._status = (True, False, None, "step")  # met_budget, overran_min_leaves, budget_ms, stopped_by

    # -- state ---------------------------------------------------------------
    @property
    def num_leaves(self) -> int:
        """Leaves of the tree (the most a session evaluates)."""
        return self._num_leaves

    @property
    def leaves(self) -> int:
        """Leaves evaluated so far."""
        return self._next

    @property
    def done(self) -> bool:
        """True when no more leaves will be evaluated (all done, cancelled or closed)."""
        return self._next >= self._num_leaves or self._cancelled or self._cache is None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def cached_nodes(self) -> tuple[str, ...]:
        """Tree nodes whose activations the session currently holds (the current path)."""
        if self._cache is None:
            return ()
        return tuple(nid for nid, s in self._program.slots.items() if nid is not None and self._cache[s] is not None)

    @property
    def steps_taken(self) -> list[tuple[int, int, int, float]]:
        """``(step index, first leaf, end, seconds)`` of each step so far: wall time up to its logits on the host."""
        return self._steps_upto(self._next)

    def _steps_upto(self, leaves: int) -> list[tuple[int, int, int, float]]:
        out, n, steps = [], 0, self._program.steps
        while n < leaves:
            j = self._taken[n]
            out.append((j, n, steps[j].hi, self._step_s[n]))
            n = steps[j].hi
        return out

    @property
    def leaf_seconds(self) -> list[float]:
        """Wall time of each leaf evaluated so far (seconds): a step's time, split evenly over its leaves."""
        return _leaf_seconds(self.steps_taken)

    # -- control -------------------------------------------------------------
    def cancel(self) -> None:
        """Stop at the next leaf boundary (safe from any thread); keeps the leaves already done."""
        self._cancelled = True

    def close(self) -> None:
        """Drop the cached activations (the result stays readable)."""
        self._cache = None

    def step(self) -> bool:
        """Evaluate the next step of the plan (one leaf; plan "subtrees": the next whole subtree). Returns False
        (evaluating nothing) when the session is done."""
        if self.done:
            return False
        self._acquire()
        try:
            t0 = self._clock()
            program = self._program
            self._loop(None, program.steps[program.at[self._next]].hi, 0, None)
            self._elapsed += self._clock() - t0
        finally:
            self._release()
        self._status = (True, False, None, "step")
        return True

    def refine(
        self,
        budget_ms: float | None = None,
        deadline: float | None = None,
        max_leaves: int | None = None,
        min_leaves: int | None = None,
        stop_when: Callable[[np.ndarray], bool] | None = None,
    ) -> AnytimeResult:
        """Continue from the cached activations; same options as :meth:`AnytimeRunner.run`.

        ``max_leaves`` / ``min_leaves`` count all leaves of the session (not
        just this call); ``min_leaves`` defaults to 1 so a result always exists.
        """
        t0 = self._clock()
        stop_at, budget = check_stop_at(t0, budget_ms, deadline)
        n_stop, n_min = check_limits(self._program, max_leaves, 1 if min_leaves is None else min_leaves, self._plan)
        if self._cancelled and self._next == 0:
            raise SessionCancelled("session was cancelled before its first leaf: it has no result; start a new one")
        if self._cache is None and self._next == 0:
            raise RunnerClosedError("session is closed and has no leaf; start a new one with runner.start(x)")
        self._acquire()
        try:
            self.advance(t0, stop_at, budget, n_stop, n_min, stop_when)
        finally:
            self._release()
        return self.result()

    def result(self) -> AnytimeResult:
        """The ensemble of the leaves evaluated so far (at least one); :class:`NonFiniteResult` when their logits, or
        their mean, are not finite."""
        n = self._next
        if n == 0 and self._cancelled:
            raise SessionCancelled("session.result(): cancelled before its first leaf, so there is no result")
        if n == 0:
            raise NoResultError("session.result(): no leaf evaluated yet; call step() or refine() first")
        return self._result_of(n, self._shown[:n], self._elapsed, *self._status)

    def _result_of(self, n: int, leaf_logits: np.ndarray, elapsed_s: float, met: bool, overran: bool,
                   budget_ms: float | None, reason: str) -> AnytimeResult:  # fmt: skip
        """The result of the first ``n`` leaves (``leaf_logits``), every field counting the same leaves."""
        steps = self._steps_upto(n)
        return check_finite_result(AnytimeResult(
            leaf_logits=leaf_logits,
            elapsed_ms=elapsed_s * 1e3,
            met_budget=met,
            overran_min_leaves=overran,
            budget_ms=budget_ms,
            stopped_by=reason,
            class_names=self._class_names,
            leaf_ms=[t * 1e3 for t in _leaf_seconds(steps)],
            step_ms=[(lo, hi, t * 1e3) for _, lo, hi, t in steps],
        ))  # fmt: skip

    def answer_now(self, met_budget: bool, budget_ms: float | None, stopped_by: str, elapsed_s: float) -> AnytimeResult:
        """The result of the leaves done so far, as :meth:`settle` then :meth:`result` would give it, while a step of
        this session may be running in another thread (the stream scheduler answers a frame at its deadline): the
        cache is left alone, the leaf logits are copied (a running step writes only the leaves after them), and
        every field counts the same leaves."""
        n = self._next
        if n == 0:
            raise NoResultError("session.answer_now(): no leaf evaluated yet")
        return self._result_of(n, self._leaf_logits[:n].copy(), elapsed_s, met_budget, False, budget_ms, stopped_by)

    def settle(self, met_budget: bool, budget_ms: float | None, stopped_by: str, elapsed_s: float) -> None:
        """Record how a frame stepped from outside ended (the stream scheduler's: it runs the steps with
        :func:`step_together`), for :meth:`result`; frees the cache."""
        self._cache = None
        self._elapsed = elapsed_s
        self._status = (met_budget, False, budget_ms, stopped_by)

    def _absorb(self, j: int, logits: np.ndarray, seconds: float) -> None:
        """The end of step ``j`` (run on this session's cache): its logits (host, this session's rows) into the
        leaf logits, the slots it frees dropped, the position moved to its last leaf."""
        step = self._program.steps[j]
        lo, hi = step.lo, step.hi
        if step.several:
            self._leaf_logits[lo:hi] = logits.swapaxes(0, 1)
        else:
            self._leaf_logits[lo] = logits
        cache = self._cache
        for d in step.drops:
            cache[d] = None
        self._step_s[lo] = seconds
        self._taken[lo] = j
        self._next = hi
        if hi >= self._num_leaves:
            self._cache = None  # nothing left to compute: free the image too

    # -- the loop ------------------------------------------------------------
    def advance(
        self,
        t0: float,
        stop_at: float | None,
        budget_ms: float | None,
        n_stop: int,
        n_min: int,
        stop_when: Callable[[np.ndarray], bool] | None = None,
        *,
        final: bool = False,
        on_unit: UnitHook | None = None,
    ) -> None:
        """Evaluate steps up to ``n_stop`` leaves (arguments already checked and rounded to the program's
        stops) and record the outcome for :meth:`result`.

        The caller holds the runner's lock. ``t0``: when the call began (its elapsed time and budget count
        from there). ``final``: the session ends at ``n_stop`` (``run``), so its last step skips the exports,
        and (mixed programs) nothing can cancel or refine it: the whole-tree step may be taken.
        ``on_unit``: called in place of each unit call, e.g. to time it.
        """
        # a run()'s own work before its first step (input check, upload) and after its last (that step's cost-model
        # update, the wrap-up) is in the budget: learned frame by frame, and part of what the forced leaves take when
        # the forced-miss label is judged (as predicted when the call began)
        model = self._model
        entry = final and self._next == 0 and hasattr(model, "observe_entry")  # (stand-in models may lack it)
        entry_s, exit_s = (model.entry if entry else 0.0), getattr(model, "exit", 0.0)
        if entry:
            model.observe_entry(self._clock() - t0)
        start = self._next
        if self.done:
            reason = "cancelled" if self._cancelled else ("complete" if self._next >= self._num_leaves else "closed")
            t_forced = t_end = t0
        else:
            reason, t_forced, t_end = self._loop(stop_at, n_stop, n_min, stop_when, final, on_unit)
        if final:
            self._cache = None
        t1 = self._clock()
        self._elapsed += t1 - t0
        if entry and self._next > start and hasattr(model, "observe_exit"):
            model.observe_exit(t1 - t_end)
        # a forced miss: the forced leaves (the frame's last steps, or overrunning it) and the run's own work before and
        # after them overran a budget shorter than what they take 9 times in 10 (the leaves' own measured p90; the
        # entry's and exit's predicted quantile); over a budget that holds them, the miss is the run's (a pre-emption,
        # a busy machine). Computed only for a frame that missed (the p90 sorts a leaf's recent times)
        missed = stop_at is not None and t1 > stop_at
        overran = (missed and (t_forced > stop_at or t_forced == t_end)
                   and t0 + entry_s + self._forced_cost(start, n_min) + exit_s > stop_at)  # fmt: skip
        self._status = (not missed, overran, budget_ms, reason)

    def _fast(self, j: int) -> float:
        """Seconds step ``j`` takes when it runs fast: the lower quartile of its own recent times in the cost model (its
        median with fewer than 4 of them)."""
        model = self._model
        times = getattr(model, "times", None)
        if times is not None and len(times[j]) >= 4:
            own = sorted(times[j])
            return own[(len(own) - 1) // 4]
        return model.base[j]

    def _forced_cost(self, start: int, n_min: int) -> float:
        """Seconds the forced steps of a call from leaf ``start`` to ``n_min`` leaves take 9 times in 10: the p90 of each step's
        own recent times in the cost model (its median with fewer than 10 of them; its prediction for a step it
        has not measured; 0 without a cost model).

        Not the prediction the budget checks: that adds a pooled margin for the tail (up to the whole tree on a
        loaded machine), and labelled misses forced at budgets 14x the first leaf's median (issue 28)."""
        model = self._model
        pred = model.pred
        if pred is None:
            return 0.0
        median, known, times = getattr(model, "base", None), getattr(model, "known", None), getattr(model, "times", None)
        cost = 0.0
        for j in self._program.walk(start, n_min):
            if median is None or (known is not None and not known[j]):
                cost += pred[j]
            elif times is not None and len(times[j]) >= 10:
                own = sorted(times[j])
                cost += own[int(0.9 * (len(own) - 1))]
            else:
                cost += median[j]
        return cost

    def _loop(
        self,
        stop_at: float | None,
        n_stop: int,
        n_min: int,
        stop_when: Callable[[np.ndarray], bool] | None,
        final: bool = False,
        on_unit: UnitHook | None = None,
    ) -> tuple[str, float, float]:
        """Evaluate steps from leaf ``self._next`` up to ``n_stop``; return (why it stopped, time the forced leaves ended,
        time the last step ended).

        The step at position ``n`` is the program's (mixed programs: :func:`~.program.choose`'s); it is
        started only if ``n < n_min`` (forced) or all of: not cancelled, ``stop_when`` does not fire, and
        ``now + predicted[step] + exit <= stop_at``, ``exit`` being the cost model's prediction of the frame's own
        work after its last step (that step's update: the last decision comes before it). A ``run()`` whose budget
        holds no step after leaf 0 (:func:`~.program.ends_after_leaf_0`) runs leaf 0 as the export-free first-leaf
        file and ends; that call's time is no sample of leaf 0's step (nor is a ``max_leaves=1`` frame's).
        """
        cache = self._cache
        if cache is None:
            raise RunnerClosedError("session is closed; its cached activations were dropped")
        program = self._program
        steps, at, alts, logits_slot = program.steps, program.at, program.alts, program.logits_slot
        if on_unit is not None:  # the same loop, each call routed through the hook
            steps = [s._replace(calls=wrap(s.calls), final=wrap(s.final)) for s in steps
                     for wrap in (lambda calls: tuple(Call(lambda inputs, c=c: on_unit(c, inputs), *c[1:]) for c in calls),)]  # fmt: skip
        num_leaves, last = self._num_leaves, (n_stop if final else -1)
        # the export-free first-leaf file costs less than leaf 0's chain: not a sample of that step's cost
        unobserved = at[0] if last == 1 and program.first_leaf else -1
        whole = final and stop_when is None and n_stop == num_leaves  # nothing can cancel, refine or stop it early
        to_host, clock, cold_calls = self._to_host, self._clock, self._cold_calls
        shown = self._shown
        pred, observe = self._model.pred, self._model.observe
        median, known = getattr(self._model, "base", None), getattr(self._model, "known", None)  # mixed programs
        decide_at = None if stop_at is None else stop_at - getattr(self._model, "exit", 0.0)  # room for the exit
        # a run() that stops after leaf 0 whatever comes next (its budget holds no later step) runs that file too;
        # not while a profile's audit waits for measurements: that file's time is not one
        first_only = (final and last != 1 and n_min <= 1 and program.first_leaf and decide_at is not None
                      and median is not None and known is not None and self._next == 0
                      and getattr(self._model, "audit", None) is None)  # fmt: skip
        n = self._next
        now = clock()
        t_forced = now
        reason = "max_leaves" if n_stop < num_leaves else "complete"
        # a step's time is learned once the next step's calls are issued: on a GPU they return once queued, so the
        # update (the host's ~10-40 us a step) overlaps the device's work; a CPU's return when done, so there it is
        # in the next step's time. A run()'s last step is learned so after the next frame's first step
        # (CostModel.defer): off this frame's deadline, as the exit it was (the H200's narrow windows: issue 39)
        model = self._model
        cost = getattr(model, "cm", None)  # (a stand-in model has none: each step learned at once)
        learn, deferred = None, cost is not None and cost.deferred is not None
        while n < n_stop:
            j = at[n]
            if alts is not None and alts[n]:
                j = choose(program, n, now, decide_at, pred, median, known, n_stop, n_min, whole and n == 0, stop_when is None)
            if n >= n_min:
                if self._cancelled:
                    reason = "cancelled"
                    break
                if stop_when is not None and n and stop_when(shown[:n]):
                    reason = "stop_when"
                    break
                if decide_at is not None and now + pred[j] > decide_at:
                    reason = "budget"
                    break
            step = steps[j]
            alone = first_only and n == 0 and j == at[0] and ends_after_leaf_0(program, now, decide_at, self._fast(j), pred, known)
            cold = cold_calls()
            run_step(cache, step, alone or step.hi == last)
            if deferred:  # the last frame's last step
                cost.flush()
                deferred = False
            if learn is not None:
                observe(*learn)
                learn = None
            logits = to_host(cache[logits_slot])
            t = clock()
            self._absorb(j, logits, t - now)
            if j != unobserved and not alone and cold_calls() == cold:  # a capture's time is no sample of it
                if known is not None and known[j] and getattr(model, "audit", None) is None:
                    learn = (j, t - now)
                else:  # a first measurement (what the steps not measured yet, or a profile's audit, are judged by):
                    observe(j, t - now)  # learned before the next decision
            now = t
            n = step.hi
            if step.lo < n_min <= n:
                t_forced = now
            if alone:  # the first-leaf file exports nothing: the frame ends here, as the budget said it would
                reason = "budget"
                break
        if learn is not None:
            if final and cost is not None:
                cost.defer(observe, *learn)
            else:  # a session's step(): learned before it returns
                observe(*learn)
        if self._cancelled and reason != "cancelled" and n < num_leaves and n >= n_min:
            reason = "cancelled"
        if n >= num_leaves:
            self._cache = None  # nothing left to compute: free the image too
        return reason, t_forced, now
