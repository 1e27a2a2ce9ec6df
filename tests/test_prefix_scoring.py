"""Prefix-cached candidate scoring against the plain backend.score path, and label distributions."""

from __future__ import annotations

import numpy as np
import pytest

from candor.backends.base import SCORE_CANDIDATES, WHITE_BOX, backend_capabilities, score_candidates, score_pairs
from candor.backends.engine.candidate_tokens import encode_candidates, split_candidates
from candor.backends.engine.prefix_scoring import _CachedScorer, _Trie
from candor.util.errors import CandorError
from candor.verbal.distribution import candidate_distribution, single_token_ids, surface_forms


class ScoreOnly:
    """The tiny model behind a backend without ``score_candidates``, so the generic path runs."""

    white_box = True
    capabilities = WHITE_BOX

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


def test_trie_passes_bound_the_nodes_per_pass():
    trie = _Trie([[1, 2, 3], [1, 2, 4], [7, 8, 9, 10], [5]])
    # Nodes: (1) (1,2) (7) (7,8) (7,8,9); "[5]" feeds no node.
    assert trie.depths == [0, 1, 0, 1, 2]
    assert trie.passes(max_nodes=100) == [[0, 1, 2, 3, 4]]
    assert trie.passes(max_nodes=2) == [[0, 1], [2, 3], [4]]
    assert _Trie([[5], [6]]).passes(max_nodes=10) == [[]]


def test_trie_reads_sum_to_candidate_scores():
    trie = _Trie([[1, 2], [1, 3], [4]], offsets=[0, 1, 0])
    # Reads: (root→1), (node 0→2), (node 0→3) and (root→4); candidate 1 skips its first token.
    assert trie.reads == [(-1, 1), (0, 2), (0, 3), (-1, 4)]
    assert sorted(trie.reads_at) == [-1, 0] and trie.reads_at[0].tolist() == [1, 2]
    np.testing.assert_allclose(trie.candidate_scores(np.array([-1.0, -2.0, -3.0, -4.0])), [-3.0, -3.0, -4.0])


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
    assert SCORE_CANDIDATES in backend_capabilities(tiny_backend)
    assert SCORE_CANDIDATES not in backend_capabilities(ScoreOnly(tiny_backend))
    generic = score_candidates(ScoreOnly(tiny_backend), prompts, CANDIDATES[:4])
    cached = score_candidates(tiny_backend, prompts, CANDIDATES[:4])
    np.testing.assert_allclose(generic, cached, atol=1e-4)
    np.testing.assert_allclose(score_pairs(tiny_backend, prompts, CANDIDATES[:4]), cached, atol=1e-4)
    np.testing.assert_allclose(tiny_backend.score_candidates(prompts, CANDIDATES[:4]), cached, atol=1e-12)


def test_small_chunks_give_the_same_scores(tiny_backend, prompts, monkeypatch):
    import candor.backends.engine.prefix_scoring as ps

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


# ---------------------------------------------------------------- batches of chat prompts


QUESTIONS = [
    ("Who wrote Hamlet?", "Shakespeare"),
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "eight legs, I believe"),
    ("Name the largest planet.", "Jupiter"),
]


@pytest.fixture()
def chat_prompts(tiny_backend):
    """Prompts that share a long chat prefix and end with the same line, like verbalized prompts."""
    system = "Answer briefly, then state your confidence.\nConfidence: [a score]"
    out = []
    for question, answer in QUESTIONS:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {question}"}]
        out.append(tiny_backend.render_chat(messages) + f"Answer: {answer}\nConfidence:")
    return out


PERCENTS = [f"{p}{n}%" for n in (0, 5, 10, 55, 80, 100) for p in ("", " ")]


def test_batched_prompts_with_a_shared_prefix_equal_backend_score(tiny_backend, chat_prompts):
    cands = PERCENTS + CANDIDATES
    np.testing.assert_allclose(
        score_candidates(tiny_backend, chat_prompts, cands),
        expected_sums(tiny_backend, chat_prompts, cands),
        atol=1e-4,
    )


def test_one_row_per_batch_and_one_node_per_pass_give_the_same_scores(tiny_backend, chat_prompts, monkeypatch):
    import candor.backends.engine.prefix_scoring as ps

    cands = ["80%", " 80%", " 100%", "A"]
    full = score_candidates(tiny_backend, chat_prompts, cands)
    monkeypatch.setattr(ps, "MAX_BATCH_TOKENS", 1)
    monkeypatch.setattr(ps, "MAX_TREE_NODES", 1)
    np.testing.assert_allclose(score_candidates(tiny_backend, chat_prompts, cands), full, atol=1e-5)


def test_shared_last_line_is_tokenized_once_like_the_full_prompts(tiny_backend, chat_prompts):
    prompts = [*chat_prompts, "no line break: Hello", "ends with a break\n"]
    cands = [*PERCENTS, "lo", "\n", " world"]
    fast = encode_candidates(tiny_backend, prompts, cands)
    for prompt, enc in zip(prompts, fast, strict=True):
        plain = split_candidates(tiny_backend.encode([prompt])[0], tiny_backend.encode([prompt + c for c in cands]))
        assert enc == plain
    # The four chat prompts share one tokenization of their tails.
    assert len({id(e.tails) for e in fast[:4]}) == 1


def test_generic_backends_get_the_same_distribution(tiny_backend, chat_prompts):
    for labels in (["A", "B"], ["7", "80%"]):
        np.testing.assert_allclose(
            candidate_distribution(ScoreOnly(tiny_backend), chat_prompts, labels),
            candidate_distribution(tiny_backend, chat_prompts, labels),
            rtol=1e-4,
        )


def test_scoring_work_counts_the_shared_prefix_suffixes_and_trie_nodes(tiny_backend, chat_prompts):
    from candor.backends.engine.prefix_scoring import scoring_work
    from candor.backends.tokens import shared_prefix_length

    work = scoring_work(tiny_backend, chat_prompts, PERCENTS)
    encoded = encode_candidates(tiny_backend, chat_prompts, PERCENTS)
    prefix = shared_prefix_length([e.context[: e.keep] for e in encoded])
    assert work["shared_prefix"] == prefix > 8
    assert work["suffix"] == [e.keep - prefix for e in encoded]
    assert all(s > 0 for s in work["suffix"])
    assert work["trie_nodes"] == [len(_Trie(e.tails, e.offsets).tokens) for e in encoded]
    # " 55%" and " 5%" share their first tokens: fewer nodes than tokens in all tails together.
    assert 0 < work["trie_nodes"][0] < sum(len(t) - 1 for t in encoded[0].tails)
    assert scoring_work(tiny_backend, chat_prompts[:1], PERCENTS)["shared_prefix"] == 0
