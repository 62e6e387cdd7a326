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
    """

    def __init__(self, kind: str, total_steps: int, warmup_steps: int = 0, warmup_start: float = 1.0) -> None:
        self.kind, self.total_steps = kind, max(1, total_steps)
        self.warmup_steps, self.warmup_start = warmup_steps, warmup_start

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:  # 1. from the unscaled rate up to the peak
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(step - self.warmup_steps, span) / span  # 2. progress through the schedule proper, 0..1
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t))
        if self.kind == "step":
            return 0.1 ** ((t >= 0.5) + (t >= 0.75))
        return 1.0

    def fit_to(self, total_steps: int, steps_per_epoch: int, warmup_epochs: float) -> "_Schedule":
        """Set the run's length (and with it the warm-up: ``warmup_epochs``, at most a tenth of the steps)."""
        self.total_steps = max(1, total_steps)
        scaled = self.warmup_start < 1.0
        self.warmup_steps = min(round(warmup_epochs * steps_per_epoch), self.total_steps // 10) if scaled else 0
        return self
