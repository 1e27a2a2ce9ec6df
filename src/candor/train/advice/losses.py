"""The loss terms of ADVICE and ConfTuner, on confidence distributions over a format's labels.

See docs/methods.md "ADVICE and ConfTuner".

Every function takes log-probabilities ``[B, n]`` (rows summing to 1 in
probability) and returns a ``[B]`` tensor per example; the trainers average
over the batch. Natural logs throughout, so JSD ≤ ln 2.

- ``L_JSD = max(0, τ − JSD(P_c ‖ P_w))`` with τ = 0.6: the distributions for
  the correct and the wrong answer must differ.
- ``L_Margin = max(0, δ − (μ_c − μ_w))`` with δ = 1: the correct answer's
  expected confidence must be higher. With δ = 1 on the [0, 1] scale the
  hinge is active unless μ_c = 1 and μ_w = 0.
- ``L_Sum = |1 − (μ_c + μ_w)|``: the two confidences should add up to one.
- ConfTuner's tokenized Brier ``Σ_i q_i·(y − v_i)²``: q the distribution
  over the labels, v their values, y the answer's correctness.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from candor.util.errors import CandorError

JSD_TARGET = 0.6
MARGIN = 1.0


def _kl_to(log_p: torch.Tensor, log_m: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ M) per row; labels where P is 0 add nothing (0·log 0 = 0)."""
    p = log_p.exp()
    diff = torch.where(p > 0, log_p - log_m, torch.zeros_like(log_p))
    return (p * diff).sum(-1)


def jsd(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence per row, natural log: 0 for equal rows, ln 2 for disjoint ones."""
    log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - math.log(2.0)
    return 0.5 * _kl_to(log_p, log_m) + 0.5 * _kl_to(log_q, log_m)


def jsd_hinge(log_p: torch.Tensor, log_q: torch.Tensor, target: float = JSD_TARGET) -> torch.Tensor:
    """``max(0, target − JSD(P ‖ Q))`` per row."""
    return torch.clamp(target - jsd(log_p, log_q), min=0.0)


def margin_hinge(mu_correct: torch.Tensor, mu_wrong: torch.Tensor, delta: float = MARGIN) -> torch.Tensor:
    """``max(0, δ − (μ_c − μ_w))`` per row."""
    return torch.clamp(delta - (mu_correct - mu_wrong), min=0.0)


def sum_penalty(mu_correct: torch.Tensor, mu_wrong: torch.Tensor) -> torch.Tensor:
    """``|1 − (μ_c + μ_w)|`` per row."""
    return (1.0 - (mu_correct + mu_wrong)).abs()


def brier(log_q: torch.Tensor, values: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """ConfTuner's tokenized Brier score per row: ``Σ_i q_i·(y − v_i)²``."""
    gap = correct.to(log_q.dtype).unsqueeze(-1) - values.to(log_q.device, log_q.dtype).unsqueeze(0)
    return (log_q.exp() * gap.pow(2)).sum(-1)


@dataclass(frozen=True)
class LossWeights:
    """Which loss terms are on and how much each counts; a term with weight 0 is not computed.

    ``lm``: NLL of a_correct's answer tokens (ADVICE) or of the scored
    answer's tokens (ConfTuner, off by default). ``brier``: ConfTuner's loss,
    on its own (ConfTuner) or added to ADVICE's (ADVICE+ConfTuner).
    """

    lm: float = 1.0
    jsd: float = 1.0
    margin: float = 1.0
    sum: float = 1.0
    brier: float = 0.0
    jsd_target: float = JSD_TARGET
    margin_delta: float = MARGIN

    def __post_init__(self) -> None:
        for name in ("lm", "jsd", "margin", "sum", "brier"):
            if getattr(self, name) < 0:
                raise CandorError(f"loss weight {name} must be >= 0, got {getattr(self, name)}")
        if not any(getattr(self, name) > 0 for name in ("lm", "jsd", "margin", "sum", "brier")):
            raise CandorError("every loss term is switched off: nothing to train")

    @property
    def pairwise(self) -> bool:
        """Whether any term needs the (a_correct, a_wrong) pair."""
        return self.jsd > 0 or self.margin > 0 or self.sum > 0

    def active(self) -> list[str]:
        return [name for name in ("lm", "jsd", "margin", "sum", "brier") if getattr(self, name) > 0]

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
