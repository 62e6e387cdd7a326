"""The four HNE training losses (Ruiz & Verbeek, AAAI 2021), as small pure functions.

Every function takes the fused model's leaf logits ``(batch, N, classes)`` in
depth-first leaf order. The nested sub-ensemble of size ``n`` is the mean of
the first ``n`` leaves' logits (:func:`ensemble_logits`); ``y^b`` for
b = 0..B are the sub-ensembles of ``tree.ensemble_sizes`` (1, 2, 4, ..., N
for the binary HNE), ``y^E = y^B`` is the full ensemble, and ``l`` is the
cross-entropy (with hard labels, or with soft labels ``softmax(y^E / T)``).

The paper's equations, summed over the M images of a batch:

    (1)  L^I  = sum_{n=1..N} sum_m l(F_n(x_m), y_m)          independent: every member on the labels
    (2)  L^S  = sum_{b=0..B} sum_m l(y^b_m, y_m)             structured: every sub-ensemble on the labels
    (3)  L^D  = sum_{n=1..N} sum_m l(F_n(x_m), y^E_m)        co-distillation: every member on the ensemble
    (5)  L^HD = sum_{b=0..B-1} sum_m l(y^b_m, y^E_m)         hierarchical: every smaller sub-ensemble on it
    objective (1 - alpha) L^I + alpha L^D   or   (1 - alpha) L^I + alpha L^HD,   alpha = 0.5, T = 2

with the teacher ``y^E`` detached and the students' softmax taken at the same
temperature T. Two weightings (``weighting=``) turn the sums into a loss:

* ``"paper"`` (default): the equations as written, divided by the number of
  terms of the objective's label term (N for L^I, B + 1 for L^S) and by M, so
  the learning rate does not depend on the size of the tree while the
  paper's ratio between the terms is kept. For the binary HNE with N = 16,
  B = 4 that weights a mean over the 4 sub-ensembles of L^HD by B/N = 1/4
  against the mean over the 16 members of L^I; L^D and L^I both sum over the
  N members, 1 : 1. The distillation divergence is the soft-label
  cross-entropy ``l`` itself. ``temperature_squared=True`` multiplies the
  distillation term by T^2 (Hinton et al., 2015); the paper does not, so it
  is off.
* ``"mean-t2"``: the convention of hne-edge 0.1 (kept to compare with it):
  every term is a mean over its members or sub-ensembles, the divergence is
  the KL divergence (the soft-label cross-entropy minus the teacher's
  entropy: the same gradient, 0 when a member matches the teacher), and the
  distillation term is always multiplied by T^2. Relative to ``"paper"`` it
  weights L^HD by (N/B) T^2 = 16x and L^D by T^2 = 4x (N = 16, B = 4, T = 2).

One normalisation (``normalize=``), beside the equations, not instead of them:

* ``"none"`` (default): the objective above.
* ``"label"``: the objective divided by the label term's weight (1 - alpha),

      (1 - alpha) L^I + alpha L^HD   ->   L^I + alpha / (1 - alpha) L^HD      (L^D alike),

  so that the label term keeps weight 1 whatever alpha is. With SGD this is
  the paper's objective with the learning rate multiplied by 1 / (1 - alpha)
  for the loss gradient only: weight decay is added by the optimiser, after
  the loss, so it keeps the paper's lr x wd. At short schedules the paper's
  halved label term is what loses accuracy against L^I, not the distillation
  (RESULTS.md); at the paper's 200 epochs it has not been measured. L^I and
  L^S have no alpha: ``"label"`` leaves them unchanged.

RESULTS.md compares the weightings and the normalisation on CIFAR-10;
tests/train/test_losses.py pins them against hand computations of the equations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import InputError
from ..tree import TreeSpec
from .config import LOSSES, NORMALIZATIONS, WEIGHTINGS  # the names a config accepts live with the torch-free config

__all__ = [
    "LOSSES",
    "WEIGHTINGS",
    "NORMALIZATIONS",
    "ensemble_logits",
    "independent_loss",
    "structured_loss",
    "distillation_loss",
    "hierarchical_distillation_loss",
    "hne_loss",
]


def _check(logits: torch.Tensor, tree: TreeSpec | None = None) -> None:
    if logits.dim() != 3:
        raise InputError(f"leaf logits must be (batch, N, classes); received shape {tuple(logits.shape)}")
    if tree is not None and logits.shape[1] != tree.num_leaves:
        raise InputError(
            f"leaf logits have {logits.shape[1]} leaves; expected {tree.num_leaves} (tree branching {tree.branching})"
        )


def _check_weighting(weighting: str) -> None:
    if weighting not in WEIGHTINGS:
        raise InputError(f"weighting must be one of {', '.join(WEIGHTINGS)}; received {weighting!r}")


def ensemble_logits(logits: torch.Tensor, n: int) -> torch.Tensor:
    """The anytime sub-ensemble of the first ``n`` leaves: mean of their logits, ``(batch, classes)``."""
    if not 1 <= n <= logits.shape[1]:
        raise InputError(f"ensemble size n must be in 1..{logits.shape[1]}; received {n}")
    return logits[:, :n].mean(dim=1)


def _teacher(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # detached: the ensemble is the teacher, not a student of its members
    return F.softmax(logits.detach().mean(dim=1) / temperature, dim=-1)


def _divergence(student: torch.Tensor, teacher: torch.Tensor, temperature: float, weighting: str) -> torch.Tensor:
    """Per-sample divergence of ``softmax(student / T)`` from the teacher's probabilities, over the last dim.

    ``paper``: the soft-label cross-entropy l = -sum p log q (the equations' l);
    ``mean-t2``: KL(p || q) = l - H(p), the same gradient.
    """
    log_q = F.log_softmax(student / temperature, dim=-1)
    if weighting == "paper":
        return -(teacher * log_q).sum(-1)
    return (teacher * (torch.log(teacher.clamp_min(1e-30)) - log_q)).sum(-1)


def _distill_scale(temperature: float, weighting: str, temperature_squared: bool) -> float:
    return temperature**2 if (weighting == "mean-t2" or temperature_squared) else 1.0


def independent_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """L^I, Eq. (1), over N and the batch: the mean cross-entropy of every leaf (same under both weightings)."""
    _check(logits)
    b, n, c = logits.shape
    # (b*n, c) vs labels repeated per leaf: one call, same mean as looping over leaves
    return F.cross_entropy(logits.reshape(b * n, c), targets.repeat_interleave(n))


def structured_loss(logits: torch.Tensor, targets: torch.Tensor, tree: TreeSpec) -> torch.Tensor:
    """L^S, Eq. (2), over B + 1 and the batch: the mean cross-entropy of every sub-ensemble y^b."""
    _check(logits, tree)
    terms = [F.cross_entropy(ensemble_logits(logits, n), targets) for n in tree.ensemble_sizes]
    return torch.stack(terms).mean()


def distillation_loss(
    logits: torch.Tensor, temperature: float = 2.0, *, weighting: str = "paper", temperature_squared: bool = False
) -> torch.Tensor:
    """L^D, Eq. (3), over N and the batch: every leaf toward the detached full ensemble's soft labels.

    ``paper``: mean over leaves of l(F_n, y^E) (times T^2 with ``temperature_squared``);
    ``mean-t2``: mean over leaves of KL, times T^2.
    """
    _check(logits)
    _check_weighting(weighting)
    teacher = _teacher(logits, temperature)
    per_leaf = _divergence(logits, teacher[:, None, :], temperature, weighting)  # (b, N)
    return per_leaf.mean() * _distill_scale(temperature, weighting, temperature_squared)


def hierarchical_distillation_loss(
    logits: torch.Tensor,
    tree: TreeSpec,
    temperature: float = 2.0,
    *,
    weighting: str = "paper",
    temperature_squared: bool = False,
) -> torch.Tensor:
    """L^HD, Eq. (5): every sub-ensemble y^b smaller than the full one toward its soft labels.

    ``paper``: the sum over the B sub-ensembles divided by N (the label term's
    count), i.e. (B / N) times their mean (times T^2 with ``temperature_squared``);
    ``mean-t2``: the mean over the B sub-ensembles of KL, times T^2.
    A tree whose only whole-subtree ensemble is the full one (e.g. a single
    network) has nothing to distil: the loss is 0.
    """
    _check(logits, tree)
    _check_weighting(weighting)
    teacher = _teacher(logits, temperature)
    sizes = [n for n in tree.ensemble_sizes if n < tree.num_leaves]
    if not sizes:
        return logits.sum() * 0.0
    terms = torch.stack([_divergence(ensemble_logits(logits, n), teacher, temperature, weighting).mean() for n in sizes])
    total = terms.sum() / tree.num_leaves if weighting == "paper" else terms.mean()
    return total * _distill_scale(temperature, weighting, temperature_squared)


def hne_loss(
    kind: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    tree: TreeSpec,
    alpha: float = 0.5,
    temperature: float = 2.0,
    *,
    weighting: str = "paper",
    temperature_squared: bool = False,
    normalize: str = "none",
) -> torch.Tensor:
    """The training objective for ``kind`` in :data:`LOSSES` under ``weighting`` in :data:`WEIGHTINGS`.

    ``independent``: L^I; ``structured``: L^S; ``distill``: (1-alpha) L^I + alpha L^D;
    ``hierarchical``: (1-alpha) L^I + alpha L^HD. ``normalize="label"`` divides the last two by
    (1 - alpha) (see the module docstring).
    """
    _check(logits, tree)
    _check_weighting(weighting)
    if normalize not in NORMALIZATIONS:
        raise InputError(f"normalize must be one of {', '.join(NORMALIZATIONS)}; received {normalize!r}")
    if normalize == "label" and not alpha < 1:
        raise InputError(f"normalize='label' divides the objective by (1 - alpha); received alpha={alpha!r}, expected alpha < 1")
    options = {"weighting": weighting, "temperature_squared": temperature_squared}
    if kind == "independent":
        return independent_loss(logits, targets)
    if kind == "structured":
        return structured_loss(logits, targets, tree)
    if kind == "distill":
        distillation = distillation_loss(logits, temperature, **options)
    elif kind == "hierarchical":
        distillation = hierarchical_distillation_loss(logits, tree, temperature, **options)
    else:
        raise InputError(f"loss must be one of {', '.join(LOSSES)}; received {kind!r}")
    objective = (1 - alpha) * independent_loss(logits, targets) + alpha * distillation
    return objective / (1 - alpha) if normalize == "label" else objective
