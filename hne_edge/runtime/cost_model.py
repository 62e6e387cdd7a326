"""The cost model: how long each anytime step takes on this device, measured and learned online.

A *step* is what the scheduler runs between two stops: one leaf (plans
"segments", "nodes"), a whole subtree (plan "subtrees"), the whole tree
(plan "fused"); a mixed runner has all of them and predicts each, so it can
compare a subtree in one call with the leaves it replaces. Below, "leaf
``i``" reads "step ``i``": for the per-leaf plans they are the same.
**Profiles** (:mod:`.profile_file`: the file format, where it is saved and found). ``AnytimeRunner.profile()``
times every step (and every unit) after warm-up and saves a :class:`Profile`; a new runner loads the one that
matches its bundle and variant, and the model below starts from it.

**Prediction.** Step ``i`` is predicted to cost ``steady[i] * slow * noise + allowance(steady[i] * slow)``, from
the stall model shared by every step and batch size (:mod:`.stalls`: how fast the machine runs now, and how often
and how long it stalls - a stall is an event, never a cost):

* ``steady[i]`` is the step's cost at full speed (from the profile, then the lower quartile of its calls that were
  not stalls, tracked online: each moves it by at most ``alpha``, 0.05, x itself); ``slow`` is the machine's
  current slowdown, the lower quartile of the last 64 calls' ratios over their steady costs, pooled over every
  step: contention or a throttled clock moves it within 49 calls for every step at once (steps the budget has not
  let run since included), its end within 16; stalls cannot move it unless three calls in four stall.
  ``base[i] = steady[i] * slow * mid`` is the step's median at the current speed (``mid``: the median of the
  recent non-stall ratios over ``slow``): what the stream scheduler adds up and :meth:`CostModel.median_step` says.
* ``noise``: the ``quantile`` (default 0.99) of the recent calls' ratios over their base that were not stalls
  (the last ``window``, 128, pooled): the spread a budget must fit on a quiet machine (1.0-2x on a CPU).
* ``allowance``: a call more than ``STALL_RATIO`` (3) times its base is a stall, its excess a stall's size. The
  allowance is the smallest slack that keeps the chance of a stall longer than it, striking a call of this
  step's length, within ``1 - quantile`` (the miss rate promised): 0 while stalls are isolated (fewer than two
  in 1.5 s, decayed) or rare enough for this step's length.
* Re-probe: a step not run for ``probe_after`` (500) frames whose base is over twice its own fastest recent time
  (it learned a slow spell of its own) is predicted at that fastest time until it runs once; that time then
  replaces what it had learned. At most one risky start per such step per 500 frames; steps that are merely
  rarely reached are not probed.

**A step's own cost change** is told from stalls by the run it makes: its calls stall ``k`` times in a row, each
within 1.5x of the others, where ``k`` makes such a run improbable (1 in 1,000) at the chance that a call of its
length stalls lately (2 on a quiet machine, 5 when one call in four stalls; at least as many as one in four would
take while other steps stall meanwhile); it is then learned (:meth:`_BatchModel._relearn`, with a warning when a
profile's entry goes) and re-probed after 16 frames without a run, twice as long each time it proves as slow. A
call far *faster* than its base (a third) is proof at once: a stall only adds time.

Why a stall model and not a quantile of every ratio: a stall strikes whatever runs, and predicting one in full
for every step stops every leaf but the forced first one from starting (issue 15), while capping the ratios (16x,
the model before issue 39) still let two stalls in 128 calls raise every prediction 16-fold: an H200 stream
scheduler learned `step 0: 1.34 s` (1,870 times its entry) from one CUDA graph capture and rejected 85 % of the
frames one FIFO runner served; a right profile entry whose first run met a 40 ms stall was learned at 41 ms.
Why 0.99: measured on hne_resnet_small (benchmarks/bench_runtime.py, budgets uniform over the anytime range,
1000 frames), p95 gave 1.6-1.9% misses with 95-98% of an oracle's leaves; p99 gave 0.5% misses at batch 1 with
92-96% of the oracle's leaves, meeting both targets (<= 1%, >= 90%).

**Batch sizes** (:func:`profile_at_batch`, the batch rule): a profile predicts a batch size only from the
sizes it measured (``AnytimeRunner.profile()`` measures the bundle's min and opt by default): their medians,
interpolated between them, their measured slope beyond them, and nothing from one measured size alone (that
batch size is then learned online, as without a profile). A CPU's cost grows about linearly with batch, a
launch-bound GPU's is about flat (an H200: 1.24 ms at batch 1, 1.43 ms at 16); assuming either is wrong on the
other by 10x or more.

**A run's own work before its first step** (the input check, the image's upload: a synchronous copy of ~0.07 ms
on an H200) is in a ``run()``'s budget but in no step. :attr:`_BatchModel.entry` is the ``quantile`` of the last
``window`` of them that were not stalls (:class:`~.stalls.SteadyWindow`), and the forced first step is judged with
it (whether an overrun was forced). The next steps need no such term: each is decided at the time it would start.

**A run's own work after its last step** (the session's wrap-up; until 2026-11-29 that step's cost-model update
too) is in the budget, and in no step: the last decision is taken before it. Left out, a frame whose last step ended
inside its budget missed it anyway: a virtual-clock replay of the second H200 run's recorded steps (mixed, batch 1)
charging each update 60 us after the last step misses 3.6-4.9% of budgets, as that run's 6.0% (whose host, at load 57
on 16 CPUs, also ran its frames 1.2x slower than their profile). :attr:`_BatchModel.exit` is the ``quantile`` of the
last ``window`` of them; a step starts only when it and that work after it fit (:mod:`.session`), and a forced
overrun is judged with it too.

**Updates off the deadline.** A step's update (:meth:`_BatchModel.observe`) is made once the next step's calls are
issued (:mod:`.session`): on a GPU, whose calls return once queued, it overlaps that step's device time; on a CPU it
is in that step's measured time, so in its prediction. A ``run()``'s last step is kept (:meth:`CostModel.defer`) and
made once the next frame's first step is issued, or when the model is read (:meth:`CostModel.for_batch`): not after
the frame's answer is ready, where it was work in the exit. A profile's first measurements (its audit) and a step's
first are learned at once: they decide what the next decision predicts. Replayed on the H200's traces, the two took
`mixed` from 0.57 / 0.67 to 0.72 / 0.93 of the plan-achievable oracle's leaves (batch 1 / 16; BENCHMARKS.md).

Queries: :meth:`CostModel.predict_step` (what a step is predicted to cost at a batch size: what a budget must
fit) and :meth:`CostModel.median_step` (its median estimate: what speeds are compared by).

**A profile that does not describe this machine** (hand-edited, or made on another one) is dropped with
a warning once the first ``AUDIT_SAMPLES`` (8) leaf times are in: when their median ratio to the
profile is outside [1/10, 10], the model forgets the profile and starts over from those measurements, as
without one. Bounded influence would otherwise unlearn it 5% per observation: a profile 1e300 times too
fast made 263 of 300 frames miss their budget. Within a factor of 10 the profile is kept and refined.

**One entry that does not describe this machine** (one step's median hand-edited 2000 times too slow, which
a budget then never lets run, so it was never measured again and every budgeted frame stopped before it)
is caught three ways (issue 29), each with a warning:

* on load (:func:`entries_unlike_their_peers`): steps that add the same MACs (leaves at the same depth of
  the tree) cost alike, so an entry more than ``PROFILE_TOLERANCE`` (10) times off the median of at least
  two such peers is replaced by that median until the step is measured here;
* on its first measurement here once the whole profile passed its audit (:meth:`_BatchModel._check_entry`):
  an entry more than 10 times above what is measured is learned afresh from the measurement (not unlearned
  5% per observation); one far below is a stall until the step's next runs say it is its cost (above);
* a step the budget has kept from running for ``probe_after`` frames, never measured here, whose entry is
  over twice what its peers (or, alone at its depth, its MACs at the other steps' speed) say, is re-probed
  at that estimate once (:meth:`_BatchModel._peer_estimate`).

**Without a profile** no frame is spent measuring: the first leaf is always
evaluated (``min_leaves >= 1``), so its time calibrates seconds-per-MAC and
unseen leaves are predicted from the manifest's MACs; each leaf's own time
replaces that estimate once observed. Until 8 observations exist the noise
is at least ``cold_margin`` (1.5). Before any observation the prediction is
infinite: a budgeted first frame evaluates only the forced leaves.
"""

from __future__ import annotations

import bisect
import math
import numbers
import time
import warnings
from collections import deque
from typing import Callable, Collection, Sequence

from ..errors import InputError, short_repr
from .stalls import STALL_FLOOR_S, STALL_RATIO, Speed, Stalls, SteadyWindow
from .profile_file import (  # noqa: F401 - the profile's names, importable from here as before
    Profile,
    ProfileError,
    cache_profile_path,
    find_profile,
    host_info,
    profile_filename,
    read_profile,
    save_profile,
    summarize,
    user_cache_dir,
)

__all__ = [
    "entries_unlike_their_peers",
    "Profile",
    "ProfileError",
    "read_profile",
    "CostModel",
    "profile_filename",
    "user_cache_dir",
    "save_profile",
    "find_profile",
    "summarize",
    "profile_at_batch",
    "profile_measures",
]

_INF = math.inf
MIN_LEAF_SECONDS = 1e-9  # a coarse or virtual clock may time a fast leaf at 0 s: later ratios divide by it
PROBE_SOON = 16  # frames after which a step relearned from stalls in a row is re-probed (doubling while as slow)
AUDIT_SAMPLES = 8  # a profile's first measurements here, whose median ratio decides whether it is kept
PROFILE_TOLERANCE = 10.0  # a profile off by more than this factor (either way) is dropped, not slowly unlearned


def entries_unlike_their_peers(base: Sequence[float], macs: Sequence[int],
                               tolerance: float = PROFILE_TOLERANCE) -> dict[int, float]:  # fmt: skip
    """Steps whose entry is more than ``tolerance`` times off the median of the other steps that add the same MACs
    (the same depth of the tree: they cost alike), where there are at least two such: ``{step: that median}``."""
    peers: dict[int, list[int]] = {}
    for i, m in enumerate(macs):
        peers.setdefault(m, []).append(i)
    doubtful = {}
    for i, b in enumerate(base):
        others = sorted(base[j] for j in peers[macs[i]] if j != i)
        if len(others) >= 2:
            median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
            if not median / tolerance <= b <= median * tolerance:
                doubtful[i] = median
    return doubtful


def _warn_doubtful(doubtful: dict[int, float], base: Sequence[float], name: str, batch: int) -> None:
    shown = "; ".join(f"step {i}: {base[i] * 1e3:.3g} ms, its peers {m * 1e3:.3g} ms" for i, m in sorted(doubtful.items())[:4])
    warnings.warn(
        f"{name} (batch {batch}): {len(doubtful)} entr{'y' if len(doubtful) == 1 else 'ies'} more than "
        f"{PROFILE_TOLERANCE:g} times off the steps that add the same MACs ({shown}); predicted as their peers until "
        "measured here (run `hne-edge profile` again on this machine)", stacklevel=3,
    )  # fmt: skip


class _BatchModel:
    """Predictions and online updates for one batch size. Hot path: ``observe`` (a few us) and ``pred``.

    ``steady[i]``: step ``i``'s steady cost at full speed (``speed.slow == 1``), the lower quartile of its calls that
    were not stalls (the speed is the pooled ratios' lower quartile: the same statistic, so the two never drift
    apart); ``base[i] = steady * slow * mid``: its median at the current speed (what the scheduler adds up and
    ``choose`` compares by). ``base`` and ``pred`` are updated in place (the session and the scheduler hold
    references to them): ``pred = steady * slow * noise + allowance``.
    The speed, the noise and the stalls are the cost model's, shared by every batch size (:mod:`.stalls`).
    """

    def __init__(
        self,
        macs: Sequence[int],
        base: list[float] | None,
        seed_ratios: Sequence[float],
        cm: "CostModel",
        seed_times: Sequence[Sequence[float]] | None = None,
    ) -> None:
        n = len(macs)
        self.n = n
        self.cm = cm
        self.speed, self.stalls = cm.speed, cm.stalls
        # a profile's first AUDIT_SAMPLES measurements here decide whether it describes this machine at all; until
        # then they wait (the profile predicts), then they are learned in order
        self.audit: list[tuple[int, float, float]] | None = [] if base is not None else None
        self.macs = [float(m) for m in macs]
        self.known = [base is not None] * n
        self.unknown = [] if base is not None else list(range(n))  # predicted from MACs until observed
        self.steady = list(base) if base is not None else [0.0] * n
        self.base = list(self.steady)  # (times the speed: set by _refresh)
        self.q = cm.quantile
        self.miss_rate = 1.0 - cm.quantile  # what the stall allowance is sized to
        self.alpha = cm.alpha
        self.pred: list[float] = [math.inf] * n
        self.seen_t = 0.0  # sum of base over known steps, and their MACs: seconds per MAC for unknown steps
        self.seen_m = 0.0
        self.times: list[deque[float]] = [deque(maxlen=cm.tail_window) for _ in range(n)]  # each step's own times
        self.slow_runs: list[list[tuple]] = [[] for _ in range(n)]  # its stalls in a row: (time, size, serial)
        self.relearned = [False] * n  # its base was learned here in place of a profile entry
        self.unconfirmed: dict[int, str] = {}  # a relearned entry's warning, said once its next call confirms it
        self.frames = 0  # observations of step 0 (one per frame), and that count when step i was last observed
        self.seen = [0] * n
        self.probe_after = cm.probe_after
        self.probe_in = [cm.probe_after] * n  # frames without a run after which step i is re-probed
        self.probing = [False] * n
        # a profile's entries as loaded (what the audit compares with) and those not yet measured here (each is
        # checked against its first measurement: _check_entry, whose warnings wait for the audit's verdict)
        self.loaded = list(self.steady)
        self.unchecked: list[bool] | None = [True] * n if base is not None else None
        self.entry_warnings: list[str] = []
        self.peers = [[j for j in range(n) if j != i and self.macs[j] == self.macs[i]] for i in range(n)]
        # a run()'s own work before its first step (input check, the image's upload) and after its last one (that
        # step's update here, the wrap-up): in the budget, in no step; their steady quantiles (seconds; 0 until observed)
        self.entry = self.exit = 0.0
        # (a stall only when 0.2 ms over their median too: a median of 0 - a virtual clock's, or the first runs' - made
        # every later 30 us exit a stall, 639 of them, and the allowance held a GPU trace's frames at one leaf)
        self.entries = SteadyWindow(self.q, cm.window, self.stalls, STALL_FLOOR_S)
        self.exits = SteadyWindow(self.q, cm.window, self.stalls, STALL_FLOOR_S)
        if seed_ratios and not cm.seeded:
            cm.seeded = True
            self.speed.seed(list(seed_ratios)[-cm.window :])
        for i, ts in enumerate(seed_times or ()):
            self.times[i].extend(float(t) for t in ts)
        self._synced = (-1, -1)
        self._refreshed_at = -math.inf
        self._refresh()

    # -- the run's own work ------------------------------------------------------------------------------------
    def observe_entry(self, seconds: float) -> None:
        """A run()'s time from its call to its first step (input check, upload): :attr:`entry` becomes the
        ``quantile`` of the recent ones that were not stalls. The forced first step is judged with it: on a GPU the
        upload is a synchronous copy of ~0.05 ms, as much as a budget near the first leaf has to spare (measured in
        virtual-clock replays: 2% misses at 0.05 ms when ignored)."""
        self.entry = self.entries.push(seconds)

    def observe_exit(self, seconds: float) -> None:
        """A run()'s time from the end of its last step to its end (that step's :meth:`observe`, the session's
        wrap-up): :attr:`exit` becomes the steady quantile of them. Every start decision leaves room for it (the
        step started may be the frame's last)."""
        self.exit = self.exits.push(seconds)

    # -- a step's time -----------------------------------------------------------------------------------------
    def observe(self, leaf: int, seconds: float) -> None:
        if self.audit is not None:
            self._audit(leaf, seconds)
            return
        if self.unchecked is not None and self.unchecked[leaf]:
            self._check_entry(leaf, seconds)  # an entry 10x above is learned afresh below, as a first observation
        seconds = max(seconds, MIN_LEAF_SECONDS)
        speed = self.speed
        slow = speed.slow
        if not self.known[leaf]:  # its first measurement: learned at once
            self.known[leaf] = True
            self.unknown.remove(leaf)
            self.steady[leaf] = base = seconds / slow
            self.seen_t += base
            self.seen_m += self.macs[leaf]
            self.stalls.work(seconds)
        elif self.probing[leaf]:  # a re-probe: learned afresh, unless it is as slow as what it had learned
            self.probing[leaf] = False
            base, new = self.steady[leaf], seconds / slow
            if new * STALL_RATIO < base:  # its base was stalls (or a slow spell of its own)
                self.steady[leaf] = new
                self.seen_t += new - base
                self.times[leaf].clear()
                self.probe_in[leaf] = self.probe_after
            else:  # it is that slow: probed again after twice as long
                self.probe_in[leaf] = min(2 * self.probe_in[leaf], self.probe_after)
            self.stalls.work(seconds)
        else:
            base = self.steady[leaf]
            u, stalled = speed.split(seconds, base)
            runs = self.slow_runs[leaf]
            if stalled:
                runs.append((seconds / slow, seconds - base * slow, speed.serial))
                shared = runs[-1][2] - runs[0][2] >= len(runs)  # other steps stalled since this run of them began
                need = speed.improbable_run(base * slow, shared)
                if len(runs) >= need:
                    last = runs[-need:]
                    times = sorted(t for t, _, _ in last)
                    if times[-1] <= 1.5 * times[0] and speed.steady():  # as slow each time: its cost, not stalls
                        self._relearn(leaf, times[len(times) // 2], [z for _, z, _ in last], need)
                    del runs[: len(runs) - need + 1]
            elif u * STALL_RATIO < 1.0 and speed.steady():  # far faster than its base, alone: a stall only adds
                runs.clear()  # time, so its base was wrong (learned from stalls in a row that were not its cost)
                self.seen_t += seconds / slow - base
                self.steady[leaf] = seconds / slow
                self.unconfirmed.pop(leaf, None)
            else:
                if runs:
                    runs.clear()
                if self.unconfirmed:  # its relearned cost held on its next call: now it is worth saying
                    message = self.unconfirmed.pop(leaf, None)
                    if message is not None:
                        self.entry_warnings.append(message)
                        self._flush_entry_warnings()
                # its lower quartile, tracked (Robbins-Monro): down 3/4 alpha below it, up 1/4 alpha above - bounded
                # influence (one observation moves it by 3.75 % at most) and no drift against the speed's quartile
                if abs(u - 1.0) > 1e-9:  # (a tie moves nothing: a deterministic cost stays exact)
                    delta = self.alpha * base * (-0.75 if u < 1.0 else 0.25)
                    self.steady[leaf] = base + delta
                    self.seen_t += delta
        self.times[leaf].append(seconds)
        if leaf == 0:
            self.frames += 1
            if not self.frames % 16:  # every 16 frames: look for steps to re-probe
                self.seen[0] = self.frames
                self._refresh()
                return
        self.seen[leaf] = self.frames
        if not self.sync():  # nothing shared moved: only this step's prediction did (and, early on, the unknown
            if self.unknown:  # steps', predicted at the known ones' seconds per MAC)
                self._refresh()
            else:
                self.base[leaf] = self.steady[leaf] * self.speed.slow * self.speed.mid
                self.pred[leaf] = self._predict(leaf, self._rate)

    def _relearn(self, leaf: int, seconds: float, sizes: list[float], runs: int) -> None:
        """Step ``leaf`` took about ``seconds`` (at full speed) in ``runs`` calls in a row, each a stall by its base:
        improbable as stalls at the rate they strike every step (:meth:`~.stalls.Speed.improbable_run`), so its cost.
        Those stalls are forgotten; a profile's entry replaced so is said (as :meth:`_check_entry` says a fast one)."""
        base = self.steady[leaf]
        self.steady[leaf] = seconds
        self.seen_t += seconds - base
        self.stalls.forget(sizes)
        # stalls in a row that only looked like its cost (a burst's first ones) would keep it from ever running
        # again: kept from running, it is re-probed soon (16 frames), then after twice as long each time it is as slow
        self.probe_in[leaf] = min(PROBE_SOON, self.probe_after)
        # a batch the profile does not hold has no entries (0.0): nothing its measurement could be said to differ from
        if self.cm.profile is not None and self.loaded[leaf] > 0 and not self.relearned[leaf]:
            slow = self.speed.slow  # the measurement and the entry at the machine's pace now, as _check_entry's
            entry = self.loaded[leaf] * slow
            ratio = seconds * slow / entry
            than = f"{ratio:.3g} times slower" if ratio >= 1 else f"{1 / ratio:.3g} times faster"
            name = self.cm.profile.label
            self.unconfirmed[leaf] = (  # said once the step's next call confirms it (not a burst's first stalls)
                f"{name}: step {leaf} measured {seconds * slow * 1e3:.3g} ms here {runs} times in a row, {than} than "
                f"its entry ({entry * 1e3:.3g} ms); learns it from measurements (run `hne-edge profile` again on this "
                "machine)"
            )  # fmt: skip
        self.relearned[leaf] = True

    def _check_entry(self, leaf: int, seconds: float) -> None:
        """The first measurement here of a profile's step: an entry more than PROFILE_TOLERANCE times above it (a
        stall only adds time: a measurement far *faster* is proof) is forgotten - the step becomes unknown, so
        :meth:`observe` learns it from this measurement - with a warning. A measurement far slower is a stall until
        the step's next runs say otherwise (:meth:`_relearn`): a right entry whose first run met a 40 ms stall was
        learned at 41 ms, and budgets stopped frames before it until a re-probe."""
        self.unchecked[leaf] = False
        if not any(self.unchecked):
            self.unchecked = None  # every entry measured: off the hot path
        entry = self.steady[leaf] * self.speed.slow
        ratio = max(seconds, MIN_LEAF_SECONDS) / entry
        if ratio >= 1 / PROFILE_TOLERANCE:
            return
        self.known[leaf], self.probing[leaf] = False, False
        self.unknown.append(leaf)
        self.seen_t -= self.steady[leaf] if self.seen_m > 0 else 0.0
        self.times[leaf].clear()  # the profile's samples of it too
        self.relearned[leaf] = True
        name = self.cm.profile.label if self.cm.profile is not None else "the profile"
        self.entry_warnings.append(
            f"{name}: step {leaf} measured {seconds * 1e3:.3g} ms here, {1 / ratio:.3g} times "
            f"faster than its entry ({entry * 1e3:.3g} ms); learns it from measurements "
            "(run `hne-edge profile` again on this machine)"
        )  # fmt: skip
        self._flush_entry_warnings()

    def _flush_entry_warnings(self) -> None:
        for message in self.entry_warnings:
            warnings.warn(message, stacklevel=5)
        self.entry_warnings.clear()

    def _peer_estimate(self, i: int) -> float:
        """What step ``i`` should cost by the others: the median base of the steps that add the same MACs, or, alone
        at its depth, its MACs at the median speed (seconds per MAC) of the other known steps; inf when neither."""
        base, known = self.steady, self.known
        peers = sorted(base[j] for j in self.peers[i] if known[j])
        if peers:
            return peers[len(peers) // 2]
        speeds = sorted(base[j] / self.macs[j] for j in range(self.n) if j != i and known[j] and self.macs[j] > 0)
        return self.macs[i] * speeds[len(speeds) // 2] if speeds and self.macs[i] > 0 else _INF

    def _audit(self, leaf: int, seconds: float) -> None:
        """Check the profile against the first measurements; drop it when it is off by PROFILE_TOLERANCE.

        One observation moves a base by at most ``alpha`` (5%), so a profile off by a factor of 1e300
        would take thousands of frames to unlearn, each one missing its budget. The median of the first
        AUDIT_SAMPLES ratios (robust to a stall or two) is compared instead; within the tolerance the
        profile stays and the measurements are learned as usual, in order.
        """
        audit = self.audit
        audit.append((leaf, seconds, max(seconds, MIN_LEAF_SECONDS) / (self.loaded[leaf] * self.speed.slow)))
        if len(audit) < AUDIT_SAMPLES:
            return
        self.audit = None
        ratio = sorted(r for _, _, r in audit)[len(audit) // 2]
        if not 1 / PROFILE_TOLERANCE <= ratio <= PROFILE_TOLERANCE:
            pred, base = self.pred, self.base  # the session and the scheduler hold these lists: keep them, refill them
            self.__init__(self.macs, None, (), self.cm)
            pred[:], base[:] = self.pred, self.base
            self.pred, self.base = pred, base
            name = self.cm.profile.label if self.cm.profile is not None else "the profile"
            warnings.warn(
                f"{name} predicts {max(ratio, 1 / ratio):.3g} times {'faster' if ratio > 1 else 'slower'} "
                f"than the first {len(audit)} measurements here; dropped it and learns from measurements (run "
                "`hne-edge profile` again on this machine)", stacklevel=3,
            )  # fmt: skip
        for i, t, _ in audit:
            self.observe(i, t)

    # -- predictions --------------------------------------------------------------------------------------------
    def _predict(self, i: int, rate: float) -> float:
        """Step ``i``'s prediction: its steady cost at the current speed times the noise, plus the stall allowance."""
        steady = (self.steady[i] if self.known[i] else self.macs[i] * self._per_mac) * self.speed.slow
        if not steady < _INF:
            return _INF
        return steady * self.speed.noise + (self.stalls.allowance_at(rate, steady, self.miss_rate) if rate else 0.0)

    def allowance(self, seconds: float) -> float:
        """The stall allowance of ``seconds`` of calls at their medians (a sequence: the stream scheduler's plans),
        at the stall rate of the last refresh."""
        return self.stalls.allowance_at(self._rate, seconds, self.miss_rate) if self._rate else 0.0

    def sync(self) -> bool:
        """Refresh every prediction if the shared speed, noise or stalls moved since they were made (and, while
        stalls are not isolated, every ``HORIZON_S / 16`` of the clock: their rate decays); True if it did."""
        key = (self.speed.version, self.stalls.version)
        if key == self._synced:
            if self.stalls.settled() and not self._rate:  # quiet, and so were the predictions
                return False
            now = self.stalls.clock()
            if now - self._refreshed_at < self.stalls.horizon_s / 16:
                return False
        self._refresh()
        return True

    def _refresh(self) -> None:
        stalls, speed = self.stalls, self.speed
        self._synced = (speed.version, stalls.version)
        self._refreshed_at = stalls.clock()
        self._rate = rate = stalls.rate()
        self._per_mac = self.seen_t / self.seen_m if self.seen_m > 0 else math.inf
        slow = speed.slow
        base, known, seen, pred = self.steady, self.known, self.seen, self.pred
        now, mid = self.base, speed.mid
        for i in range(self.n):
            now[i] = base[i] * slow * mid
        frames, probe_in = self.frames, self.probe_in
        for i in range(self.n):
            p = self._predict(i, rate)
            if known[i] and seen[i] < frames - probe_in[i]:
                if self.unchecked is not None and self.unchecked[i]:
                    estimate = self._peer_estimate(i)  # kept from running for long, never measured here, and its
                    if base[i] > 2 * estimate:  # entry says far more than its peers: re-probe at what they say
                        p = min(p, estimate * slow)
                        self.probing[i] = True
                elif self.times[i]:
                    fastest = min(self.times[i])
                    if base[i] * slow > 2 * fastest:  # untested for long, and it learned a slow spell: re-probe at its best
                        p = min(p, fastest)
                        self.probing[i] = True
            pred[i] = p


def check_quantile(quantile: object) -> float:
    """The prediction quantile, a real number in [0.5, 1): the runner checks it before it opens a session."""
    if isinstance(quantile, bool) or not isinstance(quantile, numbers.Real) or not 0.5 <= quantile < 1.0:
        raise InputError(f"quantile: received {short_repr(quantile)}; expected a number in [0.5, 1)")
    return float(quantile)


class CostModel:
    """Per-step cost predictions (seconds) for each batch size, from a profile and online observations.

    Args:
        step_macs: MACs each step adds (per sample), from the manifest (for plans "segments" and "nodes":
            each leaf's).
        profile: a matching saved :class:`Profile`, or None.
        quantile: the noise quantile predictions fit, and ``1 - quantile`` the miss rate the stall allowance is
            sized to (see the module docstring).
        window: how many recent non-stall observations the noise is the quantile of.
        alpha: the most one observation moves a step's steady cost, as a share of it.
        min_samples, cold_margin: until ``min_samples`` observations the noise is at least ``cold_margin``.
        tail_window: how many of a step's own recent times are kept (its fastest: the re-probe; its p90: whether
            a miss was forced).
        probe_after: frames after which a leaf the budget kept from running is re-probed.
        path: the steps that make up the whole tree once (default: every step); a mixed runner's
            bigger steps are alternatives to some of them.
        clock: the clock the stall rate decays by (the backend's).
        measured_here: the profile's batch sizes this process measured (``AnytimeRunner.profile``): their entries
            need no audit against the first measurements (a profile loaded or given does).
    """

    def __init__(
        self,
        step_macs: Sequence[int],
        profile: Profile | None = None,
        quantile: float = 0.99,
        window: int = 128,
        alpha: float = 0.05,
        min_samples: int = 8,
        cold_margin: float = 1.5,
        tail_window: int = 256,
        probe_after: int = 500,
        path: Sequence[int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        measured_here: Collection[int] = (),
    ) -> None:
        quantile = check_quantile(quantile)
        if not 1.0 <= cold_margin <= STALL_RATIO:
            raise InputError(f"cold_margin must be in [1, {STALL_RATIO:g}]; received {cold_margin!r}")
        self.step_macs = list(step_macs)
        self.path = None if path is None else tuple(path)
        self.profile = profile
        self.measured_here = frozenset(measured_here)  # its batch sizes measured in this process: no audit
        self.quantile = quantile
        self.window = window
        self.alpha = alpha
        self.min_samples = min_samples
        self.cold_margin = cold_margin
        self.tail_window = tail_window
        self.probe_after = probe_after
        self.stalls = Stalls(clock)
        self.speed = Speed(quantile, self.stalls, min_samples, cold_margin, window)
        self.seeded = False  # the noise seeded from a profile's samples (once, by the first batch size built)
        self._models: dict[int, _BatchModel] = {}
        self.deferred: tuple[Callable[[int, float], None], int, float] | None = None  # (see defer)

    def defer(self, observe: Callable[[int, float], None], step: int, seconds: float) -> None:
        """Keep a run()'s last observation (``observe(step, seconds)``) until the next frame's first step is issued
        (:meth:`session_model`'s sessions make it then) or the model is read (:meth:`for_batch`): it is then off that
        frame's deadline, and on a GPU it overlaps the next frame's device work."""
        self.flush()
        self.deferred = (observe, step, seconds)

    def flush(self) -> None:
        """Make the observation :meth:`defer` kept, if any."""
        if self.deferred is not None:
            observe, step, seconds = self.deferred
            self.deferred = None
            observe(step, seconds)

    def for_batch(self, batch: int) -> _BatchModel:
        """The model of ``batch``, every observation made."""
        self.flush()
        return self.session_model(batch)

    def session_model(self, batch: int) -> _BatchModel:
        """The model a frame's session feeds: :meth:`for_batch` without making the deferred observation (the
        session makes it once its first step is issued)."""
        model = self._models.get(batch)
        if model is None:
            model = self._models[batch] = self._new_model(batch)
        else:
            model.sync()
        return model

    def predict(self, batch: int) -> list[float]:
        """Current predicted seconds per step at ``batch`` (a copy): what a budget must fit."""
        return list(self.for_batch(batch).pred)

    def predict_step(self, step: int, batch: int) -> float:
        """What step ``step`` (an index of the runner's ``steps``) is predicted to cost at ``batch``, in seconds:
        the quantile prediction a budget must fit (infinite while nothing measured says). The query a
        scheduler asks of a unit before starting it."""
        return self.for_batch(batch).pred[step]

    def median_step(self, step: int, batch: int) -> float:
        """Step ``step``'s current steady cost at ``batch`` (seconds, at the machine's current speed; 0 while
        unmeasured): what speeds are compared by. Its ``base``, which carries the speed already."""
        model = self.for_batch(batch)
        return model.base[step] if model.known[step] else 0.0

    def _new_model(self, batch: int) -> _BatchModel:
        at = profile_at_batch(self.profile, batch)
        if at is None or len(at[0]) != len(self.step_macs):
            return _BatchModel(self.step_macs, None, (), self)
        base, nearest = at
        leaves = self.profile.batches[nearest]["leaves"]
        # the steady cost is a lower quartile (see _BatchModel): each entry's median times its samples' quartile over
        # their median (1 without samples); the noise seeds are the samples over that quartile
        # (within [0.5, 1]: an entry whose samples disagree with its median is the peers' check's to judge, below)
        low = [min(1.0, max(0.5, _lower_quartile(leaf.get("samples_ms", ()), leaf["median_ms"]) / leaf["median_ms"]))
               for leaf in leaves]  # fmt: skip
        base = [max(b * f, MIN_LEAF_SECONDS) for b, f in zip(base, low)]  # medians of 1e-320 ms underflow to 0 s
        seeds = []
        reps = min(len(leaf.get("samples_ms", ())) for leaf in leaves)
        for r in range(reps):  # interleave leaves so the window keeps every leaf
            for leaf, f in zip(leaves, low):
                seeds.append(leaf["samples_ms"][r] / (leaf["median_ms"] * f))
        scale = [b / (leaf["median_ms"] / 1e3) for b, leaf in zip(base, leaves)]  # samples at this batch size
        times = [[t / 1e3 * k for t in leaf.get("samples_ms", ())] for leaf, k in zip(leaves, scale)]
        doubtful = entries_unlike_their_peers(base, self.step_macs)
        if doubtful:  # predicted as their peers, their own samples (and ratios) left out
            _warn_doubtful(doubtful, base, self.profile.label, batch)
            base = [doubtful.get(i, b) for i, b in enumerate(base)]
            times = [[] if i in doubtful else ts for i, ts in enumerate(times)]
            seeds = [r for k, r in enumerate(seeds) if k % len(leaves) not in doubtful]
        model = _BatchModel(self.step_macs, base, seeds, self, times)
        if nearest in self.measured_here:  # measured on this machine, now: the audit's question is answered
            model.audit = None
        return model


def _lower_quartile(samples: Sequence[float], default: float) -> float:
    """The lower quartile of a profile entry's samples (``default``, its median, with fewer than 4 or a zero)."""
    srt = sorted(samples)
    q = srt[(len(srt) - 1) // 4] if len(srt) >= 4 else default
    return q if q > 0 else default


def profile_at_batch(profile: Profile | None, batch: int) -> tuple[list[float], int] | None:
    """The batch rule: a profile's step medians (seconds) at ``batch``, from what was measured only, and the
    measured batch size whose samples seed the tails; None when nothing measured says (the cost model then
    learns that batch size online, as without a profile).

    * a profiled batch size: its medians;
    * between two profiled sizes: linear interpolation of each step's median;
    * below the smallest: the smallest's (fixed costs dominate a small batch);
    * above the largest: each step's measured slope between the two largest sizes, never below flat. On a
      launch-bound GPU that slope is about 0 (H200: the fused tree costs 1.24 ms at batch 1, 1.43 ms at 16);
      on a CPU it is about linear. With one profiled size nothing says how cost grows with batch: None,
      rather than assume a CPU's linear slope (a batch-1 profile predicted batch 16 "41x slower" than an H200
      measured, and was dropped) or a GPU's flat one (which under-predicts a CPU 10-fold).

    ``AnytimeRunner.profile()`` measures the bundle's min and opt batch sizes by default, so a profile has two.
    """
    if profile is None or not profile.batches:
        return None
    sizes = sorted(profile.batches)
    lower = [b for b in sizes if b <= batch]
    upper = [b for b in sizes if b >= batch]
    if lower and upper:
        b0, b1 = lower[-1], upper[0]
        m0, m1 = profile.leaf_medians_s(b0), profile.leaf_medians_s(b1)
        w = 0.0 if b1 == b0 else (batch - b0) / (b1 - b0)
        return [a + w * (c - a) for a, c in zip(m0, m1)], (b0 if w < 0.5 else b1)
    if upper:
        return profile.leaf_medians_s(upper[0]), upper[0]
    if len(sizes) < 2:
        return None
    b0, b1 = sizes[-2], sizes[-1]
    m0, m1 = profile.leaf_medians_s(b0), profile.leaf_medians_s(b1)
    return [c + max(0.0, (c - a) / (b1 - b0)) * (batch - b1) for a, c in zip(m0, m1)], b1


def profile_measures(profile: Profile | None, batch: int) -> bool:
    """Whether ``profile`` predicts ``batch`` from measurements around it: a size it measured, or between two (the
    batch rule's interpolation). Beyond its sizes it extrapolates - a guess a stream scheduler must not plan an
    overload's first calls on: a CPU profile of 1-8 rows predicted a 16-row call at 5.7 ms that took 8.3-14 ms
    (ONNX Runtime, hne_resnet_small; its cost grows faster than linearly there), and every frame of the first
    stacked calls at 300 fps a camera missed until the model had learned it, 20-30 calls later."""
    if profile is None or not profile.batches:
        return False
    return min(profile.batches) <= batch <= max(profile.batches)
