"""The in-place KV cache of the decode loop, against references that do not use it.

References: transformers' own ``model.generate(do_sample=False)`` for greedy
token ids, and one teacher-forced forward pass over prompt + generated ids
(no cache, batch of one) for every row's log-probs. Rows are refilled
mid-run: more prompts than the batch holds, of different lengths, ending at
different steps (stop strings, EOS, the token cap).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np
import pytest
import torch

from candor.backends.base import DecodeRequest, Generations, SamplingParams
from candor.backends.engine.decode_loop import ChunkFeed, DecodeJob, DecodeLoop
from candor.backends.engine.kv_slots import SlotKV, copy_rows
from candor.backends.hf import HFBackend
from candor.backends.tokens import prefill_shared_prefix, usable_prefix_length

PROMPTS = [
    "Question: What is the largest planet?\nAnswer:",
    "Hello",
    "Question: Who painted the Mona Lisa? Give the full name of the painter, please.\nAnswer:",
    "Question: 2+2?\nAnswer:",
    "The weather today is",
    "Question: Name a prime number larger than one hundred and twenty, and explain why it is prime.\nAnswer:",
    "Once upon a time",
]
WAIT = 60


def transformers_greedy(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy decoding of one unpadded prompt (up to its EOS, which it keeps)."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
    )
    return out[0, ids.shape[1] :].tolist()


def teacher_forced(model, prompt_ids: list[int], ids: list[int]) -> np.ndarray:
    """Log-prob of each of ``ids`` after ``prompt_ids`` and the ids before it: one forward, no cache."""
    with torch.inference_mode():
        full = torch.tensor([prompt_ids + ids])
        logprobs = torch.log_softmax(model(input_ids=full, use_cache=False).logits[0].double(), dim=-1)
    start = len(prompt_ids)
    return logprobs[start - 1 : start - 1 + len(ids)].gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).numpy()


def run_loop(
    backend: HFBackend, prompts: list[str], n: int, params: SamplingParams, prefix: int = 0, split: bool = False
) -> tuple[list[Generations], SlotKV]:
    """What ``generate`` does, keeping the loop to read its cache's counters.

    ``prefix``: the prompts' first tokens prefilled once and shared, as
    ``generate`` does for a common few-shot block; ``split``: the slot cache
    keeps them apart (``generate`` does where the lean step runs).
    """
    encoded = backend.encode(prompts)
    matcher = backend.stop_matcher(params.stop)
    jobs = [
        DecodeJob(prompt_ids=ids, n=n, greedy=True, params=params, seed=seed, matcher=matcher)
        for seed, ids in enumerate(encoded)
    ]
    capacity = backend.batch_size * (1 + n)
    columns = max(map(len, encoded)) + 2 * params.max_new_tokens
    loop = DecodeLoop(backend, rows=capacity, columns=columns, split_prefix=split)
    with torch.inference_mode(), backend.packed_linears:  # as generate runs it (the lean step needs both)
        prefix_cache = prefill_shared_prefix(backend.model, encoded[0][:prefix]) if prefix else None
        loop.run(ChunkFeed(jobs, backend.batch_size, capacity, prefix_cache, prefix))
    assert isinstance(loop.kv, SlotKV)
    return [job.result for job in jobs], loop.kv


def check_against_references(
    backend: HFBackend, prompts: list[str], gens: list[Generations], params, atol: float = 1e-5
) -> None:
    model, matcher = backend.model, backend.stop_matcher(params.stop)
    checks = []
    for prompt, gen in zip(prompts, gens, strict=True):
        prompt_ids = backend.encode([prompt])[0]
        reference = transformers_greedy(model, backend.tokenizer, prompt_ids, params.max_new_tokens)
        greedy = gen.greedy
        assert greedy is not None
        generated = reference[: greedy.completion_tokens]  # what the loop generated, ending token included
        kept = generated[: len(greedy.token_ids)]
        assert greedy.token_ids == kept
        if greedy.completion_tokens > len(greedy.token_ids):  # ended by EOS or a stop string
            last = generated[-1]
            assert last in backend.eos_ids or matcher.hit(generated)
        checks += [(prompt_ids, list(c.token_ids), c.logprobs) for c in [greedy, *gen.samples] if c.token_ids]
    check_logprobs(model, checks, atol)


def check_logprobs(model, checks: list[tuple[list[int], list[int], list[float]]], atol: float) -> None:
    """Each ``(prompt_ids, ids, got)``: ``got`` within ``atol`` of the exact (float64) log-probs, beyond the
    float32 forward's own largest error there.

    A float32 reference is off by rounding too, by more on some CPUs' kernels
    than on others (1.8e-5 on an AVX2-only one, for the lively model), so the
    decode loop is held to the exact values, with the float32 teacher-forced
    forward's distance from them, over the same completions, as the rounding
    it may share.
    """
    twin = float64_twin(model)
    exact = [teacher_forced(twin, prompt_ids, ids) for prompt_ids, ids, _ in checks]
    rounding = max(
        (
            float(np.abs(teacher_forced(model, prompt_ids, ids) - want).max())
            for (prompt_ids, ids, _), want in zip(checks, exact, strict=True)
        ),
        default=0.0,
    )
    for (_, _, got), want in zip(checks, exact, strict=True):
        np.testing.assert_allclose(got, want, atol=atol + rounding, rtol=0)


_TWINS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def float64_twin(model):
    """A float64 copy of ``model``, kept while the model lives."""
    if model not in _TWINS:
        _TWINS[model] = copy.deepcopy(model).double()
    return _TWINS[model]


def test_greedy_and_logprobs_equal_references_with_rows_refilled(lively_model, tokenizer):
    backend = HFBackend(lively_model, tokenizer, batch_size=2)  # 6 rows: every prompt after the second refills
    params = SamplingParams(max_new_tokens=14, stop=("y",))  # rows end at every step from 1 to 14
    gens, kv = run_loop(backend, PROMPTS, 2, params)
    check_against_references(backend, PROMPTS, gens, params)
    lengths = [c.completion_tokens for g in gens for c in [g.greedy, *g.samples]]
    assert len(set(lengths)) > 3 and max(lengths) == params.max_new_tokens
    assert any(c.finish_reason == "stop" for g in gens for c in [g.greedy, *g.samples])
    # The cache really moved rows into freed slots and moved its window back to column 0.
    assert kv.rows_moved > 0 and kv.window_moves > 0
    # generate runs this same loop (its prompts sorted by length, so other prefill batches).
    for got, ours in zip(backend.generate(PROMPTS, 2, params, seeds=list(range(len(PROMPTS)))), gens, strict=True):
        for a, b in zip([got.greedy, *got.samples], [ours.greedy, *ours.samples], strict=True):
            assert a.token_ids == b.token_ids
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


def test_eos_ends_rows_and_leaves_the_others_exact(lively_model, tokenizer):
    # The tiny model's tokens are arbitrary; make the most frequent greedy token an end-of-sequence id.
    backend = HFBackend(lively_model, tokenizer, batch_size=2)
    free = backend.generate(PROMPTS, 0, SamplingParams(max_new_tokens=10, stop=()))
    counts = np.bincount([t for g in free for t in g.greedy.token_ids[1:]])
    backend.eos_ids = backend.eos_ids | {int(counts.argmax())}
    params = SamplingParams(max_new_tokens=10, stop=())
    gens, kv = run_loop(backend, PROMPTS, 1, params)
    assert any(c.stop_logprob is not None for g in gens for c in [g.greedy, *g.samples])
    model, eos = backend.model, backend.eos_ids
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        prompt_ids = backend.encode([prompt])[0]
        reference = transformers_greedy(model, tokenizer, prompt_ids, params.max_new_tokens)
        cut = next((i for i, t in enumerate(reference) if t in eos), len(reference))
        assert gen.greedy.token_ids == reference[:cut]
        for completion in [gen.greedy, *gen.samples]:
            ids = list(completion.token_ids)
            if completion.stop_logprob is not None:  # the EOS token's own log-prob, from the same reference
                ended = ids + [reference[cut]] if completion is gen.greedy else None
                if ended is not None:
                    np.testing.assert_allclose(
                        completion.stop_logprob, teacher_forced(model, prompt_ids, ended)[-1], atol=1e-5, rtol=1e-5
                    )
            if ids:
                np.testing.assert_allclose(
                    completion.logprobs, teacher_forced(model, prompt_ids, ids), atol=1e-5, rtol=1e-5
                )


def test_live_requests_move_the_window_and_grow_the_cache(lively_model, tokenizer):
    # The engine's cache starts sized for the first request; a longer prompt joining later needs
    # room before the write column, so the live rows' window moves; a request with more rows than
    # the engine's max_rows runs alone, in a reallocated (larger) cache.
    backend = HFBackend(lively_model, tokenizer, batch_size=2)
    long_prompt = " ".join(PROMPTS) * 3
    params = SamplingParams(max_new_tokens=12, stop=())
    joined: list[tuple[str, int, int, object]] = []
    with backend.live_engine(max_rows=8) as engine:

        def submit_more(sample: int, token: int) -> bool:
            if sample == -1 and not joined:
                for prompt, n, seed in ((long_prompt, 1, 4), (PROMPTS[2], 9, 5)):
                    joined.append(
                        (prompt, n, seed, engine.submit(DecodeRequest(prompt=prompt, n=n, params=params, seed=seed)))
                    )
            return True

        first = engine.submit(
            DecodeRequest(prompt=PROMPTS[1], n=1, params=params, seed=3, on_token=submit_more)
        ).result(WAIT)
        results = [(PROMPTS[1], 1, 3, first)] + [(p, n, s, f.result(WAIT)) for p, n, s, f in joined]  # type: ignore[attr-defined]
        kv = engine.loop.kv
    assert isinstance(kv, SlotKV) and kv.window_moves > 0 and kv.reallocations > 0
    for prompt, n, seed, got in results:
        expected = backend.generate([prompt], n, params, seeds=[seed])[0]
        assert got.greedy.token_ids == expected.greedy.token_ids
        assert [s.token_ids for s in got.samples] == [s.token_ids for s in expected.samples]
        for a, b in zip([got.greedy, *got.samples], [expected.greedy, *expected.samples], strict=True):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)
    check_against_references(backend, [long_prompt], [results[1][3]], params)


def test_embedded_model_equals_references_with_rows_refilled():
    backend = HFBackend.from_pretrained("smollm2-135m", batch_size=2)
    shots = "Question: What is the capital of France?\nAnswer: Paris\n"
    questions = [
        "Who wrote Hamlet?",
        "What is the boiling point of water in Celsius?",
        "Which planet is known as the red planet?",
        "How many legs does a spider have?",
        "What is the chemical symbol for gold?",
    ]
    prompts = [f"{shots}Question: {q}\nAnswer:" for q in questions]
    params = SamplingParams(max_new_tokens=12, stop=("\n",))
    prefix = usable_prefix_length(backend.model, backend.encode(prompts))
    gens, kv = run_loop(backend, prompts, 2, params, prefix=prefix, split=True)  # as generate runs it
    assert kv.prefix_length == prefix > 0
    # 30 float32 layers: the reference's own two kernels (nn.Linear's MKL and the packed oneDNN,
    # same full forward) already differ by up to 2.1e-5 in these log-probs, so 1e-5 would test rounding.
    check_against_references(backend, prompts, gens, params, atol=5e-5)
    assert kv.rows_moved > 0
    assert any(c.finish_reason == "stop" for g in gens for c in [g.greedy, *g.samples])


SHOTS = "Question: What is the capital of France?\nAnswer: Paris\nQuestion: Who wrote Hamlet?\nAnswer: Shakespeare\n"


@pytest.mark.parametrize("split", [True, False], ids=["prefix-kept-once", "prefix-in-every-slot"])
def test_a_shared_prefix_gives_the_references_kept_once_or_in_every_slot(lively_model, tokenizer, split):
    backend = HFBackend(lively_model, tokenizer, batch_size=2)
    assert backend.lean_step is not None  # split attention is the lean step's
    prompts = [SHOTS + p for p in PROMPTS]
    prefix = usable_prefix_length(backend.model, backend.encode(prompts))
    assert prefix > 20
    params = SamplingParams(max_new_tokens=14, stop=("y",))
    gens, kv = run_loop(backend, prompts, 2, params, prefix=prefix, split=split)
    assert backend.lean_step is not None and backend.lean_step.checked  # decode steps ran the lean step
    check_against_references(backend, prompts, gens, params)
    assert kv.rows_moved > 0
    assert kv.prefix_length == (prefix if split else 0)
    layer = kv.cache.layers[0]
    if split:
        assert layer.prefix_keys.shape[:3] == (1, layer.keys.shape[1], prefix)


def test_generate_keeps_the_prefix_once_with_the_same_tokens(lively_model, tokenizer, monkeypatch):
    backend = HFBackend(lively_model, tokenizer, batch_size=2)
    prompts = [SHOTS + p for p in PROMPTS]
    params = SamplingParams(max_new_tokens=12, stop=("y",))
    kept: list[int] = []
    keep = SlotKV._keep_prefix
    monkeypatch.setattr(SlotKV, "_keep_prefix", lambda self, cache, n: (kept.append(n), keep(self, cache, n))[1])
    split = backend.generate(prompts, 2, params)
    assert kept and kept[0] > 20  # generate really split the prefix
    backend.split_prefix = False
    whole = backend.generate(prompts, 2, params)
    assert len(kept) == 1
    for a, b in zip(split, whole, strict=True):
        for x, y in zip([a.greedy, *a.samples], [b.greedy, *b.samples], strict=True):
            assert x.token_ids == y.token_ids
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5, rtol=1e-5)


def test_rows_without_the_prefix_join_a_cache_keeping_it_and_do_not_see_it(lively_model, tokenizer):
    """As in a live engine with a template: prompts with and without the prefix share one batch."""
    backend = HFBackend(lively_model, tokenizer, batch_size=2)
    prompts = [SHOTS + PROMPTS[0], PROMPTS[2], SHOTS + PROMPTS[3]]  # the second does not start with it
    encoded = backend.encode(prompts)
    prefix = usable_prefix_length(backend.model, [encoded[0], encoded[2]])
    params = SamplingParams(max_new_tokens=10, stop=())
    matcher = backend.stop_matcher(())
    loop = DecodeLoop(backend, rows=4, columns=8, split_prefix=True)
    jobs = [
        DecodeJob(prompt_ids=ids, n=1, greedy=True, params=params, seed=seed, matcher=matcher)
        for seed, ids in enumerate(encoded)
    ]
    with torch.inference_mode(), backend.packed_linears:  # as generate and the live engine run the loop
        prefix_cache = prefill_shared_prefix(backend.model, encoded[0][:prefix])
        loop.admit(loop.prefill(jobs[1:2]))  # without the prefix, before the cache keeps one
        loop.admit(loop.prefill(jobs[:1], prefix_cache, prefix))
        loop.step()
        loop.step()
        loop.admit(loop.prefill(jobs[2:], prefix_cache, prefix))  # joins running rows, the cache grows
        while loop.live_rows:
            loop.step()
        assert isinstance(loop.kv, SlotKV) and loop.kv.prefix_length == prefix
        assert backend.lean_step is not None and backend.lean_step.checked  # the split attention ran
        with pytest.raises(ValueError, match="keeping"):  # one cache keeps one prefix
            shorter = prefill_shared_prefix(backend.model, encoded[0][: prefix - 1])
            loop.admit(loop.prefill(jobs[:1], shorter, prefix - 1))
        other = [*encoded[0][: prefix - 1], encoded[0][prefix - 1] + 1]  # same length, last token changed
        with pytest.raises(ValueError, match="different shared prefix"):
            loop.admit(loop.prefill(jobs[:1], prefill_shared_prefix(backend.model, other), prefix))
    check_against_references(backend, prompts, [job.result for job in jobs], params)


def test_copy_rows_writes_what_advanced_indexing_writes():
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(12, 3, 20, 8, generator=generator)
    prefill = torch.randn(4, 3, 9, 8, generator=generator)
    rows, sources = torch.tensor([7, 2, 10, 3, 5]), torch.tensor([0, 0, 3, 1, 1])
    want = buffer.clone()
    want[rows, :, 11:18] = prefill[sources, :, 2:9]  # admission: prompts repeated into free slots
    copy_rows(buffer[:, :, 11:18], rows, prefill[:, :, 2:9], sources)
    assert torch.equal(buffer, want)
    holes, movers = torch.tensor([1, 4]), torch.tensor([10, 11])
    want[holes, :, 5:15] = want[movers, :, 5:15]  # compaction: within one buffer
    copy_rows(buffer[:, :, 5:15], holes, buffer[:, :, 5:15], movers)
    assert torch.equal(buffer, want)


def test_a_finished_generate_frees_its_cache_without_the_garbage_collector(tiny_backend):
    """The slot cache's layers pointed back at their store: a reference cycle that only ``gc`` freed, so each
    ``generate`` left its KV buffers behind until a collection ran (1.15 GB per call on the embedded model,
    22 GB before the OOM killer on BFCL's tool calls). Freed by reference counts alone now."""
    import gc

    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.95, top_k=50)
    tiny_backend.generate(PROMPTS[:2], 2, params, seeds=[1, 2])  # warm: caches built once stay
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects() if isinstance(o, SlotKV)}
        tiny_backend.generate(PROMPTS[:3], 3, params, seeds=[1, 2, 3])
        left = [o for o in gc.get_objects() if isinstance(o, SlotKV) and id(o) not in before]
    finally:
        gc.enable()
    assert not left, f"{len(left)} slot caches outlived their generate call (kept alive by a reference cycle)"
