"""Diagnostics without a model: candidates, JSD, correlations, rollout algebra, token regions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.diagnose import DiagnoseConfig, build_candidates
from candor.diagnose.attribution import AttributionExample, AttributionResult
from candor.diagnose.candidates import CandidateSet
from candor.diagnose.regions import ANSWER, BOS, QUESTION, REGIONS, TEMPLATE, prompt_regions
from candor.diagnose.rollout import attention_rollout
from candor.diagnose.runner import spread
from candor.diagnose.sensitivity import (
    QuestionSensitivity,
    SensitivityResult,
    jensen_shannon,
    pairwise_jsd,
    pearson,
    within_question_correlation,
)
from candor.util.errors import CandorError


def _record(qid: str, dataset: str, question: str, gold: list[str], greedy: str, samples: list[str]) -> Record:
    item = QAItem(id=qid, dataset=dataset, split="test", question=question, answers=tuple(gold))
    return Record(item=item, greedy=Completion(greedy), samples=[Completion(s) for s in samples])


# ---------------------------------------------------------------- JSD


def test_jsd_matches_scipy_squared_natural_log():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(10), size=50)
    q = rng.dirichlet(np.ones(10), size=50)
    p[:5, :3] = 0.0  # zeros: 0·log 0 = 0
    p /= p.sum(1, keepdims=True)
    ours = jensen_shannon(p, q)
    reference = np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, q, strict=True)])
    np.testing.assert_allclose(ours, reference, rtol=1e-10, atol=1e-12)


def test_jsd_bounds_identical_zero_disjoint_ln2():
    assert jensen_shannon([0.2, 0.8], [0.2, 0.8]) == pytest.approx(0.0)
    assert jensen_shannon([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2))


def test_pairwise_jsd_order_and_count():
    dist = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    pairs = pairwise_jsd(dist)
    assert len(pairs) == 6
    # (0,1) disjoint, (0,2) identical, (0,3) = JSD([1,0],[.5,.5])
    assert pairs[0] == pytest.approx(math.log(2))
    assert pairs[1] == pytest.approx(0.0)
    assert pairs[2] == pytest.approx(jensenshannon([1, 0], [0.5, 0.5]) ** 2)


def _question(mu, correct, dist=None) -> QuestionSensitivity:
    mu = np.asarray(mu, dtype=float)
    dist = np.stack([1 - mu, mu], axis=1) if dist is None else dist
    return QuestionSensitivity(
        item_id="q",
        dataset="d",
        answers=[str(i) for i in range(len(mu))],
        correct=np.asarray(correct),
        distributions=dist,
        mu=mu,
        jsd=pairwise_jsd(dist),
    )


def test_sensitivity_summary_hand_computed():
    # Question 1: three identical rows (3 pairs at 0); question 2: two disjoint rows (1 pair at ln 2).
    q1 = _question([0.5, 0.5, 0.5], [0, 1, 0])
    q2 = _question([0.0, 1.0], [0, 1])
    s = SensitivityResult("number", [q1, q2]).summary()
    assert s["n_pairs"] == 4
    assert s["share_jsd_le_0.1"] == pytest.approx(0.75)
    assert s["mean_jsd"] == pytest.approx(math.log(2) / 4)
    mu, correct = [0.5, 0.5, 0.5, 0.0, 1.0], [0, 1, 0, 0, 1]
    assert s["corr_mu_correct"] == pytest.approx(np.corrcoef(mu, correct)[0, 1])
    # q1 has constant μ and is skipped; q2 is perfectly correlated.
    assert s["within_question_corr_mu_correct"] == pytest.approx(1.0)
    assert s["auroc_mu_correct"] == pytest.approx(5 / 6)


def test_correlations_undefined_are_nan():
    assert math.isnan(pearson([0.3, 0.3, 0.3], [0, 1, 0]))
    assert math.isnan(pearson([0.1, 0.9], [1, 1]))
    assert math.isnan(within_question_correlation([_question([0.2, 0.9], [1, 1])]))


def test_sensitivity_roundtrip_recomputes_jsd():
    q = _question([0.1, 0.7, 0.4], [1, 0, 0])
    back = SensitivityResult.from_dict(SensitivityResult("number", [q]).to_dict())
    np.testing.assert_allclose(back.questions[0].jsd, q.jsd, atol=1e-6)
    assert back.questions[0].correct.tolist() == [1, 0, 0]


# ---------------------------------------------------------------- candidates


def _pool() -> list[Record]:
    return [
        _record(
            "a", "nq", "capital of france", ["Paris", "City of Paris"], "Paris", ["paris.", "Lyon", "", "The Paris"]
        ),
        _record("b", "nq", "capital of italy", ["Rome"], "Milan", ["Rome"]),
        _record("c", "nq", "capital of spain", ["Madrid"], "Madrid", []),
        _record("d", "hq", "who wrote hamlet", ["Shakespeare"], "Marlowe", []),
    ]


def test_candidates_order_dedup_sources_and_labels():
    sets = build_candidates(_pool(), max_candidates=30, seed=0)
    first = sets[0]
    # "paris." and "The Paris" normalize to "paris"; the empty sample is dropped.
    assert first.answers[:3] == ("Paris", "Lyon", "City of Paris")
    assert first.sources[:3] == ("greedy", "sample", "gold")
    assert first.correct[:3] == (1, 0, 1)
    borrowed = [a for a, s in zip(first.answers, first.sources, strict=True) if s == "borrowed"]
    # Same dataset first (nq: Milan, Rome, Madrid in some order), then the other dataset.
    assert set(borrowed[:3]) == {"Milan", "Rome", "Madrid"}
    assert set(borrowed[3:]) == {"Marlowe", "Shakespeare"}
    assert all(c == 0 for a, c in zip(first.answers, first.correct, strict=True) if a in borrowed)
    assert len({a.lower() for a in first.answers}) == len(first.answers)


def test_candidates_cap_seed_and_pool_order():
    pool = _pool()
    capped = build_candidates(pool, max_candidates=4)
    assert [len(c) for c in capped] == [4, 4, 4, 4]
    again = build_candidates(list(reversed(pool)), max_candidates=30, seed=0)
    assert {c.item.id: c.answers for c in again} == {c.item.id: c.answers for c in build_candidates(pool)}

    def own(sets):
        return [[a for a, s in zip(c.answers, c.sources, strict=True) if s != "borrowed"] for c in sets]

    assert own(build_candidates(pool, seed=1)) == own(build_candidates(pool, seed=0))


def test_candidates_errors_and_roundtrip():
    with pytest.raises(CandorError, match="at least 2"):
        build_candidates(_pool(), max_candidates=1)
    with pytest.raises(CandorError, match="unknown correctness judge"):
        build_candidates(_pool(), judge="nope")
    c = build_candidates(_pool())[1]
    assert CandidateSet.from_dict(c.to_dict()) == c
    with pytest.raises(CandorError, match="differ in length"):
        CandidateSet(c.item, ("a", "b"), (1,), ("greedy", "sample"))


def test_spread_balances_datasets_and_spaces_evenly():
    sets = build_candidates(_pool())  # a, b, c from nq; d from hq
    assert [c.item.id for c in spread(sets, 2)] == ["a", "d"]
    assert [c.item.id for c in spread(sets, 3)] == ["a", "b", "d"]  # nq gets 2 of 3: positions 0 and int(1.5)
    assert len(spread(sets, None)) == 4 and len(spread(sets, 9)) == 4
    assert spread(sets, 0) == []
    many = [
        CandidateSet(
            QAItem(id=f"{d}{i}", dataset=d, split="test", question="q", answers=("x",)), ("x",), (1,), ("gold",)
        )
        for i in range(20)
        for d in ("nq", "hq", "2wiki", "pararel")
    ]
    picked = spread(many, 10)
    # 10 over 4 datasets of 20: the first two get 3, the others 2, evenly spaced within each.
    assert [c.item.id for c in picked if c.item.dataset == "hq"] == ["hq0", "hq6", "hq13"]
    assert [c.item.id for c in picked if c.item.dataset == "pararel"] == ["pararel0", "pararel10"]
    assert len(picked) == 10


def test_config_rejects_unknown_stage():
    with pytest.raises(CandorError, match="unknown diagnose stage"):
        DiagnoseConfig(stages=("sensitivity", "saliency"))


# ---------------------------------------------------------------- rollout algebra


def test_rollout_two_layers_hand_computed():
    import torch

    a1 = torch.tensor([[[1.0, 0.0], [0.6, 0.4]], [[1.0, 0.0], [0.2, 0.8]]])  # 2 heads → mean [[1,0],[.4,.6]]
    a2 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    r = attention_rollout([a1, a2])
    m1 = np.array([[1.0, 0.0], [0.2, 0.8]])  # 0.5·mean + 0.5·I
    m2 = np.array([[1.0, 0.0], [0.5, 0.5]])
    np.testing.assert_allclose(r.numpy(), m2 @ m1)
    np.testing.assert_allclose(r.sum(-1).numpy(), 1.0)


def test_rollout_rejects_bad_shapes():
    import torch

    with pytest.raises(CandorError, match="at least one layer"):
        attention_rollout([])
    with pytest.raises(CandorError, match=r"\[heads, T, T\]"):
        attention_rollout([torch.ones(1, 2, 3, 3)])


# ---------------------------------------------------------------- token regions


def test_regions_on_the_real_tokenizer(tokenizer):
    item = QAItem(id="x", dataset="nq", split="test", question="who wrote hamlet", answers=("Shakespeare",))
    r = prompt_regions(tokenizer, item, " William Shakespeare ", "number")
    assert r.prompt.endswith("Answer: William Shakespeare\nConfidence:")
    assert r.roles[0] == BOS
    assert tokenizer.decode([i for i, k in zip(r.ids, r.roles, strict=True) if k == QUESTION]).strip() == (
        "who wrote hamlet"
    )
    start, end = r.answer_span
    assert tokenizer.decode(r.ids[start:end]).strip() == "William Shakespeare"
    assert (r.roles[start:end] == ANSWER).all() and r.roles[-1] == TEMPLATE
    mass = r.mass(np.ones(len(r.ids)))
    assert mass["bos"] == 1 and mass["answer"] == end - start and sum(mass.values()) == len(r.ids)


# ---------------------------------------------------------------- attribution bookkeeping


def test_attribution_ranks_by_magnitude():
    roles = np.array([BOS, TEMPLATE, QUESTION, ANSWER, ANSWER, TEMPLATE])
    scores = np.array([0.05, -0.4, 0.1, -0.2, 0.3, 0.01])
    ex = AttributionExample(
        item_id="q",
        answer="a",
        tokens=list("abcdef"),
        roles=roles,
        scores=scores,
        mu_input=0.6,
        mu_baseline=0.5,
        delta=0.0,
    )
    assert ex.ranking().tolist() == [1, 4, 3, 2, 0, 5]
    assert ex.first_answer_rank == 3  # token 3 (|−0.2|) is third
    assert [t["index"] for t in ex.top(2)] == [1, 4]
    shares = ex.region_shares()
    assert shares["answer"] == pytest.approx(0.5 / 1.06)
    assert sum(shares.values()) == pytest.approx(1.0)
    back = AttributionExample.from_dict(ex.to_dict())
    assert back.first_answer_rank == 3 and [REGIONS[k] for k in back.roles][3] == "answer"

    # A second example whose answer token leads the ranking; deltas 0.02 and 0.1 on gaps 0.1 and 0.2.
    ex2 = AttributionExample(
        item_id="q2",
        answer="b",
        tokens=list("ab"),
        roles=np.array([BOS, ANSWER]),
        scores=np.array([0.1, 0.2]),
        mu_input=0.3,
        mu_baseline=0.1,
        delta=0.1,
    )
    ex.delta = 0.02
    s = AttributionResult(8, [ex, ex2]).summary(top_k=1)
    assert s["mean_first_answer_rank"] == pytest.approx(2.0)
    assert s["share_first_answer_in_top1"] == pytest.approx(0.5)
    assert s["mean_abs_delta"] == pytest.approx(0.06)
    assert s["median_delta_over_gap"] == pytest.approx(0.35)
    assert s["abs_attribution_share"]["answer"] == pytest.approx((0.5 / 1.06 + 2 / 3) / 2)
