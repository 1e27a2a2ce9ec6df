"""The ``openai`` backend: any OpenAI-compatible server (vLLM, TGI, llama.cpp, transformers serve, hosted APIs).

Prompts reach the server as they reach every backend, as finished strings:

- on the ``completions`` endpoint (the default) a prompt is sent as is, so
  the QA templates and their chat templates are rendered here, with the
  served model's tokenizer when one is given (``tokenizer=``); without it
  ``render_chat`` refuses and ``auto`` templates fall back to ``fewshot``;
- on the ``chat`` endpoint the server applies its own chat template:
  ``render_chat`` packs the messages into the prompt string and
  ``generate`` unpacks them. Text appended after the messages (an opened
  assistant turn such as ``Confidence:``) joins the last user message, since
  chat APIs cannot continue an assistant turn.

What a server offers differs: transformers serve ignores ``n``, ``logprobs``
and ``top_logprobs``; vLLM gives all of them and prompt log-probs. One small
probe request finds out (unless ``capabilities`` is given), and the result
is the backend's ``capabilities``: estimators that need more refuse before
any real request. Without server-side ``n``, samples come from repeated
requests with distinct seeds. The probe drops the non-standard ``top_k``
only when the server refuses the request's content and takes it without
``top_k``; an auth error, a wrong model or a rate limit is raised.

Prompt scoring reads the log-probs of an echoed prompt. Which echoed tokens
belong to the continuation is found by laying the token strings over the
text, not from ``text_offset`` (absent on some servers, and counted over a
leading ``<|begin_of_text|>`` by vLLM); an echo that does not spell the
prompt is not scored (the probe does not grant ``score``, and ``score``
raises) rather than read as an empty continuation of probability 1.
Next-token log-probs find a token in the server's ``top_logprobs`` under
any of the names servers give it (``token_id:N``, its text with a leading
space, its vocabulary piece such as ``▁A``).

Every seed sent is derived from the prompt's seed (and the sample's index) by :func:`request_seed`,
in [0, 2^31 - 1]: servers seed torch or numpy with it, which a 63-bit seed overflows.

Token counts come from the server's ``usage`` (the prompt's, and the
generated tokens of a request with one choice; several choices share theirs
only when their log-prob token lists account for it exactly) and are None
where the server does not tell: nothing on the generation path needs a
local tokenizer. ``finish_reason`` is the server's, or ``stop`` where the
text was cut here at a stop string the server ignored.

The official ``openai`` client does the HTTP: timeouts, and retries with exponential
backoff (0.5 s doubling, capped at 8 s, with jitter) on 408, 409, 429, 5xx and dropped
connections; before the probe, :mod:`.server_check` asks once, in seconds, whether the
server is there and lists the model. Requests run on a thread pool of ``max_concurrency``.
The API key comes from ``$api_key_env``, never from a file; local servers need none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from candor.backends.base import (
    CONSTRAINED,
    DEFAULT_TOP_LOGPROBS,
    GENERATE,
    LOGPROBS,
    NEXT_TOKEN_LOGPROBS,
    SCORE,
    TOKENIZER,
    TOP_LOGPROBS,
    UPSTREAM_TOOLS,
    Completion,
    Generations,
    SamplingParams,
)
from candor.backends.constraints import JsonConstraint
from candor.backends.server_check import check_served_model
from candor.backends.server_tokens import aligned, canonical_token, echoed_spans, shown_tokens, tokens_within
from candor.util.errors import CandorError, UpstreamError
from candor.util.seeds import item_seed
from candor.util.version import install_hint

logger = logging.getLogger(__name__)

ENDPOINTS = ("completions", "chat")

# Marks the messages that ``render_chat`` packs into a prompt for the chat endpoint.
CHAT_MARK = "\x00candor-chat\x00"

# Servers cap top_logprobs (OpenAI and vLLM at 20); next-token reads ask for this many.
MAX_TOP_LOGPROBS = 20

SAMPLES_N = "n"  # the server returns n choices per request (an internal capability)

# The finish reasons a Completion carries; others (content_filter, tool_calls, abort) are "cannot tell".
FINISH_REASONS = {"stop": "stop", "length": "length"}


class ServerAnswered(UpstreamError):
    """The server answered a request with an error status (after the client's retries)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# Statuses with which a server refuses a request's content (an unknown or invalid field).
REJECTED = (400, 422)


class Reply(NamedTuple):
    """What one request returned: its choices and the response's ``usage`` (None where absent)."""

    choices: list[Any]
    prompt_tokens: int | None
    completion_tokens: int | None


def _openai_module() -> Any:
    try:
        import openai
    except ImportError:
        raise CandorError(f"the openai backend needs the openai client: {install_hint('openai')}") from None
    return openai


class OpenAIBackend:
    """A black- or grey-box backend that talks to an OpenAI-compatible server over HTTP."""

    white_box = False
    # The server batches for itself: ``generate`` may run from several threads at once, so a caller
    # never has to hold one request back until another's call returns (see serve.batching).
    concurrent_calls = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        endpoint: str = "completions",
        api_key_env: str = "OPENAI_API_KEY",
        tokenizer: str | Any | None = None,
        max_concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 5,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        capabilities: Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        if endpoint not in ENDPOINTS:
            raise CandorError(f"openai backend: endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
        if max_concurrency < 1:
            raise CandorError(f"openai backend: max_concurrency must be at least 1, got {max_concurrency}")
        openai = _openai_module()
        self.model_name = model
        self.base_url = base_url
        self.endpoint = endpoint
        self.max_concurrency = max_concurrency
        self.top_logprobs = top_logprobs
        self.seed = seed
        self.describe_kind = f"openai ({base_url})"
        # Local servers accept any key; hosted ones read theirs from the environment.
        api_key = os.environ.get(api_key_env) or "EMPTY"
        self.api_key_env = api_key_env  # named in the startup check's message
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
        self.tokenizer = _load_tokenizer(tokenizer) if tokenizer is not None else None
        self._capabilities = frozenset(capabilities) if capabilities is not None else None
        self._takes_top_k = True

    # ------------------------------------------------------------ capabilities

    @property
    def capabilities(self) -> frozenset[str]:
        """What this server offers, probed with one tiny request on first use."""
        if self._capabilities is None:
            self._capabilities = self._probe()
            logger.info("%s offers: %s", self.base_url, ", ".join(sorted(self._capabilities)))
        return self._capabilities

    def applied_params(self, params: SamplingParams) -> SamplingParams:
        """The samples' decoding as this server gets it: without ``top_k`` where it refuses the field (probed)."""
        _ = self.capabilities  # the probe finds out whether the server takes top_k
        return params if self._takes_top_k or params.top_k == 0 else replace(params, top_k=0)

    def _probe(self) -> frozenset[str]:
        check_served_model(self.client, self.base_url, self.model_name, self.api_key_env)  # seconds, not retries
        # Structured output and tools are passed on as asked (a server that refuses them answers that request).
        caps = {GENERATE, CONSTRAINED} | ({UPSTREAM_TOOLS} if self.endpoint == "chat" else set())
        if self.tokenizer is not None:
            caps.add(TOKENIZER)
        probe = "Hello"
        if self.endpoint == "chat":
            probe = CHAT_MARK + json.dumps([{"role": "user", "content": "Hello"}]) + CHAT_MARK
        ask = {"max_tokens": 1, "temperature": 1.0, "n": 2, "logprobs": 2}
        try:
            choices = self._request(probe, **ask, extra_body={"top_k": 50})
        except ServerAnswered as exc:
            if exc.status not in REJECTED:
                raise  # auth, a wrong model or URL, rate limits: the user must see them
            # Refused content: top_k is the one non-standard field, so ask again without it. Only if
            # that succeeds was top_k the cause; otherwise the second refusal is the server's answer.
            choices = self._request(probe, **ask)
            self._takes_top_k = False
            logger.warning("%s does not take top_k; samples use temperature and top_p only", self.base_url)
        if len(choices) == 2:
            caps.add(SAMPLES_N)
        tokens, lps, tops = self._choice_logprobs(choices[0])
        if lps and all(x is not None for x in lps):
            caps.add(LOGPROBS)
        if tops and any(tops):
            caps.add(TOP_LOGPROBS)
            if TOKENIZER in caps:
                caps.add(NEXT_TOKEN_LOGPROBS)
        if self.endpoint == "completions" and LOGPROBS in caps and self._scores_echoed_prompts():
            caps.add(SCORE)
        return frozenset(caps)

    def _scores_echoed_prompts(self) -> bool:
        """Whether an echoed prompt comes back with log-probs on tokens that spell the prompt."""
        prompt, continuation = "Hello there", " my friend"
        try:
            choice = self._request(prompt + continuation, max_tokens=1, temperature=0.0, logprobs=0, echo=True)[0]
        except ServerAnswered as exc:
            if exc.status in REJECTED:
                return False  # no echo here
            raise
        try:
            self._continuation_logprobs(choice, prompt, continuation)
        except CandorError as exc:
            logger.info("%s: no prompt scoring (%s)", self.base_url, exc)
            return False
        return True

    def require(self, capability: str, what: str) -> None:
        if capability not in self.capabilities:
            raise CandorError(f"{what} needs {capability}, which the server at {self.base_url} does not offer")

    # ------------------------------------------------------------ text

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if self.endpoint == "chat":
            return CHAT_MARK + json.dumps(list(messages)) + CHAT_MARK
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise CandorError(
                f"openai backend ({self.base_url}): no chat template for {self.model_name!r} on the completions "
                "endpoint; pass the model's tokenizer (--tokenizer) or use the chat endpoint"
            )
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self._need_tokenizer()(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._need_tokenizer().decode(list(token_ids))

    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise CandorError(f"openai backend ({self.base_url}): this needs the model's tokenizer (--tokenizer)")
        return self.tokenizer

    # ------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
        constraint: JsonConstraint | None = None,
    ) -> list[Generations]:
        """Greedy answer (temperature 0) and ``n`` samples per prompt, requests in parallel.

        ``constraint``: the answers must be JSON valid for its schema, passed to the server as its structured
        output (``response_format`` ``json_schema``, strict); one that allows plain text is refused (for a
        choice between calling a tool and answering, pass the tools: :meth:`generate_tool_calls`).
        """
        return self._generate(
            prompts, n, params, greedy, seeds, structured_output(constraint, f"the server at {self.base_url}")
        )

    def generate_tool_calls(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        tools: Sequence[dict[str, Any]],
        tool_choice: str | dict[str, Any] = "auto",
        parallel_tool_calls: bool | None = None,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
    ) -> list[Generations]:
        """``generate`` with OpenAI ``tools`` and ``tool_choice`` passed to the server (capability ``upstream_tools``).

        An answer that calls tools is a :class:`Completion` whose ``text`` is the canonical JSON list of its
        calls (:func:`calls_text`); one that answers in words keeps its text. Its tokens and log-probs are
        whatever the server gives for what the model generated (for a call, the text the server parsed the
        calls from, which need not spell ``text``). The chat endpoint only: tools are a chat field.
        """
        if self.endpoint != "chat":
            raise CandorError(
                f"openai backend ({self.base_url}): tools are passed on the chat endpoint only (--endpoint chat)"
            )
        fields: dict[str, Any] = {"tools": list(tools), "tool_choice": tool_choice}
        if parallel_tool_calls is not None:
            fields["parallel_tool_calls"] = bool(parallel_tool_calls)
        return self._generate(prompts, n, params, greedy, seeds, fields)

    def _generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        greedy: bool,
        seeds: Sequence[int] | None,
        fields: dict[str, Any],
    ) -> list[Generations]:
        """``generate``'s requests, with ``fields`` (structured output, tools) added to each.

        A server may take ``n`` choices per request up to a bound the probe (``n`` = 2) cannot see: llama.cpp's
        takes at most its slot count. A refused request of several choices is asked again one request per
        sample; if that succeeds, the server keeps that way for the backend's life (a warning says so), and if
        it fails too, the refusal was about something else and is raised.
        """
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise CandorError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        seeds = list(seeds) if seeds is not None else [self.seed + i for i in range(len(prompts))]
        caps = self.capabilities
        try:
            return self._generate_with(caps, prompts, n, params, greedy, seeds, fields)
        except ServerAnswered as exc:
            if exc.status not in REJECTED or n < 2 or SAMPLES_N not in caps:
                raise
            results = self._generate_with(caps - {SAMPLES_N}, prompts, n, params, greedy, seeds, fields)
            self._capabilities = caps - {SAMPLES_N}
            logger.warning(
                "%s refused %d choices in one request (%s); its samples now go one request each",
                self.base_url,
                n,
                exc,
            )
            return results

    def _generate_with(
        self,
        caps: frozenset[str],
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        greedy: bool,
        seeds: list[int],
        fields: dict[str, Any],
    ) -> list[Generations]:
        top = self.top_logprobs if TOP_LOGPROBS in caps else (0 if LOGPROBS in caps else None)
        tasks: list[tuple[int, int, Callable[[], list[Any]]]] = []  # (prompt, first sample or -1, request)
        for i, prompt in enumerate(prompts):
            if greedy:
                tasks.append((i, -1, self._bind(prompt, params, 0.0, 1, None, top, fields)))
            if n and SAMPLES_N in caps:
                seed = request_seed(seeds[i])
                tasks.append((i, 0, self._bind(prompt, params, params.temperature, n, seed, top, fields)))
            else:
                # No server-side n: one request per sample, each with its own seed.
                tasks.extend(
                    (i, j, self._bind(prompt, params, params.temperature, 1, seed, top, fields))
                    for j, seed in enumerate(sample_seeds(seeds[i], n))
                )
        results = [Generations(greedy=None, samples=[None] * n) for _ in prompts]  # type: ignore[list-item]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            replies = list(pool.map(lambda task: task[2](), tasks))
        for (i, first, _), reply in zip(tasks, replies, strict=True):
            ordered = sorted(reply.choices, key=lambda c: _get(c, "index") or 0)
            counts = self._completion_token_counts(ordered, reply.completion_tokens)
            completions = [self._completion(c, params.stop, k) for c, k in zip(ordered, counts, strict=True)]
            if results[i].prompt_tokens is None:
                results[i].prompt_tokens = reply.prompt_tokens
            if first < 0:
                results[i].greedy = completions[0]
            else:
                results[i].samples[first : first + len(completions)] = completions
        if any(len(g.samples) != n or any(s is None for s in g.samples) for g in results):
            raise UpstreamError(f"{self.base_url} returned fewer samples than the {n} requested")
        return results

    def _bind(
        self,
        prompt: str,
        params: SamplingParams,
        temperature: float,
        n: int,
        seed: int | None,
        top: int | None,
        fields: dict[str, Any] | None = None,
    ) -> Callable[[], Reply]:
        sampled = temperature > 0
        kwargs: dict[str, Any] = {
            "max_tokens": params.max_new_tokens,
            "temperature": temperature,
            "n": n,
            "stop": list(params.stop) or None,
            "logprobs": top,
            "seed": seed,
            "fields": fields or None,
        }
        if sampled:
            kwargs["top_p"] = params.top_p
            if params.top_k > 0 and self._takes_top_k:
                kwargs["extra_body"] = {"top_k": params.top_k}  # vLLM, TGI and llama.cpp read it
        return lambda: self._call(prompt, **kwargs)

    def _request(self, prompt: str, **kwargs: Any) -> list[Any]:
        """The choices of one request (at least one)."""
        return self._call(prompt, **kwargs).choices

    def _call(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float,
        n: int = 1,
        stop: list[str] | None = None,
        logprobs: int | None = None,
        seed: int | None = None,
        top_p: float | None = None,
        echo: bool = False,
        extra_body: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> Reply:
        """One request: its choices and token usage. Transport errors become one CandorError.

        ``fields``: more request fields (``response_format``, ``tools``), which the completions endpoint sends
        in the body beside the client's own (vLLM and SGLang read ``response_format`` there too).
        """
        openai = _openai_module()
        common: dict[str, Any] = {"model": self.model_name, "max_tokens": max_tokens, "temperature": temperature}
        for key, value in (("n", n if n != 1 else None), ("stop", stop), ("seed", seed), ("top_p", top_p)):
            if value is not None:
                common[key] = value
        if fields and self.endpoint == "chat":
            common.update(fields)
        elif fields:
            extra_body = {**(extra_body or {}), **fields}
        if extra_body:
            common["extra_body"] = extra_body
        try:
            if self.endpoint == "chat":
                if logprobs is not None:
                    common["logprobs"] = True
                    common["top_logprobs"] = logprobs
                response = self.client.chat.completions.create(messages=_messages(prompt), **common)
            else:
                if prompt.startswith(CHAT_MARK):
                    raise CandorError("a chat prompt reached the completions endpoint; use one endpoint throughout")
                if logprobs is not None:
                    common["logprobs"] = logprobs
                if echo:
                    common["echo"] = True
                response = self.client.completions.create(prompt=prompt, **common)
        except openai.APIConnectionError as exc:
            raise UpstreamError(f"cannot reach the server at {self.base_url} ({exc}); is it running?") from None
        except openai.APIStatusError as exc:
            raise ServerAnswered(
                f"the server at {self.base_url} answered {exc.status_code} for model {self.model_name!r}: "
                f"{_short(exc.message)}",
                exc.status_code,
            ) from None
        choices = list(response.choices or [])
        if not choices:
            raise UpstreamError(f"the server at {self.base_url} answered no choices for model {self.model_name!r}")
        usage = _get(response, "usage")
        return Reply(choices, _count(_get(usage, "prompt_tokens")), _count(_get(usage, "completion_tokens")))

    def _completion_token_counts(self, choices: Sequence[Any], total: int | None) -> list[int | None]:
        """Each choice's generated tokens, from the response's usage (which counts all choices together).

        One choice owns the total. Several share it: each gets the length of its
        own log-prob token list only when those lengths add up to the total (so
        they count what usage counts); otherwise nobody can tell, and it is None.
        """
        if total is None:
            return [None] * len(choices)
        if len(choices) == 1:
            return [total]
        lengths = [len(self._choice_logprobs(c)[0]) if _get(c, "logprobs") is not None else None for c in choices]
        if None in lengths or sum(lengths) != total:  # type: ignore[arg-type]
            return [None] * len(choices)
        return lengths  # type: ignore[return-value]

    def _completion(self, choice: Any, stop: Sequence[str] = (), completion_tokens: int | None = None) -> Completion:
        if self.endpoint == "chat":
            message = _get(choice, "message")
            calls = _get(message, "tool_calls") if message is not None else None
            if calls:
                return self._calls_completion(choice, calls, completion_tokens)
            raw = (_get(message, "content") if message is not None else "") or ""
        else:
            raw = _get(choice, "text") or ""
        # Some servers (transformers serve) ignore ``stop``: cut here too, as the hf backend does.
        ends = [k for k in (raw.find(x) for x in stop if x) if k >= 0]
        raw = raw[: min(ends)] if ends else raw
        # A text cut at a stop string here stopped there, whatever the server says.
        finish = "stop" if ends else FINISH_REASONS.get(_get(choice, "finish_reason"))
        tokens, lps, tops = self._choice_logprobs(choice)
        if tokens and all(x is not None for x in lps):
            # Drop tokens past the returned text: the EOS or the token that completed a stop string.
            keep = tokens_within(tokens, len(raw))
            tokens, lps, tops = tokens[:keep], lps[:keep], tops[:keep]
        else:
            tokens, lps, tops = [], [], []
        return Completion(
            text=raw.strip(),
            tokens=list(tokens),
            logprobs=[float(x) for x in lps],
            top_logprobs=tops if any(tops) else [],  # an empty position stays, in line with its token
            finish_reason=finish,
            completion_tokens=completion_tokens,
        )

    def _calls_completion(self, choice: Any, calls: Sequence[Any], completion_tokens: int | None) -> Completion:
        """An answer that calls tools: its calls' canonical JSON, with every token the server gave log-probs for."""
        tokens, lps, tops = self._choice_logprobs(choice)
        if not tokens or any(x is None for x in lps):
            tokens, lps, tops = [], [], []
        return Completion(
            text=calls_text(calls, self.base_url),
            tokens=list(tokens),
            logprobs=[float(x) for x in lps],  # type: ignore[arg-type]
            top_logprobs=tops if any(tops) else [],
            finish_reason="stop" if _get(choice, "finish_reason") in ("tool_calls", "stop") else None,
            completion_tokens=completion_tokens,
        )

    def _choice_logprobs(self, choice: Any) -> tuple[list[str], list[float | None], list[dict[str, float]]]:
        """Tokens, their log-probs and top alternatives of one choice (empty when the server gave none)."""
        block = _get(choice, "logprobs")
        if block is None:
            return [], [], []
        if self.endpoint == "chat":
            content = _get(block, "content") or []
            tokens = [_get(e, "token") for e in content]
            lps = [_get(e, "logprob") for e in content]
            tops = [
                {_get(t, "token"): float(_get(t, "logprob")) for t in (_get(e, "top_logprobs") or [])} for e in content
            ]
            return aligned(tokens, lps, tops)
        tokens = list(_get(block, "tokens") or [])
        lps = list(_get(block, "token_logprobs") or [])
        tops = [{str(k): float(v) for k, v in (d or {}).items()} for d in (_get(block, "top_logprobs") or [])]
        return aligned(tokens, lps, tops)

    # ------------------------------------------------------------ scoring

    def score(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[float]]:
        """Log-probs of each continuation's tokens, from the server's prompt log-probs (``echo``)."""
        if len(prompts) != len(continuations):
            raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        self.require(SCORE, "scoring continuations")

        def one(pair: tuple[str, str]) -> list[float]:
            prompt, cont = pair
            choice = self._request(prompt + cont, max_tokens=1, temperature=0.0, logprobs=0, echo=True)[0]
            return self._continuation_logprobs(choice, prompt, cont)

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(one, zip(prompts, continuations, strict=True)))

    def _continuation_logprobs(self, choice: Any, prompt: str, continuation: str) -> list[float]:
        """The log-probs of the continuation's tokens in an echoed ``prompt + continuation``.

        The echoed tokens are laid over the text (see :func:`candor.backends.server_tokens.echoed_spans`);
        the continuation's are those ending past the prompt (a token merged
        across the boundary counts). Anything that does not line up is an
        error: an empty list would read as log-prob 0, probability 1.
        """
        tokens, lps, _ = self._choice_logprobs(choice)
        if not tokens:
            raise CandorError(
                f"the server at {self.base_url} echoed no tokens with log-probs; cannot score continuations"
            )
        text = prompt + continuation
        spans = echoed_spans(tokens, text)
        if spans is None:
            raise CandorError(
                f"the server at {self.base_url} echoed tokens that do not spell the prompt "
                f"({_short(repr(tokens[:8]), 80)} for {_short(repr(text), 80)}); cannot score continuations"
            )
        picked = [lps[i] for i, (start, end) in spans if end > len(prompt)]
        if continuation and not picked:
            raise CandorError(f"the server at {self.base_url} echoed no token of the continuation {continuation!r}")
        if any(lp is None for lp in picked):
            raise CandorError(f"the server at {self.base_url} gave no log-prob for a token of {continuation!r}")
        return [float(lp) for lp in picked]  # type: ignore[arg-type]

    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        """Log-probs of ``token_ids`` at the next position, read from the server's top log-probs.

        A token outside the top ``MAX_TOP_LOGPROBS`` gets the smallest log-prob
        shown (an upper bound on its own); ``last_fallbacks`` counts the prompts
        where that happened.
        """
        self.require(NEXT_TOKEN_LOGPROBS, "next-token log-probs")
        wanted = [self._token_keys(t) for t in token_ids]

        def one(prompt: str) -> tuple[list[float], bool]:
            choice = self._request(prompt, max_tokens=1, temperature=0.0, logprobs=MAX_TOP_LOGPROBS)[0]
            _, _, tops = self._choice_logprobs(choice)
            shown = shown_tokens(tops[0] if tops else {})
            floor = min(shown.values()) if shown else float("-inf")
            found = [next((shown[k] for k in keys if k in shown), None) for keys in wanted]
            return [floor if lp is None else lp for lp in found], None in found

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            rows = list(pool.map(one, prompts))
        self.last_fallbacks = sum(missed for _, missed in rows)
        return np.array([values for values, _ in rows], dtype=float).reshape(len(prompts), len(token_ids))

    def _token_keys(self, token_id: int) -> list[str]:
        """What a server may call ``token_id`` in its top log-probs, most specific first.

        vLLM's ``token_id:N`` form; the token's text as it reads inside a text
        (`` A``: decoding the id alone drops a SentencePiece word's leading
        space, and would then match the different token ``A``); and its
        vocabulary piece (``▁A``, ``ĠA``, ``<0x0A>``), which some servers send
        as it is. Server names go through :func:`~candor.backends.server_tokens.canonical_token` as well.
        """
        tokenizer = self._need_tokenizer()
        token_id = int(token_id)
        keys = [f"token_id:{token_id}", canonical_token(self._text_in_context(token_id))]
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            keys.append(canonical_token(piece))
        return list(dict.fromkeys(keys))

    def _text_in_context(self, token_id: int) -> str:
        """The text ``token_id`` adds after a plain word (its leading space kept)."""
        tokenizer = self._need_tokenizer()
        anchor = list(tokenizer("x", add_special_tokens=False)["input_ids"])
        before = tokenizer.decode(anchor)
        after = tokenizer.decode([*anchor, token_id])
        return after[len(before) :] if after.startswith(before) else tokenizer.decode([token_id])

    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        raise CandorError(f"the server at {self.base_url} gives no hidden states; use a white-box backend such as hf")


# ---------------------------------------------------------------- structured output and tool calls


def structured_output(constraint: JsonConstraint | None, where: str) -> dict[str, Any]:
    """The request field that asks an OpenAI-compatible server for JSON valid for ``constraint``'s schema.

    ``{"response_format": {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}}`` (OpenAI,
    vLLM and SGLang read it); none without a constraint. A constraint with ``allow_text`` has no such field:
    refused.
    """
    if constraint is None:
        return {}
    if constraint.allow_text:
        raise CandorError(
            f"{where} takes a JSON schema as structured output, not 'JSON or plain text' "
            "(allow_text); pass the tools themselves to let the model choose (generate_tool_calls)"
        )
    schema = {"name": "answer", "schema": constraint.schema_dict, "strict": True}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def calls_text(calls: Sequence[Any], server: str = "the server") -> str:
    """The canonical JSON of an answer's tool calls: ``[{"arguments": {...}, "name": "..."}]``.

    Keys sorted, no spaces (``separators=(",", ":")``), the calls in the order of their canonical text (several
    calls in one answer are a set). Arguments that are not a JSON object stay as the text the server sent.
    """
    out = []
    for call in calls:
        function = _get(call, "function")
        name, arguments = _get(function, "name"), _get(function, "arguments")
        if not isinstance(name, str):
            raise UpstreamError(f"{server} returned a tool call without a function name")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # malformed arguments stay as sent: they are the model's answer
                arguments = json.loads(arguments) if arguments.strip() else {}
        out.append({"arguments": arguments, "name": name})
    canonical = [json.dumps(call, sort_keys=True, separators=(",", ":")) for call in out]
    return "[" + ",".join(sorted(canonical)) + "]"


# ---------------------------------------------------------------- seeds

# Servers seed 32-bit generators (numpy) or reject what torch cannot take: stay below 2^31.
MAX_SEED = 2**31 - 1


def request_seed(prompt_seed: int, *sample: int) -> int:
    """The seed sent for a prompt (and one of its samples): deterministic, in [0, MAX_SEED]."""
    return item_seed("openai", prompt_seed, *sample)


def sample_seeds(prompt_seed: int, n: int) -> list[int]:
    """``n`` distinct request seeds for one prompt's samples, one request each.

    Hashing into 31 bits can collide; a collision is redrawn with a counter, so
    the seeds stay distinct and depend only on the prompt's seed, never on the batch.
    """
    seeds: list[int] = []
    taken: set[int] = set()
    for j in range(n):
        seed, retry = request_seed(prompt_seed, j), 0
        while seed in taken:
            retry += 1
            seed = request_seed(prompt_seed, j, retry)
        taken.add(seed)
        seeds.append(seed)
    return seeds


# ---------------------------------------------------------------- helpers


def _load_tokenizer(tokenizer: str | Any) -> Any:
    if not isinstance(tokenizer, str):
        return tokenizer
    from candor.backends.default_model import is_embedded, resolve_embedded

    path = str(resolve_embedded(tokenizer)) if is_embedded(tokenizer) else tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise CandorError(f"cannot load the tokenizer {tokenizer!r}: {exc}") from None


def _messages(prompt: str) -> list[dict[str, str]]:
    """Unpack a chat prompt from ``render_chat``; plain text becomes one user message."""
    if not prompt.startswith(CHAT_MARK):
        return [{"role": "user", "content": prompt}]
    packed, _, tail = prompt[len(CHAT_MARK) :].partition(CHAT_MARK)
    messages = [dict(m) for m in json.loads(packed)]
    if tail:
        messages[-1]["content"] = f"{messages[-1]['content']}\n{tail}"
    return messages


def _get(obj: Any, key: str) -> Any:
    """A field of a response object or dict (servers add fields the client does not model)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _count(value: Any) -> int | None:
    """A token count from ``usage``; None when the server left it out or sent something else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _short(text: Any, limit: int = 200) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"
