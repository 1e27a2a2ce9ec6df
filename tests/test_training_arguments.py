"""The shared training plumbing: the learning-rate schedule the trainers actually get."""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer

from candor.train.common import training_arguments, warmup_settings
from candor.util.errors import CandorError


def scheduled_learning_rates(tmp_path, warmup_ratio: float, steps: int, lr: float = 1e-3) -> list[float]:
    """The learning rate the scheduler gives at each of the first ``steps`` optimizer steps."""
    args = training_arguments(tmp_path, learning_rate=lr, epochs=1, batch_size=1, warmup_ratio=warmup_ratio)
    trainer = Trainer(model=torch.nn.Linear(2, 1), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    return rates


def test_the_learning_rate_rises_over_the_warmup_ratio_then_decays(tmp_path):
    # 0.3 of 10 steps: 3 warmup steps (0, 1/3, 2/3 of the peak), the peak at step 3, then linear decay to 0.
    rates = scheduled_learning_rates(tmp_path, warmup_ratio=0.3, steps=10)
    assert rates[:4] == pytest.approx([0.0, 1e-3 / 3, 2e-3 / 3, 1e-3])
    assert all(a > b for a, b in zip(rates[3:], rates[4:], strict=False))
    assert rates[-1] == pytest.approx(1e-3 / 7)


def test_no_warmup_starts_at_the_peak(tmp_path):
    assert scheduled_learning_rates(tmp_path, warmup_ratio=0.0, steps=4)[0] == pytest.approx(1e-3)


def test_the_ratio_goes_where_the_installed_transformers_reads_it():
    from dataclasses import dataclass

    @dataclass
    class ArgumentsWithRatio:  # the field set of transformers 4.x: a ratio field and an integer step count
        warmup_steps: int = 0
        warmup_ratio: float = 0.0

    @dataclass
    class ArgumentsWithoutRatio:  # transformers 5: warmup_steps below 1 is a ratio
        warmup_steps: float = 0

    assert warmup_settings(0.1, ArgumentsWithRatio) == {"warmup_ratio": 0.1}
    assert warmup_settings(0.1, ArgumentsWithoutRatio) == {"warmup_steps": 0.1}
    with pytest.raises(CandorError, match="warmup_ratio"):
        warmup_settings(1.5)
