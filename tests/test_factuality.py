"""Conformal factuality (candor.serve.factuality): the claim threshold against plain-loop references, the
refusals with the dev size needed, and the guarantees simulated over 1,000 seeded draws of dev and test answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from candor.cli import app
from candor.serve import factuality as fa
from candor.serve import thresholds as th
from candor.serve.honest_folder import read_folder
from candor.util.errors import CandorError

# ---------------------------------------------------------------- plain-loop references


def reference_threshold(answers: list[list[tuple[float, bool]]], alpha: float, delta: float | None) -> float:
    """The rule written out: scan every candidate threshold, from removing everything down to keeping everything.

    conformal: the smallest candidate t that cleans at least ⌈(n + 1)(1 − α)⌉ answers; risk: going down from the
    top, the last t whose count of answers still holding a false claim passes the binomial test at δ.
    """
    n = len(answers)
    scores = [max((v for v, false in a if false), default=-math.inf) for a in answers]
    candidates = sorted({0.0, *(math.nextafter(s, math.inf) for s in scores if s > -math.inf)}, reverse=True)
    chosen = None
    for t in candidates:
        dirty = sum(1 for s in scores if s >= t)
        if delta is None:
            ok = n - dirty >= math.ceil((n + 1) * (1 - alpha) - 1e-9)
        else:
            ok = th.binomial_pvalue(dirty, n, alpha) <= delta
        if not ok:
            break
        chosen = t
    assert chosen is not None
    return chosen


def random_answers(rng: np.random.Generator, n: int, ties: bool) -> list[list[tuple[float, bool]]]:
    out = []
    for _ in range(n):
        m = int(rng.integers(2, 6))
        values = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], m) if ties else rng.random(m)
        out.append([(float(v), bool(rng.random() < 0.25)) for v in values])
    return out


def as_rows(answers: list[list[tuple[float, bool]]], method: str = "claim-prob") -> list[dict]:
    return [
        {"id": f"a{i}#{j}", "answer": f"a{i}", "correct": int(not false), "failure": None, "confidence": {method: v}}
        for i, a in enumerate(answers)
        for j, (v, false) in enumerate(a)
    ]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(("alpha", "delta"), [(0.1, None), (0.3, None), (0.1, 0.1), (0.2, 0.05)])
def test_the_threshold_is_the_rule_written_as_a_loop(ties, alpha, delta):
    rng = np.random.default_rng(7)
    for _ in range(20):
        answers = random_answers(rng, int(rng.integers(40, 120)), ties)
        g = fa.tune(fa.labelled_claims(as_rows(answers), "claim-prob"), "claim-prob", alpha, delta)
        assert g.threshold == reference_threshold(answers, alpha, delta)
        assert g.rule == ("conformal" if delta is None else "risk") and g.n_dev == len(answers)
        without_false = np.mean([all(v < g.threshold for v, false in a if false) for a in answers])
        assert g.dev_without_false == pytest.approx(without_false)


def test_a_threshold_above_a_false_claim_of_confidence_one_removes_every_claim():
    answers = [[(1.0, True), (1.0, False)]] * 30
    g = fa.tune(fa.labelled_claims(as_rows(answers), "claim-prob"), "claim-prob", 0.1)
    assert g.threshold == th.ABSTAIN_ALL and g.dev_claims_kept == 0.0 and g.dev_without_false == 1.0


def test_answers_without_a_false_claim_keep_every_claim():
    answers = [[(0.0, False), (0.3, False)]] * 30
    g = fa.tune(fa.labelled_claims(as_rows(answers), "claim-prob"), "claim-prob", 0.1)
    assert g.threshold == 0.0 and g.dev_claims_kept == 1.0


def test_unlabelled_claims_count_false_and_answers_of_one_claim_are_left_out():
    rows = as_rows([[(0.9, False), (0.2, False)]] * 30)
    rows += [{"answer": "single", "correct": 0, "failure": None, "confidence": {"claim-prob": 0.99}}]
    rows[0]["correct"] = None  # unlabelled: its 0.9 now counts as a false claim's confidence
    rows[2] |= {"correct": 1, "failure": "echo"}  # a failure mode counts false even when a label is there
    claims = fa.labelled_claims(rows, "claim-prob")
    assert claims.n_answers == 30 and claims.counts == {"one_claim_answers": 1, "unlabelled_claims_counted_false": 2}
    assert list(claims.scores()[:2]) == [0.9, 0.9] and set(claims.scores()[2:]) == {-math.inf}


@pytest.mark.parametrize(("alpha", "delta"), [(0.1, None), (0.2, None), (0.05, None), (0.1, 0.1), (0.1, 0.05)])
def test_too_few_dev_answers_are_refused_with_the_size_needed(alpha, delta):
    needed = fa.needed_dev(alpha, delta)
    assert needed == (math.ceil((1 - alpha) / alpha) if delta is None else th.min_evidence(alpha, delta))
    fa.rank_for(needed, alpha, delta)  # enough
    with pytest.raises(CandorError, match=f"needs at least {needed}"):
        fa.rank_for(needed - 1, alpha, delta)


def test_a_saved_guarantee_reads_back_and_a_bad_one_is_refused():
    g = fa.tune(fa.labelled_claims(as_rows(random_answers(np.random.default_rng(1), 50, False)), "claim-prob"),
                "claim-prob", 0.2, 0.1)  # fmt: skip
    assert fa.FactualityGuarantee.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    assert "probability ≥ 0.9 over the 50 dev answers" in g.statement and g.describe()["delta"] == 0.1
    with pytest.raises(CandorError, match="not a saved factuality guarantee"):
        fa.FactualityGuarantee.from_dict({"alpha": 0.1})
    with pytest.raises(CandorError, match="delta exactly when"):
        fa.FactualityGuarantee.from_dict(g.to_dict() | {"rule": "conformal"})
    assert fa.tuned_at([g], "claim-prob", 0.2) is g
    with pytest.raises(
        CandorError, match=r"no factuality guarantee for claim-prob at alpha=0.1 \(tuned: claim-prob at"
    ):
        fa.tuned_at([g], "claim-prob", 0.1)


# ---------------------------------------------------------------- simulation over seeded draws

DRAWS, N_DEV, N_TEST, MOST_CLAIMS = 1000, 200, 200, 6


def synthetic_scores(rng: np.random.Generator, draws: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(draws, n)`` answers of 2–6 claims, each false with the answer's own chance; false claims less confident.

    Returns each answer's score (its most confident false claim, -inf without one) and its claims' confidences,
    ``(draws, n, 6)`` with NaN past its last claim.
    """
    claims = rng.integers(2, MOST_CLAIMS + 1, (draws, n, 1))
    present = np.arange(MOST_CLAIMS) < claims
    false = (rng.random((draws, n, MOST_CLAIMS)) < rng.beta(2, 5, (draws, n, 1))) & present
    values = np.where(false, rng.beta(2, 4, false.shape), rng.beta(5, 2, false.shape))
    scores = np.where(false, values, -np.inf).max(axis=-1)
    return scores, np.where(present, values, np.nan)


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3])
def test_split_conformal_covers_one_minus_alpha_over_1000_draws(alpha):
    rng = np.random.default_rng(int(alpha * 100))
    dev, _ = synthetic_scores(rng, DRAWS, N_DEV)
    test, test_values = synthetic_scores(rng, DRAWS, N_TEST)  # fresh answers for each draw
    thresholds = fa.threshold_at_rank(dev, fa.rank_for(N_DEV, alpha))
    covered = test < thresholds[:, None]  # the refined test answer holds no false claim
    coverage = covered.mean()
    k = fa.conformal_rank(N_DEV, alpha)
    assert coverage >= 1 - alpha - 0.01, coverage
    # Not vacuous: with continuous scores above the ties at -inf, coverage is at most (k + 1) / (n + 1).
    assert coverage <= (k + 1) / (N_DEV + 1) + 0.01, coverage
    kept = np.nanmean(np.where(np.isnan(test_values), np.nan, test_values >= thresholds[:, None, None]))
    assert 0.05 < kept < 0.95, kept  # the threshold removes some claims and keeps others


@pytest.mark.parametrize(("alpha", "delta"), [(0.1, 0.1), (0.2, 0.05)])
def test_risk_control_holds_at_one_minus_delta_over_1000_draws(alpha, delta):
    rng = np.random.default_rng(11)
    population, _ = synthetic_scores(rng, 1, 400_000)
    population = np.sort(population[0])
    dev, _ = synthetic_scores(rng, DRAWS, N_DEV)
    thresholds = fa.threshold_at_rank(dev, fa.rank_for(N_DEV, alpha, delta))
    # The true share of answers still holding a false claim at each draw's threshold: P(score ≥ t).
    risk = 1 - np.searchsorted(population, thresholds, side="left") / population.size
    violated = (risk > alpha).mean()
    assert violated <= delta, violated
    assert np.median(risk) > alpha / 2, np.median(risk)  # not vacuous: the thresholds sit near the target
    conformal = fa.threshold_at_rank(dev, fa.rank_for(N_DEV, alpha))
    assert (thresholds >= conformal).all()  # the high-probability guarantee is the more cautious one here


# ---------------------------------------------------------------- the command


@pytest.fixture
def honest_folder(tiny_backend, tmp_path):
    from candor.serve import Decoding, HonestModel

    folder = tmp_path / "honest"
    HonestModel(
        tiny_backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4)
    ).save_pretrained(folder)
    return folder


def test_claims_tune_saves_the_guarantee_in_the_folder_and_it_loads_back(honest_folder, tmp_path, tiny_backend):
    from candor.serve import HonestModel

    answers = random_answers(np.random.default_rng(3), 60, False)
    path = tmp_path / "claim_confidences.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in as_rows(answers)))
    before = read_folder(honest_folder).version
    runner = CliRunner()
    for alpha, delta in (("0.2", []), ("0.3", ["--delta", "0.1"]), ("0.2", ["--delta", "0.1"])):
        result = runner.invoke(
            app,
            [
                "claims-tune",
                "-c",
                str(path),
                "-e",
                "claim-prob",
                "--alpha",
                alpha,
                "--honest",
                str(honest_folder),
                *delta,
            ],
        )
        assert result.exit_code == 0, result.output
    saved = read_folder(honest_folder)
    assert saved.version != before
    # alpha 0.2 tuned twice: the second (risk control) replaced the first
    assert [(g.alpha, g.rule) for g in saved.factuality] == [(0.3, "risk"), (0.2, "risk")]
    expected = fa.tune(fa.labelled_claims(as_rows(answers), "claim-prob"), "claim-prob", 0.2, 0.1)
    assert fa.tuned_at(saved.factuality, "claim-prob", 0.2) == expected
    model = HonestModel.from_pretrained(honest_folder, backend=tiny_backend)
    assert model.factuality == saved.factuality
    resaved = model.save_pretrained(tmp_path / "again")
    assert read_folder(resaved).factuality == saved.factuality


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--alpha", "0.01"], "needs at least 99"),
        (["--alpha", "0.1", "--delta", "0.01"], "needs at least 44"),
        (["--alpha", "1.5"], "must be in (0, 1)"),
        (["--alpha", "0.1", "-e", "claim-nonsense"], "unknown claim estimator"),
        (["--alpha", "0.1", "-e", "claim-ptrue"], "has no 'claim-ptrue' confidence"),
    ],
)
def test_claims_tune_refuses(honest_folder, tmp_path, args, says):
    path = tmp_path / "claim_confidences.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in as_rows([[(0.5, True), (0.9, False)]] * 40)))
    base = ["claims-tune", "-c", str(path), "--honest", str(honest_folder)]
    if "-e" not in args:
        base += ["-e", "claim-prob"]
    result = CliRunner().invoke(app, [*base, *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert read_folder(honest_folder).factuality == ()
