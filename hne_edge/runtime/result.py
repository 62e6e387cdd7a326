"""What anytime inference returns, and the confidence rules that stop it early (numpy only)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import numpy as np

from ..errors import InputError

__all__ = ["AnytimeResult", "Uncertainty", "StopRule", "Agreement", "softmax", "summarize_frames"]


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    z = logits - logits.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def _vote_counts(leaf_logits: np.ndarray, num_classes: int) -> np.ndarray:
    """(batch, classes) number of leaves voting for each class."""
    votes = leaf_logits.argmax(-1)  # (n, B)
    counts = np.zeros((leaf_logits.shape[1], num_classes), dtype=np.int64)
    for row in votes:
        counts[np.arange(len(row)), row] += 1
    return counts


@dataclass(frozen=True)
class Uncertainty:
    """Disagreement of the evaluated leaves, per sample (arrays of shape (batch,)).

    ``logit_std``: std over leaves of the logits, averaged over classes (0 with one leaf).
    ``vote_entropy``: entropy (nats) of the leaves' top-1 votes (0: unanimous).
    ``agreement``: fraction of leaves voting for the ensemble's prediction.
    ``entropy``: predictive entropy (nats) of the ensemble's mean-logit softmax.
    """

    logit_std: np.ndarray
    vote_entropy: np.ndarray
    agreement: np.ndarray
    entropy: np.ndarray


@dataclass(eq=False)
class AnytimeResult:
    """The ensemble of the first ``leaves`` leaves for one batch.

    ``logits`` is the mean of the evaluated leaves' logits (the HNE's
    ensemble prediction, as the paper averages logits); ``probs`` its softmax.
    ``leaf_ms`` is the wall time of each leaf (a step of several leaves - a whole subtree - split evenly
    over them); ``step_ms`` is ``(first leaf, end, ms)`` of each step, what the cost model learned from.
    ``elapsed_ms`` is the wall time of the call that produced it (for
    sessions: of all calls so far). ``met_budget`` is True when the call had
    no budget or finished by its deadline; ``overran_min_leaves`` is True
    when the budget was shorter than what the forced ``min_leaves`` take 9
    times in 10 (the p90 of each one's recent times in the cost model) and
    they went past it: that miss was unavoidable, not the scheduler's choice.
    A forced leaf that fits that but runs long (the process pre-empted, a busy
    machine) is an ordinary miss. ``stopped_by``: "complete", "max_leaves",
    "budget", "stop_when", "cancelled", "step" or "closed" (session closed early).
    A session's ``leaf_logits`` is a read-only view of its buffer (an in-place edit raises numpy's
    "read-only" ValueError): ``np.array(result.leaf_logits)`` is a copy of one's own to edit.
    """

    leaf_logits: np.ndarray  # (leaves, batch, classes), float32
    elapsed_ms: float
    met_budget: bool = True
    overran_min_leaves: bool = False
    budget_ms: float | None = None
    stopped_by: str = "complete"
    class_names: tuple[str, ...] = field(default=(), repr=False)
    leaf_ms: list[float] = field(default_factory=list, repr=False)  # wall time of each leaf
    step_ms: list[tuple[int, int, float]] = field(default_factory=list, repr=False)  # (first leaf, end, ms) per step

    @property
    def leaves(self) -> int:
        return int(self.leaf_logits.shape[0])

    @cached_property
    def logits(self) -> np.ndarray:
        """(batch, classes): mean of the evaluated leaves' logits."""
        ll = self.leaf_logits
        return ll[0].copy() if ll.shape[0] == 1 else ll.sum(axis=0) * np.float32(1.0 / ll.shape[0])

    @cached_property
    def probs(self) -> np.ndarray:
        return softmax(self.logits)

    @property
    def predictions(self) -> np.ndarray:
        """(batch,) predicted class indices."""
        return self.logits.argmax(-1)

    @property
    def confidence(self) -> np.ndarray:
        """(batch,) probability of the predicted class."""
        return self.probs.max(-1)

    @property
    def labels(self) -> list[str]:
        """Predicted class names (indices as strings if the bundle has no names)."""
        names = self.class_names
        return [names[i] if i < len(names) else str(i) for i in self.predictions.tolist()]

    @cached_property
    def uncertainty(self) -> Uncertainty:
        ll = self.leaf_logits
        n, batch, classes = ll.shape
        std = ll.std(axis=0).mean(-1) if n > 1 else np.zeros(batch, dtype=np.float32)
        counts = _vote_counts(ll, classes)
        p = counts / n
        with np.errstate(divide="ignore", invalid="ignore"):
            vote_entropy = -np.where(p > 0, p * np.log(p), 0.0).sum(-1) + 0.0  # no -0.0
        agreement = counts[np.arange(batch), self.predictions] / n
        probs = self.probs
        entropy = -(probs * np.log(np.clip(probs, 1e-12, None))).sum(-1) + 0.0
        return Uncertainty(std.astype(np.float32), vote_entropy, agreement, entropy)

    def to_dict(self, per_sample: bool = True) -> dict:
        out = {
            "leaves": self.leaves,
            # ns resolution: the budget is re-derived from a clock deadline and carries float noise
            "elapsed_ms": round(self.elapsed_ms, 6),
            "budget_ms": None if self.budget_ms is None else round(self.budget_ms, 6),
            "met_budget": self.met_budget,
            "overran_min_leaves": self.overran_min_leaves,
            "stopped_by": self.stopped_by,
        }
        if per_sample:
            u = self.uncertainty
            out["samples"] = [
                {
                    "class": int(c),
                    "label": label,
                    "prob": float(pr),
                    "logit_std": float(s),
                    "vote_entropy": float(v),
                    "agreement": float(a),
                }
                for c, label, pr, s, v, a in zip(
                    self.predictions, self.labels, self.confidence, u.logit_std, u.vote_entropy, u.agreement
                )
            ]
        return out


class StopRule:
    """Decides, between leaves, that the evaluated leaves are good enough.

    Called with ``leaf_logits`` of shape (leaves so far, batch, classes), read-only (the session's own);
    return True to stop. Subclasses set ``min_leaves``.
    """

    min_leaves: int = 1

    def __call__(self, leaf_logits: np.ndarray) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class Agreement(StopRule):
    """Stop when, for every sample of the batch, the evaluated leaves agree.

    Args:
        min_leaves: never stop before this many leaves (>= 2 for a disagreement to mean anything).
        vote: fraction of leaves whose top-1 equals the ensemble's top-1 (1.0: unanimous).
        margin: if set, also require the ensemble's top-1 minus top-2 probability >= margin.
        max_std: if set, also require the class-averaged logit std over leaves <= max_std.
    """

    min_leaves: int = 2
    vote: float = 1.0
    margin: float | None = None
    max_std: float | None = None

    def __post_init__(self) -> None:  # written so that NaN fails every comparison, and so every check
        if not isinstance(self.min_leaves, int) or isinstance(self.min_leaves, bool) or self.min_leaves < 1:
            raise InputError(f"Agreement.min_leaves must be an int >= 1; received {self.min_leaves!r}")
        if not (_real(self.vote) and 0.0 < self.vote <= 1.0):
            raise InputError(f"Agreement.vote must be in (0, 1]; received {self.vote!r}")
        if self.margin is not None and not (_real(self.margin) and 0.0 <= self.margin <= 1.0):
            raise InputError(f"Agreement.margin must be in [0, 1] or None; received {self.margin!r}")
        if self.max_std is not None and not (_real(self.max_std) and 0.0 <= self.max_std < math.inf):
            raise InputError(f"Agreement.max_std must be a finite number >= 0 or None; received {self.max_std!r}")

    def __call__(self, leaf_logits: np.ndarray) -> bool:
        n = leaf_logits.shape[0]
        if n < self.min_leaves:
            return False
        mean = leaf_logits.mean(axis=0)  # (B, C)
        top = mean.argmax(-1)  # (B,)
        agree = (leaf_logits.argmax(-1) == top).mean(axis=0)  # (B,)
        if (agree < self.vote - 1e-9).any():
            return False
        if self.margin is not None:
            p = softmax(mean)
            two = np.partition(p, -2, axis=-1)[:, -2:]
            if ((two[:, 1] - two[:, 0]) < self.margin).any():
                return False
        if self.max_std is not None and n > 1 and (leaf_logits.std(axis=0).mean(-1) > self.max_std).any():
            return False
        return True


def summarize_frames(results: "Sequence[AnytimeResult]", correct: "Sequence[bool] | None" = None) -> dict:
    """What a run of frames did, in one record (``hne-edge run``'s summary, the demo's budget table).

    ``frames``/``samples``: counted; ``mean_leaves``: per frame; ``misses``: frames answered after their
    budget, of which ``forced_misses`` had a budget shorter than their forced leaves
    (:attr:`AnytimeResult.overran_min_leaves`); ``latency_ms``: quantiles of the frames' wall times;
    ``accuracy`` (a fraction, as in every JSON file) and ``scored``: over the samples ``correct`` covers.
    """
    elapsed = np.asarray([r.elapsed_ms for r in results], dtype=np.float64)
    summary: dict = {
        "frames": len(results),
        "samples": int(sum(r.leaf_logits.shape[1] for r in results)),
        "mean_leaves": float(np.mean([r.leaves for r in results])) if results else 0.0,
        "misses": int(sum(not r.met_budget for r in results)),
        "forced_misses": int(sum(r.overran_min_leaves for r in results)),
        "latency_ms": {f"p{q}": float(np.percentile(elapsed, q)) for q in (50, 90, 99)} if len(elapsed) else {},
    }
    if len(elapsed):
        summary["latency_ms"]["max"] = float(elapsed.max())
    if correct is not None and len(correct):
        summary["accuracy"] = float(np.mean(correct))
        summary["scored"] = len(correct)
    return summary
