"""The hf backend's live engine: requests joining the running decode loop, checked against ``generate``."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from candor.backends.base import LIVE_DECODE, DecodeRequest, Generations, SamplingParams, backend_capabilities
from candor.backends.engine import DEFAULT_PREFILL_CHUNK
from candor.backends.engine import shared_prefix as shared_prefix_module
from candor.backends.engine.chunked_prefill import chunking_agrees
from candor.backends.engine.shared_prefix import SharedPrefix
from candor.backends.hf import HFBackend
from candor.util.errors import CandorError

PROMPTS = [
    "Question: What is the largest planet?\nAnswer:",
    "Question: Who painted the Mona Lisa? Give the full name of the painter.\nAnswer:",
    "Hello",
    "Question: 2+2?\nAnswer:",
]
LONG = SamplingParams(max_new_tokens=24, stop=())
WAIT = 60  # seconds a test waits for the engine before failing (never reached when it works)


@pytest.fixture()
def backend(lively_model, tokenizer):
    return HFBackend(lively_model, tokenizer, batch_size=4, model_name="lively")


def assert_same(got: Generations, expected: Generations) -> None:
    got_rows, expected_rows = [got.greedy, *got.samples], [expected.greedy, *expected.samples]
    assert len(got_rows) == len(expected_rows)
    for a, b in zip(got_rows, expected_rows, strict=True):
        assert (a is None) == (b is None)
        if a is None:
            continue
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        # 1e-5, plus float32 rounding relative to the value (the scaled-up weights give large logits).
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


def test_backend_declares_live_decode(backend):
    assert LIVE_DECODE in backend_capabilities(backend)


def test_requests_joining_at_different_steps_equal_generate_alone(backend):
    # Different settings per request: each row samples with its own request's parameters.
    settings = [
        (PROMPTS[0], 3, LONG, 11),
        (PROMPTS[1], 2, SamplingParams(max_new_tokens=9, temperature=0.7, top_k=5, stop=("e",)), 12),
        (PROMPTS[2], 0, SamplingParams(max_new_tokens=6, stop=()), 13),
        (PROMPTS[3], 4, SamplingParams(max_new_tokens=12, top_p=0.5, stop=("\n",)), 14),
    ]
    futures: list[Future[Generations]] = []
    joined_at: list[int] = []
    first_tokens: list[int] = []

    with backend.live_engine(max_rows=64) as engine:

        def first_request_hook(sample: int, token: int) -> bool:
            # The long request's greedy row submits the others at its steps 2, 4 and 7.
            if sample == -1:
                first_tokens.append(token)
                if len(first_tokens) in (2, 4, 7):
                    prompt, n, params, seed = settings[len(futures)]
                    joined_at.append(len(first_tokens))
                    futures.append(engine.submit(DecodeRequest(prompt=prompt, n=n, params=params, seed=seed)))
            return True

        prompt, n, params, seed = settings[0]
        futures.append(
            engine.submit(DecodeRequest(prompt=prompt, n=n, params=params, seed=seed, on_token=first_request_hook))
        )
        results = [futures[0].result(WAIT)]
        results += [f.result(WAIT) for f in futures[1:]]
    assert len(futures) == 4 and joined_at == [2, 4, 7]
    for (prompt, n, params, seed), got in zip(settings, results, strict=True):
        expected = backend.generate([prompt], n, params, seeds=[seed])[0]
        assert_same(got, expected)
        assert got.prompt_tokens == expected.prompt_tokens
    # Rows ended at various steps, so the batch really changed while the requests ran.
    assert len({len(c.token_ids) for g in results for c in [g.greedy, *g.samples]}) > 2


def test_a_request_starts_before_the_running_one_ends(backend):
    long_tokens: list[int] = []
    seen_by_short: list[int] = []
    at_third = threading.Event()
    submitted = threading.Event()

    def long_hook(sample: int, token: int) -> bool:
        long_tokens.append(token)
        if len(long_tokens) == 3:
            at_third.set()
            assert submitted.wait(WAIT)  # the engine holds here until the other request is queued
        return True

    def short_hook(sample: int, token: int) -> bool:
        seen_by_short.append(len(long_tokens))  # how far the long request was at each of our steps
        return True

    with backend.live_engine() as engine:
        long = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=0, params=LONG, on_token=long_hook))
        assert at_third.wait(WAIT)
        short = engine.submit(
            DecodeRequest(prompt=PROMPTS[3], n=0, params=SamplingParams(max_new_tokens=4, stop=()), on_token=short_hook)
        )
        submitted.set()
        short_result = short.result(WAIT)
        long_result = long.result(WAIT)
    assert len(long_result.greedy.token_ids) == LONG.max_new_tokens
    assert len(short_result.greedy.token_ids) == 4
    # The short request decoded its first token at the long one's 4th step and ended long before its last.
    assert seen_by_short == [4, 5, 6, 7]


def test_prefill_hook_sees_the_hidden_states_and_can_decline(backend):
    seen: list[list[np.ndarray]] = []
    tokens: list[int] = []

    def decline(states) -> bool:
        seen.append(list(states))
        return False

    def count(sample: int, token: int) -> bool:
        tokens.append(token)
        return True

    with backend.live_engine() as engine:
        declined = engine.submit(
            DecodeRequest(prompt=PROMPTS[1], n=3, params=LONG, on_prefill=decline, on_token=count)
        ).result(WAIT)
        kept_states: list[list[np.ndarray]] = []
        kept = engine.submit(
            DecodeRequest(
                prompt=PROMPTS[1], n=1, params=LONG, seed=5, on_prefill=lambda s: kept_states.append(list(s)) or True
            )
        ).result(WAIT)
    assert tokens == []  # nothing was decoded for the declined request
    assert declined.greedy is None and declined.samples == []
    assert declined.prompt_tokens == len(backend.encode([PROMPTS[1]])[0])
    assert len(seen) == 1 and len(seen[0]) == backend.model.config.num_hidden_layers + 1
    for layer, state in enumerate(seen[0]):
        assert state.dtype == np.float32 and state.shape == (backend.model.config.hidden_size,)
        np.testing.assert_allclose(state, backend.hidden_states([PROMPTS[1]], layer=layer)[0], atol=1e-5, rtol=0)
    for a, b in zip(kept_states[0], seen[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert_same(kept, backend.generate([PROMPTS[1]], 1, LONG, seeds=[5])[0])


def test_call_runs_on_the_engine_thread_between_steps(backend):
    hook_threads: set[int] = set()

    def hook(sample: int, token: int) -> bool:
        hook_threads.add(threading.get_ident())
        return True

    with backend.live_engine() as engine:
        running = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=1, params=LONG, on_token=hook))
        scored = engine.call(lambda: (threading.get_ident(), backend.score([PROMPTS[0]], [" Jupiter"])))
        thread, scores = scored.result(WAIT)
        running.result(WAIT)
        failing = engine.call(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(WAIT)
    assert hook_threads == {thread} and thread != threading.get_ident()
    assert scores == backend.score([PROMPTS[0]], [" Jupiter"])


def test_a_failing_request_leaves_the_others_intact(backend):
    def explode_at_third(sample: int, token: int) -> bool:
        if sample == 0 and explode_at_third.count == 2:
            raise RuntimeError("hook failed")
        explode_at_third.count += sample == 0
        return True

    explode_at_third.count = 0

    def bad_prefill(states) -> bool:
        raise ValueError("prefill hook failed")

    params = SamplingParams(max_new_tokens=10, stop=())
    with backend.live_engine() as engine:
        good = [engine.submit(DecodeRequest(prompt=p, n=2, params=params, seed=i)) for i, p in enumerate(PROMPTS[:2])]
        bad = engine.submit(DecodeRequest(prompt=PROMPTS[2], n=2, params=params, on_token=explode_at_third))
        bad_start = engine.submit(DecodeRequest(prompt=PROMPTS[3], n=2, params=params, on_prefill=bad_prefill))
        after = engine.submit(DecodeRequest(prompt=PROMPTS[3], n=2, params=params, seed=9))
        with pytest.raises(RuntimeError, match="hook failed"):
            bad.result(WAIT)
        with pytest.raises(ValueError, match="prefill hook failed"):
            bad_start.result(WAIT)
        results = [f.result(WAIT) for f in good] + [after.result(WAIT)]
    for (prompt, seed), got in zip([(PROMPTS[0], 0), (PROMPTS[1], 1), (PROMPTS[3], 9)], results, strict=True):
        assert_same(got, backend.generate([prompt], 2, params, seeds=[seed])[0])


def test_close_fails_what_is_queued_and_running(backend):
    started, release = threading.Event(), threading.Event()

    def hold(sample: int, token: int) -> bool:
        started.set()
        assert release.wait(WAIT)
        return True

    engine = backend.live_engine()
    running = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=0, params=LONG, on_token=hold))
    assert started.wait(WAIT)
    queued = engine.submit(DecodeRequest(prompt=PROMPTS[1], n=1, params=LONG))
    queued_call = engine.call(lambda: "never")
    closer = threading.Thread(target=engine.close)
    closer.start()
    # close() refuses new work at once, while the engine thread is still held in the hook.
    for _ in range(10_000):
        try:
            engine.submit(DecodeRequest(prompt=PROMPTS[2], n=0, params=LONG)).cancel()
        except CandorError:
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("close() never refused new requests")
    release.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    for future in (running, queued, queued_call):
        with pytest.raises(CandorError, match="closed"):
            future.result(WAIT)
    with pytest.raises(CandorError, match="closed"):
        engine.call(lambda: None)
    engine.close()  # twice is fine


def test_bad_requests_are_refused_at_submit(backend):
    with backend.live_engine() as engine:
        with pytest.raises(CandorError, match="non-negative"):
            engine.submit(DecodeRequest(prompt=PROMPTS[0], n=-1, params=LONG))
        with pytest.raises(CandorError, match="max_new_tokens"):
            engine.submit(DecodeRequest(prompt=PROMPTS[0], n=1, params=SamplingParams(max_new_tokens=0)))
        nothing = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=0, params=LONG, greedy=False)).result(WAIT)
    assert nothing.greedy is None and nothing.samples == []
    with pytest.raises(CandorError, match="max_rows"):
        backend.live_engine(max_rows=0)


def test_a_request_waits_for_free_rows(backend):
    # max_rows=4: a request of 3 rows runs; the next one (3 rows) waits until it has ended.
    order: list[str] = []

    def track(name: str):
        def hook(sample: int, token: int) -> bool:
            order.append(name)
            return True

        return hook

    params = SamplingParams(max_new_tokens=5, stop=())
    with backend.live_engine(max_rows=4) as engine:
        first = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=2, params=params, on_token=track("first")))
        second = engine.submit(DecodeRequest(prompt=PROMPTS[1], n=2, params=params, seed=3, on_token=track("second")))
        first.result(WAIT)
        got = second.result(WAIT)
    assert order.index("second") > len(order) - 1 - order[::-1].index("first")  # no overlap
    assert_same(got, backend.generate([PROMPTS[1]], 2, params, seeds=[3])[0])


# ---------------------------------------------------------------- a shared prefix, run once

FEWSHOT = (
    "Answer the question in a few words.\n"
    "Question: What is the capital of France?\nAnswer: Paris\n\n"
    "Question: Who wrote Hamlet?\nAnswer: William Shakespeare\n\n"
)
FEWSHOT_QUESTIONS = ["What is the largest planet?", "Who painted the Mona Lisa?", "How many legs has a spider?", "2+2?"]
SHARED = [f"{FEWSHOT}Question: {q}\nAnswer:" for q in FEWSHOT_QUESTIONS]
SHORT = SamplingParams(max_new_tokens=10, stop=("\n",))


@pytest.fixture()
def counted(backend, monkeypatch):
    """``backend`` recording every prefill's width (tokens run per row) and every run of a shared prefix."""
    with torch.inference_mode(), backend.packed_linears:  # memoized: the engines' start-up check counts nothing
        assert chunking_agrees(backend, DEFAULT_PREFILL_CHUNK)
    widths: list[int] = []
    prefixes: list[int] = []
    forward, with_states = backend.forward, backend.forward_with_states
    prefill = shared_prefix_module.prefill_shared_prefix

    def count_forward(ids, *args):
        if ids.shape[1] > 1:  # a decode step runs one token per row
            widths.append(ids.shape[1])
        return forward(ids, *args)

    def count_with_states(ids, *args):
        widths.append(ids.shape[1])
        return with_states(ids, *args)

    def count_prefix(model, ids):
        prefixes.append(len(ids))
        return prefill(model, ids)

    monkeypatch.setattr(backend, "forward", count_forward)
    monkeypatch.setattr(backend, "forward_with_states", count_with_states)
    monkeypatch.setattr(shared_prefix_module, "prefill_shared_prefix", count_prefix)
    return backend, widths, prefixes


def template_prefix(backend) -> SharedPrefix:
    prefix = SharedPrefix.of(backend, SHARED[:2])  # two renderings, as serving finds its template's
    assert prefix is not None and len(prefix) > 20
    return prefix


def test_prompts_past_the_prefix_equal_generate_and_the_prefix_runs_once(counted):
    backend, widths, prefixes = counted
    prefix = template_prefix(backend)
    encoded = backend.encode(SHARED)
    with backend.live_engine(max_rows=32, shared_prefix=prefix.ids) as engine:
        futures = [engine.submit(DecodeRequest(prompt=p, n=2, params=SHORT, seed=i)) for i, p in enumerate(SHARED)]
        got = [f.result(WAIT) for f in futures]
        # after the others ended
        more = engine.submit(DecodeRequest(prompt=SHARED[0], n=2, params=SHORT, seed=0)).result(WAIT)
    assert prefixes == [len(prefix)]  # once, for five requests
    # Each request's prefill ran its own tokens past the prefix only.
    assert sorted(widths) == sorted([len(ids) - len(prefix) for ids in encoded] + [len(encoded[0]) - len(prefix)])
    widths.clear()
    for i, (prompt, g) in enumerate(zip(SHARED, got, strict=True)):
        expected = backend.generate([prompt], 2, SHORT, seeds=[i])[0]  # one prompt: prefilled whole
        assert widths[-1] == len(encoded[i])
        assert_same(g, expected)
        assert g.prompt_tokens == expected.prompt_tokens == len(encoded[i])
    assert_same(more, got[0])


def test_a_prompt_without_the_prefix_is_prefilled_whole(counted):
    backend, widths, prefixes = counted
    prefix = template_prefix(backend)
    other = "Question: What is the largest planet?\nAnswer:"
    with backend.live_engine(max_rows=32, shared_prefix=prefix.ids) as engine:
        alone = engine.submit(DecodeRequest(prompt=other, n=2, params=SHORT, seed=5))
        past = engine.submit(DecodeRequest(prompt=SHARED[1], n=2, params=SHORT, seed=6))
        got, got_past = alone.result(WAIT), past.result(WAIT)
        # Both decoded in one cache that keeps the prefix once; the first prompt's rows do not see it.
        assert engine.loop.kv.prefix_length == len(prefix) and backend.lean_step.checked
    # Admitted together or one by one (timing): each prefill ran its own width.
    assert sorted(widths) == sorted(
        [len(backend.encode([other])[0]), len(backend.encode([SHARED[1]])[0]) - len(prefix)]
    )
    assert_same(got, backend.generate([other], 2, SHORT, seeds=[5])[0])
    assert_same(got_past, backend.generate([SHARED[1]], 2, SHORT, seeds=[6])[0])
    # The prefix itself (nothing past it) is no prompt of its own to split: prefilled whole.
    assert SharedPrefix(backend, prefix.ids).starts(prefix.ids) is False


def test_the_prefill_hook_reads_the_requests_own_last_position(counted):
    backend, widths, _ = counted
    prefix = template_prefix(backend)
    seen: list[list] = []

    def hook(states) -> bool:
        seen.append(states)
        return True

    with backend.live_engine(max_rows=32) as plain:
        plain.submit(DecodeRequest(prompt=SHARED[2], n=0, params=SHORT, on_prefill=hook)).result(WAIT)
    with backend.live_engine(max_rows=32, shared_prefix=prefix.ids) as engine:
        engine.submit(DecodeRequest(prompt=SHARED[2], n=0, params=SHORT, on_prefill=hook)).result(WAIT)
    full = len(backend.encode([SHARED[2]])[0])
    assert widths == [full, full - len(prefix)]
    whole, split = seen
    assert len(whole) == len(split) == backend.model.config.num_hidden_layers + 1
    for a, b in zip(whole, split, strict=True):
        assert a.shape == b.shape
        assert abs(a - b).max() <= 1e-4 * max(1.0, abs(a).max())


def test_a_prompt_s_answer_does_not_depend_on_the_requests_beside_it(backend):
    """Bit for bit: the prefix is the engine's, so a prompt's split is the same whatever runs with it."""
    prefix = template_prefix(backend)
    with backend.live_engine(max_rows=64, shared_prefix=prefix.ids) as engine:
        alone = engine.submit(DecodeRequest(prompt=SHARED[3], n=3, params=SHORT, seed=9)).result(WAIT)
        crowd = [engine.submit(DecodeRequest(prompt=p, n=3, params=SHORT, seed=9)) for p in SHARED]
        together = crowd[3].result(WAIT)
        for f in crowd:
            f.result(WAIT)
    for a, b in zip([alone.greedy, *alone.samples], [together.greedy, *together.samples], strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs[0] == b.logprobs[0]  # read from the request's own prefill: the same bits


def test_a_prompt_past_a_sliding_window_is_prefilled_whole(counted, monkeypatch):
    backend, widths, prefixes = counted
    prefix = template_prefix(backend)
    full = len(backend.encode([SHARED[0]])[0])
    # A window the prompt and its answer overrun: the split cache would not be the model's own, as in generate().
    monkeypatch.setattr(backend.model.config, "sliding_window", full + SHORT.max_new_tokens - 1, raising=False)
    with backend.live_engine(max_rows=8, shared_prefix=prefix.ids) as engine:
        engine.submit(DecodeRequest(prompt=SHARED[0], n=0, params=SHORT)).result(WAIT)
    assert widths == [full] and prefixes == []
