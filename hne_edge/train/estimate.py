"""The training run's estimate: how long the run takes, said once the step time is steady, and the warning
when the machine got too busy for torch's threads (:class:`_RunEstimate`)."""

from __future__ import annotations

import bisect
import time
from typing import Callable

import torch

from ..limits import cpu_count, load_average
from ..progress import Progress, format_duration

__all__ = ["_RunEstimate"]


class _RunEstimate:
    """Says once, when the step time is steady, how long the run takes on this device (and when that is hours,
    what makes it shorter); warns once when the machine got too busy for torch's threads.

    The first steps carry one-off costs (allocation, kernel selection, compilation, cold caches) and, on a shared
    CPU, bursts of contention: an estimate from the first 5 s said 32 min for a run of 238 s (issue 28). So the
    first step is left out, and the step time is the mean over the latest half of the steps after it, said once
    that mean is steady: the window holds :attr:`MIN_STEPS` steps or more, and the means of its :attr:`BATCHES`
    consecutive parts give it a relative standard error of at most :attr:`STEADY` (batch means: a burst of slow
    steps falls in one part and shows). A run that never settles says it after :attr:`SETTLE_S`, an epoch too
    short to tell at its end. The progress lines keep the estimate current: their rate and ETA cover the latest
    half of the elapsed time (:attr:`hne_edge.progress.Progress.rate`). A first step that alone takes 30 s is its
    own estimate (the run is long either way). Tested on a recorded trace of this machine under load
    (tests/train/test_engine.py): within 25 % of the run's time.

    Oversubscription: when the step time later grows :attr:`COLLAPSE` times over the estimate's while the load
    average is above the CPUs and torch runs several threads, it says so once with the fix (``--threads 1``).

    Args:
        steps_left: training steps left in the run; epoch_left: of them, those before the next checkpoint (the
        end of the current epoch); advice: what makes a run shorter; on_ctrl_c: Ctrl-C saves a checkpoint too;
        threads: torch's CPU threads (0: a GPU run, nothing to watch); images: per step (the global batch);
        clock, load, cpus: for tests.
    """

    MIN_STEPS = 12
    BATCHES = 4
    STEADY = 0.07
    SETTLE_S = 300.0
    COLLAPSE = 3.0

    def __init__(self, progress: Progress, steps_left: int, epoch_left: int, device: torch.device, advice: str,
                 clock: Callable[[], float] = time.perf_counter, on_ctrl_c: bool = True, threads: int = 0,
                 load: Callable[[], float | None] = load_average, cpus: int | None = None, images: int = 0) -> None:  # fmt: skip
        self.progress, self.steps_left, self.epoch_left = progress, steps_left, epoch_left
        self.device, self.advice, self.clock, self.on_ctrl_c = device, advice, clock, on_ctrl_c
        self.threads, self.load, self.cpus = threads, load, cpu_count() if cpus is None else cpus
        self.images = images  # per step (the global batch), for the warning's img/s
        self.start = clock()
        self.ends: list[float] = []  # when each step ended (the latest ones, once the estimate is said)
        self.steps = 0
        self.per_step: float | None = None  # what the estimate said
        self.said = False
        self.warned = not threads or threads < 2

    def after_step(self, step: int) -> None:
        now = self.clock()
        self.ends.append(now)
        self.steps += 1
        if not self.said:
            self._estimate(now)
        elif not self.warned:
            self._watch(now)

    def _estimate(self, now: float) -> None:
        ends, k = self.ends, self.BATCHES
        window = (self.steps - 1) // 2  # the latest half of the steps after the first (whose end is ends[0])
        if window == 0:
            if now - self.start >= 30 or self.steps == self.epoch_left:
                first = "the first step" if self.steps == 1 else f"the first {self.steps} steps"
                self.say((now - self.start) / self.steps, now, f"{first}, start-up included")
            return
        per_step = (now - ends[-window - 1]) / window
        if window >= self.MIN_STEPS:
            size = window // k
            parts = [(ends[-1 - size * i] - ends[-1 - size * (i + 1)]) / size for i in range(k)]
            mean = sum(parts) / k
            error = (sum((p - mean) ** 2 for p in parts) / (k - 1)) ** 0.5 / mean / k**0.5 if mean > 0 else 0.0
            if error <= self.STEADY:
                return self.say(per_step, now, f"the last {window} steps")
            if now - ends[0] >= self.SETTLE_S:
                return self.say(per_step, now, f"the last {window} steps, which still vary: ±{error:.0%}")
        elif self.steps == self.epoch_left:  # a short epoch: what it has, before its checkpoint
            self.say(per_step, now, f"the last {window} step{'s' if window > 1 else ''}")

    def _watch(self, now: float) -> None:
        """Once the estimate is said: the latest :attr:`MIN_STEPS` steps and 5 s at least vs the estimate's step time."""
        ends = self.ends
        if len(ends) > 8192:  # a long run: the latest steps are enough
            del ends[:4096]
        first = min(bisect.bisect_right(ends, now - 5.0) - 1, len(ends) - 1 - self.MIN_STEPS)
        if first < 0:
            return
        per_step = (now - ends[first]) / (len(ends) - 1 - first)
        if per_step < self.COLLAPSE * self.per_step:
            return
        load = self.load()
        if load is None or load <= self.cpus:
            return
        self.warned = True
        ms = f"{self.per_step * 1e3:.3g} to {per_step * 1e3:.3g} ms a step"
        rate = f"{self.images / self.per_step:,.0f} to {self.images / per_step:,.0f} img/s ({ms})" if self.images else ms
        self.progress.write(
            f"warning: training slowed from {rate} while the load average is {load:.1f} on {self.cpus} CPU{'s' if self.cpus > 1 else ''}: torch's "
            f"{self.threads} threads wait for each other on busy cores; --threads 1 is usually several times faster "
            "on a busy machine (stop with Ctrl-C and --resume with it: BENCHMARKS.md, 'Training threads under load')")

    def say(self, per_step: float, now: float, measured: str) -> None:
        self.said, self.per_step = True, per_step
        left = per_step * max(self.steps_left - self.steps, 0)
        total = now - self.start + left
        to_checkpoint = per_step * max(self.epoch_left - self.steps, 0)
        # said at an epoch's last step (a short epoch's estimate), its checkpoint comes next: "in about 0.0 s" read
        # as a fault (issue 42)
        when = "as this epoch ends" if self.steps >= self.epoch_left else f"in about {format_duration(to_checkpoint)}"
        steps = f"{self.steps_left} training step{'s' if self.steps_left != 1 else ''}"
        line = (f"estimate: {format_duration(total)} for the {steps} of this run on {self.device} "
                f"({format_duration(per_step)}/step over {measured}; "
                f"validation adds to it); a checkpoint is written at the end of every epoch (the next {when})"
                f"{' and on Ctrl-C' if self.on_ctrl_c else ''}")
        if total >= 3600:
            line += f"\n  that is hours on this {self.device.type}: {self.advice}"
        self.progress.write(line)
