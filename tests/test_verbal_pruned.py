"""The opt-in pruned label distribution (``min_mass``): kept scores exact, the stated bound on μ holds."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BlackBox

from candor.annotation.records import Record
from candor.backends.base import Completion, score_candidates
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.util.errors import CandorError
from candor.verbal.distribution import candidate_distribution, pruned_candidate_distribution, surface_forms
from candor.verbal.formats import expected_confidence, format_prompt, get_format, mu_error_bound

PERCENT = get_format("percent")
FORMS = [text for _, text in surface_forms(PERCENT.labels)]
ITEMS = [
    QAItem(id="q0", dataset="toy", split="test", question="Who wrote Hamlet?", answers=("Shakespeare",)),
    QAItem(id="q1", dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",)),
    QAItem(id="q2", dataset="toy", split="test", question="How many legs does a spider have?", answers=("eight",)),
]
ANSWERS = ["Shakespeare", "Paris", "eight legs, I believe"]


@pytest.fixture()
def prompts(tiny_backend):
    return [format_prompt(tiny_backend, it, a, PERCENT) for it, a in zip(ITEMS, ANSWERS, strict=True)]


@pytest.fixture()
def exact(tiny_backend, prompts):
    return score_candidates(tiny_backend, prompts, FORMS)


def test_a_tiny_bound_expands_everything(tiny_backend, prompts, exact):
    scores, unexpanded = tiny_backend.score_candidates_pruned(prompts, FORMS, 1e-30)
    np.testing.assert_allclose(scores, exact, atol=1e-4)
    assert (unexpanded == 0).all()


def test_kept_candidates_are_exact_and_the_unexpanded_mass_bounds_the_dropped(tiny_backend, prompts, exact):
    # A bound between the probabilities of the deeper nodes: some subtrees are expanded, others not.
    min_mass = float(np.median(np.exp(exact))) * 1e4
    scores, unexpanded = tiny_backend.score_candidates_pruned(prompts, FORMS, min_mass)
    dropped = np.isneginf(scores)
    assert dropped.any() and (~dropped).any()
    np.testing.assert_allclose(scores[~dropped], exact[~dropped], atol=1e-4)
    dropped_mass = np.where(dropped, np.exp(exact), 0.0).sum(axis=1)
    assert (unexpanded >= dropped_mass * (1 - 1e-4)).all() and (unexpanded > 0).all()


@pytest.mark.parametrize("scale", [1e2, 1e4, 1e6])
def test_mu_is_within_the_stated_bound_of_the_exact_mu(tiny_backend, prompts, exact, scale):
    min_mass = float(np.median(np.exp(exact))) * scale
    exact_mu = expected_confidence(candidate_distribution(tiny_backend, prompts, PERCENT.labels), PERCENT)
    dist, share = pruned_candidate_distribution(tiny_backend, prompts, PERCENT.labels, min_mass)
    np.testing.assert_allclose(dist.sum(1), 1.0, atol=1e-9)
    mu = expected_confidence(dist, PERCENT)
    bound = mu_error_bound(share, mu, PERCENT)
    assert (np.abs(mu - exact_mu) <= bound + 1e-6).all()
    assert ((share >= 0) & (share <= 1)).all()


def test_the_bound_by_hand():
    # μ = 0.3; labels span [0, 1]: the farthest value is 1.0, 0.7 away; a share of 0.1 moves μ at most 0.07.
    assert mu_error_bound(np.array([0.1]), np.array([0.3]), PERCENT)[0] == pytest.approx(0.07)
    assert mu_error_bound(np.array([0.0]), np.array([0.3]), PERCENT)[0] == 0.0


def record(item: QAItem, greedy: str) -> Record:
    return Record(item=item, greedy=Completion(text=greedy, logprobs=[-0.3]), samples=[])


def test_the_estimator_option_is_used_recorded_and_refused_where_it_cannot_run(tiny_backend, exact):
    recs = [record(it, a) for it, a in zip(ITEMS, ANSWERS, strict=True)]
    exact_est = get_estimator("verbal-percent")
    assert "min_mass" not in exact_est.describe()
    exact_mu = exact_est.estimate(recs, tiny_backend)
    min_mass = float(np.median(np.exp(exact))) * 1e4
    approx = get_estimator("verbal-percent", min_mass=min_mass)
    assert approx.describe()["min_mass"] == min_mass
    mu = approx.estimate(recs, tiny_backend)
    assert (approx.last_error_bound > 0).all() and not np.array_equal(mu, exact_mu)  # the option was used
    assert (np.abs(mu - exact_mu) <= approx.last_error_bound + 1e-6).all()
    with pytest.raises(CandorError, match="needs a backend with score_candidates_pruned"):
        approx.estimate(recs, BlackBox(tiny_backend))
    for bad in (-0.1, 1.0):
        with pytest.raises(CandorError, match="min_mass must be in"):
            get_estimator("verbal-percent", min_mass=bad)
    with pytest.raises(CandorError, match="min_mass must be in"):
        pruned_candidate_distribution(tiny_backend, ["x"], PERCENT.labels, 0.0)


def test_small_batches_and_few_nodes_per_pass_give_the_same_pruned_scores(tiny_backend, prompts, exact, monkeypatch):
    import candor.backends.engine.prefix_scoring as ps

    min_mass = float(np.median(np.exp(exact))) * 1e4
    whole, whole_unexpanded = tiny_backend.score_candidates_pruned(prompts, FORMS, min_mass)
    monkeypatch.setattr(ps, "MAX_BATCH_TOKENS", 40)  # one row per batch, a few nodes per pass
    split, split_unexpanded = tiny_backend.score_candidates_pruned(prompts, FORMS, min_mass)
    assert (np.isneginf(split) == np.isneginf(whole)).all()
    kept = ~np.isneginf(whole)
    np.testing.assert_allclose(split[kept], whole[kept], atol=1e-4)
    np.testing.assert_allclose(split_unexpanded, whole_unexpanded, rtol=1e-3)
