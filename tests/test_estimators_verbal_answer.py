"""The verbalized answer-level estimators (``verbal-<format>``, ``-prompting``): μ of the greedy answer."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MC, OPEN, BlackBox

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.verbal.formats import (
    confidence_distribution,
    distribution_from_prompts,
    expected_confidence,
    format_prompt,
    get_format,
)


def record(item: QAItem, greedy: str) -> Record:
    return Record(item=item, greedy=Completion(text=greedy, logprobs=[-0.3]), samples=[])


def test_verbalized_estimator_scores_the_greedy_answer(tiny_backend):
    recs = [record(OPEN, " Shakespeare\n"), record(MC, "(B) Paris")]
    est = get_estimator("verbal-text-prompting")
    assert (est.name, est.level, est.variant) == ("verbal-text-prompting", "answer", "prompting")
    out = est.estimate(recs, tiny_backend)
    dist = confidence_distribution(tiny_backend, [OPEN, MC], ["Shakespeare", "B"], "text", "prompting")
    np.testing.assert_allclose(out, expected_confidence(dist, "text"), rtol=1e-6)
    assert est.last_fallbacks == 0


def test_black_box_backends_parse_generated_confidence(tiny_backend):
    recs = [record(OPEN, "Shakespeare"), record(MC, "B")]
    blind = BlackBox(tiny_backend)
    prompts = [format_prompt(blind, OPEN, "Shakespeare", "letter"), format_prompt(blind, MC, "B", "letter")]
    dist, failures = distribution_from_prompts(blind, prompts, "letter")
    uniform = np.isclose(dist, 0.2).all(1)
    one_hot = (dist.max(1) == 1.0) & (dist.sum(1) == 1.0)
    assert (uniform | one_hot).all()
    assert failures == int(uniform.sum())
    # The parse agrees with the greedy replies.
    replies = [
        g.greedy.text
        for g in tiny_backend.generate(
            prompts, 0, __import__("candor").backends.base.SamplingParams(max_new_tokens=8, stop=("\n",))
        )
    ]
    for row, reply in zip(dist, replies, strict=True):
        index = get_format("letter").parse(reply)
        assert (index is None and np.allclose(row, 0.2)) or row[index] == 1.0
    est = get_estimator("verbal-letter")
    out = est.estimate(recs, blind)
    np.testing.assert_allclose(out, expected_confidence(dist, "letter"))
    assert est.last_fallbacks == failures


@pytest.mark.integration
def test_real_model_gives_proper_distributions(smollm_dir):
    from candor.backends.hf import HFBackend

    backend = HFBackend.from_pretrained(str(smollm_dir))
    recs = [record(OPEN, "William Shakespeare"), record(MC, "B")]
    for key in ("letter", "percent"):
        est = get_estimator(f"verbal-{key}")
        mu = est.estimate(recs, backend)
        assert ((mu > 0) & (mu < 1)).all()
        np.testing.assert_allclose(est.last_distribution.sum(1), 1.0)
