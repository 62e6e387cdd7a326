"""The cost model before issue 15, kept as the baseline that bench_runtime.py measures side by side.

A pooled 0.99-quantile of the last 128 observed/base ratios, uncapped, with an
EWMA base whose updates are not bounded: a few 16-44 ms pre-emption stalls set
the quantile to hundreds, after which only the forced first leaf runs and no
new observation can lower it (issue 15). Copied from hne_edge/runtime/cost_model.py
at commit 82fc9b3; not used by the package.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from hne_edge.runtime.cost_model import CostModel


class _BatchModel:
    """Predictions and online updates for one batch size. Hot path: ``observe`` (~2 us) and ``pred``.

    The ratio window is a ring (for eviction) plus a sorted list (bisect), so the
    quantile is an index lookup instead of a numpy call per observation.
    """

    def __init__(self, macs: Sequence[int], base: list[float] | None, seed_ratios: Sequence[float], cm: "CostModel") -> None:
        n = len(macs)
        self.macs = [float(m) for m in macs]
        self.known = [base is not None] * n
        self.all_known = base is not None
        self.base = list(base) if base is not None else [0.0] * n
        self.q = cm.quantile
        self.alpha = cm.alpha
        self.min_samples = cm.min_samples
        self.cold_margin = cm.cold_margin
        self.window = cm.window
        self.ring: list[float] = []
        self.sorted: list[float] = []
        self.count = 0
        self.pred: list[float] = [math.inf] * n
        self.scale = 1.0
        self.seen_t = 0.0  # sum of base over known leaves, and their MACs: seconds per MAC for unknown leaves
        self.seen_m = 0.0
        for r in list(seed_ratios)[-cm.window :]:
            self._push(float(r))
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

    def observe(self, leaf: int, seconds: float) -> None:
        base = self.base[leaf]
        if self.known[leaf]:
            ratio = seconds / base
            delta = self.alpha * (seconds - base)
            self.base[leaf] = base + delta
            self.seen_t += delta
        else:
            self.known[leaf] = True
            self.all_known = all(self.known)
            self.base[leaf] = seconds
            self.seen_t += seconds
            self.seen_m += self.macs[leaf]
            ratio = 1.0
        self._push(ratio)
        scale = self._quantile()
        if not self.all_known or abs(scale - self.scale) > 0.005 * self.scale:  # re-predict every leaf
            self._refresh()
        else:
            self.pred[leaf] = self.base[leaf] * self.scale

    def _refresh(self) -> None:
        scale = self.scale = self._quantile()
        pred = self.pred
        if self.all_known:
            pred[:] = [b * scale for b in self.base]
            return
        per_mac = self.seen_t / self.seen_m if self.seen_m > 0 else math.inf
        pred[:] = [b * scale if k_ else m * per_mac * scale for b, m, k_ in zip(self.base, self.macs, self.known)]


class LegacyCostModel(CostModel):
    """The pre-issue-15 predictions (CostModel's constructor and profile lookup are unchanged)."""

    def _new_model(self, batch: int) -> _BatchModel:
        profile = self.profile
        if profile is None or not profile.batches:
            return _BatchModel(self.step_macs, None, (), self)
        sizes = sorted(profile.batches)
        lower = [b for b in sizes if b <= batch]
        upper = [b for b in sizes if b >= batch]
        if lower and upper:
            b0, b1 = lower[-1], upper[0]
            m0, m1 = profile.leaf_medians_s(b0), profile.leaf_medians_s(b1)
            w = 0.0 if b1 == b0 else (batch - b0) / (b1 - b0)
            base = [a + w * (c - a) for a, c in zip(m0, m1)]
            nearest = b0 if w < 0.5 else b1
        elif upper:  # smaller than anything profiled: the smallest profile (fixed costs dominate)
            nearest = upper[0]
            base = profile.leaf_medians_s(nearest)
        else:  # larger: scale the largest linearly with batch (conservative on CPUs)
            nearest = lower[-1]
            base = [m * batch / nearest for m in profile.leaf_medians_s(nearest)]
        if len(base) != len(self.step_macs):
            return _BatchModel(self.step_macs, None, (), self)
        seeds = []
        leaves = profile.batches[nearest]["leaves"]
        reps = min(len(leaf.get("samples_ms", ())) for leaf in leaves)
        for r in range(reps):  # interleave leaves so the window's tail keeps every leaf
            for leaf in leaves:
                seeds.append(leaf["samples_ms"][r] / leaf["median_ms"])
        return _BatchModel(self.step_macs, base, seeds, self)
