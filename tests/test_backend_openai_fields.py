"""The openai backend against an OpenAI-compatible server on 127.0.0.1 that answers from fixtures.

The server is real HTTP (the standard library's ``http.server`` in a thread);
what it answers is built in the documented response format of the legacy
completions endpoint as vLLM fills it (``vllm/entrypoints/openai``:
``CompletionResponse`` with ``usage``, choices with ``finish_reason`` and a
``logprobs`` block of ``text_offset``, ``token_logprobs``, ``tokens`` and
``top_logprobs``, where ``text_offset`` is the running sum of the token
strings' lengths and a position without log-probs, the first echoed prompt
token, has ``None`` in ``token_logprobs`` and ``top_logprobs``). Each test
drops or changes one field the way a real server does and checks what the
backend makes of it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from candor.backends.base import GENERATE, LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE, TOP_LOGPROBS, SamplingParams
from candor.backends.openai import SAMPLES_N, OpenAIBackend
from candor.util.errors import CandorError

MAX_SEED = 2**31 - 1  # what servers take (numpy's and torch's generators)

Responder = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class FixtureServer:
    """``POST /v1/completions`` answered by ``responder(body) -> (status, json)``; every body is kept."""

    def __init__(self, responder: Responder) -> None:
        self.bodies: list[dict[str, Any]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.bodies.append(body)
                status, answer = responder(body)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FixtureServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- the documented response format


def logprobs_block(
    tokens: list[str], lps: list[float | None], tops: list[dict[str, float] | None], start: int = 0
) -> dict[str, Any]:
    """vLLM's ``CompletionLogProbs``: offsets are the running sum of the token strings' lengths."""
    offsets, at = [], start
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def choice(text: str, index: int = 0, finish: str = "length", logprobs: dict[str, Any] | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}


def completion(
    body: dict[str, Any], choices: list[dict], prompt_tokens: int | None, completion_tokens: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "cmpl-fixture",
        "object": "text_completion",
        "created": 0,
        "model": body["model"],
        "choices": choices,
    }
    if prompt_tokens is not None:
        out["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + (completion_tokens or 0),
        }
    return out


def ignores_n(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Like transformers serve: one choice whatever ``n``, no log-probs."""
    return 200, completion(body, [choice(" Paris")], prompt_tokens=5, completion_tokens=2)


PARAMS = SamplingParams(max_new_tokens=4)


# ---------------------------------------------------------------- seeds (issue 23, item 6)


def test_seeds_sent_to_a_server_that_ignores_n_stay_31_bit_distinct_and_deterministic() -> None:
    # Prompt seeds as the serve path makes them (63-bit hashes of the question).
    prompt_seeds = [2**62 + 12345, 2**63 - 1]
    with FixtureServer(ignores_n) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE])
        backend.generate(["q1", "q2"], 5, PARAMS, greedy=False, seeds=prompt_seeds)
        first = [(b["prompt"], b["seed"]) for b in server.bodies]
        server.bodies.clear()
        backend.generate(["q2"], 5, PARAMS, greedy=False, seeds=prompt_seeds[1:])
        again = [(b["prompt"], b["seed"]) for b in server.bodies]
    seeds = [s for _, s in first]
    assert len(seeds) == 10 and all(0 <= s <= MAX_SEED for s in seeds)
    assert len(set(seeds)) == 10  # every (prompt, sample) its own seed
    # The same prompt seed gives the same seeds, whatever shares its batch.
    assert sorted(s for p, s in again) == sorted(s for p, s in first if p == "q2")


def test_one_request_with_server_side_n_sends_a_31_bit_seed() -> None:
    with FixtureServer(ignores_n) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE, SAMPLES_N])
        with pytest.raises(Exception, match="fewer samples"):  # this server ignores n, so the count is checked
            backend.generate(["q"], 3, PARAMS, greedy=False, seeds=[2**62])
    assert [b["n"] for b in server.bodies] == [3]
    assert 0 <= server.bodies[0]["seed"] <= MAX_SEED


def test_sample_seeds_stay_distinct_where_the_31_bit_hash_collides() -> None:
    from candor.backends.openai import MAX_SEED as BACKEND_MAX
    from candor.backends.openai import request_seed, sample_seeds

    assert BACKEND_MAX == MAX_SEED
    plain = [request_seed(0, j) for j in range(100_000)]
    assert len(set(plain)) < len(plain)  # the hash does collide at this size ...
    seeds = sample_seeds(0, 100_000)
    assert len(set(seeds)) == len(seeds)  # ... and the redraw keeps every sample's seed its own
    assert all(0 <= s <= MAX_SEED for s in seeds)
    assert seeds == sample_seeds(0, 100_000)


# ---------------------------------------------------------------- usage and finish_reason (issue 23, item 5)


def test_a_request_with_one_choice_owns_its_usage() -> None:
    with FixtureServer(ignores_n) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE])
        gen = backend.generate(["q"], 2, PARAMS, greedy=True, seeds=[7])[0]
    assert gen.prompt_tokens == 5
    assert [c.completion_tokens for c in (gen.greedy, *gen.samples)] == [2, 2, 2]
    assert [c.finish_reason for c in (gen.greedy, *gen.samples)] == ["length"] * 3


def with_logprobs(counts: list[int], total: int | None, finish: str = "stop") -> Responder:
    """A server that honours ``n``: choice i generated ``counts[i]`` tokens; usage says ``total``."""

    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        n = body.get("n", 1)
        choices = []
        for i in range(n):
            tokens = [" Par", "is", "\n", " and"][: counts[i % len(counts)]]
            block = logprobs_block(tokens, [-0.5] * len(tokens), [{t: -0.5} for t in tokens])
            choices.append(choice("".join(tokens), index=i, finish=finish, logprobs=block))
        return 200, completion(body, choices, prompt_tokens=9, completion_tokens=total)

    return respond


@pytest.mark.parametrize(("total", "expected"), [(7, [3, 4]), (8, [None, None]), (None, [None, None])])
def test_choices_that_share_a_request_split_its_usage_only_when_their_tokens_account_for_it(total, expected) -> None:
    with FixtureServer(with_logprobs([3, 4], total)) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE, SAMPLES_N, "logprobs"])
        gen = backend.generate(["q"], 2, PARAMS, greedy=False, seeds=[7])[0]
    assert [s.completion_tokens for s in gen.samples] == expected
    assert gen.prompt_tokens == 9  # usage gives the prompt's count in every case
    assert [s.finish_reason for s in gen.samples] == ["stop", "stop"]


def test_usage_left_out_is_none_not_zero() -> None:
    def no_usage(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, completion(body, [choice(" Paris")], prompt_tokens=None, completion_tokens=None)

    with FixtureServer(no_usage) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE])
        gen = backend.generate(["q"], 0, PARAMS)[0]
    assert gen.greedy.text == "Paris" and gen.greedy.finish_reason == "length"
    assert gen.prompt_tokens is None and gen.greedy.completion_tokens is None


@pytest.mark.parametrize(
    ("server_says", "stop", "expected"),
    [
        ("length", ("\n",), "stop"),  # cut here at a stop string the server ignored
        ("length", (), "length"),
        ("stop", (), "stop"),
        ("content_filter", (), None),  # not a reason a Completion knows: cannot tell
    ],
)
def test_finish_reason_is_the_servers_or_stop_where_cut_here(server_says, stop, expected) -> None:
    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, completion(body, [choice(" Paris\nRome", finish=server_says)], prompt_tokens=3, completion_tokens=4)

    with FixtureServer(respond) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE])
        greedy = backend.generate(["q"], 0, SamplingParams(max_new_tokens=4, stop=stop))[0].greedy
    assert greedy.finish_reason == expected
    assert greedy.completion_tokens == 4  # what the engine generated, the part cut here included


# ---------------------------------------------------------------- prompt scoring, probing, alignment (issue 28, item 5)

PROMPT, CONTINUATION = "Question: Who wrote Hamlet?\nAnswer:", " William Shakespeare"


def lp_of(i: int) -> float:
    """The fixture's log-prob of the token at position ``i``: distinct, so a wrong pick shows."""
    return -0.1 * (i + 1)


class EchoServer:
    """vLLM's echo: the prompt's tokens (decoded one by one, as vLLM shows them) and one generated token.

    ``bos``: a leading special token that vLLM echoes and counts in ``text_offset``;
    ``omit``: a field of the ``logprobs`` block to leave out.
    """

    def __init__(self, tokenizer: Any, bos: str | None = None, omit: str | None = None, pieces: bool = False):
        self.tokenizer, self.bos, self.omit, self.pieces = tokenizer, bos, omit, pieces

    def tokens(self, text: str) -> list[str]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.pieces:  # the vocabulary pieces ("Ġthere"), as older vLLM sent them
            return list(self.tokenizer.convert_ids_to_tokens(ids))
        return [self.tokenizer.decode([i]) for i in ids]

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompt = body["prompt"]
        tokens = ([self.bos] if self.bos else []) + (self.tokens(prompt) if body.get("echo") else [])
        tokens.append(" Paris")  # the one generated token
        lps: list[float | None] = [lp_of(i) for i in range(len(tokens))]
        tops: list[dict[str, float] | None] = [{t: lp_of(i)} for i, t in enumerate(tokens)]
        if body.get("echo"):
            lps[0], tops[0] = None, None  # the first prompt token has no log-prob
        block = logprobs_block(tokens, lps, tops)
        if self.omit:
            del block[self.omit]
        text = (prompt if body.get("echo") else "") + " Paris"
        return 200, completion(body, [choice(text, logprobs=block)], prompt_tokens=len(tokens) - 1, completion_tokens=1)


def expected_scores(tokenizer: Any, bos: bool = False) -> list[float]:
    """The fixture's log-probs of the continuation's tokens (they follow the prompt's)."""
    n_prompt = len(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    n_cont = len(tokenizer(PROMPT + CONTINUATION, add_special_tokens=False)["input_ids"]) - n_prompt
    first = n_prompt + (1 if bos else 0)
    return [lp_of(i) for i in range(first, first + n_cont)]


def scorer(url: str) -> OpenAIBackend:
    return OpenAIBackend("m", base_url=url, capabilities=[GENERATE, "logprobs", "score"])


@pytest.mark.parametrize("server_kind", ["text_offset left out", "a leading BOS counted in text_offset"])
def test_score_reads_the_continuation_without_trusting_text_offset(tokenizer, server_kind) -> None:
    bos = "<|begin_of_text|>" if "BOS" in server_kind else None
    omit = "text_offset" if "left out" in server_kind else None
    with FixtureServer(EchoServer(tokenizer, bos=bos, omit=omit)) as server:
        scores = scorer(server.url).score([PROMPT], [CONTINUATION])[0]
    assert scores == pytest.approx(expected_scores(tokenizer, bos=bos is not None))
    assert len(scores) >= 2  # " William Shakespeare" is more than one token


@pytest.mark.parametrize("omit", ["tokens", "token_logprobs"])
def test_score_refuses_an_echo_it_cannot_read_and_the_probe_does_not_grant_it(tokenizer, omit) -> None:
    with FixtureServer(EchoServer(tokenizer, omit=omit)) as server:
        with pytest.raises(CandorError, match="echoed no tokens with log-probs; cannot score continuations"):
            scorer(server.url).score([PROMPT], [CONTINUATION])
        assert SCORE not in OpenAIBackend("m", base_url=server.url).capabilities


def test_an_echo_of_vocabulary_pieces_is_not_scored(tokenizer) -> None:
    # "Ġthere" is not the text " there": offsets and pieces say nothing about where the prompt ends.
    with FixtureServer(EchoServer(tokenizer, pieces=True)) as server:
        probed = OpenAIBackend("m", base_url=server.url).capabilities
        assert LOGPROBS in probed and SCORE not in probed
        with pytest.raises(CandorError, match="do not spell the prompt"):
            scorer(server.url).score([PROMPT], [CONTINUATION])


def test_the_probe_grants_score_to_an_echo_that_spells_the_prompt(tokenizer) -> None:
    with FixtureServer(EchoServer(tokenizer, bos="<|begin_of_text|>")) as server:
        backend = OpenAIBackend("m", base_url=server.url)
        assert {GENERATE, LOGPROBS, TOP_LOGPROBS, SCORE} <= backend.capabilities
        assert backend.score([PROMPT], [CONTINUATION])[0] == pytest.approx(expected_scores(tokenizer, bos=True))


def openai_error(message: str, param: str | None = None) -> dict[str, Any]:
    """The error body OpenAI-compatible servers send."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


def rejects_top_k(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A strict server: the non-standard ``top_k`` field is an error (as the hosted API answers it)."""
    if "top_k" in body:
        return 400, openai_error("Unrecognized request argument supplied: top_k", "top_k")
    return ignores_n(body)


def fails_first(status: int) -> Responder:
    """A server whose first answer is ``status`` (auth, a missing model, a rate limit), then fine."""
    seen = []

    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        seen.append(body)
        return (status, openai_error(f"status {status}")) if len(seen) == 1 else ignores_n(body)

    return respond


def test_only_a_refusal_of_top_k_drops_it_for_later_samples() -> None:
    with FixtureServer(rejects_top_k) as server:
        backend = OpenAIBackend("m", base_url=server.url, max_retries=0)
        backend.generate(["q"], 2, PARAMS, greedy=False, seeds=[1])
        assert [b.get("top_k") for b in server.bodies if b["prompt"] == "q"] == [None, None]
    for status in (401, 404, 429):
        with FixtureServer(fails_first(status)) as server:
            backend = OpenAIBackend("m", base_url=server.url, max_retries=0)
            with pytest.raises(CandorError, match=f"answered {status}"):
                _ = backend.capabilities  # surfaced, not read as "no top_k"
            backend.generate(["q"], 2, PARAMS, greedy=False, seeds=[1])  # the probe runs again, and passes
            assert [b.get("top_k") for b in server.bodies if b["prompt"] == "q"] == [50, 50], status


def test_top_logprobs_stay_in_line_with_their_tokens_when_a_position_has_none() -> None:
    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tokens = [" Par", "is", " today"]
        tops = [{" Par": -0.1, " Rome": -2.5}, None, {" today": -0.3, " now": -1.9}]
        block = logprobs_block(tokens, [-0.1, -0.2, -0.3], tops)
        return 200, completion(body, [choice("".join(tokens), logprobs=block)], prompt_tokens=3, completion_tokens=3)

    with FixtureServer(respond) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE, LOGPROBS, TOP_LOGPROBS])
        greedy = backend.generate(["q"], 0, PARAMS)[0].greedy
    assert greedy.tokens == [" Par", "is", " today"]
    assert greedy.top_logprobs == [{" Par": -0.1, " Rome": -2.5}, {}, {" today": -0.3, " now": -1.9}]


# ---------------------------------------------------------------- next-token log-probs by token name


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    """A SentencePiece-style tokenizer as Llama 2 and Mistral ship it: "▁" marks a space, bytes fall back to <0xNN>."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "A": 4, "▁A": 5, "▁B": 6, "x": 7, "▁x": 8, "▁": 9, "B": 10}
    merges = [("▁", "A"), ("▁", "B"), ("▁", "x")]
    model = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    model.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    model.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert tok.decode([5]) == "A" == tok.decode([4])  # decoding one id drops the word's space: the trap
    assert tok("x A")["input_ids"] == [8, 5]
    return tok


def next_token_server(top: dict[str, float]) -> Responder:
    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        first = max(top, key=top.get)
        block = logprobs_block([first], [top[first]], [top])
        return 200, completion(body, [choice(first, logprobs=block)], prompt_tokens=4, completion_tokens=1)

    return respond


@pytest.mark.parametrize(
    "names",
    [
        {"▁A": -0.2, "A": -1.5, "<0x0A>": -2.0, "▁B": -3.0},  # vocabulary pieces (llama.cpp, older vLLM)
        {" A": -0.2, "A": -1.5, "\n": -2.0, " B": -3.0},  # decoded tokens (vLLM)
        {"token_id:5": -0.2, "token_id:4": -1.5, "token_id:3": -2.0, "token_id:6": -3.0},  # return_tokens_as_token_ids
    ],
)
def test_next_token_logprobs_find_sentencepiece_tokens_however_the_server_names_them(
    sentencepiece_tokenizer, names
) -> None:
    with FixtureServer(next_token_server(names)) as server:
        backend = OpenAIBackend(
            "m",
            base_url=server.url,
            tokenizer=sentencepiece_tokenizer,
            capabilities=[GENERATE, TOP_LOGPROBS, NEXT_TOKEN_LOGPROBS],
        )
        got = backend.next_token_logprobs(["Q: x?\nA:"], [5, 4, 3])  # "▁A", "A", the newline byte
    assert got.tolist() == [[-0.2, -1.5, -2.0]]
    assert backend.last_fallbacks == 0


@pytest.mark.parametrize("pieces", [False, True], ids=["decoded (vLLM)", "vocabulary pieces (older vLLM)"])
def test_next_token_logprobs_on_a_byte_level_tokenizer(tokenizer, pieces) -> None:
    space_paris, paris, space_rome = (
        tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Paris", "Paris", " Rome")
    )
    name = (lambda i: tokenizer.convert_ids_to_tokens(i)) if pieces else (lambda i: tokenizer.decode([i]))
    assert name(space_paris) == ("ĠParis" if pieces else " Paris")
    shown = {name(space_paris): -0.3, name(paris): -2.2, name(space_rome): -2.9}
    with FixtureServer(next_token_server(shown)) as server:
        backend = OpenAIBackend(
            "m", base_url=server.url, tokenizer=tokenizer, capabilities=[GENERATE, TOP_LOGPROBS, NEXT_TOKEN_LOGPROBS]
        )
        got = backend.next_token_logprobs(["Q: capital of France?\nA:"], [space_paris, paris])
        assert got.tolist() == [[-0.3, -2.2]] and backend.last_fallbacks == 0
        berlin = tokenizer(" Berlin", add_special_tokens=False)["input_ids"][:1]
        unseen = backend.next_token_logprobs(["Q"], berlin)
    assert unseen.tolist() == [[-2.9]] and backend.last_fallbacks == 1  # outside the top: the smallest shown
