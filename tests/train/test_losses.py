"""The four HNE losses against direct hand computations of the paper's equations (python loops over math.exp/log).

Both weightings are pinned: ``paper`` (the equations, normalised by the label term's count) and
``mean-t2`` (hne-edge 0.1: means over members, KL, times T^2).
"""

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
def test_mean_t2_distillation_loss_matches_hand_computation(t):
    z = _logits(2)
    zl = z.tolist()
    total = 0.0
    for b in range(B):
        p = _softmax(_mean_rows(zl[b]), t)  # teacher: full ensemble
        for i in range(N):
            total += _kl(p, _softmax(zl[b][i], t))
    unscaled = total / (B * N)
    assert distillation_loss(z, t, weighting="mean-t2").item() == pytest.approx(t * t * unscaled, rel=1e-10)


@pytest.mark.parametrize("t", [1.0, 2.0])
def test_mean_t2_hierarchical_distillation_matches_hand_computation(t):
    z = _logits(3)
    zl = z.tolist()
    terms = []
    for n in (1, 2):  # sizes < N only: the full ensemble is the teacher
        s = 0.0
        for b in range(B):
            s += _kl(_softmax(_mean_rows(zl[b]), t), _softmax(_mean_rows(zl[b][:n]), t))
        terms.append(s / B)
    expected = t * t * sum(terms) / len(terms)
    assert hierarchical_distillation_loss(z, TREE, t, weighting="mean-t2").item() == pytest.approx(expected, rel=1e-10)


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
    distillation_loss(z, t, weighting="mean-t2").backward()
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
    hierarchical_distillation_loss(z, TREE, t, weighting="mean-t2").backward()
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
    for weighting in ("paper", "mean-t2"):
        expected_d = 0.7 * li + 0.3 * distillation_loss(z, 3.0, weighting=weighting)
        got_d = hne_loss("distill", z, y, TREE, alpha=0.3, temperature=3.0, weighting=weighting)
        assert got_d.item() == pytest.approx(expected_d.item())
        expected_hd = 0.5 * li + 0.5 * hierarchical_distillation_loss(z, TREE, 2.0, weighting=weighting)
        assert hne_loss("hierarchical", z, y, TREE, weighting=weighting).item() == pytest.approx(expected_hd.item())


def test_distillation_is_zero_when_members_agree():
    z = torch.randn(2, 1, 3).repeat(1, N, 1)
    assert distillation_loss(z, weighting="mean-t2").item() == pytest.approx(0.0, abs=1e-6)
    assert hierarchical_distillation_loss(z, TREE, weighting="mean-t2").item() == pytest.approx(0.0, abs=1e-6)


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


# -- the paper's weighting (the default) --------------------------------------------------------------
def _soft_ce(p: list[float], q: list[float]) -> float:
    """The paper's l with soft labels: -sum p log q."""
    return -sum(pi * math.log(qi) for pi, qi in zip(p, q))


def _paper_objective_sums(zl, y, kind: str, alpha: float, t: float) -> float:
    """Eq. (1), (3), (5) as written: sums over members / sub-ensembles and over the batch, no T^2."""
    l_i = sum(_ce(zl[m][n], y[m]) for m in range(B) for n in range(N))
    if kind == "independent":
        return l_i
    teacher = [_softmax(_mean_rows(zl[m]), t) for m in range(B)]
    if kind == "distill":
        l_x = sum(_soft_ce(teacher[m], _softmax(zl[m][n], t)) for m in range(B) for n in range(N))
    else:  # hierarchical: b = 0..B-1, sizes 1, 2 (the full ensemble of 4 is the teacher)
        l_x = sum(_soft_ce(teacher[m], _softmax(_mean_rows(zl[m][:size]), t)) for m in range(B) for size in (1, 2))
    return (1 - alpha) * l_i + alpha * l_x


@pytest.mark.parametrize("kind", ["independent", "distill", "hierarchical"])
@pytest.mark.parametrize("alpha,t", [(0.5, 2.0), (0.3, 1.0), (0.8, 4.0)])
def test_paper_weighting_is_the_equations_divided_by_the_label_terms_count(kind, alpha, t):
    """Default objective = (the paper's summed objective) / (N members x M images), for every alpha and T."""
    z, y = _logits(7), _targets()
    expected = _paper_objective_sums(z.tolist(), y.tolist(), kind, alpha, t) / (N * B)
    got = hne_loss(kind, z, y, TREE, alpha=alpha, temperature=t)
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_paper_weighting_ratios_for_the_binary_hne():
    """N = 16, B = 4: L^HD's mean over sub-ensembles weighs B/N = 1/4 of L^I's mean over members; L^D 1 : 1.

    mean-t2 weighs them (N/B) T^2 = 16x and T^2 = 4x heavier (the issue's hand computation).
    """
    tree = TreeSpec((1, 2, 2, 2, 2))
    z = torch.randn(3, 16, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    zl = z.tolist()
    t = 2.0
    teacher = [_softmax(_mean_rows(zl[m]), t) for m in range(3)]
    mean_hd = sum(_soft_ce(teacher[m], _softmax(_mean_rows(zl[m][:s]), t)) for m in range(3) for s in (1, 2, 4, 8)) / (3 * 4)
    mean_d = sum(_soft_ce(teacher[m], _softmax(zl[m][n], t)) for m in range(3) for n in range(16)) / (3 * 16)
    assert hierarchical_distillation_loss(z, tree, t).item() == pytest.approx(mean_hd * 4 / 16, rel=1e-12)
    assert distillation_loss(z, t).item() == pytest.approx(mean_d, rel=1e-12)
    # T^2 is an explicit option on top of the paper's weighting
    assert hierarchical_distillation_loss(z, tree, t, temperature_squared=True).item() == pytest.approx(
        mean_hd * 4 / 16 * t * t, rel=1e-12)
    # the two weightings' gradients differ by exactly (N/B) T^2 for L^HD and T^2 for L^D (KL and l share gradients)
    grads = {}
    for w in ("paper", "mean-t2"):
        for name, fn in (("hd", lambda x: hierarchical_distillation_loss(x, tree, t, weighting=w)),
                         ("d", lambda x: distillation_loss(x, t, weighting=w))):
            x = z.clone().requires_grad_()
            fn(x).backward()
            grads[name, w] = x.grad
    assert torch.allclose(grads["hd", "mean-t2"], grads["hd", "paper"] * (16 / 4) * t * t, atol=1e-12)
    assert torch.allclose(grads["d", "mean-t2"], grads["d", "paper"] * t * t, atol=1e-12)


def test_paper_distillation_gradient_treats_teacher_as_constant():
    """Soft-label cross-entropy: dl/dz = (q - p) / T per member; the mean over B x N scales it."""
    t = 2.0
    z = _logits(8)
    distillation_loss(z, t).backward()
    with torch.no_grad():
        p = torch.softmax(z.mean(1) / t, -1)[:, None, :]
        q = torch.softmax(z / t, -1)
        expected = (q - p) / t / (B * N)
    assert torch.allclose(z.grad, expected, atol=1e-12)


def test_unknown_weighting_is_refused():
    with pytest.raises(ValueError, match="received 'sum'"):
        hne_loss("hierarchical", _logits(), _targets(), TREE, weighting="sum")


# -- the label normalisation (normalize="label", beside the paper's objective) ------------------------------
@pytest.mark.parametrize("kind", ["distill", "hierarchical"])
@pytest.mark.parametrize("alpha,t", [(0.5, 2.0), (0.3, 1.0), (0.8, 4.0), (0.0, 2.0)])
def test_label_normalisation_is_the_objective_divided_by_one_minus_alpha(kind, alpha, t):
    """normalize="label" = L^I + alpha / (1 - alpha) L^X, from the hand-computed sums of Eq. (1), (3), (5)."""
    z, y = _logits(9), _targets()
    zl, yl = z.tolist(), y.tolist()
    label_term = _paper_objective_sums(zl, yl, "independent", 0.0, t) / (N * B)  # L^I, weight 1
    distill_term = (_paper_objective_sums(zl, yl, kind, 1.0, t)) / (N * B)  # alpha = 1: the distillation sum alone
    got = hne_loss(kind, z, y, TREE, alpha=alpha, temperature=t, normalize="label")
    assert got.item() == pytest.approx(label_term + alpha / (1 - alpha) * distill_term, rel=1e-12)
    paper = _paper_objective_sums(zl, yl, kind, alpha, t) / (N * B)
    assert got.item() == pytest.approx(paper / (1 - alpha), rel=1e-12)


def test_label_normalisation_leaves_losses_without_alpha_alone():
    z, y = _logits(10), _targets()
    for kind in ("independent", "structured"):
        assert hne_loss(kind, z, y, TREE, normalize="label").item() == hne_loss(kind, z, y, TREE).item()


def test_label_normalised_gradient_is_the_papers_over_one_minus_alpha():
    alpha = 0.3
    grads = {}
    for normalize in ("none", "label"):
        z = _logits(11)
        hne_loss("hierarchical", z, _targets(), TREE, alpha=alpha, normalize=normalize).backward()
        grads[normalize] = z.grad
    assert torch.allclose(grads["label"], grads["none"] / (1 - alpha), rtol=1e-12, atol=0)


def test_label_normalised_sgd_is_the_papers_with_the_loss_lr_scaled_and_the_decay_lr_not():
    """torch SGD (momentum, coupled weight decay) on the normalised objective == a hand-written SGD on the
    paper's objective whose loss gradient steps at lr / (1 - alpha) and whose decay steps at lr, over 4 steps.

    Scaling the whole paper objective's lr by 1 / (1 - alpha) instead would scale the decay too: not the same run.
    """
    alpha, lr, momentum, wd = 0.5, 0.1, 0.9, 5e-4
    y = _targets()

    def paper_grad(p: torch.Tensor) -> torch.Tensor:
        x = p.detach().clone().requires_grad_()
        hne_loss("hierarchical", x, y, TREE, alpha=alpha).backward()
        return x.grad

    def torch_sgd(normalize: str, lr: float) -> torch.Tensor:
        p = torch.nn.Parameter(_logits(12).detach().clone())
        opt = torch.optim.SGD([p], lr=lr, momentum=momentum, weight_decay=wd)
        for _ in range(4):
            opt.zero_grad()
            hne_loss("hierarchical", p, y, TREE, alpha=alpha, normalize=normalize).backward()
            opt.step()
        return p.detach()

    p, buf = _logits(12).detach().clone(), None
    for _ in range(4):  # torch's SGD with the two learning rates written out: d = g / (1 - alpha) + wd p (lr folded in)
        step = paper_grad(p) * (lr / (1 - alpha)) + (lr * wd) * p
        buf = step if buf is None else momentum * buf + step
        p = p - buf
    normalised = torch_sgd("label", lr)
    assert torch.allclose(normalised, p, rtol=0, atol=1e-12)
    assert not torch.allclose(normalised, torch_sgd("none", lr), rtol=0, atol=1e-6)  # it is a different run
    assert not torch.allclose(normalised, torch_sgd("none", lr / (1 - alpha)), rtol=0, atol=1e-9)  # decay x2 differs


def test_label_normalisation_needs_alpha_below_one():
    z, y = _logits(), _targets()
    with pytest.raises(ValueError, match=r"received alpha=1.0, expected alpha < 1"):
        hne_loss("hierarchical", z, y, TREE, alpha=1.0, normalize="label")
    with pytest.raises(ValueError, match=r"normalize must be one of none, label; received 'full'"):
        hne_loss("hierarchical", z, y, TREE, normalize="full")
