"""What a client can make the live engine hold: stop matchers, long prompts, the slot cache's width."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from candor.backends.base import DecodeRequest, SamplingParams
from candor.backends.engine import chunked_prefill, kv_slots, stops
from candor.backends.engine.chunked_prefill import ChunkedPrefill, check_chunk, chunk_ends, chunking_agrees
from candor.backends.engine.stops import MATCHER_CACHE_SIZE, StopMatcher
from candor.backends.hf import HFBackend
from candor.backends.tokens import positions_from_mask, prefill_shared_prefix
from candor.util.errors import CandorError
from candor.util.memory import resident_bytes

WAIT = 120
# About 700 tokens: past one key block of the CPU attention kernel, so the chunks' padding to a block is exercised.
LONG_PROMPT = "Question: " + " ".join(f"item {i} of the list is red." for i in range(100)) + "\nAnswer:"
SHORT_PROMPT = "Question: What is the largest planet?\nAnswer:"


@pytest.fixture()
def backend(lively_model, tokenizer):
    return HFBackend(lively_model, tokenizer, batch_size=4, model_name="lively")


# ------------------------------------------------------------------ stop matchers


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc (Linux)")
def test_many_unique_stop_lists_keep_a_bounded_cache_and_little_memory(backend):
    backend.stop_matcher(("warm-up",))  # the decoded vocabulary, once per tokenizer
    unique = 2 * MATCHER_CACHE_SIZE
    before = resident_bytes()
    for i in range(unique):
        # "e" is in about half of the tokens: a matcher holding their ids as a set of ints took ~1.5 MB.
        matcher = backend.stop_matcher(("e", f"#{i}#"))
    grown = resident_bytes() - before
    assert grown < 24 * 2**20, f"{unique} unique stop lists kept {grown / 2**20:.1f} MiB"
    assert len(backend.stop_matchers) == MATCHER_CACHE_SIZE
    assert grown < 8 * 2**20, f"{3 * MATCHER_CACHE_SIZE} unique stop lists kept {grown / 2**20:.1f} MiB"
    # The compact matcher ends on exactly the tokens whose text holds a stop string.
    vocab = stops.decoded_vocab(backend.tokenizer)
    expected = {i for i, text in enumerate(vocab) if "e" in text or f"#{unique - 1}#" in text}
    assert {i for i in range(len(vocab)) if i in matcher.token_ids} == expected
    assert len(matcher.token_ids) == len(expected) and matcher.token_ids.nbytes == len(vocab)
    # The least recently used list went; a list used again stays.
    assert backend.stop_matchers.cached(("e", "#0#")) is None
    assert backend.stop_matchers.cached(("e", f"#{unique - 1}#")) is matcher


def test_a_stop_holding_the_separator_is_found_token_by_token(tokenizer):
    vocab = stops.decoded_vocab(tokenizer)
    matcher = StopMatcher(tokenizer, vocab, ["\x00", "Paris"])
    assert {i for i in range(len(vocab)) if i in matcher.token_ids} == {
        i for i, t in enumerate(vocab) if "\x00" in t or "Paris" in t
    }
    with pytest.raises(ValueError, match="at least one"):
        stops.StopMatchers(tokenizer, size=0)


def test_stop_matchers_are_built_off_the_engine_thread_and_requests_keep_their_order(backend, monkeypatch):
    built_on: list[str] = []
    build = StopMatcher.__init__

    def recording(self, *args, **kwargs):
        built_on.append(threading.current_thread().name)
        build(self, *args, **kwargs)

    monkeypatch.setattr(StopMatcher, "__init__", recording)
    started: list[int] = []
    params = [SamplingParams(max_new_tokens=6, stop=(f"zz{i}", "\n")) for i in range(4)]
    with backend.live_engine(max_rows=8) as engine:
        futures = [
            engine.submit(
                DecodeRequest(prompt=SHORT_PROMPT, n=0, params=p, on_prefill=lambda s, i=i: started.append(i) or True)
            )
            for i, p in enumerate(params)
        ]
        got = [f.result(WAIT) for f in futures]
    assert "candor-live-engine" not in built_on
    assert built_on.count("candor-stop-matchers_0") == 4
    assert started == [0, 1, 2, 3]  # admitted in the order submitted
    for p, g in zip(params, got, strict=True):
        assert g.greedy.token_ids == backend.generate([SHORT_PROMPT], 0, p)[0].greedy.token_ids


def test_a_pending_stop_matcher_build_delays_only_the_request_that_needs_it(backend, monkeypatch):
    """Issue 53, defect 9: while one request's unique stop list is being built, a request without stops
    (and one whose matcher is kept) is admitted and finishes; the first one runs once its matcher is ready."""
    release, building, events = threading.Event(), threading.Event(), []
    build = StopMatcher.__init__

    def held(self, tokenizer, vocab, stop_strings):
        if "held-back" in stop_strings:  # the expensive unique list: its build waits until the test lets it go
            building.set()
            release.wait(WAIT)
            events.append("built")
        build(self, tokenizer, vocab, stop_strings)

    monkeypatch.setattr(StopMatcher, "__init__", held)
    kept = ("\n",)
    backend.stop_matcher(kept)  # a list the backend already has a matcher for
    slow = SamplingParams(max_new_tokens=4, stop=("held-back", "\n\n"))
    params = {"none": SamplingParams(max_new_tokens=4), "kept": SamplingParams(max_new_tokens=4, stop=kept)}
    with backend.live_engine(max_rows=8) as engine:
        try:
            pending = engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=slow))
            assert building.wait(WAIT)
            for name, p in params.items():
                got = engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=p)).result(WAIT)
                events.append(name)
                assert got.greedy.token_ids == backend.generate([SHORT_PROMPT], 0, p)[0].greedy.token_ids
            assert not pending.done()  # still waiting for its matcher, which only it needs
        finally:
            release.set()
        pending.result(WAIT)
        events.append("held-back")
    assert events == ["none", "kept", "built", "held-back"]


# ------------------------------------------------------------------ chunked prefill


def whole_prefill(backend, ids, prefix: int = 0):
    """A prompt prefilled in one piece as the live engine has always done it (over the prefix's cache, if any)."""
    cache = prefill_shared_prefix(backend.model, ids[:prefix]) if prefix else backend.new_cache()
    tensor = torch.tensor([ids[prefix:]])
    mask = torch.ones(1, len(ids), dtype=torch.long) if prefix else torch.ones_like(tensor)
    positions = positions_from_mask(mask)[:, -tensor.shape[1] :]
    logits, states = backend.forward_with_states(tensor, mask, cache, positions)
    return logits, states, cache


def test_chunks_end_where_the_attention_kernel_cuts_one_piece():
    assert chunk_ends(0, 1000, 256) == [256, 512, 768, 1000]  # a last chunk of 232 rows: 64 x 3 + 40, as one piece
    assert chunk_ends(0, 700, 256) == [256, 700]  # not a last chunk of 188 rows (cut in blocks of 32)
    assert chunk_ends(10, 300, 256) == [300]  # 290 rows: no last chunk of at least 192 rows besides the whole
    assert chunk_ends(0, 900, 256) == [256, 512, 900]
    # 833 rows: one piece cuts them 256+256+256+65, a last chunk of 321 rows 64 x 5 + 1, a one-row sliver.
    assert chunk_ends(0, 833, 256) == [833] and chunk_ends(0, 1857, 256) == [256, 512, 768, 1024, 1857]
    assert chunk_ends(37, 37 + 1500, 128) == [37 + 128 * i for i in range(1, 11)] + [37 + 1500]


@pytest.mark.parametrize(("prefix", "rows"), [(0, None), (37, None), (0, 833), (37, 705)])
def test_chunked_prefill_gives_the_bits_of_one_piece(backend, prefix, rows):
    ids = backend.encode([LONG_PROMPT])[0]
    ids = ids if rows is None else ids[: prefix + rows]  # 833 and 705 rows end in a sliver of 1 row
    assert len(ids) > chunked_prefill.KV_BLOCK + 128
    with torch.inference_mode(), backend.packed_linears:
        logits, states, cache = whole_prefill(backend, ids, prefix)
        prefix_cache = prefill_shared_prefix(backend.model, ids[:prefix]) if prefix else None
        for chunk in (64, 192, 256):
            chunked = ChunkedPrefill.start(backend, ids, chunk, prefix_cache, prefix, with_states=True)
            steps = 1
            while not chunked.step():
                steps += 1
            assert steps == len(chunked.ends) == len(chunk_ends(prefix, len(ids), chunk))
            assert torch.equal(chunked.logits, logits), chunk
            assert all(torch.equal(a, b) for a, b in zip(chunked.states, states, strict=True)), chunk
            for mine, theirs in zip(chunked.cache.layers, cache.layers, strict=True):
                assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
        assert chunking_agrees(backend, 64)


def test_chunk_sizes_that_change_the_bits_are_refused(backend):
    for bad in (1, 7, 97, 0):
        with pytest.raises(ValueError, match="multiple of 64"):
            check_chunk(bad)
    with pytest.raises(CandorError, match="multiple of 64"):
        backend.live_engine(prefill_chunk=100)


def test_a_long_prompt_is_prefilled_in_chunks_while_a_short_one_decodes(backend):
    order: list[str] = []
    states: dict[str, list[np.ndarray]] = {}

    def on_prefill(name):
        def hook(layers) -> bool:
            states[name] = list(layers)
            order.append(f"{name} prefilled")
            return True

        return hook

    short_params = SamplingParams(max_new_tokens=8, stop=())
    long_params = SamplingParams(max_new_tokens=5, stop=())
    results = {}
    for chunk in (64, None):  # chunked, then in one piece
        order.clear()
        with backend.live_engine(max_rows=8, prefill_chunk=chunk) as engine:
            long = engine.submit(
                DecodeRequest(prompt=LONG_PROMPT, n=1, params=long_params, seed=3, on_prefill=on_prefill("long"))
            )
            short = engine.submit(
                DecodeRequest(
                    prompt=SHORT_PROMPT,
                    n=0,
                    params=short_params,
                    on_token=lambda s, t: order.append("short token") or True,
                )
            )
            results[chunk] = (long.result(WAIT), short.result(WAIT), dict(states))
            if chunk is not None:
                assert engine.prefill_chunk == 64  # chunking agreed with one piece here
        if chunk is not None:
            # The short request decoded all its tokens while the long prompt's chunks ran between its steps.
            assert order.index("long prefilled") > max(i for i, e in enumerate(order) if e == "short token")
        else:
            assert order[0] == "long prefilled"
    (long_c, short_c, states_c), (long_w, short_w, states_w) = results[64], results[None]
    pairs = [(long_c.greedy, long_w.greedy), (long_c.samples[0], long_w.samples[0]), (short_c.greedy, short_w.greedy)]
    for a, b in pairs:
        assert a.token_ids == b.token_ids
        assert a.logprobs[0] == b.logprobs[0]  # read from the prefill's logits: the same bits
        # Later steps attend over a window as wide as the widest row beside them, which differs between the runs.
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)
    for a, b in zip(states_c["long"], states_w["long"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("grace", [0.5, 0.0])
def test_a_long_prompts_next_chunk_waits_for_the_follow_up_call_of_a_request_that_just_ended(
    backend, monkeypatch, grace
):
    """After a request's rows end, its next call (re-read, scoring) comes within milliseconds: it runs before the
    long prompt's next chunk (which can hold a CPU engine for a second), unless there is no grace to wait."""
    from candor.backends.engine import live_engine

    monkeypatch.setattr(live_engine, "FOLLOW_UP_S", grace)
    order: list[str] = []
    step = ChunkedPrefill.step

    def recorded_step(self):
        order.append("chunk")
        return step(self)

    monkeypatch.setattr(ChunkedPrefill, "step", recorded_step)
    with backend.live_engine(max_rows=8, prefill_chunk=64) as engine:
        long = engine.submit(
            DecodeRequest(prompt=LONG_PROMPT * 2, n=0, params=SamplingParams(max_new_tokens=2, stop=()))
        )
        short = engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=SamplingParams(max_new_tokens=4, stop=())))
        follow_up = threading.Event()

        def call_soon(_):  # the follow-up arrives 10 ms after the rows end, as a waking coroutine's would
            order.append("short done")
            threading.Timer(
                0.01, lambda: engine.call(lambda: order.append("call")).add_done_callback(lambda _: follow_up.set())
            ).start()

        short.add_done_callback(call_soon)
        assert follow_up.wait(WAIT)
        long.result(WAIT)
    after = order[order.index("short done") :]
    assert after.count("chunk") >= 1  # the long prompt was still prefilling when the short request ended
    assert (after[1] == "call") == (grace > 0), order


# ------------------------------------------------------------------ the slot cache gives memory back


def test_the_slot_cache_shrinks_after_a_long_request_and_is_released_when_idle(backend, monkeypatch):
    monkeypatch.setattr(kv_slots, "SHRINK_BYTES", 0)  # the tiny model's buffers are far below the real threshold
    monkeypatch.setattr(kv_slots, "RESTING_COLUMNS", 0)  # and the short request's 48 columns are released too
    long_ids = backend.encode([LONG_PROMPT])[0]
    short_params = SamplingParams(max_new_tokens=40, stop=())
    widths: list[int] = []

    with backend.live_engine(max_rows=8, prefill_chunk=None) as engine:
        kv = engine.loop.kv

        def watch(sample: int, token: int) -> bool:
            widths.append(kv.capacity_columns)
            return True

        short = engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=short_params, on_token=watch))
        long = engine.submit(DecodeRequest(prompt=LONG_PROMPT, n=0, params=SamplingParams(max_new_tokens=2, stop=())))
        long.result(WAIT)
        got = short.result(WAIT)
        engine.call(lambda: None).result(WAIT)  # the step that ended the short request is over
        assert kv.shrinks >= 2 and kv.cache is None  # shrunk while the short one ran, released once idle
    assert max(widths) >= len(long_ids)  # the long prompt widened every slot
    assert widths[-1] < len(long_ids) // 2  # and the short request finished in a narrow cache again
    expected = backend.generate([SHORT_PROMPT], 0, short_params)[0].greedy
    assert got.greedy.token_ids == expected.token_ids
    np.testing.assert_allclose(got.greedy.logprobs, expected.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc (Linux)")
def test_an_idle_engine_gives_back_what_a_large_request_freed_once_it_has_grown():
    from candor.util.memory import IdleTrimmer

    trimmer = IdleTrimmer(growth=64 * 2**20, interval_s=0.0)
    assert trimmer.on_idle() is None and trimmer.trims == 1  # the first idle moment finds the rest level
    assert trimmer.on_idle() is None and trimmer.trims == 1  # no growth since: no trim (a trim walks the heap)
    blocks = [bytearray(100_000) for _ in range(3000)]  # 300 MB in heap-sized pieces, then freed
    pin = bytearray(100_000)  # allocated after them: the heap's top stays in use, so free() alone keeps the pages
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touch every page
    peak = resident_bytes()
    del blocks
    assert trimmer.on_idle() is None and trimmer.trims == 2
    assert resident_bytes() < peak - 150 * 2**20, "the freed heap pages were not given back"
    del pin


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc (Linux)")
def test_a_trim_too_soon_after_the_last_is_put_off_and_says_when_it_is_due():
    from candor.util.memory import IdleTrimmer

    trimmer = IdleTrimmer(growth=64 * 2**20, interval_s=30.0)
    assert trimmer.on_idle() is None and trimmer.trims == 1
    blocks = [bytearray(100_000) for _ in range(1500)]
    pin = bytearray(100_000)
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])
    del blocks
    due = trimmer.on_idle()
    assert due is not None and 0 < due <= 30.0 and trimmer.trims == 1  # put off: the engine asks again then
    trimmer.trimmed_at -= 30.0  # as if the interval had passed
    assert trimmer.on_idle() is None and trimmer.trims == 2
    del pin


def test_a_chunked_prefills_cache_is_freed_when_dropped_not_left_to_the_cycle_collector(backend):
    """A long prompt's cache is hundreds of megabytes: in a reference cycle, an idle server would keep it."""
    import gc
    import weakref

    prefill = ChunkedPrefill.start(backend, backend.encode([LONG_PROMPT])[0], 64, room=8)
    while not prefill.step():
        pass
    roomy = prefill.with_room(16)
    gc.disable()
    try:
        caches = [weakref.ref(prefill.cache), weakref.ref(roomy.cache)]
        del prefill, roomy
        assert [ref() for ref in caches] == [None, None]
    finally:
        gc.enable()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc (Linux)")
def test_an_idle_engine_trims_what_its_callers_freed_after_its_last_work(backend):
    """The callers drop the last requests' caches after the engine's last work for them: the engine looks again."""
    import time

    with backend.live_engine(max_rows=4) as engine:
        engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=SamplingParams(max_new_tokens=2, stop=()))).result(
            WAIT
        )
        time.sleep(0.2)  # the engine has gone idle and found its rest level
        trims = engine.memory_trims
        blocks = [bytearray(100_000) for _ in range(3000)]  # a caller's 300 MB, freed after the engine went idle
        pin = bytearray(100_000)
        for block in blocks:
            block[::4096] = b"x" * len(block[::4096])
        peak = resident_bytes()
        del blocks
        deadline = time.monotonic() + 10
        while engine.memory_trims == trims and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.memory_trims > trims, "the idle engine never looked at its memory again"
        assert resident_bytes() < peak - 150 * 2**20
        del pin
