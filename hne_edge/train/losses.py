"""The four HNE training losses (Ruiz & Verbeek, AAAI 2021), as small pure functions.

Every function takes the fused model's leaf logits ``(batch, N, classes)``
in depth-first leaf order. The nested sub-ensemble of size ``n`` is the
mean of the first ``n`` leaves' logits (:func:`ensemble_logits`); the sizes
the structured and hierarchical losses supervise are ``tree.ensemble_sizes``
(``y^b`` for b = 0..B: 1, 2, 4, ..., N for the binary HNE).

    L^I   independent    mean over leaves of CE(y^i, label)
    L^S   structured     mean over b = 0..B of CE(y^b, label)
    L^D   distill        mean over leaves of KL(softmax(y^E/T) || softmax(y^i/T)) * T^2
    L^HD  hierarchical   mean over b = 0..B-1 (sizes < N) of KL(softmax(y^E/T) || softmax(y^b/T)) * T^2

Conventions (tested in tests/test_losses.py):

* **Members are averaged, not summed**, so the loss scale does not grow
  with N and the same learning rate works for any tree.
* **The teacher y^E (the full ensemble) is detached**: distillation moves
  the members toward the ensemble, never the ensemble toward its members.
* **Distillation terms are multiplied by T^2** (Hinton et al., 2015): the
  gradient of a temperature-softened KL scales as 1/T^2, so without it
  changing T would silently re-weight alpha.
* The distillation divergence is the KL divergence; it differs from the
  soft-label cross-entropy only by the teacher's entropy, a constant with
  no gradient, and is 0 when a member matches the teacher.

The training objective for ``distill`` / ``hierarchical`` is
``(1 - alpha) * L^I + alpha * L^D`` (or ``L^HD``); see :func:`hne_loss`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tree import TreeSpec

__all__ = [
    "LOSSES",
    "ensemble_logits",
    "independent_loss",
    "structured_loss",
    "distillation_loss",
    "hierarchical_distillation_loss",
    "hne_loss",
]

LOSSES = ("independent", "structured", "distill", "hierarchical")


def _check(logits: torch.Tensor, tree: TreeSpec | None = None) -> None:
    if logits.dim() != 3:
        raise ValueError(f"leaf logits must be (batch, N, classes); received shape {tuple(logits.shape)}")
    if tree is not None and logits.shape[1] != tree.num_leaves:
        raise ValueError(
            f"leaf logits have {logits.shape[1]} leaves; expected {tree.num_leaves} (tree branching {tree.branching})"
        )


def ensemble_logits(logits: torch.Tensor, n: int) -> torch.Tensor:
    """The anytime sub-ensemble of the first ``n`` leaves: mean of their logits, ``(batch, classes)``."""
    if not 1 <= n <= logits.shape[1]:
        raise ValueError(f"ensemble size n must be in 1..{logits.shape[1]}; received {n}")
    return logits[:, :n].mean(dim=1)


def _soft_kl(student: torch.Tensor, teacher_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over the batch of KL(teacher || softmax(student / T)), times T^2. ``student``: (batch, classes)."""
    log_q = F.log_softmax(student / temperature, dim=-1)
    return F.kl_div(log_q, teacher_probs, reduction="batchmean") * temperature**2


def _teacher(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # detached: the ensemble is the teacher, not a student of its members
    return F.softmax(logits.detach().mean(dim=1) / temperature, dim=-1)


def independent_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """L^I: cross-entropy of every leaf, averaged over leaves (and the batch)."""
    _check(logits)
    b, n, c = logits.shape
    # (b*n, c) vs labels repeated per leaf: one call, same mean as looping over leaves
    return F.cross_entropy(logits.reshape(b * n, c), targets.repeat_interleave(n))


def structured_loss(logits: torch.Tensor, targets: torch.Tensor, tree: TreeSpec) -> torch.Tensor:
    """L^S: cross-entropy of every nested sub-ensemble y^b (sizes ``tree.ensemble_sizes``), averaged over b."""
    _check(logits, tree)
    terms = [F.cross_entropy(ensemble_logits(logits, n), targets) for n in tree.ensemble_sizes]
    return torch.stack(terms).mean()


def distillation_loss(logits: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """L^D: every leaf toward the (detached) full ensemble's soft labels; mean over leaves, times T^2."""
    _check(logits)
    teacher = _teacher(logits, temperature)
    b, n, c = logits.shape
    log_q = F.log_softmax(logits / temperature, dim=-1)  # (b, n, c)
    kl = (teacher[:, None, :] * (torch.log(teacher.clamp_min(1e-30))[:, None, :] - log_q)).sum(-1)  # (b, n)
    return kl.mean() * temperature**2


def hierarchical_distillation_loss(logits: torch.Tensor, tree: TreeSpec, temperature: float = 2.0) -> torch.Tensor:
    """L^HD: every sub-ensemble y^b smaller than the full ensemble toward its soft labels; mean over b, times T^2.

    A tree whose only whole-subtree ensemble is the full one (e.g. a single
    network) has nothing to distil: the loss is 0.
    """
    _check(logits, tree)
    teacher = _teacher(logits, temperature)
    sizes = [n for n in tree.ensemble_sizes if n < tree.num_leaves]
    if not sizes:
        return logits.sum() * 0.0
    return torch.stack([_soft_kl(ensemble_logits(logits, n), teacher, temperature) for n in sizes]).mean()


def hne_loss(
    kind: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    tree: TreeSpec,
    alpha: float = 0.5,
    temperature: float = 2.0,
) -> torch.Tensor:
    """The training objective for ``kind`` in :data:`LOSSES`.

    ``independent``: L^I; ``structured``: L^S; ``distill``: (1-alpha) L^I + alpha L^D;
    ``hierarchical``: (1-alpha) L^I + alpha L^HD.
    """
    _check(logits, tree)
    if kind == "independent":
        return independent_loss(logits, targets)
    if kind == "structured":
        return structured_loss(logits, targets, tree)
    if kind == "distill":
        return (1 - alpha) * independent_loss(logits, targets) + alpha * distillation_loss(logits, temperature)
    if kind == "hierarchical":
        return (1 - alpha) * independent_loss(logits, targets) + alpha * hierarchical_distillation_loss(
            logits, tree, temperature
        )
    raise ValueError(f"loss must be one of {', '.join(LOSSES)}; received {kind!r}")
