"""Prefix-cached candidate scoring against the plain backend.score path, and label distributions."""

from __future__ import annotations

import numpy as np
import pytest

from candor.backends.prefix_scoring import (
    _CachedScorer,
    _score_generic,
    _tree_chunks,
    _Trie,
    candidate_distribution,
    score_candidates,
    single_token_ids,
    surface_forms,
)
from candor.errors import CandorError


class ScoreOnly:
    """The tiny model behind a backend that is not an HFBackend, so the generic path runs."""

    white_box = True

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture()
def prompts(tiny_backend):
    chat = tiny_backend.render_chat([{"role": "user", "content": "Question: Who wrote Hamlet?"}])
    return [chat + "Answer: Shakespeare\nConfidence:", "A short plain prompt ending in Hello"]


CANDIDATES = ["A", " A", " 9", "9", " very high", " 100%", "0.7", "world", "\n"]


def expected_sums(backend, prompts, candidates) -> np.ndarray:
    per_token = backend.score([p for p in prompts for _ in candidates], list(candidates) * len(prompts))
    return np.array([sum(lps) for lps in per_token]).reshape(len(prompts), len(candidates))


def test_cached_scores_equal_the_sum_of_backend_score(tiny_backend, prompts):
    cached = score_candidates(tiny_backend, prompts, CANDIDATES)
    assert cached.shape == (2, len(CANDIDATES))
    np.testing.assert_allclose(cached, expected_sums(tiny_backend, prompts, CANDIDATES), atol=1e-4)
    assert (cached < 0).all()


@pytest.mark.parametrize("strategy", ["tree", "repeat"])
def test_both_cache_strategies_equal_backend_score(tiny_backend, prompts, strategy):
    percents = [f"{p}{n}%" for n in (0, 1, 8, 10, 80, 100) for p in ("", " ")]
    scorer = _CachedScorer(tiny_backend, strategy)
    assert scorer.strategy == strategy
    np.testing.assert_allclose(
        scorer.score(prompts, percents + CANDIDATES),
        expected_sums(tiny_backend, prompts, percents + CANDIDATES),
        atol=1e-4,
    )


def test_tree_is_the_default_for_sdpa_and_eager_attention(tiny_backend):
    assert tiny_backend.model.config._attn_implementation in ("sdpa", "eager")
    assert _CachedScorer(tiny_backend).strategy == "tree"


def test_trie_shares_common_starts():
    trie = _Trie([[1, 2, 3], [1, 2, 4], [1, 5], [6]])
    # Proper prefixes: (1), (1, 2); "[6]" and the last tokens are never fed.
    assert (trie.tokens, trie.depths, trie.parents) == ([1, 2], [0, 1], [-1, 0])
    assert trie.node([1, 2]) == 1
    assert trie.ancestry().tolist() == [[True, False], [True, True]]
    branch = _Trie([[1, 2, 3], [1, 4, 5]])
    assert branch.ancestry().tolist() == [[True, False, False], [True, True, False], [True, False, True]]


def test_tree_chunks_bound_the_nodes_per_pass():
    tails = [[1, 2, 3], [1, 2, 4], [7, 8, 9, 10], [5]]
    assert _tree_chunks(tails, 100) == [[0, 1, 2, 3]]
    assert _tree_chunks(tails, 2) == [[0, 1], [2, 3]]  # [5] feeds no node, so it joins any group


def test_a_candidate_merging_with_the_prompt_end_is_scored_like_backend_score(tiny_backend, tokenizer):
    # "Hello" + "world" may re-tokenize the prompt's last token; the cache then stops before it.
    prompt = "Say Hel"
    merged = tokenizer.encode(prompt + "lo", add_special_tokens=False)
    assert merged[: len(tokenizer.encode(prompt, add_special_tokens=False))] != tokenizer.encode(
        prompt, add_special_tokens=False
    ), "the test needs a candidate that merges across the boundary"
    cands = ["lo", "lo world", " there"]
    cached = score_candidates(tiny_backend, [prompt], cands)
    expected = [sum(lps) for lps in tiny_backend.score([prompt] * 3, cands)]
    np.testing.assert_allclose(cached[0], expected, atol=1e-4)


def test_non_hf_backends_take_the_generic_path(tiny_backend, prompts):
    generic = score_candidates(ScoreOnly(tiny_backend), prompts, CANDIDATES[:4])
    cached = score_candidates(tiny_backend, prompts, CANDIDATES[:4])
    np.testing.assert_allclose(generic, cached, atol=1e-4)
    np.testing.assert_allclose(_score_generic(tiny_backend, prompts, CANDIDATES[:4]), cached, atol=1e-4)


def test_small_chunks_give_the_same_scores(tiny_backend, prompts, monkeypatch):
    import candor.backends.prefix_scoring as ps

    full = score_candidates(tiny_backend, prompts, CANDIDATES)
    monkeypatch.setattr(ps, "MAX_CACHE_TOKENS", 1)  # repeat: one candidate per forward pass
    monkeypatch.setattr(ps, "MAX_TREE_NODES", 1)  # tree: one trie node per forward pass
    for strategy in ("tree", "repeat"):
        np.testing.assert_allclose(_CachedScorer(tiny_backend, strategy).score(prompts, CANDIDATES), full, atol=1e-5)


def test_empty_inputs_and_candidates(tiny_backend, prompts):
    assert score_candidates(tiny_backend, [], ["A"]).shape == (0, 1)
    assert score_candidates(tiny_backend, prompts, []).shape == (2, 0)
    with pytest.raises(CandorError, match="empty"):
        score_candidates(tiny_backend, prompts, ["A", ""])


def test_surface_forms_add_a_leading_space_without_duplicates():
    assert surface_forms(["A", " B"]) == [(0, "A"), (0, " A"), (1, " B"), (1, "  B")]
    assert surface_forms(["x", "x"], prefixes=("",)) == [(0, "x")]


def test_single_token_ids_on_the_real_tokenizer(tiny_backend, tokenizer, prompts):
    letters = single_token_ids(tiny_backend, prompts[:1], ["A", " A", "E", " E"])
    assert letters == tokenizer.convert_tokens_to_ids(["A", "ĠA", "E", "ĠE"])
    # SmolLM2 writes a spaced digit as "Ġ" then the digit, so digits are not single tokens.
    assert single_token_ids(tiny_backend, prompts[:1], ["9", " 9"]) is None
    assert single_token_ids(tiny_backend, prompts[:1], ["9"]) == tokenizer.convert_tokens_to_ids(["9"])


def test_distribution_single_token_path_equals_next_token_probabilities(tiny_backend, tokenizer, prompts):
    dist = candidate_distribution(tiny_backend, prompts, ["A", "B", "C"])
    ids = tokenizer.convert_tokens_to_ids(["A", "ĠA", "B", "ĠB", "C", "ĠC"])
    p = np.exp(tiny_backend.next_token_logprobs(prompts, ids)).reshape(2, 3, 2).sum(2)
    np.testing.assert_allclose(dist, p / p.sum(1, keepdims=True), rtol=1e-5)


def test_distribution_multi_token_path_sums_surface_forms(tiny_backend, prompts):
    labels = ["7", "very high", "0.5"]
    dist = candidate_distribution(tiny_backend, prompts, labels)
    forms = [f for label in labels for f in (label, " " + label)]
    per_token = tiny_backend.score([p for p in prompts for _ in forms], forms * len(prompts))
    p = np.exp([sum(lps) for lps in per_token]).reshape(2, 3, 2).sum(2)
    np.testing.assert_allclose(dist, p / p.sum(1, keepdims=True), rtol=1e-4)
    np.testing.assert_allclose(dist.sum(1), 1.0)
