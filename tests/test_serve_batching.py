"""The engine a served question runs on: the live decode loop, or micro-batches of ``generate`` (issue 24).

Real models only: the tiny real Llama behind the ``hf`` backend, declared without its live engine where
the micro-batching adapter is under test (as a remote backend is).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_counting import CountingBackend

from candor.backends.base import LIVE_DECODE, DecodeRequest, SamplingParams
from candor.backends.engine.live_engine import HFLiveEngine
from candor.serve.batching import Admission, EngineClosed, MicroBatchEngine, QueueFull, open_engine
from candor.util.errors import CandorError

PROMPTS = [f"Question: Who painted picture number {i}?\nAnswer:" for i in range(6)]
PARAMS = SamplingParams(max_new_tokens=6)


class BatchOnlyBackend(CountingBackend):
    """The real hf backend without its live engine: served through micro-batches of ``generate``."""

    capabilities = CountingBackend.capabilities - {LIVE_DECODE}


@pytest.fixture()
def batch_only(tiny_model, tokenizer):
    return BatchOnlyBackend(tiny_model, tokenizer, batch_size=16)


def test_open_engine_gives_the_live_engine_where_the_backend_has_one(tiny_model, tokenizer, batch_only):
    from candor.backends.hf import HFBackend

    live = open_engine(HFBackend(tiny_model, tokenizer))
    batched = open_engine(batch_only)
    try:
        assert isinstance(live, HFLiveEngine) and isinstance(batched, MicroBatchEngine)
    finally:
        live.close()
        batched.close()


def test_concurrent_requests_share_one_generate_call_and_get_what_generate_gives_each(batch_only):
    engine = MicroBatchEngine(batch_only, max_batch=16, max_wait_ms=300)
    try:
        futures = [
            engine.submit(DecodeRequest(prompt=p, n=2, params=PARAMS, seed=10 + i)) for i, p in enumerate(PROMPTS)
        ]
        got = [f.result(timeout=120) for f in futures]
    finally:
        engine.close()
    assert engine.batches == 1 and len(batch_only.calls) == 1
    for i, (p, g) in enumerate(zip(PROMPTS, got, strict=True)):
        alone = batch_only.generate([p], 2, PARAMS, seeds=[10 + i])[0]
        assert g.greedy.token_ids == alone.greedy.token_ids
        assert [s.token_ids for s in g.samples] == [s.token_ids for s in alone.samples]


def test_a_request_that_fails_its_batch_fails_alone(batch_only):
    """A failing request (its token hook raises) is isolated: the batch is rerun request by request."""

    def broken(sample: int, token: int) -> bool:
        raise RuntimeError("a listener bug")

    engine = MicroBatchEngine(batch_only, max_wait_ms=300)
    try:
        futures = [
            engine.submit(DecodeRequest(prompt=p, n=0, params=PARAMS, on_token=broken if i == 2 else None))
            for i, p in enumerate(PROMPTS)
        ]
        for i, f in enumerate(futures):
            if i == 2:
                with pytest.raises(RuntimeError, match="a listener bug"):
                    f.result(timeout=120)
            else:
                assert f.result(timeout=120).greedy is not None
    finally:
        engine.close()


def test_a_cancelled_request_is_never_generated_and_calls_run_in_the_engine_thread(batch_only):
    engine = MicroBatchEngine(batch_only, max_wait_ms=300)
    try:
        kept = engine.submit(DecodeRequest(prompt=PROMPTS[0], n=0, params=PARAMS))
        dropped = engine.submit(DecodeRequest(prompt=PROMPTS[1], n=0, params=PARAMS))
        assert dropped.cancel()
        where = engine.call(lambda: threading.current_thread().name).result(timeout=120)
        assert kept.result(timeout=120).greedy is not None
    finally:
        engine.close()
    assert where == "candor-engine"
    assert batch_only.generated == [PROMPTS[0]]
    with pytest.raises(EngineClosed):
        engine.submit(DecodeRequest(prompt=PROMPTS[0], n=0, params=PARAMS))
    with pytest.raises(CandorError, match="live engine"):  # the adapter has no prefill to read
        MicroBatchEngine(batch_only).submit(
            DecodeRequest(prompt=PROMPTS[0], n=0, params=PARAMS, on_prefill=lambda s: True)
        )


def test_admission_takes_a_request_whole_or_not_at_all():
    admission = Admission(3)
    admission.admit(2)
    with pytest.raises(QueueFull):
        admission.admit(2)
    assert admission.in_flight == 2
    admission.release()
    admission.admit(2)
    assert admission.in_flight == 3 and admission.admitted == 4


def test_a_short_request_finishes_while_a_long_one_is_still_decoding(tiny_model, tokenizer):
    """Continuous batching through the real server: a request never waits for the running batch to end."""
    from candor.serve import Decoding, HonestModel
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread

    backend = CountingBackend(tiny_model, tokenizer, batch_size=16)
    backend.token_delay = 0.01  # 400 tokens take 4 s or more
    # The protocol answers are 4 tokens; the long request's sampled reply runs to 400.
    model = HonestModel(backend, "n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    long_q = "Which is the longest river, asked at length?"

    def ask(question: str, max_tokens: int) -> float:
        body = {
            "model": "candor",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0.5,
            "seed": 1,
        }
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert resp.status == 200
        return time.monotonic()

    with serve_in_thread(create_app(model, ServeSettings(max_tokens=400))) as url, ThreadPoolExecutor(2) as pool:
        long_done = pool.submit(ask, long_q, 400)
        deadline = time.monotonic() + 120
        while not long_done.done() and time.monotonic() < deadline and backend.tokens_for(long_q) == 0:
            time.sleep(0.05)  # the long request's protocol generation has finished; its reply is decoding
        short_done = pool.submit(ask, "What is two plus two, asked briefly?", 2)
        assert short_done.result() < long_done.result()  # the short one finished first


def test_a_question_source_that_runs_elsewhere_never_holds_the_engine(tiny_model, tokenizer, tiny_model_dir, tmp_path):
    """A question-level source marked ``runs_in_engine = False`` (a remote classifier) scores in a worker thread."""
    from candor.serve import Decoding, HonestModel
    from candor.serve.confidence_sources import HeadSource
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    lm, tok = load_causal_lm(tiny_model_dir, device="cpu")
    folder = ConfidenceHead.create(lm, tok, HeadConfig(backbone=tiny_model_dir, template="chat"), seed=1)
    folder = folder.save_pretrained(tmp_path / "head")

    class Apart(HeadSource):
        runs_in_engine = False
        threads: list[str] = []

        def score_questions(self, questions):
            self.threads.append(threading.current_thread().name)
            return super().score_questions(questions)

    model = HonestModel(
        BatchOnlyBackend(tiny_model, tokenizer), Apart(folder), template="fewshot", decoding=Decoding(max_new_tokens=3)
    )
    got = model.answer(PROMPTS[0]).confidence
    assert Apart.threads and all(not t.startswith("candor-") for t in Apart.threads)
    assert got == pytest.approx(float(HeadSource(folder).score_questions([PROMPTS[0]])[0]), abs=1e-6)


@pytest.mark.parametrize("template", ["fewshot", "chat"])
def test_a_served_models_live_engine_runs_its_templates_prefix_once(tiny_model, tokenizer, template):
    """The engine gets the template's own prefix (never one found from the questions queued together)."""
    from candor.backends.engine.shared_prefix import SharedPrefix
    from candor.backends.hf import HFBackend
    from candor.serve import HonestModel
    from candor.serve.confidence_sources import question_item

    backend = HFBackend(tiny_model, tokenizer, batch_size=4)
    model = HonestModel(backend, "n-prob", template=template)
    renderings = [model.template(question_item(q), backend) for q in ("Who?", "Which river is longest?")]
    expected = SharedPrefix.of(backend, renderings)
    assert expected is not None and len(expected) >= 8
    engine = model.open_engine(max_batch=4)
    try:
        assert isinstance(engine, HFLiveEngine)
        assert engine.prefix is not None and engine.prefix.ids == expected.ids
        prompt = model.template(question_item("What is the tallest mountain?"), backend)
        assert engine.prefix.starts(backend.encode([prompt])[0])
    finally:
        engine.close()
    # A backend without a live engine gets the micro-batcher, which finds its batches' prefix itself.
    batched = HonestModel(BatchOnlyBackend(tiny_model, tokenizer, batch_size=4), "n-prob", template=template)
    engine = batched.open_engine(max_batch=4)
    try:
        assert isinstance(engine, MicroBatchEngine)
    finally:
        engine.close()


def test_a_server_backed_engine_starts_a_request_while_another_ones_call_runs(tiny_model, tokenizer):
    """With a backend whose server batches for itself (``concurrent_calls``), a group never waits for another.

    The generation server is a real ``candor serve`` (slowed per token); the engine in front talks to it
    through the openai backend, as ``candor serve --backend openai`` does.
    """
    from candor.backends.openai import OpenAIBackend
    from candor.serve import Decoding, HonestModel
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread

    backend = CountingBackend(tiny_model, tokenizer, batch_size=16)
    backend.token_delay = 0.01  # 400 tokens take 4 s or more
    generator = HonestModel(backend, "n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    long_q, short_q = "Which is the longest river, asked at length?", "What is two plus two, asked briefly?"
    with serve_in_thread(create_app(generator, ServeSettings(max_tokens=400))) as url:
        remote = OpenAIBackend("candor", base_url=f"{url}/v1", capabilities=["generate"], max_retries=0)
        engine = MicroBatchEngine(remote, max_batch=4, max_wait_ms=0)
        try:
            greedy = SamplingParams(max_new_tokens=400, temperature=0.0, stop=())
            long_f = engine.submit(DecodeRequest(prompt=long_q, n=0, params=greedy))
            deadline = time.monotonic() + 120
            while not long_f.done() and time.monotonic() < deadline and backend.tokens_for(long_q) == 0:
                time.sleep(0.05)  # the long request is being answered by the server
            short_f = engine.submit(
                DecodeRequest(prompt=short_q, n=0, params=SamplingParams(max_new_tokens=2, temperature=0.0))
            )
            short = short_f.result(timeout=300)
            assert not long_f.done()  # the short one did not wait for the long one's call to return
            assert short.greedy is not None and long_f.result(timeout=300).greedy is not None
        finally:
            engine.close()
    assert engine.batches == 2
