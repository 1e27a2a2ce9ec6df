"""Claim-level estimators against hand computations, and claim evaluation (bootstrap by answer, refinement)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from candor.annotation.claims import Claim
from candor.backends.base import Completion
from candor.estimators.claim_base import ClaimContext
from candor.estimators.claim_ccp import CONTRA, ENTAIL, NEUTRAL, combine, token_ccp_log
from candor.estimators.claim_scoring import claim_estimator_names, get_claim_estimator, score_claims
from candor.evaluation.claims import (
    claim_metrics,
    cluster_resamples,
    paired_gap,
    precision_at_kept,
    refinement_curve,
)
from candor.util.errors import CandorError

TOKENS = [" Paris", " is", " in", " France", ".", " Rome", " is", " big", "."]
LOGPROBS = [-0.1, -0.2, -0.3, -0.4, -0.05, -2.0, -0.5, -1.5, -0.01]
TOPS = [
    {" Paris": -0.1, " Lyon": -2.5, " paris": -3.0, ",": -4.0},
    {" is": -0.2, " was": -1.8},
    {" in": -0.3, " at": -1.4},
    {" France": -0.4, " Europe": -1.2, " Spain": -2.2},
    {".": -0.05, "!": -3.0},
    {" Rome": -2.0, " Milan": -0.9, " rome": -1.0},
    {" is": -0.5},
    {" big": -1.5, " large": -0.6, " small": -1.7},
    {".": -0.01},
]
TEXT = "Paris is in France. Rome is big."
CLAIMS = [
    Claim(text="Paris is in France.", start=0, end=19, tokens=[0, 1, 2, 3, 4]),
    Claim(text="Rome is big.", start=20, end=32, tokens=[5, 6, 7, 8]),
]


def answer() -> Completion:
    return Completion(text=TEXT, token_ids=list(range(9)), tokens=TOKENS, logprobs=LOGPROBS, top_logprobs=TOPS)


def test_every_builtin_claim_estimator_is_registered():
    assert set(claim_estimator_names()) >= {
        "claim-prob",
        "claim-perplexity",
        "claim-max-entropy",
        "claim-ccp",
        "claim-ptrue",
        "claim-consistency",
    }


def test_token_reductions_equal_hand_computations():
    first, second = LOGPROBS[:5], LOGPROBS[5:]
    assert score_claims("claim-prob", answer(), CLAIMS) == pytest.approx([math.exp(sum(first)), math.exp(sum(second))])
    assert score_claims("claim-perplexity", answer(), CLAIMS) == pytest.approx(
        [math.exp(sum(first) / 5), math.exp(sum(second) / 4)]
    )


def test_a_claim_with_no_tokens_or_a_token_past_the_end_is_refused():
    with pytest.raises(CandorError, match="rests on no token"):
        score_claims("claim-prob", answer(), [Claim(text="x", start=0, end=1, tokens=[])])
    with pytest.raises(CandorError, match="past the answer's end"):
        score_claims("claim-prob", answer(), [Claim(text="x", start=0, end=1, tokens=[42])])


def test_max_entropy_needs_the_prompt_and_a_model():
    with pytest.raises(CandorError, match="needs a model backend"):
        score_claims("claim-max-entropy", answer(), CLAIMS, prompt="Q")
    with pytest.raises(CandorError, match="pass the answer's prompt"):
        score_claims("claim-max-entropy", answer(), CLAIMS, backend=object())  # type: ignore[arg-type]


def test_ccp_equals_the_formula_by_hand_with_a_lexical_judge():
    # The lexical judge finds no pair of distinct words equivalent, so every distinct alternative is a
    # contradiction; case-only variants ("paris", "rome") are entailed without asking; "," has no word
    # (neutral); function words ("is", "in") and "." count as entailed (CCP 1).
    values = score_claims("claim-ccp", answer(), CLAIMS, judge="lexical")

    def token(greedy: float, entail: list[float], contra: list[float]) -> float:
        e = np.logaddexp.reduce([greedy, *entail])
        return float(np.exp(e - np.logaddexp.reduce([greedy, *entail, *contra])))

    paris = token(-0.1, [-3.0], [-2.5])  # " paris" entailed, " Lyon" contradicts, "," neutral
    france = token(-0.4, [], [-1.2, -2.2])
    rome = token(-2.0, [-1.0], [-0.9])
    big = token(-1.5, [], [-0.6, -1.7])
    assert values == pytest.approx([paris * france, rome * big])


def test_ccp_combines_directions_as_lm_polygraph_does():
    assert combine(ENTAIL, ENTAIL) == ENTAIL
    assert combine(ENTAIL, CONTRA) == NEUTRAL
    assert combine(NEUTRAL, CONTRA) == CONTRA
    assert combine(ENTAIL, NEUTRAL) == ENTAIL
    assert combine(NEUTRAL, NEUTRAL) == NEUTRAL
    alts = [("a", -0.1), ("b", -1.0), ("c", -2.0)]
    assert token_ccp_log(alts, [ENTAIL, CONTRA, NEUTRAL]) == pytest.approx(-0.1 - np.logaddexp(-0.1, -1.0))


def test_ccp_refuses_answers_without_alternatives_and_an_llm_judge_without_a_model():
    bare = Completion(text=TEXT, token_ids=list(range(9)), tokens=TOKENS, logprobs=LOGPROBS)
    with pytest.raises(CandorError, match="top-k alternatives"):
        score_claims("claim-ccp", bare, CLAIMS, judge="lexical")
    with pytest.raises(CandorError, match="pass backend="):
        get_claim_estimator("claim-ccp")


def test_claim_consistency_counts_the_samples_with_an_equivalent_sentence():
    samples = [
        Completion(text="Paris is in France. The Tiber flows north."),
        Completion(text="Berlin lies on the Spree river."),
        Completion(text="rome is big!"),
    ]
    values = score_claims("claim-consistency", answer(), CLAIMS, samples=samples, judge="lexical")
    assert values == pytest.approx([1 / 3, 1 / 3])
    with pytest.raises(CandorError, match="needs 1 sampled answers"):
        score_claims("claim-consistency", answer(), CLAIMS, judge="lexical")


def test_an_answer_without_claims_gets_an_empty_array():
    est = get_claim_estimator("claim-prob")
    ctx = [
        ClaimContext(prompt="", question="", answer=answer(), claims=[]),
        ClaimContext(prompt="", question="", answer=answer(), claims=CLAIMS),
    ]
    out = est.estimate(ctx)
    assert len(out[0]) == 0 and len(out[1]) == 2


# ---------------------------------------------------------------- evaluation


def test_resamples_draw_whole_answers():
    groups = np.array(["a", "a", "a", "b", "c", "c"])
    for idx in cluster_resamples(groups, 50, seed=1):
        drawn = groups[idx]
        for name, size in (("a", 3), ("b", 1), ("c", 2)):
            assert (drawn == name).sum() % size == 0  # an answer comes with all its claims, or not at all
        assert len(np.unique(idx[groups[idx] == "a"])) in (0, 3)


def test_claim_metrics_value_matches_sklearn_and_intervals_are_by_answer():
    rng = np.random.default_rng(0)
    conf = rng.uniform(size=60)
    y = (rng.uniform(size=60) < conf).astype(int)
    groups = [f"ans{i // 3}" for i in range(60)]
    out = claim_metrics(conf, y, groups, bootstrap=200, seed=0)
    assert out["auroc"]["value"] == pytest.approx(roc_auc_score(y, conf))
    lo, hi = out["auroc"]["ci"]
    assert lo < out["auroc"]["value"] < hi
    # The same values with every claim its own answer give a different (claim-level) interval.
    per_claim = claim_metrics(conf, y, [str(i) for i in range(60)], bootstrap=200, seed=0)
    assert per_claim["auroc"]["ci"] != out["auroc"]["ci"]
    assert set(out) == {"auroc", "ece", "prr", "aurc"}
    with pytest.raises(CandorError, match="unknown claim metric"):
        claim_metrics(conf, y, groups, metrics=["f1"])
    with pytest.raises(CandorError, match="60 confidences, 59 labels"):
        claim_metrics(conf, y[:59], groups)


def test_refinement_curve_by_hand():
    conf = [0.9, 0.8, 0.8, 0.3, 0.1]
    y = [1, 1, 0, 0, 1]
    curve = refinement_curve(conf, y)
    assert curve["threshold"] == [0.9, 0.8, 0.3, 0.1]
    assert curve["kept"] == pytest.approx([0.2, 0.6, 0.8, 1.0])
    assert curve["precision"] == pytest.approx([1.0, 2 / 3, 0.5, 0.6])
    at = precision_at_kept(conf, y, ["a", "a", "b", "b", "c"], shares=(0.5, 0.75), bootstrap=0)
    assert at["100%"]["value"] == pytest.approx(0.6)
    assert at["50%"]["value"] == pytest.approx(2 / 3)  # the threshold 0.8 keeps 60% >= 50%
    assert at["75%"]["value"] == pytest.approx(0.5)
    with pytest.raises(CandorError, match=r"in \(0, 1\]"):
        precision_at_kept(conf, y, ["a"] * 5, shares=(1.5,), bootstrap=0)


def test_paired_gap_is_the_difference_of_the_two_metrics():
    rng = np.random.default_rng(3)
    c1, c2 = rng.uniform(size=40), rng.uniform(size=40)
    y1, y2 = (rng.uniform(size=40) < c1).astype(int), (rng.uniform(size=40) < 0.5).astype(int)
    g = [f"p{i // 2}" for i in range(40)]
    gap = paired_gap((c1, y1, g), (c2, y2, g), "auroc", bootstrap=200)
    assert gap["value"] == pytest.approx(roc_auc_score(y1, c1) - roc_auc_score(y2, c2))
    assert gap["ci"][0] < gap["value"] < gap["ci"][1]


def test_claim_max_entropy_equals_a_direct_forward_pass(tiny_backend, tiny_model):
    import torch

    from candor.annotation.claim_split import split_claims
    from candor.backends.base import SamplingParams

    prompt = "Question: who wrote Hamlet?\nAnswer:"
    answer_ = tiny_backend.generate([prompt], 0, SamplingParams(max_new_tokens=10), greedy=True)[0].greedy
    claims = [
        Claim(text="a", start=0, end=1, tokens=[0, 1, 2]),
        Claim(text="b", start=1, end=2, tokens=list(range(3, len(answer_.token_ids)))),
    ]
    values = score_claims("claim-max-entropy", answer_, claims, tiny_backend, prompt=prompt)
    ids = tiny_backend.encode([prompt])[0] + list(answer_.token_ids)
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(torch.tensor([ids])).logits[0].double(), -1)
    start = len(ids) - len(answer_.token_ids) - 1
    entropy = -(logp.exp() * logp).sum(-1)[start : start + len(answer_.token_ids)].numpy()
    assert values == pytest.approx([math.exp(-entropy[c.tokens].max()) for c in claims], abs=1e-6)
    # the sentence splitter maps claims onto this answer's tokens through the backend's decode
    assert all(c.tokens for c in split_claims(answer_.text, answer_, decode=tiny_backend.decode) if c.text.strip())
