"""The differentiable P(C | q, a) (candor.verbal.scorer) against the inference path, on every format."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from candor.backends.tokens import pad_batch
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.verbal.distribution import candidate_distribution
from candor.verbal.formats import confidence_distribution, format_prompt
from candor.verbal.scorer import LabelScorer, build_prompt, prompt_text, span_mask, token_span

ITEMS = [
    QAItem(id="a", dataset="toy", split="test", question="Who wrote Hamlet?", answers=("Shakespeare",)),
    QAItem(
        id="b",
        dataset="toy",
        split="test",
        question="What is the capital of the most populous country in Europe?",
        answers=("Moscow",),
    ),
    QAItem(
        id="c",
        dataset="toy",
        split="test",
        question="Which city is the capital of France?",
        answers=("B", "Paris"),
        choices=("Rome", "Paris", "Berlin", "Madrid"),
        answer_index=1,
    ),
]
ANSWERS = ["William Shakespeare", "Paris.", "B"]


@pytest.fixture(scope="module")
def sharp_model(tokenizer):
    """The tiny Llama with a sharper output layer that makes the two-token labels likely.

    Far from uniform, the first tokens of two-token labels ("Ġ", "very") get a
    bias, and "7" is made near-certain right after "Ġ" (its output row points
    along "Ġ"'s embedding), so " 7" and "7" differ and a wrong two-token path shows.
    """
    from conftest import build_tiny_model

    model = build_tiny_model(len(tokenizer), seed=1)
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight * 8.0)
        head.bias.zero_()
        for fmt in ("number", "text"):
            head.bias[LabelScorer(tokenizer, fmt).first_tokens] = 6.0
        space, seven = tokenizer.convert_tokens_to_ids(["Ġ", "7"])
        embedding = model.get_input_embeddings().weight[space]
        head.weight[seven] += 3.0 * embedding / embedding.norm()
    model.lm_head = head
    return model


@pytest.fixture(scope="module")
def sharp_backend(sharp_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(sharp_model, tokenizer, batch_size=4)


def _batch(tokenizer, fmt, side, n=3):
    prompts = [build_prompt(tokenizer, it, a, fmt) for it, a in zip(ITEMS[:n], ANSWERS[:n], strict=True)]
    ids, mask = pad_batch([p.ids for p in prompts], tokenizer.pad_token_id, side)
    targets = span_mask([p.answer_span for p in prompts], [len(p.ids) for p in prompts], ids.shape[1], side)
    return prompts, ids, mask, targets


@pytest.mark.parametrize("fmt", ["letter", "number", "text", "float", "percent"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("n", [2, 3])  # two open questions share the system prompt; the third is multiple choice
def test_distribution_equals_the_inference_path(sharp_backend, sharp_model, tokenizer, fmt, side, share, n):
    reference = confidence_distribution(sharp_backend, ITEMS[:n], ANSWERS[:n], fmt)
    assert np.abs(reference - 1.0 / reference.shape[1]).max() > 0.02  # not uniform: the check can fail
    _, ids, mask, _ = _batch(tokenizer, fmt, side, n)
    scorer = LabelScorer(tokenizer, fmt)
    assert (scorer._shared_plan(ids, mask, None) is not None) == (n == 2)  # which path runs
    with torch.no_grad():
        got = scorer.forward(sharp_model, ids, mask, share_prefix=share).log_probs.exp()
    np.testing.assert_allclose(got.numpy(), reference, atol=1e-4)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-6)


def test_the_two_token_forms_matter(sharp_backend, tokenizer):
    # SmolLM2 writes " 7" as "Ġ" + "7"; dropping those forms changes the distribution, so the
    # equality above really checks the two-token path.
    scorer = LabelScorer(tokenizer, "number")
    assert tokenizer.convert_ids_to_tokens(scorer.first_tokens) == ["Ġ"]
    prompts = [format_prompt(sharp_backend, it, a, "number") for it, a in zip(ITEMS, ANSWERS, strict=True)]
    full = candidate_distribution(sharp_backend, prompts, scorer.fmt.labels)
    no_space = candidate_distribution(sharp_backend, prompts, scorer.fmt.labels, prefixes=("",))
    assert np.abs(full - no_space).max() > 1e-3


def test_inputs_embeds_give_the_same_distribution_and_a_gradient(sharp_model, tokenizer):
    for fmt in ("letter", "number", "text"):
        scorer = LabelScorer(tokenizer, fmt)
        _, ids, mask, _ = _batch(tokenizer, fmt, "left")
        with torch.no_grad():
            from_ids = scorer.log_distribution(sharp_model, ids, mask)
        embeds = sharp_model.get_input_embeddings()(ids).detach().requires_grad_(True)
        from_embeds = scorer.log_distribution(sharp_model, None, mask, inputs_embeds=embeds)
        torch.testing.assert_close(from_embeds, from_ids, atol=1e-5, rtol=0)
        from_embeds[:, 0].sum().backward()
        assert embeds.grad is not None and embeds.grad.abs().sum() > 0
        assert embeds.grad[mask == 0].abs().sum() == 0  # padding does not influence the result


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("share", [False, True])
def test_answer_token_logprobs_equal_backend_score(sharp_backend, sharp_model, tokenizer, side, share):
    prompts, ids, mask, targets = _batch(tokenizer, "number", side, 2)
    with torch.no_grad():
        out = LabelScorer(tokenizer, "number").forward(sharp_model, ids, mask, targets=targets, share_prefix=share)
    heads = [p.text[: p.text.rfind(a)] for p, a in zip(prompts, ANSWERS[:2], strict=True)]
    reference = [sum(lp) for lp in sharp_backend.score(heads, ANSWERS[:2])]
    np.testing.assert_allclose(out.token_logprobs.sum(1).numpy(), reference, atol=1e-3)
    assert (out.token_logprobs[~targets] == 0).all()


def test_prompt_matches_format_prompt_and_finds_the_answer(tiny_backend, tokenizer):
    for item, answer in zip(ITEMS, ANSWERS, strict=True):
        for variant in ("default", "prompting"):
            assert prompt_text(tokenizer, item, answer, "letter", variant) == format_prompt(
                tiny_backend, item, answer, "letter", variant
            )
        p = build_prompt(tokenizer, item, f"  {answer} ", "number")
        assert list(p.ids) == tiny_backend.encode([p.text])[0]
        assert tokenizer.decode(list(p.ids[p.answer_start : p.answer_end])).strip() == answer
        assert tokenizer.decode(list(p.ids[p.answer_end :])) == "\nConfidence:"


def test_token_span_edges():
    offsets = [(0, 0), (0, 6), (6, 7), (7, 13), (13, 14)]  # <s> "Answer" ":" " Paris" "\n"
    assert token_span(offsets, 8, 13) == (3, 4)
    assert token_span(offsets, 5, 8) == (1, 4)
    assert token_span(offsets, 20, 25) == (5, 5)  # nothing there
    assert token_span(offsets, 8, 8) == (5, 5)  # empty answer


def test_padding_helpers():
    ids, mask = pad_batch([[1, 2, 3], [4]], 0, "left")
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_batch([[1, 2, 3], [4]], 0, "right")
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert span_mask([(1, 3), (0, 1)], [3, 1], 3, "left").tolist() == [[False, True, True], [False, False, True]]
    with pytest.raises(CandorError, match="padding side"):
        pad_batch([[1]], 0, "middle")


def test_chains_cover_every_form_once_per_shared_prefix(tokenizer):
    # SmolLM2 splits numbers into digits: " 0.7" is "Ġ" "0" "." "7", " 80%" is "Ġ" "8" "0" "%".
    chains = {fmt: LabelScorer(tokenizer, fmt).chains for fmt in ("letter", "number", "text", "float", "percent")}
    assert chains["letter"] == []
    assert [tokenizer.convert_ids_to_tokens(list(c)) for c in chains["number"]] == [["Ġ"]]
    assert sorted(tokenizer.convert_ids_to_tokens(list(c)) for c in chains["float"]) == [
        ["0", "."],
        ["1", "."],
        ["Ġ", "0", "."],
        ["Ġ", "1", "."],
    ]
    # Percent: "0", "100" and the two-digit numbers but "10", with and without "Ġ".
    assert len(chains["percent"]) == 2 * (1 + 1 + 89)


@pytest.mark.parametrize("fmt", ["float", "percent"])
def test_inputs_embeds_on_the_long_formats(sharp_model, tokenizer, fmt):
    scorer = LabelScorer(tokenizer, fmt)
    _, ids, mask, _ = _batch(tokenizer, fmt, "right", 2)
    with torch.no_grad():
        from_ids = scorer.log_distribution(sharp_model, ids, mask)
        from_embeds = scorer.log_distribution(sharp_model, None, mask, sharp_model.get_input_embeddings()(ids))
    torch.testing.assert_close(from_embeds, from_ids, atol=1e-5, rtol=0)


def test_bad_calls_are_errors(sharp_model, tokenizer):
    scorer = LabelScorer(tokenizer, "letter")
    _, ids, mask, targets = _batch(tokenizer, "letter", "left")
    with pytest.raises(CandorError, match="input_ids or inputs_embeds"):
        scorer.forward(sharp_model, None, mask)
    embeds = sharp_model.get_input_embeddings()(ids)
    with pytest.raises(CandorError, match="need input_ids"):
        scorer.forward(sharp_model, None, mask, inputs_embeds=embeds, targets=targets)
    first = torch.zeros_like(targets)
    first[:, 0] = True  # a padded or first token cannot be a target
    with pytest.raises(CandorError, match="first position"):
        scorer.forward(sharp_model, ids, mask, targets=first)


def test_expected_value(tokenizer):
    scorer = LabelScorer(tokenizer, "letter")
    log_probs = torch.log(torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(scorer.expected_value(log_probs), torch.tensor([0.5, 0.5]))
