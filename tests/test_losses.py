"""The four HNE losses against direct hand computations (python loops over math.exp/log)."""

from __future__ import annotations

import math

import pytest
import torch

from hne_edge.train.losses import (
    distillation_loss,
    ensemble_logits,
    hierarchical_distillation_loss,
    hne_loss,
    independent_loss,
    structured_loss,
)
from hne_edge.tree import TreeSpec

TREE = TreeSpec((1, 2, 2))  # 4 leaves; whole-subtree ensembles of 1, 2, 4 leaves
B, N, C = 3, 4, 5


def _logits(seed: int = 0) -> torch.Tensor:
    return (torch.randn(B, N, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2).requires_grad_()


def _softmax(row: list[float], t: float = 1.0) -> list[float]:
    m = max(row)
    e = [math.exp((v - m) / t) for v in row]
    s = sum(e)
    return [v / s for v in e]


def _mean_rows(z: list[list[float]]) -> list[float]:
    return [sum(r[c] for r in z) / len(z) for c in range(len(z[0]))]


def _ce(row: list[float], label: int) -> float:
    return -math.log(_softmax(row)[label])


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def _targets() -> torch.Tensor:
    return torch.tensor([0, 3, 4])


def test_ensemble_logits_is_mean_of_first_n():
    z = _logits()
    assert torch.allclose(ensemble_logits(z, 3), (z[:, 0] + z[:, 1] + z[:, 2]) / 3)
    with pytest.raises(ValueError, match="received 5"):
        ensemble_logits(z, 5)


def test_independent_loss_matches_hand_computation():
    z, y = _logits(), _targets()
    zl = z.tolist()
    expected = sum(_ce(zl[b][i], int(y[b])) for b in range(B) for i in range(N)) / (B * N)
    assert independent_loss(z, y).item() == pytest.approx(expected, rel=1e-12)


def test_structured_loss_matches_hand_computation():
    z, y = _logits(1), _targets()
    zl = z.tolist()
    assert TREE.ensemble_sizes == (1, 2, 4)
    terms = []
    for n in (1, 2, 4):
        terms.append(sum(_ce(_mean_rows(zl[b][:n]), int(y[b])) for b in range(B)) / B)
    assert structured_loss(z, y, TREE).item() == pytest.approx(sum(terms) / 3, rel=1e-12)


@pytest.mark.parametrize("t", [1.0, 2.0, 4.0])
def test_distillation_loss_matches_hand_computation_with_t_squared(t):
    z = _logits(2)
    zl = z.tolist()
    total = 0.0
    for b in range(B):
        p = _softmax(_mean_rows(zl[b]), t)  # teacher: full ensemble
        for i in range(N):
            total += _kl(p, _softmax(zl[b][i], t))
    unscaled = total / (B * N)
    assert distillation_loss(z, t).item() == pytest.approx(t * t * unscaled, rel=1e-10)


@pytest.mark.parametrize("t", [1.0, 2.0])
def test_hierarchical_distillation_matches_hand_computation(t):
    z = _logits(3)
    zl = z.tolist()
    terms = []
    for n in (1, 2):  # sizes < N only: the full ensemble is the teacher
        s = 0.0
        for b in range(B):
            s += _kl(_softmax(_mean_rows(zl[b]), t), _softmax(_mean_rows(zl[b][:n]), t))
        terms.append(s / B)
    expected = t * t * sum(terms) / len(terms)
    assert hierarchical_distillation_loss(z, TREE, t).item() == pytest.approx(expected, rel=1e-10)


def test_distillation_gradient_treats_teacher_as_constant():
    """Analytic gradient with p (the teacher) held constant: dL/dz_i = T (q_i - p) / (B N).

    For L^D this formula also holds *without* the detach: with the teacher
    softmax(mean_i z_i / T), sum_i KL(p || q_i) has zero gradient through p
    (log p - mean_i log q_i is constant over classes). So the detach is checked
    structurally in test_teacher_is_detached; L^HD's gradient test below does fail
    without it.
    """
    t = 2.0
    z = _logits(4)
    distillation_loss(z, t).backward()
    with torch.no_grad():
        p = torch.softmax(z.mean(1) / t, -1)[:, None, :]
        q = torch.softmax(z / t, -1)
        expected = t * (q - p) / (B * N)
    assert torch.allclose(z.grad, expected, atol=1e-12)


def test_teacher_is_detached():
    from hne_edge.train.losses import _teacher

    z = _logits()
    assert not _teacher(z, 2.0).requires_grad


def test_hierarchical_gradient_treats_teacher_as_constant():
    """dL/dz_i = mean over sizes n > i of T (q_n - p) / (n B): leaves enter sub-ensembles with weight 1/n."""
    t = 2.0
    z = _logits(5)
    hierarchical_distillation_loss(z, TREE, t).backward()
    expected = torch.zeros_like(z)
    with torch.no_grad():
        p = torch.softmax(z.mean(1) / t, -1)
        sizes = (1, 2)
        for n in sizes:
            q = torch.softmax(z[:, :n].mean(1) / t, -1)
            for i in range(n):
                expected[:, i] += t * (q - p) / (n * B) / len(sizes)
    assert torch.allclose(z.grad, expected, atol=1e-12)
    assert torch.count_nonzero(z.grad[:, 2:]) == 0  # leaves 2-3 only appear in the (detached) teacher


def test_hne_loss_combines_terms_with_alpha():
    z, y = _logits(6), _targets()
    li = independent_loss(z, y)
    assert hne_loss("independent", z, y, TREE).item() == pytest.approx(li.item())
    assert hne_loss("structured", z, y, TREE).item() == pytest.approx(structured_loss(z, y, TREE).item())
    expected_d = 0.7 * li + 0.3 * distillation_loss(z, 3.0)
    assert hne_loss("distill", z, y, TREE, alpha=0.3, temperature=3.0).item() == pytest.approx(expected_d.item())
    expected_hd = 0.5 * li + 0.5 * hierarchical_distillation_loss(z, TREE, 2.0)
    assert hne_loss("hierarchical", z, y, TREE).item() == pytest.approx(expected_hd.item())


def test_distillation_is_zero_when_members_agree():
    z = torch.randn(2, 1, 3).repeat(1, N, 1)
    assert distillation_loss(z).item() == pytest.approx(0.0, abs=1e-6)
    assert hierarchical_distillation_loss(z, TREE).item() == pytest.approx(0.0, abs=1e-6)


def test_single_network_has_nothing_to_distil():
    z = _logits()[:, :1]
    assert hierarchical_distillation_loss(z, TreeSpec((1,))).item() == 0.0


def test_losses_check_shapes():
    y = _targets()
    with pytest.raises(ValueError, match="expected 4"):
        hne_loss("hierarchical", torch.randn(B, 3, C), y, TREE)
    with pytest.raises(ValueError, match=r"\(batch, N, classes\)"):
        independent_loss(torch.randn(B, C), y)
    with pytest.raises(ValueError, match="received 'bogus'"):
        hne_loss("bogus", torch.randn(B, N, C), y, TREE)
