"""The stream scheduler's policy (:class:`~.streams.StreamScheduler`), pure: the frames' state in, a decision out.

**The policy.** :func:`admit` and :func:`decide` are pure (the frames' state in, a decision out), so a virtual
clock can drive them from recorded step timings. Costs are the runner's cost model: ``pred`` (the quantile a
deadline must fit) and ``base`` (the median speeds are compared by) of each step at a number of rows
(``CostModel.for_batch``; between profiled batch sizes, :func:`~.cost_model.profile_at_batch` interpolates).
*A sequence of calls* is predicted to end at the sum of their medians plus the largest of their margins
(prediction minus median): one stall, not one per call. A stall strikes whatever runs; the quantile is one
call's, and charging it to every call of a plan (plus the worker's own p99 per call) rejected 314 of 1200
frames at 4 cameras on a loaded machine where the first leaves took a tenth of the device. The worker's own
time per call (deciding, handing over, uploading) counts likewise: its median in every call, its quantile once.

1. *Admission.* A frame is admitted when its first leaf, and the first leaf of every admitted frame still
   waiting for one that would meet its deadline without it, end by their deadlines in earliest-deadline-first
   (EDF) order from when the device is next free (the running call's median end - or, past it, as far past it
   again - its margin carried) and the late first leaves queued have run (they go first, see 3). Every call is
   planned at its steady cost (the cost model's median at the machine's current speed) and the queue carries
   one margin: the largest of its calls' noise plus the stall allowance, which the runner's stall model sizes
   to the miss rate promised from how often and how long stalls strike lately (:mod:`.stalls`; 0 while stalls
   are isolated). A stall is an event, not a cost: it raises no median, so admission is as before from the
   frame after an isolated stall, and a burst's allowance ends with the burst. A frame
   refused so, when no first leaf is waiting (they do not saturate the device) and it can still make it at
   the medians (:func:`late_fits`), is run late, flagged (``late=True``), before any refinement: rejected it
   is worth nothing for sure (a loaded machine's quantile can be 8x the median: bench_streams at 2 threads).
   With first leaves waiting it is rejected (an overload is rejected, not run late: at 300 fps, letting every
   frame in that made it at the medians ran 756 late frames of which 484 missed).
   Otherwise it is rejected at once (its result says "rejected"; nothing runs for it) or, with
   ``late="run"``, run late and flagged too. A frame predicted to miss while no other
   frame is pending or running is run late, flagged, rather than rejected: it takes nothing from anyone, and a
   rejected frame measures nothing, so a prediction grown by a stall (a loaded machine) would otherwise reject
   every frame after it - unless its deadline has passed when it is submitted (a submitting thread that fell
   behind): nothing can make it then. *One call's worth waits:* a frame whose stream already has a frame
   waiting for its first leaf is refused, unplanned, when the first leaves waiting (its own rows counted)
   exceed ``max_rows``: a full stacked call waiting keeps the device busy, a longer queue adds only waiting, and
   a stall strikes every frame in it (:class:`~.streams.StreamScheduler` counts; a stream with no frame waiting
   is planned as above, so a camera at its nominal rate never meets the rule). *At saturation, one call's worth
   waits from every stream:* when the rows submitted lately (:class:`ArrivalRate`, decayed over ``ARRIVAL_S``)
   would keep the device busy on their own at its cheapest seconds a row (:func:`saturated`), a frame is refused,
   unplanned, unless it and the first leaves waiting would run as one call (:func:`one_call`: stacked as rule 4
   stacks them, on time), and no refinement runs while a first leaf waits (a refinement's milliseconds there are
   a new frame's first leaf refused). Admission alone filled the queue until each new first leaf ended at its
   deadline: every frame queued was at the edge of its own, so no stack could form (a stack delays its earliest
   member) and the device served its dearest calls, one row at a time; and every frame queued was Python planned
   at each submit and each call. At 8 cameras x 300 fps (bench_streams, this CPU) the worker waited for the
   interpreter's lock 45-58 % of its call time and 5-12 % of the admitted frames ran late; with the rule it
   stacks 2-16 rows a call, serves three times the frames, and 0-1 % run late a run (BENCHMARKS.md, Streams: the
   frames of a stacked call a stall struck, and some runs' first 15 ms, while every call is 1.5-2x its quiet
   profile and the speed not followed yet). On exact costs
   (tests/runtime/test_streams_policy.py) it serves 7 % more frames where stacking pays and 5 % fewer where it
   saves nothing. Below saturation - a camera at its nominal rate, a stall's backlog, a burst (40 rows at one
   instant read 400 a second) - nothing changes.
2. *First leaves first, in EDF order.* The first leaves of admitted frames are mandatory: a plan holds them
   in EDF order, and nothing enters the plan that would make one of them end after its deadline.
3. *Slack to the highest value per millisecond.* The next step of every frame with a leaf (a leaf, or for
   plan "mixed" the step :func:`~.program.choose` picks: a whole subtree where it measures faster and fits)
   is worth its rise in expected accuracy - the bundle's accuracy after ``n`` leaves, :func:`gain_curve` - times
   the frame's rows (without an accuracy record: the leaves it adds), over its predicted cost. The steps enter
   the plan greedily by that value per millisecond, each only if the plan stays feasible (every item ends by
   its deadline in EDF order). A refinement that runs past its frame's deadline costs the frame nothing (it is
   answered at its deadline with the leaves it has, see 6) but the device time; the plan keeps every first leaf
   on time through it as through any call. The step that runs is the plan's earliest-deadline item; the plan
   is made again after every step (new frames, cancels, measured times). A late first leaf (below) waits only
   for the on-time ones: no refinement runs before it.
4. *Batching across streams.* Frames waiting at the same step are one call (their rows stacked) when the cost
   model's median for the stacked rows is below the sum of the separate calls' medians, each call with the
   worker's own time per call, and the call's prediction ends by every member's deadline (and the bundle's
   batch range holds the rows); a stack that does not pay or fit is tried a row smaller (the latest deadline
   left out), down to two. The batched call is one item of the plan, so it must fit the plan too.
5. *Never start a step predicted to make an admitted frame miss:* the step that runs ends by its frames'
   deadlines and leaves every first leaf in the plan on time (as predicted). A first leaf that can no longer
   make its deadline even at the medians (in EDF order behind the others, stacked where that keeps more on
   time) is run late, flagged - or, with ``late="reject"`` (the scheduler's default) while other frames are
   pending, taken back: answered "rejected" (:func:`decide`'s ``drop_late``: its answer would be worth nothing
   by then, and its run delays every frame that can still make it); one that can still make it at the medians
   keeps its place (the quantile is admission's promise, not a reason to send an admitted frame to the back of
   the queue).
6. *Delivery.* A frame's result is delivered as soon as it has every leaf, no step of it can end before its
   deadline, its next step adds nothing (value <= 0), or it is cancelled - and, with a leaf, at its deadline
   whatever runs then (:class:`~.streams.StreamScheduler`'s watcher: the answer the caller has by the deadline
   is what counts, as for ``AnytimeRunner.run``). A result is never silently dropped: a backend error during a
   step is that step's frames' exception.

Time: deadlines are absolute values of the backend's clock, as for :meth:`AnytimeRunner.run`. The scheduler
passes each deadline less the time its answers lately took from its decision to the caller's hands (its
quantile; callbacks and the interpreter's lock included): an answer counts when it is handed out.
"""

from __future__ import annotations

import bisect
import heapq
import math
import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import InputError
from .program import Program, choose
from .session import check_count

__all__ = ["Pending", "Decision", "ArrivalRate", "admit", "admission", "saturated", "one_call", "first_leaf_end", "late_end", "late_fits", "decide", "accuracy_by_n", "gain_curve", "read_accuracy", "expected_accuracy"]  # fmt: skip

INF = math.inf
ARRIVAL_S = 0.1  # the time constant of the rows-a-second estimate saturation reads (three frame periods at 30 fps): a
# burst of frames at one instant is a count, not a rate (40 rows at once read 400 rows a second); an overload that
# lasts is read within about a tenth of a second (8 cameras x 300 fps on this CPU: 0.06-0.15 s)


# -- what a leaf is worth ------------------------------------------------------------------------------


def accuracy_by_n(accuracy: Sequence[float] | Mapping[int, float], num_leaves: int) -> list[float]:
    """The accuracy of the first ``n`` leaves' ensemble for ``n = 0..N`` (0 for none: no answer).

    ``accuracy``: a sequence for ``n = 1..N``, or ``{n: accuracy}`` at some ``n`` (1 among them): linear between
    them, flat after the last (a checkpoint's record holds ``n = 1, 2, 4, ..., N``)."""
    if isinstance(accuracy, Mapping):
        points = {}
        for n, a in accuracy.items():
            points[check_count(n, "accuracy's n", 1, num_leaves)] = _accuracy_value(a, n)
        if 1 not in points:
            raise InputError(f"accuracy: received n = {sorted(points)}; expected n = 1 among them (the first leaf)")
        ns = sorted(points)
        values = [float(np.interp(n, ns, [points[k] for k in ns])) for n in range(1, num_leaves + 1)]
    else:
        values = [_accuracy_value(a, i + 1) for i, a in enumerate(accuracy)]
        if len(values) != num_leaves:
            raise InputError(f"accuracy: received {len(values)} values; expected one per n = 1..{num_leaves}")
    return [0.0, *values]


def _accuracy_value(value: Any, n: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)) or not 0 <= value <= 1:
        raise InputError(f"accuracy at n = {n}: received {value!r}; expected a fraction in [0, 1]")
    return float(value)


def gain_curve(accuracy: Sequence[float] | Mapping[int, float] | None, num_leaves: int) -> list[float]:
    """What the policy counts the first ``n`` leaves of a frame worth, ``n = 0..N``: a step's value is the rise it
    adds, times the frame's rows.

    ``accuracy`` (as :func:`accuracy_by_n` reads it; e.g. :func:`read_accuracy` of a file): the curve over ``n >= 1``
    replaced by its least concave majorant, so a dip or a plateau before a rise is worth the rise spread over
    the leaves that reach it (a greedy choice would never cross it otherwise), and a fall after the best ``n`` is
    worth nothing. None: every leaf is worth one (the leaves added)."""
    if accuracy is None:
        return [float(n) for n in range(num_leaves + 1)]
    values = accuracy_by_n(accuracy, num_leaves)
    hull: list[int] = []  # the upper hull of (n, accuracy) for n = 1..N
    for n in range(1, num_leaves + 1):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (values[b] - values[a]) * (n - a) <= (values[n] - values[a]) * (b - a):
                hull.pop()  # b lies on or under the chord from a to n
            else:
                break
        hull.append(n)
    curve = [0.0] * (num_leaves + 1)
    for a, b in zip(hull, hull[1:]):
        for n in range(a, b + 1):
            curve[n] = values[a] + (values[b] - values[a]) * (n - a) / (b - a)
    curve[hull[-1]] = values[hull[-1]]
    return curve


def read_accuracy(path: str | os.PathLike) -> dict[int, float]:
    """``{n: accuracy}`` from a JSON record: ``hne-edge eval``'s metrics.json (``anytime``: every n) or a checkpoint's
    record (``held_out``: n = 1, 2, 4, ..., N; the shipped ``hne_edge/assets/cifar10_demo.json``).

    Read as the manifest is (strict JSON, bounded nesting), from a regular file of at most
    :data:`~hne_edge.limits.MAX_JSON_BYTES`: deep nesting was a RecursionError, ``/dev/zero`` was read without
    end and a FIFO waited for a writer forever."""
    from ..bundle.schema import parse_json  # noqa: PLC0415
    from ..errors import BundleError  # noqa: PLC0415
    from ..limits import read_bounded  # noqa: PLC0415

    expected = "an eval metrics.json or a checkpoint record"
    try:
        data = parse_json(read_bounded(path, expected), str(path), expected)
    except BundleError as exc:
        raise InputError(str(exc) if "expected" in str(exc) else f"{exc}; expected {expected}") from None
    rows = data.get("anytime", data.get("held_out")) if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path}: received no 'anytime' or 'held_out' list; expected the accuracy per n of an eval "
                         "metrics.json or a checkpoint record")  # fmt: skip
    out = {}
    for row in rows:
        if not isinstance(row, dict) or type(row.get("n")) is not int or "accuracy" not in row:
            raise InputError(f"{path}: received a row {str(row)[:80]}; expected {{'n': int, 'accuracy': fraction}}")
        out[row["n"]] = _accuracy_value(row["accuracy"], row["n"])
    return out


def expected_accuracy(leaves_on_time: Sequence[int], accuracy: Sequence[float]) -> float:
    """The mean over frames of the accuracy their answer had when their deadline came: ``accuracy[n]`` (the curve
    of :func:`accuracy_by_n`, 0 for n = 0) of the leaves each frame delivered by its deadline - 0 for a frame
    rejected, cancelled before a leaf or late (an answer after the deadline is no answer in time)."""
    if not len(leaves_on_time):
        return 0.0
    return float(np.mean([accuracy[n] for n in leaves_on_time]))


# -- the policy (pure) ---------------------------------------------------------------------------------


class Pending(NamedTuple):
    """What the policy sees of a frame not yet delivered."""

    key: int
    deadline: float  # absolute, clock seconds
    leaves: int  # done so far
    rows: int  # its batch rows
    late: bool  # its first leaf runs late (admitted late, or no longer able to make its deadline)


class Decision(NamedTuple):
    """What :func:`decide` says to do now."""

    step: int  # the step to run (-1: none)
    frames: tuple[int, ...]  # the frames it runs for (their rows stacked in one call when several)
    seconds: float  # its predicted cost (the quantile a deadline must fit)
    median: float  # its median cost: when the device is likely free again (what admission plans from)
    finish: tuple[int, ...]  # frames to deliver now (no step of theirs can end by their deadline, or adds nothing)
    doomed: tuple[int, ...]  # frames whose first leaf can no longer make its deadline: run late, flagged
    drop: tuple[int, ...] = ()  # with ``drop_late``: frames without a leaf that nothing can answer by their deadline


class _Item:
    """One call of the plan: a step for one frame, or for several stacked (``alone``: their members, to try alone).
    ``cost``: its predicted quantile; ``base``: its median; ``margin``: the difference (what one stall may add)."""

    __slots__ = ("deadline", "cost", "base", "margin", "value", "step", "frames", "alone")

    def __init__(self, deadline: float, cost: tuple[float, float], value: float, step: int, frames: list[Pending]) -> None:
        self.deadline, self.value, self.step, self.frames = deadline, value, step, frames
        self.cost, self.base = cost
        self.margin = self.cost - self.base
        self.alone: list | None = None


class _M(NamedTuple):
    """A frame at a step, as stacking and the plan read it."""

    deadline: float
    cost: tuple[float, float]  # (quantile, median) of its call alone, the worker's overhead included
    median: float  # the step's median alone (INF: nothing measured; stacking is compared by it)
    frame: Pending


def _allowance_of(model: Any) -> Callable[[float], float] | None:
    """The stall allowance of a sequence whose calls take ``seconds`` at their medians, from the cost model's stall
    model (the same for every batch size: ``_BatchModel.allowance``); None for a model without one (a test's exact
    costs). A sequence meets a stall in proportion to its length: one call's allowance, charged once to a queue,
    let the last of 8 first leaves miss 1.35 % of the time at 10 % pre-empted calls (a virtual-clock replay)."""
    return getattr(model, "allowance", None)


def _overheads(overhead: float | tuple[float, float]) -> tuple[float, float]:
    """(median, quantile) of the worker's seconds per call; a number: both."""
    return (overhead, overhead) if isinstance(overhead, (int, float)) else (float(overhead[0]), float(overhead[1]))


def _call(model: Any, j: int, overhead: tuple[float, float]) -> tuple[float, float]:
    """(quantile, median) of a call of step ``j`` as ``model`` predicts it, the worker's overhead added. A cost
    nothing measured says counts as the overhead alone (the frame runs first, unplanned)."""
    p = model.pred[j]
    if not p < INF:
        return overhead[1], overhead[0]
    b = model.base[j] if model.known[j] else p
    return p + overhead[1], min(b, p) + overhead[0]


def admit(
    start: float,
    waiting: Sequence[Pending],
    frame: Pending,
    program: Program,
    model_for: Callable[[int], Any],
    max_rows: float = INF,
    batching: bool = True,
    overhead: float | tuple[float, float] = 0.0,
    margin: float = 0.0,
    ahead: Sequence[Pending] = (),
) -> bool:
    """Whether ``frame`` (no leaf yet) may be admitted: EDF over first leaves from ``start`` (when the device is
    next free: the running call's median end; ``margin``: what may delay the sequence beyond its medians, at least
    the running call's prediction beyond its median; the scheduler's: or the stall its hand-outs plan for, the larger:
    :func:`decide`'s ``margin``).

    ``waiting``: the admitted frames still waiting for their first leaf (not late). The first leaves are planned
    as :func:`decide` plans them (stacked where it would stack them, else alone, in deadline order, medians in
    sequence plus one stall); the frame is admitted when its first leaf ends by its deadline and so does every
    waiting one that would without it (``overhead``: as for :func:`decide`). ``ahead``: first leaves running late
    and not yet started; :func:`decide` runs them first wherever the on-time ones stay on time, so they come off
    ``start`` (their medians, their largest margin): ignored, they pushed every frame admitted after them to the
    edge of its deadline, a small stall made those late too, and at 300 fps such late frames were answered
    0.5 s after their deadlines.
    A cost nothing measured says (infinite: a cold cost model) admits, as the runner runs a forced first leaf."""
    return admission(start, waiting, frame, program, model_for, max_rows, batching, overhead, margin, ahead) is not None


def admission(start: float, waiting: Sequence[Pending], frame: Pending, program: Program, model_for: Callable[[int], Any],
              max_rows: float = INF, batching: bool = True, overhead: float | tuple[float, float] = 0.0,
              margin: float = 0.0, ahead: Sequence[Pending] = ()) -> float | None:  # fmt: skip
    """:func:`admit` (same arguments) and, when it admits, when the frame's first leaf ends at the medians as
    :func:`first_leaf_end` plans it (INF: nothing measured); None: refused. One plan serves both unless the
    plan with room for a stall left a queued frame out or ran each alone where stacked calls left one out (then
    the plan at the medians is another): planning twice cost ``submit`` 40% of its time with 30 frames queued."""
    if not model_for(frame.rows).pred[program.at[0]] < INF:
        return INF
    plan, lost, dropped, how = _plan_first_leaves(start, waiting, frame, program, model_for, max_rows, batching,
                                                  overhead, margin, ahead, True)  # fmt: skip
    if lost:
        return None
    item, _, begin = next(entry for entry in plan if frame in entry[0].frames)
    if not dropped and how != "separate":  # what keeps every frame with room for a stall keeps it at the medians
        return begin + item.base
    return first_leaf_end(start, waiting, frame, program, model_for, max_rows, batching, overhead, ahead)


class ArrivalRate:
    """The rows submitted a second lately: a count decayed with the time constant ``ARRIVAL_S`` (its expectation is
    the rate times the constant)."""

    __slots__ = ("count", "t")

    def __init__(self, now: float) -> None:
        self.count, self.t = 0.0, now

    def rate(self, now: float) -> float:
        """The rate at ``now`` (rows a second), nothing added."""
        return self.add(now, 0)

    def add(self, now: float, rows: int) -> float:
        """``rows`` submitted at ``now``; returns the rate (rows a second), these rows counted."""
        if now > self.t:
            self.count *= math.exp((self.t - now) / ARRIVAL_S)
            self.t = now
        self.count += rows
        return self.count / ARRIVAL_S


def saturated(rate: float, program: Program, model_for: Callable[[int], Any], max_rows: float = INF,
              batching: bool = True, overhead: float | tuple[float, float] = 0.0, min_rows: int = 1) -> bool:  # fmt: skip
    """Whether first leaves arriving at ``rate`` rows a second would keep the device busy on their own: ``rate``
    times the cheapest seconds a row - of a call of ``min_rows`` (the fewest a frame has) and, when frames stack,
    of the largest call, each its median over its rows, the worker's median per call included - is at least 1.
    False while nothing measured says. The largest call's model is read only when the smallest call saturates:
    the worker asks at every decision, and a model refreshed there for nothing is a refresh per step."""
    j, overhead = program.at[0], _overheads(overhead)
    sizes = (min_rows, int(max_rows)) if batching and min_rows < max_rows < INF else (min_rows,)
    for rows in sizes:
        model = model_for(rows)
        if not (model.known[j] and model.pred[j] < INF) or rate * _call(model, j, overhead)[1] < rows:
            return False
    return True


def one_call(start: float, waiting: Sequence[Pending], frame: Pending, program: Program,
             model_for: Callable[[int], Any], max_rows: float = INF, batching: bool = True,
             overhead: float | tuple[float, float] = 0.0, ahead: Sequence[Pending] = ()) -> bool:  # fmt: skip
    """Whether ``frame``'s first leaf and those ``waiting`` (admitted, not started) would run as one call from
    ``start``: stacked as :func:`decide` stacks them (the call's prediction ends by the earliest of their
    deadlines and its median, the worker's per call included, is below their separate calls'), within
    ``max_rows``. Nothing waiting: True; a late first leaf queued (``ahead``: the device is behind) or a backend
    that cannot stack with anything waiting: False. Rule 1's test at saturation (the module docstring)."""
    if ahead:
        return False
    if not waiting:
        return True
    if not batching or frame.rows + sum(f.rows for f in waiting) > max_rows:
        return False
    j, overhead, model_for = program.at[0], _overheads(overhead), _cached(model_for)
    members = [_member(f, f.deadline, j, model_for(f.rows), overhead) for f in (*waiting, frame)]
    groups, singles = _batches(start, j, members, model_for, max_rows, overhead)
    return not singles and len(groups) == 1


def first_leaf_end(start: float, waiting: Sequence[Pending], frame: Pending, program: Program,
                   model_for: Callable[[int], Any], max_rows: float = INF, batching: bool = True,
                   overhead: float | tuple[float, float] = 0.0, ahead: Sequence[Pending] = ()) -> float:  # fmt: skip
    """When ``frame``'s first leaf ends as :func:`admit` plans it, at the medians (no stall): what the scheduler
    compares its real end with, to learn how far its plans run over (INF: nothing measured, or it does not fit)."""
    plan, *_ = _plan_first_leaves(start, waiting, frame, program, model_for, max_rows, batching, overhead, 0.0, ahead, False)
    return next((end for it, end, _ in plan if frame in it.frames), INF)


def _plan_first_leaves(start, waiting, frame, program, model_for, max_rows, batching, overhead, margin, ahead, stall):
    """:func:`admit`'s plan: the first leaves ``waiting`` that keep their deadlines, with ``frame``'s after ``ahead``:
    (the plan, the frames it leaves out, the frames ``waiting`` left out before ``frame`` came, which plan it is:
    :func:`_first_leaves_how`)."""
    j = program.at[0]
    overhead = _overheads(overhead)
    model_for = _cached(model_for)
    calls: dict[int, tuple] = {}  # rows -> (its call's (quantile, median), the step's median): a queue's frames share few

    def member(f: Pending, deadline: float) -> _M:
        call = calls.get(f.rows)
        if call is None:
            m = _member(f, deadline, j, model_for(f.rows), overhead)
            calls[f.rows] = (m.cost, m.median)
            return m
        return _M(deadline, call[0], call[1], f)

    allow = _allowance_of(model_for(frame.rows)) if stall else None
    for f in ahead:
        quantile, median = member(f, INF).cost
        start, margin = start + median, max(margin, quantile - median)
    members = [member(f, f.deadline) for f in waiting]
    _, lost = _first_leaves(start, members, j, model_for, max_rows, batching, overhead, margin, stall, allow)
    on_time = [m for m in members if m.frame not in lost] if lost else members
    plan, left_out, how = _first_leaves_how(start, on_time + [member(frame, frame.deadline)], j, model_for, max_rows,
                                            batching, overhead, margin, stall, allow)  # fmt: skip
    return plan, left_out, lost, how


def late_end(start: float, waiting: Sequence[Pending], frame: Pending, program: Program,
             model_for: Callable[[int], Any], overhead: float | tuple[float, float] = 0.0) -> float:  # fmt: skip
    """When ``frame``'s first leaf ends, at the medians, run late: after every first leaf ``waiting`` (on time or
    late: a late one runs after those before it), each alone at its median (and the worker's median overhead),
    from ``start``."""
    j, overhead = program.at[0], _overheads(overhead)
    return start + sum(_member(f, f.deadline, j, model_for(f.rows), overhead).cost[1] for f in (*waiting, frame))


def late_fits(start: float, waiting: Sequence[Pending], frame: Pending, program: Program,
              model_for: Callable[[int], Any], overhead: float | tuple[float, float] = 0.0) -> bool:  # fmt: skip
    """Whether ``frame``, which :func:`admit` refuses, can still make its deadline at the medians when run late
    (:func:`late_end`)."""
    return late_end(start, waiting, frame, program, model_for, overhead) <= frame.deadline


def decide(
    now: float,
    frames: Sequence[Pending],
    program: Program,
    model_for: Callable[[int], Any],
    gain: Sequence[float],
    max_rows: float = INF,
    batching: bool = True,
    overhead: float | tuple[float, float] = 0.0,
    drop_late: bool = False,
    margin: float = 0.0,
    overload: bool = False,
) -> Decision:
    """The policy of the module docstring: which step runs now, for which frames; which frames are delivered.

    ``model_for(rows)``: the cost model at that many rows (``pred``, ``base``, ``known`` per step, as
    ``CostModel.for_batch``); ``gain``: :func:`gain_curve`; ``max_rows``: the most rows one call may stack;
    ``overhead``: the worker's own seconds per call (deciding, handing frames over, uploading), its median and
    its quantile (a number: both), added to every call's median and prediction. ``drop_late``: a frame without a
    leaf that cannot make its deadline even at the medians, while other frames are pending, is dropped (``drop``:
    the scheduler delivers it as rejected) instead of run late - its answer is worth nothing by then, and running
    it delays every frame that can still make it (8 cameras beside busy neighbours: late frames starved behind
    on-time ones, answered 200 ms after their deadlines, and the queue behind them missed). Pure: nothing is
    changed, nothing is run. ``margin``: a stall the hand-out after the plan may meet (the scheduler's hand-out
    lags beyond their steady quantile): one stall strikes the sequence, the steps or the answer's hand-out, so it is
    charged as one more call's margin - not subtracted from every deadline on top of the steps' own allowance (beside
    six busy loops 13 ms of each 33 ms went to the one and 12 ms to the other, and one camera's frames stopped at 2.5
    leaves, 9 ms after they came, where one runner took 9). ``overload``: the rows arriving keep the device busy on
    their own (:func:`saturated`): no refinement runs while a first leaf waits (rule 1)."""
    n_leaves, at, alts, steps = program.num_leaves, program.at, program.alts, program.steps
    overhead = _overheads(overhead)
    finish: list[int] = []
    doomed: list[int] = []
    drop: list[int] = []
    late: list[_Item] = []
    by_step: dict[int, list[_M]] = {}
    model_for = _cached(model_for)
    for f in frames:
        n, rows = f.leaves, f.rows
        model = model_for(rows)
        deadline = INF if (f.late and n == 0) else f.deadline
        j = at[n]
        if alts is not None and alts[n]:
            j = choose(program, n, now, None if deadline == INF else deadline, model.pred, model.base, model.known,
                       n_leaves, 0 if n else 1, False, True)  # fmt: skip
        member = _member(f, deadline, j, model, overhead)
        p = model.pred[j] + overhead[1]
        allow = _allowance_of(model)
        if allow is not None:  # as the plan charges it (_Plan._margin): a step the plan cannot hold is not waited for
            p = max(p, member.cost[1] + allow(member.cost[1]))
        p = max(p, member.cost[1] + margin)
        if n:
            if now + p > deadline or gain[steps[j].hi] <= gain[n]:
                finish.append(f.key)  # no step of it can end by its deadline, or the next adds nothing
                continue
        elif now + member.cost[1] > f.deadline and drop_late and len(frames) > 1:  # past saving, others wait
            drop.append(f.key)
            continue
        elif deadline < INF and now + member.cost[1] > deadline:  # past saving even at its median
            doomed.append(f.key)
            deadline = INF
        if deadline == INF:  # a first leaf run late: after the first leaves that can make it, before refinements
            late.append(_Item(-INF, member.cost, 0.0, j, [f]))
            continue
        by_step.setdefault(j, []).append(member)

    mandatory: list[_M] = by_step.pop(at[0], [])  # every first leaf is step at[0]
    optional: list[_Item] = []
    for j, members in by_step.items():
        rise = gain[steps[j].hi]
        if batching and len(members) > 1:
            groups, members = _batches(now, j, members, model_for, max_rows, overhead)
            for cost, group in groups:
                item = _Item(group[0].deadline, cost, sum((rise - gain[m.frame.leaves]) * m.frame.rows for m in group), j,
                             [m.frame for m in group])  # fmt: skip
                item.alone = group  # its members alone, for when the group does not fit
                optional.append(item)
        for m in members:
            item = _Item(m.deadline, m.cost, (rise - gain[m.frame.leaves]) * m.frame.rows, j, [m.frame])
            optional.append(item)

    # the first leaves in EDF order (stacked where that keeps them on time); one late even at the medians is doomed
    first, lost = _first_leaves(now, mandatory, at[0], model_for, max_rows, batching, overhead, stall=False)
    for f in lost:
        doomed.append(f.key)
        late.append(_Item(-INF, _member(f, INF, at[0], model_for(f.rows), overhead).cost, 0.0, at[0], [f]))
    plan = _Plan(now, [it for it, *_ in first], margin, _allowance_of(model_for(frames[0].rows)) if frames else None)

    waiting_late = False
    for it in late:  # first come, first served, as long as the on-time first leaves stay on time
        waiting_late |= not plan.insert(it)
    if waiting_late or overload and plan.items:  # a late first leaf waits for the on-time ones, and no refinement
        # goes before it; at saturation none goes before any first leaf (rule 1: its milliseconds are a new frame's)
        for it in late:
            if it not in plan.items:
                plan._put(len(plan.items), it)
    else:
        heap = [(-it.value / max(it.cost, 1e-12), k, it) for k, it in enumerate(optional)]
        heapq.heapify(heap)
        seq = len(heap)
        while heap:
            _, _, it = heapq.heappop(heap)
            if not plan.insert(it) and it.alone:  # the group does not fit: its members may, alone
                rise = gain[steps[it.step].hi]
                for m in it.alone:
                    value = (rise - gain[m.frame.leaves]) * m.frame.rows
                    alone = _Item(m.deadline, m.cost, value, it.step, [m.frame])
                    heapq.heappush(heap, (-value / max(m.cost[0], 1e-12), seq, alone))
                    seq += 1
    if not plan.items:
        return Decision(-1, (), 0.0, 0.0, tuple(finish), tuple(doomed), tuple(drop))
    run = plan.items[0]
    for k, it in enumerate(plan.items):  # the first leaves as soon as the plan allows: frames that go on stay in step
        if it.step == at[0] and not it.value:
            if k and plan.fits(0, it, upto=k):
                run = it
            break
    return Decision(run.step, tuple(f.key for f in run.frames), run.cost, run.base, tuple(finish), tuple(doomed),
                    tuple(drop))


class _Plan:
    """Calls in deadline order, each predicted to end at ``now`` + the medians of the calls up to it + the largest
    of their margins: one stall strikes the sequence (a stall strikes whatever runs; the cost model's quantile is
    one call's, and charging it to every call of a sequence is charging a stall per call)."""

    def __init__(self, now: float, items: list[_Item], margin: float = 0.0,
                 allow: Callable[[float], float] | None = None) -> None:  # fmt: skip
        self.now, self.margin0, self.items = now, margin, []
        self.allow = allow  # the stall allowance of a sequence as long as its medians (None: the items' margins)
        self.deadlines: list[float] = []
        self.bases: list[float] = []  # the medians up to each item
        self.margins: list[float] = []  # the largest margin up to each item
        for it in items:  # (already feasible, in order)
            self._put(len(self.items), it)

    def end(self, k: int) -> float:
        return self.now + self.bases[k] + self._margin(self.margins[k], self.bases[k])

    def _margin(self, margin: float, base: float) -> float:
        """The margin of a sequence of ``base`` seconds at its medians whose calls' largest margin is ``margin``."""
        return margin if self.allow is None else max(margin, self.allow(base))

    def _put(self, pos: int, it: _Item) -> None:
        base = self.bases[pos - 1] if pos else 0.0
        margin = self.margins[pos - 1] if pos else self.margin0
        for k in range(pos, len(self.items)):
            self.bases[k] += it.base
            self.margins[k] = max(self.margins[k], it.margin)
        self.items.insert(pos, it)
        self.deadlines.insert(pos, it.deadline)
        self.bases.insert(pos, base + it.base)
        self.margins.insert(pos, max(margin, it.margin))

    def fits(self, pos: int, it: _Item, upto: int | None = None) -> bool:
        """Whether ``it`` at ``pos`` ends by its deadline and the items after it (up to ``upto``) still do."""
        base = self.bases[pos - 1] if pos else 0.0
        margin = self.margins[pos - 1] if pos else self.margin0
        if self.now + base + it.base + self._margin(max(margin, it.margin), base + it.base) > it.deadline > -INF:
            return False  # (a late first leaf: -INF)
        for k in range(pos, len(self.items) if upto is None else upto):
            later = self.bases[k] + it.base
            if self.now + later + self._margin(max(self.margins[k], it.margin), later) > self.deadlines[k]:
                return False
        return True

    def insert(self, it: _Item) -> bool:
        """Put ``it`` at its EDF place if every item still ends by its deadline."""
        pos = bisect.bisect_right(self.deadlines, it.deadline)
        if not self.fits(pos, it):
            return False
        self._put(pos, it)
        return True


def _cached(model_for: Callable[[int], Any]) -> Callable[[int], Any]:
    """``model_for`` asked once per row count (a plan asks it for every frame and every stacked call)."""
    models: dict[int, Any] = {}

    def model(rows: int) -> Any:
        m = models.get(rows)
        if m is None:
            m = models[rows] = model_for(rows)
        return m

    return model


def _member(f: Pending, deadline: float, j: int, model: Any, overhead: tuple[float, float]) -> _M:
    """``f`` at step ``j`` with ``deadline``: what stacking and the plan read."""
    return _M(deadline, _call(model, j, overhead), model.base[j] if model.known[j] else INF, f)


def _first_leaves(now: float, members: list[_M], j: int, model_for: Callable[[int], Any], max_rows: float,
                  batching: bool, overhead: tuple[float, float], margin: float = 0.0, stall: bool = True,
                  allow: Callable[[float], float] | None = None,
                  ) -> tuple[list[tuple[_Item, float, float]], list[Pending]]:  # fmt: skip
    """The first leaves' plan from ``now`` (``margin``: the running call's, see :class:`_Plan`): ``([(item, its
    predicted end, its start at the medians)] in EDF order, the frames it cannot keep on time)``.

    Frames are stacked as :func:`_batches` stacks them, or each runs alone: whichever keeps more of them on time
    (stacked on a tie); a frame that misses even so is left out (its first leaf runs late). Falling back to every
    frame alone whenever one stacked call missed was a cliff: a queue that fitted stacked at admission lost most
    of its frames at the next decision (bench_streams at 300 fps: half the admitted frames)."""
    plan, lost, _ = _first_leaves_how(now, members, j, model_for, max_rows, batching, overhead, margin, stall, allow)
    return plan, lost


def _first_leaves_how(now, members, j, model_for, max_rows, batching, overhead, margin, stall, allow=None):
    """:func:`_first_leaves` and which plan it is: "alone" (nothing stacks), "stacked", or "separate" (each alone
    because stacked left more out)."""
    groups, singles = _batches(now, j, members, model_for, max_rows, overhead) if batching and len(members) > 1 else ([], members)
    if not groups:
        return (*_keep(now, _alone(members, j), margin, stall, allow), "alone")
    stacked = _keep(now, sorted([_Item(g[0].deadline, cost, 0.0, j, [m.frame for m in g]) for cost, g in groups]
                                + [_Item(m.deadline, m.cost, 0.0, j, [m.frame]) for m in singles],
                                key=lambda it: it.deadline), margin, stall, allow)  # fmt: skip
    if not stacked[1]:
        return (*stacked, "stacked")
    separate = _keep(now, _alone(members, j), margin, stall, allow)
    return (*separate, "separate") if len(separate[1]) < len(stacked[1]) else (*stacked, "stacked")


def _alone(members: list[_M], j: int) -> list[_Item]:
    """Each member's call alone, in deadline order."""
    return sorted((_Item(m.deadline, m.cost, 0.0, j, [m.frame]) for m in members), key=lambda it: it.deadline)


def _keep(now: float, items: list[_Item], margin: float, stall: bool = True,
          allow: Callable[[float], float] | None = None) -> tuple[list[tuple[_Item, float, float]], list[Pending]]:
    """``items`` run in this order from ``now`` (medians in sequence plus the largest margin so far; ``stall``
    False: the medians alone), each left out when it would end after its deadline: ``([(item, its predicted end,
    its start at the medians)], the frames left out)``."""
    plan, lost, base, worst = [], [], now, margin
    for it in items:
        wait = max(worst, it.margin) if stall else 0.0
        if stall and allow is not None:  # the stall allowance of the sequence up to it, as long as it is
            wait = max(wait, allow(base - now + it.base))
        end = base + it.base + wait
        if end > it.deadline:
            lost.extend(it.frames)
            continue
        plan.append((it, end, base))
        base, worst = base + it.base, max(worst, it.margin)
    return plan, lost


def _batches(now: float, j: int, members: list[_M], model_for: Callable[[int], Any], max_rows: float,
             overhead: tuple[float, float]) -> tuple[list, list]:  # fmt: skip
    """Frames waiting at step ``j`` as one call: (``[((quantile, median), members)]``, the members left alone).

    In deadline order, as many as ``max_rows`` holds; a call is formed when its prediction ends by the earliest
    deadline among them and its median is below the sum of the separate calls' medians, every call counted with
    the worker's own time per call (``overhead``'s median). Else the latest member is left out and the rest are
    compared again, down to two; with no stack of two, the earliest frame runs alone and the rest are grouped
    anew. Without the worker's time, one-row first leaves at 0.43 ms (ONNX Runtime CPU saves nothing per row at
    1-16 rows here) were never worth one call; and a stack too long for its earliest deadline sent that frame
    alone, then the next, where a smaller stack fitted (bench_streams at 300 fps: BENCHMARKS.md, Streams)."""
    members = sorted(members, key=lambda m: m.deadline)
    per_call = overhead[0]
    groups, singles = [], []
    while len(members) >= 2:
        rows, separate = [], []  # of the first k members, k = 1, 2, ...: their rows, their separate calls' medians
        total_rows, total = 0, 0.0
        for m in members:
            total_rows += m.frame.rows
            if total_rows > max_rows:
                break
            total += m.median + per_call
            rows.append(total_rows)
            separate.append(total)
        for k in range(len(rows), 1, -1):  # the most that holds first, a row fewer while it does not pay or fit
            model = model_for(rows[k - 1])
            cost = _call(model, j, overhead)
            median = model.base[j] if model.known[j] else INF
            if now + cost[0] <= members[0].deadline and median + per_call < separate[k - 1]:
                groups.append((cost, members[:k]))
                del members[:k]
                break
        else:
            singles.append(members.pop(0))
    singles.extend(members)
    return groups, singles
