"""Constrained decoding on the embedded model (SmolLM2-135M-Instruct), through the live engine and ``generate``.

Every constrained answer, greedy or sampled, parses and validates against its schema (objects, enums,
nested objects, arrays, bounded numbers, booleans and constants, a tool-call ``anyOf``); the samples
differ from the greedy answer and repeat by seed; a request's answers do not depend on the requests
beside it, constrained or not. The schemas bound every string, array and number, so each answer fits the
token cap and must end by its grammar ("stop"), never at the cap.

The full set (every schema, three samples each, alone and together) is ``slow``; the default run checks three
schemas, greedy and one sample each, in one engine.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from candor.backends.base import DecodeRequest, Generations, SamplingParams
from candor.backends.constraints import JsonConstraint
from candor.backends.hf import HFBackend
from candor.util.errors import CandorError

WAIT = 600  # seconds a test waits for the engine (a loaded CI machine); never reached when it works


def text(max_length: int = 12) -> dict:
    return {"type": "string", "maxLength": max_length}


SCHEMAS: list[tuple[str, dict]] = [
    (
        "Who wrote Hamlet, and in which year was he born?",
        {
            "type": "object",
            "properties": {"author": text(), "born": {"type": "integer", "minimum": 1000, "maximum": 2000}},
            "required": ["author", "born"],
        },
    ),
    (
        "Is the Pacific the largest ocean?",
        {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "unsure"]}}, "required": ["answer"]},
    ),
    (
        "Where is the Eiffel Tower?",
        {
            "type": "object",
            "properties": {
                "place": {
                    "type": "object",
                    "properties": {"city": text(), "country": text()},
                    "required": ["city", "country"],
                }
            },
            "required": ["place"],
        },
    ),
    (
        "Name up to three primary colours.",
        {"type": "array", "items": text(10), "minItems": 1, "maxItems": 3},
    ),
    (
        "What is the temperature in Paris today, and how many people live there (in thousands)?",
        {
            "type": "object",
            "properties": {
                "celsius": {"type": "number", "minimum": -50, "maximum": 60},
                "thousands": {"type": "integer", "minimum": 0, "maximum": 99999},
            },
            "required": ["celsius", "thousands"],
        },
    ),
    (
        "Is water wet?",
        {
            "type": "object",
            "properties": {"kind": {"const": "fact"}, "holds": {"type": "boolean"}},
            "required": ["kind", "holds"],
        },
    ),
    (
        "What is the weather in Rome? Call a tool.",
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": "get_weather"},
                        "arguments": {"type": "object", "properties": {"city": text()}, "required": ["city"]},
                    },
                    "required": ["name", "arguments"],
                },
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": "get_time"},
                        "arguments": {"type": "object", "properties": {"zone": text(8)}, "required": ["zone"]},
                    },
                    "required": ["name", "arguments"],
                },
            ]
        },
    ),
    (
        "Rate two fruits from 1 to 5.",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"fruit": text(10), "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["fruit", "stars"],
            },
            "minItems": 1,
            "maxItems": 2,
        },
    ),
]
SAMPLES = 3
PARAMS = SamplingParams(max_new_tokens=96, temperature=1.0, top_p=0.95, top_k=50)


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    return HFBackend.from_pretrained(batch_size=8)


def prompt_for(backend: HFBackend, question: str, schema: dict) -> str:
    content = f"Answer with JSON that follows this JSON Schema: {json.dumps(schema)}\n\n{question}"
    return backend.render_chat([{"role": "user", "content": content}])


def requests(backend: HFBackend) -> list[DecodeRequest]:
    """One request per schema, then one free one and one that may answer in text, seeded by position."""
    out = [
        DecodeRequest(
            prompt=prompt_for(backend, q, s), n=SAMPLES, params=PARAMS, seed=i, constraint=JsonConstraint.of(s)
        )
        for i, (q, s) in enumerate(SCHEMAS)
    ]
    question, schema = SCHEMAS[6]
    out.append(DecodeRequest(prompt=prompt_for(backend, "Say hello.", {}), n=SAMPLES, params=PARAMS, seed=100))
    out.append(
        DecodeRequest(
            prompt=prompt_for(backend, question, schema),
            n=SAMPLES,
            params=PARAMS,
            seed=101,
            constraint=JsonConstraint.of(schema, allow_text=True),
        )
    )
    return out


def run(backend: HFBackend, batch: list[DecodeRequest], max_rows: int) -> list[Generations]:
    with backend.live_engine(max_rows=max_rows) as engine:
        futures = [engine.submit(r) for r in batch]
        return [f.result(timeout=WAIT) for f in futures]


@pytest.fixture(scope="module")
def together(backend) -> tuple[list[DecodeRequest], list[Generations]]:
    """Every request submitted at once: constrained, free and allow_text rows share the engine's steps."""
    batch = requests(backend)
    return batch, run(backend, batch, max_rows=len(batch) * (SAMPLES + 1))


def answers(gen: Generations) -> list:
    return [gen.greedy, *gen.samples]


@pytest.mark.integration
def test_three_schemas_validate_in_one_engine(backend):
    """The default run's check: an enum, an object and a tool call, greedy and one seeded sample each."""
    batch = [
        DecodeRequest(
            prompt=prompt_for(backend, q, s),
            n=1,
            params=SamplingParams(max_new_tokens=64),
            seed=i,
            constraint=JsonConstraint.of(s),
        )
        for i, (q, s) in enumerate(SCHEMAS)
        if i in (0, 1, 6)
    ]
    for request, gen in zip(batch, run(backend, batch, max_rows=6), strict=True):
        for completion in answers(gen):
            jsonschema.validate(json.loads(completion.text), request.constraint.schema_dict)
            assert completion.finish_reason == "stop"


@pytest.mark.slow
def test_every_constrained_answer_parses_and_validates(together):
    batch, gens = together
    checked = 0
    for request, gen in zip(batch, gens, strict=True):
        if request.constraint is None or request.constraint.allow_text:
            continue
        for completion in answers(gen):
            jsonschema.validate(json.loads(completion.text), request.constraint.schema_dict)
            assert completion.finish_reason == "stop"
            checked += 1
    assert checked == len(SCHEMAS) * (SAMPLES + 1)


@pytest.mark.slow
def test_allow_text_gives_a_valid_call_or_text_that_does_not_start_like_json(together):
    batch, gens = together
    request, gen = batch[-1], gens[-1]
    for completion in answers(gen):
        if completion.text[:1] in "{[":
            jsonschema.validate(json.loads(completion.text), request.constraint.schema_dict)
        assert completion.finish_reason == "stop"


@pytest.mark.slow
def test_samples_differ_from_the_greedy_answer(together):
    """At the default sampling settings, at least half of the constrained samples are not the greedy answer."""
    batch, gens = together
    pairs = [
        (gen.greedy.text, sample.text)
        for request, gen in zip(batch, gens, strict=True)
        if request.constraint is not None and not request.constraint.allow_text
        for sample in gen.samples
    ]
    differing = sum(greedy != sample for greedy, sample in pairs)
    assert differing >= len(pairs) / 2, f"{differing} of {len(pairs)} samples differ from the greedy answer"


def assert_same(got: Generations, expected: Generations) -> None:
    for a, b in zip(answers(got), answers(expected), strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 4, 6, 8, 9])  # an object, numbers, a tool call, the free and allow_text ones
def test_a_request_alone_equals_the_mixed_batch_and_generate(backend, together, index):
    """Alone in the engine, its answers are the same bits as beside constrained and free rows; ``generate`` with
    the same seed gives the same tokens (seeded samples repeat)."""
    batch, gens = together
    request = batch[index]
    [alone] = run(backend, [request], max_rows=SAMPLES + 1)
    assert_same(alone, gens[index])
    [generated] = backend.generate(
        [request.prompt], SAMPLES, PARAMS, seeds=[request.seed], constraint=request.constraint
    )
    assert [c.token_ids for c in answers(generated)] == [c.token_ids for c in answers(alone)]


@pytest.mark.integration
def test_generate_takes_a_constraint_per_prompt(backend):
    """``generate`` decodes prompts with different schemas in one batch (BFCL's items each offer their own tools),
    each answer valid for its own schema; a list that does not match the prompts is refused before any work."""
    chosen = [SCHEMAS[i] for i in (0, 1, 6)]
    prompts = [prompt_for(backend, q, s) for q, s in chosen]
    constraints = [JsonConstraint.of(s) for _, s in chosen]
    params = SamplingParams(max_new_tokens=64, temperature=1.0, top_p=0.95, top_k=50)
    gens = backend.generate(prompts, 1, params, seeds=[0, 1, 2], constraint=constraints)
    for (_, schema), gen in zip(chosen, gens, strict=True):
        for completion in answers(gen):
            jsonschema.validate(json.loads(completion.text), schema)
    with pytest.raises(CandorError, match="2 constraints for 3 prompts"):
        backend.generate(prompts, 1, params, constraint=constraints[:2])
