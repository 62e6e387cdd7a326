"""The learning-rate schedule: a multiplier per step, with its warm-up (what ``fit`` hands ``LambdaLR``)."""

from __future__ import annotations

import math

__all__ = ["_Schedule"]


class _Schedule:
    """LR multiplier per iteration: an optional linear warm-up, then 1. cosine from 1 to 0; 2. step x0.1 at
    50%/75%; 3. constant.

    The warm-up rises from ``warmup_start`` (the unscaled learning rate over the scaled peak: see
    :attr:`~.config.OptimConfig.warmup_start`) to 1 over ``warmup_steps``; the schedule then runs over the steps
    after it. Without a warm-up it is the paper's schedule over all ``total_steps``. A class (not a lambda) so
    the scheduler's state_dict records it as plain data, a time budget's fixed step count included.

    A time budget that falls behind its plan ends the run sooner (:meth:`shorten`): from that step on, the rest of
    the schedule's progress is compressed into the steps left (``bends``: where, the progress there, the new last
    step), so the rate never jumps and still reaches the schedule's end at the new last step.
    """

    def __init__(self, kind: str, total_steps: int, warmup_steps: int = 0, warmup_start: float = 1.0) -> None:
        self.kind, self.total_steps = kind, max(1, total_steps)
        self.warmup_steps, self.warmup_start = warmup_steps, warmup_start
        self.bends: list[list[float]] = []  # each time it was shortened: [step, progress there (0..1), new last step]

    def progress(self, step: int) -> float:
        """How far through the schedule proper (after the warm-up) ``step`` is, 0..1."""
        for at, t, last in reversed(self.bends):  # the stretch ``step`` is in was run on the last bend before it
            if step >= at:
                return min(1.0, t + (1.0 - t) * (step - at) / max(1, last - at))
        span = max(1, self.total_steps - self.warmup_steps)
        return min(max(step - self.warmup_steps, 0), span) / span

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:  # 1. from the unscaled rate up to the peak
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        t = self.progress(step)  # 2. progress through the schedule proper, 0..1
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t))
        if self.kind == "step":
            return 0.1 ** ((t >= 0.5) + (t >= 0.75))
        return 1.0

    def fit_to(self, total_steps: int, steps_per_epoch: int, warmup_epochs: float) -> "_Schedule":
        """Set the run's length (and with it the warm-up: ``warmup_epochs``, at most a tenth of the steps)."""
        self.total_steps, self.bends = max(1, total_steps), []
        scaled = self.warmup_start < 1.0
        self.warmup_steps = min(round(warmup_epochs * steps_per_epoch), self.total_steps // 10) if scaled else 0
        return self

    def shorten(self, step: int, total_steps: int) -> None:
        """End the schedule at ``total_steps`` (at least ``step``) instead, from ``step`` on (after the warm-up): the
        progress still to come is spread over the steps left, so the rate at ``step`` is unchanged."""
        if step < self.warmup_steps:
            raise ValueError(f"shorten at step {step}: inside the warm-up ({self.warmup_steps} steps); "
                             "expected a step after it")
        t = self.progress(step)
        if not self.bends:  # the schedule as fitted, as a stretch of its own: from the warm-up's end at progress 0
            self.bends.append([self.warmup_steps, 0.0, self.total_steps])
        self.total_steps = max(step, total_steps, 1)
        self.bends.append([step, t, self.total_steps])
