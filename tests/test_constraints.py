"""JSON-schema constraints (candor.backends.constraints): the constraint, its grammar cache, the token masks,
and the hf decode loop under them on the tiny Llama (the embedded model: tests/test_engine_constraints.py)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from candor.backends.base import CONSTRAINED, SamplingParams, backend_capabilities
from candor.backends.constraints import GrammarCache, JsonConstraint, apply_bitmask, bitmask_for
from candor.backends.engine.sampling import pick_tokens, sample_from_top
from candor.backends.hf import HFBackend
from candor.util.errors import CandorError

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
PROMPTS = ["Question: What is the largest planet?\nAnswer:", "Hello", "Question: 2+2?\nAnswer:"]


def assert_same(got, expected) -> None:
    """Same tokens and text; log-probs equal to float32 rounding (a padded batch computes them apart)."""
    for a, b in zip([got.greedy, *got.samples], [expected.greedy, *expected.samples], strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def vocab(tokenizer) -> int:
    return len(tokenizer)


@pytest.fixture()
def backend(lively_model, tokenizer):
    return HFBackend(lively_model, tokenizer, batch_size=4, model_name="lively")


def eos(tokenizer) -> int:
    return int(tokenizer.eos_token_id)


def accepts(cache: GrammarCache, constraint: JsonConstraint, tokenizer, text: str) -> bool:
    """Whether the constraint's grammar takes all of ``text`` and then the end of sequence."""
    matcher = cache.matcher(constraint)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return (
        all(matcher.accept_token(i) for i in ids) and matcher.accept_token(eos(tokenizer)) and matcher.is_terminated()
    )


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def grammars(tokenizer, vocab) -> GrammarCache:
    return GrammarCache(tokenizer, vocab, [eos(tokenizer)], size=8)


# ------------------------------------------------------------------- the constraint and its grammar


def test_the_constraint_is_keyed_by_the_schema_in_its_own_key_order():
    a = JsonConstraint.of({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}})
    b = JsonConstraint.of({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}})
    assert a == b and hash(a) == hash(b)
    assert a.schema == json.dumps(a.schema_dict)
    # The properties' order is the order xgrammar generates them in: a call names its function first.
    call = JsonConstraint.of({"type": "object", "properties": {"name": {"const": "f"}, "arguments": {}}})
    assert list(call.schema_dict["properties"]) == ["name", "arguments"]
    assert a != JsonConstraint.of(a.schema_dict, allow_text=True)
    with pytest.raises(CandorError, match="must be a JSON object"):
        JsonConstraint.of(["not", "a", "schema"])  # type: ignore[arg-type]
    with pytest.raises(CandorError, match="not JSON"):
        JsonConstraint.of({"type": object()})


@pytest.mark.parametrize(
    ("schema", "says"),
    [({"type": "strin"}, "strin"), ({"$ref": "#/definitions/nowhere"}, "nowhere")],
)
def test_a_schema_that_cannot_compile_is_one_clear_line(grammars, schema, says):
    with pytest.raises(CandorError) as info:
        grammars.get(JsonConstraint.of(schema))
    message = str(info.value)
    assert "\n" not in message and says in message
    assert message.startswith("the JSON schema cannot be compiled") and ".cc:" not in message


def test_the_grammar_takes_valid_json_and_refuses_the_rest(grammars, tokenizer):
    strict = JsonConstraint.of(PERSON)
    assert accepts(grammars, strict, tokenizer, '{"name": "Ann", "age": 31}')
    assert not accepts(grammars, strict, tokenizer, '{"name": "Ann"}')  # a required key missing
    assert not accepts(grammars, strict, tokenizer, '{"name": "Ann", "age": 300}')  # past the maximum
    assert not accepts(grammars, strict, tokenizer, "Paris")


def test_allow_text_takes_json_or_text_that_does_not_start_like_json(grammars, tokenizer):
    either = JsonConstraint.of(PERSON, allow_text=True)
    assert accepts(grammars, either, tokenizer, '{"name": "Ann", "age": 31}')
    assert accepts(grammars, either, tokenizer, "Paris is the capital. {not json}")
    assert not accepts(grammars, either, tokenizer, '{"name": "Ann"}')  # starts as a call: must be a valid one
    assert not accepts(grammars, either, tokenizer, "[1, 2]")
    assert not accepts(grammars, either, tokenizer, ' {"name": "Ann", "age": 31}')  # blank space first
    assert not accepts(grammars, either, tokenizer, "")  # an empty answer is neither


def test_the_grammar_cache_stays_bounded_and_keeps_the_recently_used(tokenizer, vocab):
    cache = GrammarCache(tokenizer, vocab, [eos(tokenizer)], size=4)
    first = JsonConstraint.of({"type": "object", "properties": {"k0": {"type": "integer"}}})
    cache.get(first)
    for i in range(1, 40):
        cache.get(JsonConstraint.of({"type": "object", "properties": {f"k{i}": {"type": "integer"}}}))
        cache.get(first)  # used again each time: never the least recently used
        assert len(cache) <= 4
    assert len(cache) == 4 and cache.compiled == 40
    assert cache.cached(first) is not None
    assert cache.cached(JsonConstraint.of({"type": "object", "properties": {"k1": {"type": "integer"}}})) is None
    cache.get(first)
    assert cache.compiled == 40  # a hit compiles nothing
    with pytest.raises(CandorError, match="at least 1"):
        GrammarCache(tokenizer, vocab, [], size=0)


def test_the_bitmask_sets_exactly_the_forbidden_logits_to_minus_infinity(grammars, tokenizer, vocab):
    constraint = JsonConstraint.of(PERSON)
    fresh, moved = grammars.matcher(constraint), grammars.matcher(constraint)
    for token in tokenizer.encode('{"name": "', add_special_tokens=False):
        assert moved.accept_token(token)
    logits = torch.randn(2, vocab)
    masked = logits.clone()
    apply_bitmask(masked, bitmask_for([fresh, moved], vocab))
    allowed = torch.isfinite(masked)
    open_brace = tokenizer.encode("{", add_special_tokens=False)[0]
    assert allowed[0, open_brace] and allowed[0].sum() < vocab // 10  # the object's opening only
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    assert allowed[1, open_brace] and not allowed[1, newline]  # a string's characters, not a raw line break
    assert allowed[1].sum() > allowed[0].sum()
    assert torch.equal(masked[allowed], logits[allowed])
    for row, matcher in enumerate((fresh, moved)):  # what the mask allows is what the matcher accepts
        for token in torch.randperm(vocab)[:200].tolist():
            assert bool(allowed[row, token]) == matcher.accept_token(token)
            if allowed[row, token]:
                matcher.rollback(1)


# ------------------------------------------------------------------- picking tokens from masked logits


def test_masked_rows_choose_from_the_mask_and_report_the_raw_log_probs(vocab):
    torch.manual_seed(0)
    logits = torch.randn(4, vocab) * 3
    masked_rows = [1, 3]
    masked = logits[masked_rows].clone()
    allowed = torch.zeros_like(masked, dtype=torch.bool)
    allowed[:, 100:110] = True
    masked[~allowed] = float("-inf")
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=0.95, top_k=50)
    samplers = [(params, [2, 3], [0.37, 0.91])]
    tokens, logprobs, top = pick_tokens(logits, samplers, 5, (masked_rows, masked))
    plain, plain_lp, plain_top = pick_tokens(logits, samplers, 5)
    assert tokens[[0, 2]].tolist() == plain[[0, 2]].tolist()  # rows without a mask are untouched
    assert tokens[1].item() == int(masked[0].argmax())  # greedy: the argmax of the masked logits
    assert 100 <= tokens[3].item() < 110  # sampled from the masked distribution
    expected = sample_from_top(*masked[1:].topk(64), torch.tensor([0.91]), params)
    assert tokens[3].item() == expected.item()
    raw = torch.log_softmax(logits, dim=-1)
    np.testing.assert_allclose(logprobs.tolist(), raw[range(4), tokens].tolist(), rtol=1e-5)
    assert top == plain_top  # the top alternatives are the model's own


def test_a_draw_never_lands_on_a_token_of_zero_probability():
    values = torch.tensor([[2.0, 1.0, float("-inf"), float("-inf")]])
    ids = torch.tensor([[7, 8, 9, 10]])
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0)
    for u in (0.0, 0.5, 0.999999, float(np.nextafter(np.float32(1), np.float32(0)))):
        assert sample_from_top(values, ids, torch.tensor([u]), params).item() in (7, 8)


# ------------------------------------------------------------------- the decode loop (tiny random Llama)


def test_the_backend_declares_constrained_decoding(backend):
    assert CONSTRAINED in backend_capabilities(backend)


def test_every_answer_of_the_random_model_validates_and_ends_by_its_grammar(backend):
    """A random model's tokens are nearly uniform: only the mask makes its answers JSON."""
    constraint = JsonConstraint.of(PERSON)
    gens = backend.generate(PROMPTS, 3, SamplingParams(max_new_tokens=48), constraint=constraint, seeds=[1, 2, 3])
    unconstrained = backend.generate(PROMPTS, 3, SamplingParams(max_new_tokens=48), seeds=[1, 2, 3])
    for gen in gens:
        for completion in (gen.greedy, *gen.samples):
            jsonschema.validate(json.loads(completion.text), PERSON)
            assert completion.finish_reason == "stop" and completion.stop_logprob is not None
    assert not any(valid(c.text, PERSON) for g in unconstrained for c in (g.greedy, *g.samples))


def test_constrained_log_probs_are_the_model_s_before_the_mask(backend, lively_model):
    constraint = JsonConstraint.of(PERSON)
    [gen] = backend.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=48), constraint=constraint, seeds=[4])
    prompt_ids = backend.encode(PROMPTS[:1])[0]
    for completion in (gen.greedy, gen.samples[0]):
        ids = prompt_ids + completion.token_ids
        with torch.inference_mode():
            raw = torch.log_softmax(lively_model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        start = len(prompt_ids) - 1
        expected = [raw[start + i, t].item() for i, t in enumerate(completion.token_ids)]
        np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4, rtol=1e-5)
        stops = [raw[start + len(completion.token_ids), e].item() for e in backend.eos_ids]
        assert any(completion.stop_logprob == pytest.approx(lp, abs=1e-4) for lp in stops)


def eos_of(backend: HFBackend) -> int:
    return int(backend.tokenizer.eos_token_id)


def test_greedy_under_a_constraint_is_the_argmax_of_the_masked_logits(backend, lively_model):
    constraint = JsonConstraint.of(PERSON)
    [gen] = backend.generate(PROMPTS[1:2], 0, SamplingParams(max_new_tokens=48), constraint=constraint)
    matcher = backend.grammars.matcher(constraint)
    ids = backend.encode(PROMPTS[1:2])[0]
    for token in gen.greedy.token_ids:
        with torch.inference_mode():
            logits = lively_model(input_ids=torch.tensor([ids])).logits[0, -1:].float()
            apply_bitmask(logits, bitmask_for([matcher], logits.shape[-1]))
        assert token == int(logits.argmax())
        assert matcher.accept_token(token)
        ids.append(token)
    assert gen.greedy.finish_reason == "stop" and matcher.is_completed()


def test_constrained_prompts_in_one_batch_equal_each_alone(backend):
    """A row's answer does not depend on the prompts beside it under a constraint."""
    params = SamplingParams(max_new_tokens=32)
    constraint = JsonConstraint.of(PERSON)
    together = backend.generate(PROMPTS, 2, params, constraint=constraint, seeds=[5, 6, 7])
    for i, prompt in enumerate(PROMPTS):
        [alone] = backend.generate([prompt], 2, params, constraint=constraint, seeds=[5 + i])
        assert_same(together[i], alone)


def test_an_uncompilable_schema_is_refused_before_any_work(backend):
    with pytest.raises(CandorError, match="cannot be compiled"):
        backend.generate(PROMPTS, 1, SamplingParams(), constraint=JsonConstraint.of({"type": "strin"}))


def test_keys_are_generated_in_the_schema_s_order(grammars, tokenizer):
    """xgrammar generates an object's keys in the order its schema lists them: a call names its function first."""
    call = {
        "type": "object",
        "properties": {"name": {"const": "f"}, "arguments": {"type": "object"}, "id": {"type": "integer"}},
        "required": ["name", "arguments"],
    }
    constraint = JsonConstraint.of(call)
    assert accepts(grammars, constraint, tokenizer, '{"name": "f", "arguments": {}}')
    assert accepts(grammars, constraint, tokenizer, '{"name": "f", "arguments": {}, "id": 3}')
    assert not accepts(grammars, constraint, tokenizer, '{"arguments": {}, "name": "f"}')
