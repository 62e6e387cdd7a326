"""The cost model: how long each anytime step takes on this device, measured and learned online.

A *step* is what the scheduler runs between two stops: one leaf (plans
"segments", "nodes"), a whole subtree (plan "subtrees"), the whole tree
(plan "fused"); a mixed runner has all of them and predicts each, so it can
compare a subtree in one call with the leaves it replaces. Below, "leaf
``i``" reads "step ``i``": for the per-leaf plans they are the same.
**Profiles** (:mod:`.profile_file`: the file format, where it is saved and found). ``AnytimeRunner.profile()``
times every step (and every unit) after warm-up and saves a :class:`Profile`; a new runner loads the one that
matches its bundle and variant, and the model below starts from it.

**Prediction.** Leaf ``i`` is predicted to cost
``min(base[i] * scale, tail[i], full + base[i]) * base[0] / anchor[i]`` where

* ``base[i]`` is the leaf's median (from the profile, then an EWMA of
  observed times, alpha 0.05, so it follows slow drift). Bounded influence:
  one observation moves it by at most ``alpha`` x itself, so a 40 ms stall
  on a 0.05 ms leaf moves it by 5%, not 40x.
* ``scale`` is the ``quantile`` (default 0.99) of the last ``window`` (128)
  observed ``time / base`` ratios, pooled over all leaves (nearest rank,
  kept in a sorted window: an index lookup per observation), each ratio
  capped at ``max_ratio`` (16).
* ``full`` is the whole tree's median (the sum of the bases of the steps of
  the plan's base walk: a mixed runner's alternatives are not added twice):
  no leaf is predicted above the full tree plus itself, so a budget of twice
  the full tree fits every next leaf unless the frame already stalled.
* ``tail[i]`` is the largest of the leaf's own last ``tail_window`` (256)
  times (each capped the same way), once it has ``1 / (1 - quantile)``
  (100) of them: no leaf is predicted above what its own observed tail
  justifies, whatever the other leaves did. (With fewer, the max is below
  the leaf's quantile and would under-predict the rarely run last leaves.)
* ``base[0] / anchor[i]``: ``anchor[i]`` is leaf 0's base when leaf ``i``
  was last observed. Leaf 0 runs in every frame, so a leaf the budget has
  not let run for a while follows the machine's current speed instead of
  keeping what it learned during a slow spell. Applied only outside
  [0.8, 1.25]: within, it is leaf 0's own noise, and following it starts
  rarely run leaves when leaf 0 happened to be fast (measured: +0.6 points
  of misses).
* Re-probe: a leaf not run for ``probe_after`` (500) frames whose base is
  over twice its own fastest recent time (it learned a slow spell of its
  own) is predicted at that fastest time until it runs once; that time then
  replaces what it had learned. At most one risky start per such leaf per
  500 frames; leaves that are merely rarely reached are not probed.

Why a pooled ratio quantile: on a shared CPU the noise is mostly common to
all leaves (other processes, frequency changes), so pooling gives 16x the
samples of a per-leaf quantile and reacts within a few frames; a quantile
(not the mean) is what bounds deadline misses. The scheduler starts a leaf
only if ``now + prediction <= deadline``; a miss needs that leaf to run past
the predicted quantile *and* the slack left to be smaller than the excess.
Why 0.99 and not 0.95: measured on hne_resnet_small (benchmarks/bench_runtime.py,
budgets uniform over the anytime range, 1000 frames), p95 gave 1.6-1.9%
misses with 95-98% of an oracle's leaves; p99 gave 0.5% misses at batch 1
with 92-96% of the oracle's leaves, meeting both targets (<= 1%, >= 90%).

Why the cap: on a loaded machine the process is pre-empted for 4-44 ms at a
time, hundreds of times a 0.05 ms leaf. Such a stall strikes whatever runs;
predicting it in full does not avoid it, it stops every leaf but the forced
first one from starting (issue 15: an uncapped p99 of 500x held a 16-leaf,
0.8 ms tree at one leaf under a 5 ms budget, and, with only leaf 0 left to
observe, never recovered). Capped, the model keeps using a budget a few
times the full tree, forgets a burst of stalls within ``window``
observations (it keeps learning from the leaves that do run), and is the
uncapped quantile under ordinary noise (whose p99 is 1.2-2x). Why 16 and
not 4 or 8: measured side by side on hne_resnet_small at batch 1 and normal
priority on a busy 2-core machine (benchmarks/bench_runtime.py --max-ratios
4,8, benchmarks/results/runtime_load.md), budgets U[first leaf, full tree]:
4 ran 88% of the oracle's leaves with 21% misses, 8 65% / 11%, 16 52% /
6.7%, the uncapped model 31% / 3.1%; under one busy loop per core with a
budget of twice the full tree every cap ran 100% of them, the uncapped
model 26%.

**Batch sizes** (:func:`profile_at_batch`, the batch rule): a profile predicts a batch size only from the
sizes it measured (``AnytimeRunner.profile()`` measures the bundle's min and opt by default): their medians,
interpolated between them, their measured slope beyond them, and nothing from one measured size alone (that
batch size is then learned online, as without a profile). A CPU's cost grows about linearly with batch, a
launch-bound GPU's is about flat (an H200: 1.24 ms at batch 1, 1.43 ms at 16); assuming either is wrong on the
other by 10x or more.

**A run's own work before its first step** (the input check, the image's upload: a synchronous copy of ~0.07 ms
on an H200) is in a ``run()``'s budget but in no step. :attr:`_BatchModel.entry` is the ``quantile`` of the last
``window`` of them, and the forced first step is judged with it (whether an overrun was forced). The next steps
need no such term: each is decided at the time it would start.

**A run's own work after its last step** (that step's cost-model update, :meth:`_BatchModel.observe`, and the
session's wrap-up) is in the budget too, and in no step: the last decision is taken before it. Left out, a frame
whose last step ended inside its budget missed it anyway: a virtual-clock replay of the second H200 run's recorded
steps (mixed, batch 1) charging each update 60 us misses 3.6-4.9% of budgets, as that run's 6.0% (whose host, at
load 57 on 16 CPUs, also ran its frames 1.2x slower than their profile). :attr:`_BatchModel.exit` is the
``quantile`` of the last ``window`` of them; a step starts only when it and that work after it fit
(:mod:`.session`), and a forced overrun is judged with it too. (The update after any other step is in the next
step's measured time, so in its prediction.)

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
  an entry more than 10 times off what is measured is learned afresh from the measurement (not unlearned
  5% per observation);
* a step the budget has kept from running for ``probe_after`` frames, never measured here, whose entry is
  over twice what its peers (or, alone at its depth, its MACs at the other steps' speed) say, is re-probed
  at that estimate once (:meth:`_BatchModel._peer_estimate`).

**Without a profile** no frame is spent measuring: the first leaf is always
evaluated (``min_leaves >= 1``), so its time calibrates seconds-per-MAC and
unseen leaves are predicted from the manifest's MACs; each leaf's own time
replaces that estimate once observed. Until 8 observations exist the scale
is at least ``cold_margin`` (1.5). Before any observation the prediction is
infinite: a budgeted first frame evaluates only the forced leaves.
"""

from __future__ import annotations

import bisect
from collections import deque
import math
import warnings
from typing import Sequence

from ..errors import InputError
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
]

_INF = math.inf
MIN_LEAF_SECONDS = 1e-9  # a coarse or virtual clock may time a fast leaf at 0 s: later ratios divide by it
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


class _RecentQuantile:
    """The ``q`` quantile (nearest rank) of the last ``window`` values pushed: a ring and a sorted copy, so a push is
    a bisect, not a sort (a run's entry and exit times, :class:`_BatchModel`)."""

    __slots__ = ("q", "window", "ring", "sorted")

    def __init__(self, q: float, window: int) -> None:
        self.q, self.window = q, window
        self.ring: deque[float] = deque()
        self.sorted: list[float] = []

    def push(self, value: float) -> float:
        """Add ``value`` (the oldest leaves a full window); return the quantile."""
        ring, srt = self.ring, self.sorted
        if len(ring) == self.window:
            del srt[bisect.bisect_left(srt, ring.popleft())]
        ring.append(value)
        bisect.insort(srt, value)
        return srt[min(len(srt) - 1, math.ceil(self.q * len(srt)) - 1)]


class _BatchModel:
    """Predictions and online updates for one batch size. Hot path: ``observe`` (a few us) and ``pred``.

    The ratio window is a ring (for eviction) plus a sorted list (bisect), so the
    quantile is an index lookup instead of a numpy call per observation.
    ``pred`` is updated in place (the scheduler holds a reference to it).
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
        # a profile's first AUDIT_SAMPLES measurements here decide whether it describes this machine at all
        self.audit: list[tuple[int, float, float]] | None = [] if base is not None else None
        self.macs = [float(m) for m in macs]
        self.path = cm.path if cm.path is not None else tuple(range(n))  # the steps whose sum is the whole tree
        self.known = [base is not None] * n
        self.unknown = [] if base is not None else list(range(n))  # predicted from MACs until observed
        self.base = list(base) if base is not None else [0.0] * n
        self.q = cm.quantile
        self.alpha = cm.alpha
        self.min_samples = cm.min_samples
        self.cold_margin = cm.cold_margin
        self.max_ratio = cm.max_ratio
        self.window = cm.window
        self.tail_window = cm.tail_window
        self.ring: list[float] = []
        self.sorted: list[float] = []
        self.count = 0
        self.pred: list[float] = [math.inf] * n
        self.scale = 1.0
        self.seen_t = 0.0  # sum of base over known leaves, and their MACs: seconds per MAC for unknown leaves
        self.seen_m = 0.0
        # each leaf's own recent times (each capped at max_ratio x its base), and their max: its observed tail
        self.times: list[deque[float]] = [deque() for _ in range(n)]
        self.tail = [math.inf] * n
        self.anchor = [self.base[0]] * n  # leaf 0's base when leaf i was last observed
        self.frames = 0  # observations of leaf 0 (one per frame), and that count when leaf i was last observed
        self.seen = [0] * n
        self.probe_after = cm.probe_after
        self.probing = [False] * n
        # a profile's entries as loaded (what the audit compares with) and those not yet measured here (each is
        # checked against its first measurement: _check_entry, whose warnings wait for the audit's verdict)
        self.loaded = list(self.base)
        self.unchecked: list[bool] | None = [True] * n if base is not None else None
        self.entry_warnings: list[str] = []
        self.peers = [[j for j in range(n) if j != i and self.macs[j] == self.macs[i]] for i in range(n)]
        self.b0_ref = self.base[0]  # leaf 0's base at the last full refresh
        self.full = _INF  # the whole tree's median cost (sum of the bases), once every leaf is known
        # a run()'s own work before its first step (input check, the image's upload) and after its last one (that
        # step's update here, the wrap-up): in the budget, in no step; their predicted quantiles (seconds; 0 until observed)
        self.entry = self.exit = 0.0
        self.entries, self.exits = _RecentQuantile(self.q, self.window), _RecentQuantile(self.q, self.window)
        # the max of n samples estimates about the 1 - 1/n quantile: it bounds a q-quantile prediction
        # only from 1 / (1 - q) samples on (100 for 0.99); fewer would under-predict rarely run leaves
        self.tail_min = max(self.min_samples, math.ceil(1 / (1 - self.q)) if self.q < 1 else 10**9)
        for r in list(seed_ratios)[-cm.window :]:
            self._push(min(float(r), self.max_ratio))
        for i, ts in enumerate(seed_times or ()):
            self.times[i].extend(min(float(t), self.max_ratio * self.base[i]) for t in list(ts)[-self.tail_window :])
            if len(self.times[i]) >= self.tail_min:
                self.tail[i] = max(self.times[i])
        self._refresh()

    def _push(self, ratio: float) -> None:
        ring, srt = self.ring, self.sorted
        if len(ring) == self.window:
            old = ring[self.count % self.window]
            del srt[bisect.bisect_left(srt, old)]
            ring[self.count % self.window] = ratio
        else:
            ring.append(ratio)
        bisect.insort(srt, ratio)
        self.count += 1

    def _quantile(self) -> float:
        srt = self.sorted
        if not srt:
            return 1.0
        scale = srt[min(len(srt) - 1, math.ceil(self.q * len(srt)) - 1)]  # nearest rank
        return max(scale, self.cold_margin) if self.count < self.min_samples else scale

    def observe_entry(self, seconds: float) -> None:
        """A run()'s time from its call to its first step (input check, upload): :attr:`entry` becomes the
        ``quantile`` of the last ``window`` of them (nearest rank). The forced first step is judged with it:
        on a GPU the upload is a synchronous copy of ~0.05 ms, as much as a budget near the first leaf has
        to spare (measured in virtual-clock replays: 2% misses at 0.05 ms when ignored)."""
        self.entry = self.entries.push(seconds)

    def observe_exit(self, seconds: float) -> None:
        """A run()'s time from the end of its last step to its end (that step's :meth:`observe`, the session's
        wrap-up): :attr:`exit` becomes the ``quantile`` of the last ``window`` of them. Every start decision leaves
        room for it (the step started may be the frame's last)."""
        self.exit = self.exits.push(seconds)

    def observe(self, leaf: int, seconds: float) -> None:
        base = self.base[leaf]
        if self.audit is not None and self._audit(leaf, seconds):
            return  # the profile was dropped and these measurements learned afresh
        if self.unchecked is not None and self.unchecked[leaf]:
            self._check_entry(leaf, seconds)  # an entry 10x off is learned afresh below, as a first observation
        if self.known[leaf] and not self.probing[leaf]:  # the hot path
            ratio = seconds / base
            if ratio > self.max_ratio:
                ratio = self.max_ratio
                seconds = ratio * base
            # bounded influence: one observation moves the base by at most alpha x base
            delta = self.alpha * base * ((ratio if ratio < 2.0 else 2.0) - 1.0)
            self.base[leaf] = base = base + delta
            self.seen_t += delta
        elif not self.known[leaf]:
            self.known[leaf] = True
            self.unknown.remove(leaf)
            seconds = max(seconds, MIN_LEAF_SECONDS)
            self.base[leaf] = base = seconds
            self.seen_t += seconds
            self.seen_m += self.macs[leaf]
            ratio = 1.0
        else:  # a re-probe: learn the leaf afresh
            self.probing[leaf] = False
            seconds = max(min(seconds, self.max_ratio * base), MIN_LEAF_SECONDS)
            ratio = seconds / base
            self.seen_t += seconds - base
            self.base[leaf] = base = seconds
            self.times[leaf].clear()
            self.tail[leaf] = math.inf
        # the leaf's own tail: the max of its recent times, kept incrementally
        ts = self.times[leaf]
        top = self.tail[leaf]
        if len(ts) == self.tail_window:
            if ts.popleft() >= top:  # the max left the window (rare)
                ts.append(seconds)
                self.tail[leaf] = top = max(ts)
            else:
                ts.append(seconds)
                if seconds > top:
                    self.tail[leaf] = top = seconds
        else:
            ts.append(seconds)
            if top == _INF:
                if len(ts) >= self.tail_min:
                    self.tail[leaf] = top = max(ts)
            elif seconds > top:
                self.tail[leaf] = top = seconds
        self.anchor[leaf] = self.base[0]
        self._push(ratio)
        scale = self._quantile()
        if leaf == 0:
            self.frames += 1
            moved = abs(base - self.b0_ref) > 0.005 * self.b0_ref  # leaf 0 moved every other leaf's prediction
            if moved or not self.frames % 16:  # and every 16 frames: look for leaves to re-probe
                self.seen[0] = self.frames
                self._refresh()
                return
        self.seen[leaf] = self.frames
        if self.full == _INF or abs(scale - self.scale) > 0.005 * self.scale:  # re-predict every leaf
            self._refresh()
        else:  # only this leaf changed (its anchor is leaf 0's base now: no factor)
            p = min(base * self.scale, top, self.full + base)
            self.pred[leaf] = p
            if self.unknown:  # steps never run yet (a mixed runner's alternatives): seconds per MAC moved
                per_mac = self.seen_t / self.seen_m
                for i in self.unknown:
                    self.pred[i] = self.macs[i] * per_mac * self.scale

    def _check_entry(self, leaf: int, seconds: float) -> None:
        """The first measurement here of a profile's step: an entry more than PROFILE_TOLERANCE times off it is
        forgotten (the step becomes unknown, so :meth:`observe` learns it from this measurement), with a warning."""
        self.unchecked[leaf] = False
        if not any(self.unchecked):
            self.unchecked = None  # every entry measured: off the hot path
        entry = self.base[leaf]
        ratio = max(seconds, MIN_LEAF_SECONDS) / entry
        if 1 / PROFILE_TOLERANCE <= ratio <= PROFILE_TOLERANCE:
            return
        self.known[leaf], self.probing[leaf] = False, False
        self.unknown.append(leaf)
        self.times[leaf].clear()  # the profile's samples of it too
        self.tail[leaf] = math.inf
        self.full = _INF  # every prediction is refreshed with the new base
        if leaf == 0:  # the other steps' anchors were leaf 0's wrong entry: they follow its measurement from now
            self.anchor[:] = [max(seconds, MIN_LEAF_SECONDS)] * self.n
        name = self.cm.profile.label if self.cm.profile is not None else "the profile"
        self.entry_warnings.append(
            f"{name}: step {leaf} measured {seconds * 1e3:.3g} ms here, {max(ratio, 1 / ratio):.3g} times "
            f"{'slower' if ratio > 1 else 'faster'} than its entry ({entry * 1e3:.3g} ms); learns it from measurements "
            "(run `hne-edge profile` again on this machine)"
        )  # fmt: skip
        if self.audit is None:  # else the audit says whether they matter: the whole profile may go instead
            self._flush_entry_warnings()

    def _flush_entry_warnings(self) -> None:
        for message in self.entry_warnings:
            warnings.warn(message, stacklevel=4)
        self.entry_warnings.clear()

    def _peer_estimate(self, i: int) -> float:
        """What step ``i`` should cost by the others: the median base of the steps that add the same MACs, or, alone
        at its depth, its MACs at the median speed (seconds per MAC) of the other known steps; inf when neither."""
        base, known = self.base, self.known
        peers = sorted(base[j] for j in self.peers[i] if known[j])
        if peers:
            return peers[len(peers) // 2]
        speeds = sorted(base[j] / self.macs[j] for j in range(self.n) if j != i and known[j] and self.macs[j] > 0)
        return self.macs[i] * speeds[len(speeds) // 2] if speeds and self.macs[i] > 0 else _INF

    def _audit(self, leaf: int, seconds: float) -> bool:
        """Check the profile against the first measurements; drop it (True) when it is off by PROFILE_TOLERANCE.

        One observation moves a base by at most ``alpha`` (5%), so a profile off by a factor of 1e300
        would take thousands of frames to unlearn, each one missing its budget. The median of the first
        AUDIT_SAMPLES ratios (robust to a stall or two) is compared instead; within the tolerance the
        profile stays and the usual bounded learning takes over.
        """
        audit = self.audit
        audit.append((leaf, seconds, max(seconds, MIN_LEAF_SECONDS) / self.loaded[leaf]))  # vs the profile as loaded
        if len(audit) < AUDIT_SAMPLES:
            return False
        self.audit = None
        ratio = sorted(r for _, _, r in audit)[len(audit) // 2]
        if 1 / PROFILE_TOLERANCE <= ratio <= PROFILE_TOLERANCE:
            self._flush_entry_warnings()  # the profile stays: the entries found off on their own are worth saying
            return False
        pred = self.pred  # the scheduler holds this list: keep it, refill it
        self.__init__(self.macs, None, (), self.cm)
        pred[:] = self.pred
        self.pred = pred
        for i, t, _ in audit:
            self.observe(i, t)
        name = self.cm.profile.label if self.cm.profile is not None else "the profile"
        warnings.warn(
            f"{name} predicts {max(ratio, 1 / ratio):.3g} times {'faster' if ratio > 1 else 'slower'} than "
            f"the first {len(audit)} measurements here; dropped it and learns from measurements (run `hne-edge profile` "
            "again on this machine)", stacklevel=2,
        )  # fmt: skip
        return True

    def _refresh(self) -> None:
        scale = self.scale = self._quantile()
        base, tail, anchor, known, seen = self.base, self.tail, self.anchor, self.known, self.seen
        self.b0_ref = b0 = base[0]
        self.full = full = sum(base[i] for i in self.path) if all(known[i] for i in self.path) else _INF
        per_mac = self.seen_t / self.seen_m if self.seen_m > 0 else math.inf
        pred, stale = self.pred, self.frames - self.probe_after
        for i in range(self.n):
            if not known[i]:
                pred[i] = self.macs[i] * per_mac * scale
                continue
            p = min(base[i] * scale, tail[i], full + base[i])
            if seen[i] < stale and self.unchecked is not None and self.unchecked[i]:
                estimate = self._peer_estimate(i)  # kept from running for long, never measured here, and its
                if base[i] > 2 * estimate:  # entry says far more than its peers: re-probe at what they say
                    p = min(p, estimate)
                    self.probing[i] = True
            elif seen[i] < stale and self.times[i]:
                fastest = min(self.times[i])
                if base[i] > 2 * fastest:  # untested for long, and it learned a slow spell: re-probe at its best
                    p = min(p, fastest)
                    self.probing[i] = True
            if i and anchor[i] > 0 and b0 > 0:  # untested since: follow leaf 0, which every frame runs,
                drift = b0 / anchor[i]  # when it moved by more than its own noise (within, it would only
                if not 0.8 <= drift <= 1.25:  # start rarely run leaves when leaf 0 happened to be fast)
                    p *= drift
            pred[i] = p


class CostModel:
    """Per-step cost predictions (seconds) for each batch size, from a profile and online observations.

    Args:
        step_macs: MACs each step adds (per sample), from the manifest (for plans "segments" and "nodes":
            each leaf's).
        profile: a matching saved :class:`Profile`, or None.
        quantile: ratio quantile used for predictions (see the module docstring).
        window: how many recent observations the quantile looks at.
        alpha: EWMA weight of one observation in a leaf's base (median) estimate.
        max_ratio: the most one observation may claim, as a multiple of its leaf's base
            (a pre-emption stall is a risk, not a cost: see the module docstring).
        tail_window: how many of a leaf's own recent times bound its prediction.
        probe_after: frames after which a leaf the budget kept from running is re-probed.
        path: the steps that make up the whole tree once (default: every step); a mixed runner's
            bigger steps are alternatives to some of them.
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
        max_ratio: float = 16.0,
        tail_window: int = 256,
        probe_after: int = 500,
        path: Sequence[int] | None = None,
    ) -> None:
        if not 0.5 <= quantile <= 1.0:
            raise InputError(f"quantile must be in [0.5, 1]; received {quantile!r}")
        if not max_ratio >= cold_margin:
            raise InputError(f"max_ratio must be >= cold_margin ({cold_margin}); received {max_ratio!r}")
        self.step_macs = list(step_macs)
        self.path = None if path is None else tuple(path)
        self.profile = profile
        self.quantile = quantile
        self.window = window
        self.alpha = alpha
        self.min_samples = min_samples
        self.cold_margin = cold_margin
        self.max_ratio = max_ratio
        self.tail_window = tail_window
        self.probe_after = probe_after
        self._models: dict[int, _BatchModel] = {}

    def for_batch(self, batch: int) -> _BatchModel:
        model = self._models.get(batch)
        if model is None:
            model = self._models[batch] = self._new_model(batch)
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
        """Step ``step``'s current median estimate at ``batch`` (seconds; 0 while unmeasured): what speeds are
        compared by."""
        model = self.for_batch(batch)
        return model.base[step] if model.known[step] else 0.0

    def _new_model(self, batch: int) -> _BatchModel:
        at = profile_at_batch(self.profile, batch)
        if at is None or len(at[0]) != len(self.step_macs):
            return _BatchModel(self.step_macs, None, (), self)
        base, nearest = at
        base = [max(b, MIN_LEAF_SECONDS) for b in base]  # medians of 1e-320 ms underflow to 0 s
        seeds = []
        leaves = self.profile.batches[nearest]["leaves"]
        reps = min(len(leaf.get("samples_ms", ())) for leaf in leaves)
        for r in range(reps):  # interleave leaves so the window's tail keeps every leaf
            for leaf in leaves:
                seeds.append(leaf["samples_ms"][r] / leaf["median_ms"])
        scale = [b / (leaf["median_ms"] / 1e3) for b, leaf in zip(base, leaves)]  # samples at this batch size
        times = [[t / 1e3 * k for t in leaf.get("samples_ms", ())] for leaf, k in zip(leaves, scale)]
        doubtful = entries_unlike_their_peers(base, self.step_macs)
        if doubtful:  # predicted as their peers, their own samples (and ratios) left out
            _warn_doubtful(doubtful, base, self.profile.label, batch)
            base = [doubtful.get(i, b) for i, b in enumerate(base)]
            times = [[] if i in doubtful else ts for i, ts in enumerate(times)]
            seeds = [r for k, r in enumerate(seeds) if k % len(leaves) not in doubtful]
        return _BatchModel(self.step_macs, base, seeds, self, times)


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
