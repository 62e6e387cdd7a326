"""Stalls are not costs: the one model of how fast this machine runs now and how often, and how long, it stalls.

A call's time is its steady cost (what the device takes for it now) plus, now and then, a **stall**: the process
pre-empted by a neighbour, a garbage collection, a CUDA graph captured for a shape never seen. A stall strikes
whatever runs; how long the call was says nothing of what the next call of that step will take. Learned as the
step's cost, one stall made budgets stop frames before the step and admission reject frames the device could
serve (an H200 rejected 85 % of a trace one FIFO runner served; beside busy loops a 2-core CPU lost a third).
So a call's time is split, once, here (:meth:`Speed.split`), and every consumer - the runner's budgets, the cost
model's predictions, the stream scheduler's admission and plans - reads the parts it needs:

* **speed** (:class:`Speed`): the machine's current slowdown, the lower quartile of the last ``SHIFT_WINDOW`` (64)
  calls' ratios (each call's time over its step's steady cost at full speed), pooled over every step. Stalls
  cannot move it unless three calls in four stall; a persistent slowdown (contention, a throttled clock, 8
  runners sharing a core) moves it within 49 calls (of the 64), for every step at once - even those that have
  not run since - and its end within 16.
* **noise**: the ``quantile`` of the recent ratios of calls that were not stalls, over the speed: the ordinary
  spread a budget must fit (1.0-2x on a CPU). A call more than ``STALL_RATIO`` times its steady cost at the
  current speed is a stall; its noise is not.
* **stalls** (:class:`Stalls`): events with a rate and a size. The rate is per second of steady work
  (pre-emption strikes a call in proportion to how long it runs: a 0.05 ms step rarely, a 10 ms one often),
  both decayed with the time constant ``HORIZON_S`` of the caller's clock; the sizes are the last
  ``MAX_SIZES`` excesses (the time beyond the steady cost).

**The allowance.** A call of steady cost ``d`` meets a stall with probability ``p = 1 - exp(-rate * d)``; started
with slack ``a`` it misses only if it meets one longer than ``a``. The allowance is the smallest ``a`` with ``p *
P(size > a) <= miss_rate`` - the miss rate promised (``1 - quantile``: 1 %): 0 while ``p <= miss_rate`` or fewer
than ``MIN_STALLS`` stalls were seen lately (an isolated stall, however long, is not a pattern), else the
``1 - miss_rate / p`` quantile of the recent sizes. A budget starts a step when its steady cost times the noise,
plus this allowance, fits; the stream scheduler charges a queue of calls the allowance of its whole length, once
(a sequence meets a stall in proportion to its length; one stall, not one a call).

Recovery, stated: an isolated stall of any length changes no prediction (it is one event: no allowance; not a
ratio in the noise window; one of ``SHIFT_WINDOW`` ratios in the median), so budgets and admission are as before
from the next frame; a burst of stalls raises the allowance until it is over: when the steady work done since its
last stall would have met one with probability 999 in 1,000 at its rate (``ln(1000) / rate`` seconds of work), or
once the events' weight, halving every ``HORIZON_S * ln 2`` seconds, falls below ``MIN_STALLS``. A slowdown is
followed within 49 calls (its first calls count as stalls until then; the shift forgets them), its end within 16.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Callable

__all__ = ["STALL_RATIO", "STALL_FLOOR_S", "SHIFT_WINDOW", "HORIZON_S", "MIN_STALLS", "Speed", "Stalls", "SteadyWindow"]

STALL_RATIO = 3.0  # a call over this many times its steady cost (at the current speed) is a stall, not a cost
STALL_FLOOR_S = 2e-4  # a lag that is no step (SteadyWindow) is a stall only when this much over its median as well
SHIFT_WINDOW = 64  # the pooled ratios whose lower quartile is the current speed: about 4 frames of 16 steps (a
# frame's steps are slow together - one frame's worth of calls read one slow frame as a slowdown, and a speed that
# followed each such frame shifted every step the budget had not run since, a random walk)
NOISE_WINDOW = 128  # the non-stall ratios whose quantile is the noise
HORIZON_S = 1.5  # the time constant (clock seconds) of the stall rate's decay: 1 s let a camera's stall every 0.3 s
# (2 % of node calls pre-empted, little work a frame) read as isolated a fifth of the time; 2 s held a burst's
# allowance 4 s after it ended
MIN_STALLS = 2.0  # the decayed count of stalls below which they are isolated: no allowance
MAX_SIZES = 256  # the recent stall sizes the allowance is a quantile of
_ENDED = math.log(1e3)  # a quiet run of steady work this many times the mean gap between stalls ends a burst
# the speed is followed when the recent ratios' lower quartile left [1/1.25, 1.25] times it: a quartile of 16 moves a
# few percent by chance, and each such move would shift every step the budget has not run since (a random walk: the
# speed drifted to 2.15 on a quiet trace, the subtree steps predicted at 2.3x); a smaller drift of a step is its own
# quartile's to track, and a slowdown worth following is far larger (contention: 8x)
_FOLLOW = 1.25
_CALL_DECAY = 1.0 - 1.0 / 256  # the share of calls that stall is over about the last 256


class Stalls:
    """Stall events with a rate (per second of steady work) and sizes (seconds beyond the steady cost).

    Args:
        clock: the clock whose seconds decay the rate (the backend's: virtual in tests).
        horizon_s: the decay's time constant.
    """

    def __init__(self, clock: Callable[[], float], horizon_s: float = HORIZON_S) -> None:
        self.clock, self.horizon_s = clock, horizon_s
        self.count = 0.0  # decayed number of stalls
        self.exposure = 0.0  # decayed seconds of steady work
        self.quiet = 0.0  # seconds of steady work since the last stall
        self.t = clock()
        self.sizes: deque[float] = deque()  # recent sizes in arrival order, and sorted
        self.sorted: list[float] = []
        self.version = 0  # bumped whenever an allowance may have changed: predictions made from it are refreshed

    def _decay(self) -> None:
        now = self.clock()
        if now > self.t:
            f = math.exp((self.t - now) / self.horizon_s)
            self.count *= f
            self.exposure *= f
            self.t = now

    def work(self, seconds: float) -> None:
        """``seconds`` of steady work observed (a call's steady part)."""
        self.exposure += seconds
        self.quiet += seconds

    def stall(self, size: float) -> None:
        """A stall of ``size`` seconds beyond the steady cost."""
        self._decay()
        self.count += 1.0
        self.quiet = 0.0
        if len(self.sizes) == MAX_SIZES:
            del self.sorted[bisect.bisect_left(self.sorted, self.sizes.popleft())]
        self.sizes.append(size)
        bisect.insort(self.sorted, size)
        self.version += 1

    def forget(self, sizes) -> None:
        """Forget these stalls (a shift of the speed, or a step's own runs, explained them: they were costs)."""
        for size in sizes:
            try:
                self.sizes.remove(size)
            except ValueError:  # already left the window
                continue
            del self.sorted[bisect.bisect_left(self.sorted, size)]
            self.count = max(0.0, self.count - 1.0)
        self.version += 1

    def rate(self) -> float:
        """Stalls per second of steady work, lately; 0 while they are isolated (fewer than ``MIN_STALLS`` in the
        decayed count: a stall every second or so, or rarer), and once a burst ended (below)."""
        self._decay()
        k = self.count
        if k < MIN_STALLS or self.exposure <= 0:
            return 0.0
        before = max(self.exposure - self.quiet, 1e-12)  # the work in which they came
        if k * self.quiet > _ENDED * before:  # so long without one is improbable at their rate (1 in 1,000):
            self.count = 0.0  # a burst ended
            self.version += 1
            return 0.0
        return k / self.exposure

    def allowance(self, seconds: float, miss_rate: float) -> float:
        """The slack a call of ``seconds`` steady cost needs so that a stall makes it miss with probability at most
        ``miss_rate`` (see the module docstring); 0 when stalls are rare enough."""
        return self.allowance_at(self.rate(), seconds, miss_rate)

    def allowance_at(self, rate: float, seconds: float, miss_rate: float) -> float:
        """:meth:`allowance` at a ``rate`` already read (one read for every step of a refresh)."""
        if rate <= 0 or not self.sorted:
            return 0.0
        p = -math.expm1(-rate * seconds)
        if p <= miss_rate:
            return 0.0
        return _nearest_rank(self.sorted, 1.0 - miss_rate / p)

    def settled(self) -> bool:
        """True while no allowance can be non-zero (the common, quiet case: predictions need no refresh)."""
        self._decay()
        return self.count < MIN_STALLS


class Speed:
    """The machine's current slowdown and noise, pooled over every step and batch size, and the one place a call's
    time is split into steady cost and stall (:meth:`split`)."""

    def __init__(self, quantile: float, stalls: Stalls, min_samples: int = 8, cold_margin: float = 1.5,
                 window: int = NOISE_WINDOW) -> None:  # fmt: skip
        self.q = quantile
        self.stalls = stalls
        self.min_samples, self.cold_margin, self.window = min_samples, cold_margin, window
        self.recent: deque[float] = deque(maxlen=SHIFT_WINDOW)  # the last ratios, stalls included
        self.slow = 1.0  # the median of recent (followed when it moved by more than _FOLLOW)
        self.noise_ring: deque[float] = deque()
        self.noise_sorted: list[float] = []
        self.count = 0
        self.noise = cold_margin
        self.mid = 1.0  # the median of the same ratios: a step's median over its lower quartile (what plans add up)
        self.since_shift: deque[float] = deque(maxlen=SHIFT_WINDOW)  # sizes of the stalls at the current speed
        self.calls = self.stalled = 0.0  # calls and stalls among them, each decayed by 1/256 a call
        self.serial = 0  # stalls seen so far (which of them a step's own run of stalls leaves to other steps)
        self.version = 0  # bumped when slow or noise moved: predictions are refreshed

    def seed(self, ratios) -> None:
        """A profile's samples over their medians: the noise as measured (capped at the stall ratio)."""
        for r in ratios:
            self._push_noise(min(float(r), STALL_RATIO))
        self._renoise()

    def split(self, seconds: float, steady: float) -> tuple[float, bool]:
        """Classify a call of ``seconds`` whose step's steady cost at full speed is ``steady``; returns (its ratio over
        the current speed, whether it was a stall). Updates the speed, the noise and the stall model."""
        ratio = seconds / steady
        self.recent.append(ratio)
        slow = self.slow
        u = ratio / slow
        stalled = u > STALL_RATIO
        self.calls = self.calls * _CALL_DECAY + 1.0
        self.stalled = self.stalled * _CALL_DECAY + stalled
        if stalled:
            size = seconds - steady * slow
            self.serial += 1
            self.stalls.stall(size)
            self.stalls.work(steady * slow)
            self.since_shift.append(size)
        else:
            self.stalls.work(seconds)
            self._push_noise(u)
        if len(self.recent) >= SHIFT_WINDOW // 2:
            low = self._low()
            if not slow / _FOLLOW <= low <= slow * _FOLLOW:
                self.slow = low
                if low > slow * STALL_RATIO / 2 and self.since_shift:  # a slowdown: its first calls were it
                    self.stalls.forget(list(self.since_shift))
                self.since_shift.clear()
                self.version += 1
        if not stalled:
            self._renoise()
        return u, stalled

    def improbable_run(self, seconds: float, shared: bool) -> int:
        """How many stalls in a row a step of steady cost ``seconds`` must meet before they are its cost: a run
        less likely than 1 in 1,000 at the chance that such a call stalls lately (the stall rate's, or the share
        of all calls that stalled, whichever is more; at least 1 in 4 when other steps ``shared`` the stalls
        meanwhile: a burst has begun, and its rate is not known yet) - 2 on a quiet machine, 5 when a call in four
        stalls (beside busy neighbours), at most 12. Two in a row while a burst began (16-44 ms stalls on 1 node
        call in 20) once learned a 0.1 ms step at 36 ms, and budgets never started it again."""
        share = self.stalled / self.calls if self.calls else 0.0
        p = max(share, -math.expm1(-self.stalls.rate() * seconds), 0.25 if shared else 0.0)
        if p <= 0.0316:  # 2 in a row: p**2 <= 1e-3
            return 2
        return min(12, math.ceil(math.log(1e-3) / math.log(min(p, 0.56))))

    def _low(self) -> float:
        """The lower quartile of the recent ratios: a slowdown stretches every call, the fastest too; stalls add time
        to some calls only, and up to three in four of them stalling leave it where it was. (Their median followed
        a burst that stalled nine of sixteen calls: a 160x "slowdown" learned, the steps that had not run since
        predicted 160 times their cost.)"""
        srt = sorted(self.recent)
        return srt[(len(srt) - 1) // 4]

    def steady(self) -> bool:
        """True unless the speed may be shifting: the recent ratios' lower quartile is within 1.5x of the current
        speed, and under half of them are stalls at it. (While it shifts, one step far off its base says nothing of
        that step: a machine-wide slowdown learned step by step left the steps not run since at full speed, and the
        frames that started them missed.)"""
        if len(self.recent) < SHIFT_WINDOW // 8:
            return True
        slow = self.slow
        stalled = sum(r > STALL_RATIO * slow for r in self.recent)
        return slow / 1.5 <= self._low() <= slow * 1.5 and 2 * stalled < len(self.recent)

    def _push_noise(self, u: float) -> None:
        ring, srt = self.noise_ring, self.noise_sorted
        if len(ring) == self.window:
            del srt[bisect.bisect_left(srt, ring.popleft())]
        ring.append(u)
        bisect.insort(srt, u)
        self.count += 1

    def _renoise(self) -> None:
        srt = self.noise_sorted
        noise = _nearest_rank(srt, self.q) if srt else 1.0
        noise = max(noise, 1.0)
        mid = max(srt[len(srt) // 2], 1.0) if srt else 1.0
        if self.count < self.min_samples:
            noise = max(noise, self.cold_margin)
        if abs(noise - self.noise) > 0.005 * self.noise or abs(mid - self.mid) > 0.005 * self.mid:
            self.noise, self.mid = noise, mid
            self.version += 1


class SteadyWindow:
    """The recent values of a lag that is no step (a run's work before its first step or after its last; the
    stream scheduler's time between two calls, its hand-outs, its watcher's wake-ups): their median and ``q``
    quantile over the last ``window`` that were not stalls. Once 8 are known, a value over ``STALL_RATIO`` times
    their median and more than ``floor`` seconds above it is a stall of the shared model, not a lag: a collection
    or a pre-emption during an upload once set every budget's entry to its length for 128 frames."""

    __slots__ = ("q", "window", "ring", "sorted", "stalls", "floor", "every", "every_sorted")

    def __init__(self, q: float, window: int, stalls: Stalls, floor: float = 0.0) -> None:
        self.q, self.window, self.stalls, self.floor = q, window, stalls, floor
        self.ring: deque[float] = deque()
        self.sorted: list[float] = []
        self.every: deque[float] = deque()  # the last ``window`` values, stalls included (see planned)
        self.every_sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.ring)

    def push(self, value: float) -> float:
        """Add ``value`` (the oldest leaves a full window) unless it is a stall; return the steady quantile."""
        every, every_sorted = self.every, self.every_sorted
        if len(every) == self.window:
            del every_sorted[bisect.bisect_left(every_sorted, every.popleft())]
        every.append(value)
        bisect.insort(every_sorted, value)
        ring, srt = self.ring, self.sorted
        if len(srt) >= 8:
            median = srt[len(srt) // 2]
            if value > STALL_RATIO * median and value - median > self.floor:
                self.stalls.stall(value - median)
                self.stalls.work(median)
                return self.quantile()
        self.stalls.work(value)
        if len(ring) == self.window:
            del srt[bisect.bisect_left(srt, ring.popleft())]
        ring.append(value)
        bisect.insort(srt, value)
        return self.quantile()

    def planned(self) -> float:
        """The lag to plan for when it comes once an answer: the larger of the steady quantile and the ``q`` quantile
        of every recent value, stalls included - the stall model's allowance for a lag (the smallest ``a`` with
        P(lag > a) <= 1 - q, where every answer meets it): an isolated stall is past the ``q`` quantile of the
        window and changes nothing; stalls on more than ``1 - q`` of the answers (a thread woken 0-15 ms late
        beside busy loops, 2 % of a scheduler's answers late) are planned for while they last in the window. The
        quantile is taken over a full window, the answers not seen yet counted as steady: over fewer than
        ``1 / (1 - q)`` values it was their maximum, and one 1 s hand-out pause 20 frames into a scheduler's life
        cut every frame to one leaf for 89 frames."""
        return sum(self.planned_parts())

    def planned_parts(self) -> tuple[float, float]:
        """:meth:`planned` as (the steady quantile, the stall planned beyond it): the stream scheduler charges the
        second as its plans' one stall rather than subtracting it from every deadline."""
        steady = self.quantile()
        return steady, max(0.0, _nearest_rank(self.every_sorted, self.q, self.window, steady) - steady)

    def median(self) -> float:
        srt = self.sorted
        return srt[len(srt) // 2] if srt else 0.0

    def quantile(self, q: float | None = None) -> float:
        """The ``q`` quantile (default the window's) of the steady values (nearest rank); 0 when empty. Values over
        the stall bar of the median now are left out too: the first 8 entered before there was a median to judge
        them by (a start-up's 4 ms hand-out held every deadline 4 ms early for 128 hand-outs)."""
        srt = self.sorted
        if not srt:
            return 0.0
        median = srt[len(srt) // 2]
        srt = srt[: bisect.bisect_right(srt, max(STALL_RATIO * median, median + self.floor))]
        return _nearest_rank(srt, self.q if q is None else q)


def _nearest_rank(srt: list[float], q: float, size: int = 0, below: float = 0.0) -> float:
    """The ``q`` quantile of the sorted ``srt`` by nearest rank: the smallest value with at least a share ``q`` of
    them at or below it (the one rule for every quantile of this module). Over ``size`` values when more than
    ``srt`` holds: the missing ones lowest, each ``below`` (``srt`` may be empty only then)."""
    n = max(len(srt), size)
    i = min(n - 1, max(0, math.ceil(q * n) - 1)) - (n - len(srt))
    return srt[i] if i >= 0 else below
