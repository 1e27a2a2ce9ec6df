"""ADVICE and ConfTuner loss terms against hand-computed values (docs/methods.md "ADVICE and ConfTuner")."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from candor.train.advice.losses import LossWeights, brier, jsd, jsd_hinge, margin_hinge, sum_penalty
from candor.util.errors import CandorError


def logs(*rows: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float64))


def test_jsd_of_identical_distributions_is_zero():
    p = logs([0.2, 0.3, 0.5], [1.0, 0.0, 0.0])
    torch.testing.assert_close(jsd(p, p), torch.zeros(2, dtype=torch.float64))


def test_jsd_of_disjoint_distributions_is_ln2():
    p = logs([1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0])
    q = logs([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.25, 0.75])
    torch.testing.assert_close(jsd(p, q), torch.full((2,), math.log(2.0), dtype=torch.float64))


def test_jsd_by_hand_and_against_scipy():
    # p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4);
    # KL(p‖m) = ½ ln(2/3) + ½ ln 2, KL(q‖m) = ln(4/3); JSD = ½ (KL(p‖m) + KL(q‖m)).
    by_hand = 0.5 * (0.5 * math.log(2 / 3) + 0.5 * math.log(2) + math.log(4 / 3))
    got = jsd(logs([0.5, 0.5]), logs([1.0, 0.0]))
    assert got.item() == pytest.approx(by_hand, abs=1e-12)
    assert by_hand == pytest.approx(0.2157615543, abs=1e-9)
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 10, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(5, 10, generator=gen, dtype=torch.float64), -1)
    reference = [jensenshannon(a.numpy(), b.numpy()) ** 2 for a, b in zip(p, q, strict=True)]  # natural log
    torch.testing.assert_close(jsd(p.log(), q.log()), torch.tensor(reference, dtype=torch.float64))


def test_jsd_hinge_switches_off_past_the_target():
    same = logs([0.5, 0.5])
    assert jsd_hinge(same, same).item() == pytest.approx(0.6)
    assert jsd_hinge(logs([1.0, 0.0]), logs([0.0, 1.0])).item() == 0.0  # ln 2 > 0.6
    assert jsd_hinge(logs([0.5, 0.5]), logs([1.0, 0.0])).item() == pytest.approx(0.6 - 0.2157615543, abs=1e-9)
    assert jsd_hinge(logs([0.5, 0.5]), logs([1.0, 0.0]), target=0.2).item() == 0.0


def test_margin_hinges_at_delta():
    mu_c = torch.tensor([0.9, 1.0, 0.2, 0.75])
    mu_w = torch.tensor([0.1, 0.0, 0.7, 0.25])
    torch.testing.assert_close(margin_hinge(mu_c, mu_w), torch.tensor([0.2, 0.0, 1.5, 0.5]))
    torch.testing.assert_close(margin_hinge(mu_c, mu_w, delta=0.5), torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_sum_penalty_is_zero_only_when_the_pair_adds_to_one():
    mu_c = torch.tensor([0.9, 0.9, 0.2, 1.0])
    mu_w = torch.tensor([0.1, 0.3, 0.3, 1.0])
    torch.testing.assert_close(sum_penalty(mu_c, mu_w), torch.tensor([0.0, 0.2, 0.5, 1.0]))


def test_brier_matches_the_formula():
    values = torch.tensor([0.9, 0.1], dtype=torch.float64)
    q = logs([0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.25, 0.75])
    y = torch.tensor([1.0, 0.0, 1.0, 0.0])
    # Σ q_i (y − v_i)²: ½·0.01 + ½·0.81; ½·0.81 + ½·0.01; 1·0.01; ¼·0.81 + ¾·0.01
    expected = torch.tensor([0.41, 0.41, 0.01, 0.21], dtype=torch.float64)
    torch.testing.assert_close(brier(q, values, y), expected)


def test_terms_have_gradients_toward_the_goal():
    logits_c = torch.zeros(1, 3, requires_grad=True)
    logits_w = torch.zeros(1, 3, requires_grad=True)
    values = torch.tensor([0.0, 0.5, 1.0])
    lp_c, lp_w = torch.log_softmax(logits_c, -1), torch.log_softmax(logits_w, -1)
    mu_c, mu_w = lp_c.exp() @ values, lp_w.exp() @ values
    (margin_hinge(mu_c, mu_w).sum() + jsd_hinge(lp_c, lp_w).sum()).backward()
    # Descending the gradient raises the correct answer's top value and lowers the wrong one's.
    assert logits_c.grad[0, 2] < 0 < logits_c.grad[0, 0]
    assert logits_w.grad[0, 0] < 0 < logits_w.grad[0, 2]


def test_loss_weights():
    w = LossWeights()
    assert w.active() == ["lm", "jsd", "margin", "sum"] and w.pairwise
    assert LossWeights(jsd=0, margin=0, sum=0, brier=1).pairwise is False
    assert LossWeights(brier=1.0).active() == ["lm", "jsd", "margin", "sum", "brier"]
    with pytest.raises(CandorError, match="must be >= 0"):
        LossWeights(jsd=-1)
    with pytest.raises(CandorError, match="switched off"):
        LossWeights(lm=0, jsd=0, margin=0, sum=0, brier=0)


def test_the_jsd_hinge_starts_flat_where_both_answers_get_the_same_distribution():
    # Why the JSD term barely moves from an answer-blind model (benchmarks/README.md, issue 13): JSD is
    # second order in P − Q, so its gradient vanishes at P = Q and grows with the gap. The margin's does not.
    logits = torch.tensor([[0.3, -0.2, 1.0, 0.1]])
    grads = []
    for gap in (0.0, 0.01, 0.1, 1.0):
        p = logits.clone().requires_grad_(True)
        q = (logits + torch.tensor([[gap, 0.0, 0.0, -gap]])).detach()
        jsd_hinge(torch.log_softmax(p, -1), torch.log_softmax(q, -1)).sum().backward()
        grads.append(p.grad.abs().max().item())
    assert grads[0] == 0.0
    assert 0 < grads[1] < grads[2] < grads[3]
    assert grads[1] < 0.01 * grads[3]
    mu_c = torch.tensor([0.5], requires_grad=True)
    margin_hinge(mu_c, torch.tensor([0.5])).sum().backward()
    assert mu_c.grad.item() == -1.0
