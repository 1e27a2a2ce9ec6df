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
requests with distinct seeds.

The official ``openai`` client does the HTTP: timeouts, and retries with
exponential backoff (0.5 s doubling, capped at 8 s, with jitter) on 408,
409, 429, 5xx and dropped connections. Requests run on a thread pool of
``max_concurrency``. The API key comes from an environment variable
(``api_key_env``), never from a file; local servers need none.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from candor.backends.base import (
    DEFAULT_TOP_LOGPROBS,
    GENERATE,
    LOGPROBS,
    NEXT_TOKEN_LOGPROBS,
    SCORE,
    TOKENIZER,
    TOP_LOGPROBS,
    Completion,
    Generations,
    SamplingParams,
)
from candor.util.errors import CandorError
from candor.util.version import install_hint

logger = logging.getLogger(__name__)

ENDPOINTS = ("completions", "chat")

# Marks the messages that ``render_chat`` packs into a prompt for the chat endpoint.
CHAT_MARK = "\x00candor-chat\x00"

# Servers cap top_logprobs (OpenAI and vLLM at 20); next-token reads ask for this many.
MAX_TOP_LOGPROBS = 20

SAMPLES_N = "n"  # the server returns n choices per request (an internal capability)


def _openai_module() -> Any:
    try:
        import openai
    except ImportError:
        raise CandorError(f"the openai backend needs the openai client: {install_hint('openai')}") from None
    return openai


class OpenAIBackend:
    """A black- or grey-box backend that talks to an OpenAI-compatible server over HTTP."""

    white_box = False

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

    def _probe(self) -> frozenset[str]:
        caps = {GENERATE}
        if self.tokenizer is not None:
            caps.add(TOKENIZER)
        probe = "Hello"
        if self.endpoint == "chat":
            probe = CHAT_MARK + json.dumps([{"role": "user", "content": "Hello"}]) + CHAT_MARK
        try:
            choices = self._request(probe, max_tokens=1, temperature=1.0, n=2, logprobs=2, extra_body={"top_k": 50})
        except CandorError as exc:
            if "answered 4" not in str(exc):
                raise
            # A strict server refuses the non-standard top_k field: sample without it.
            self._takes_top_k = False
            logger.warning("%s does not take top_k; samples use temperature and top_p only", self.base_url)
            choices = self._request(probe, max_tokens=1, temperature=1.0, n=2, logprobs=2)
        if len(choices) == 2:
            caps.add(SAMPLES_N)
        tokens, lps, tops = self._choice_logprobs(choices[0])
        if lps and all(x is not None for x in lps):
            caps.add(LOGPROBS)
        if tops and any(tops):
            caps.add(TOP_LOGPROBS)
            if TOKENIZER in caps:
                caps.add(NEXT_TOKEN_LOGPROBS)
        if self.endpoint == "completions" and LOGPROBS in caps and self._echoes_prompt():
            caps.add(SCORE)
        return frozenset(caps)

    def _echoes_prompt(self) -> bool:
        try:
            choice = self._request("Hello there", max_tokens=1, temperature=0.0, logprobs=1, echo=True)[0]
        except CandorError:
            return False
        _, lps, _ = self._choice_logprobs(choice)
        return len(lps) > 1

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
    ) -> list[Generations]:
        """Greedy answer (temperature 0) and ``n`` samples per prompt, requests in parallel."""
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise CandorError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        seeds = list(seeds) if seeds is not None else [self.seed + i for i in range(len(prompts))]
        caps = self.capabilities
        top = self.top_logprobs if TOP_LOGPROBS in caps else (0 if LOGPROBS in caps else None)
        tasks: list[tuple[int, int, Callable[[], list[Any]]]] = []  # (prompt, first sample or -1, request)
        for i, prompt in enumerate(prompts):
            if greedy:
                tasks.append((i, -1, self._bind(prompt, params, 0.0, 1, None, top)))
            if n and SAMPLES_N in caps:
                tasks.append((i, 0, self._bind(prompt, params, params.temperature, n, seeds[i], top)))
            else:
                # No server-side n: one request per sample, each with its own seed.
                tasks.extend((i, j, self._bind(prompt, params, params.temperature, 1, seeds[i] * 1000 + j, top))
                             for j in range(n))
        results = [Generations(greedy=None, samples=[None] * n) for _ in prompts]  # type: ignore[list-item]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            outputs = list(pool.map(lambda task: task[2](), tasks))
        for (i, first, _), choices in zip(tasks, outputs, strict=True):
            ordered = sorted(choices, key=lambda c: _get(c, "index") or 0)
            completions = [self._completion(c, params.stop) for c in ordered]
            if first < 0:
                results[i].greedy = completions[0]
            else:
                results[i].samples[first : first + len(completions)] = completions
        if any(len(g.samples) != n or any(s is None for s in g.samples) for g in results):
            raise CandorError(f"{self.base_url} returned fewer samples than the {n} requested")
        return results

    def _bind(
        self, prompt: str, params: SamplingParams, temperature: float, n: int, seed: int | None, top: int | None
    ) -> Callable[[], list[Any]]:
        sampled = temperature > 0
        kwargs: dict[str, Any] = {
            "max_tokens": params.max_new_tokens,
            "temperature": temperature,
            "n": n,
            "stop": list(params.stop) or None,
            "logprobs": top,
            "seed": seed,
        }
        if sampled:
            kwargs["top_p"] = params.top_p
            if params.top_k > 0 and self._takes_top_k:
                kwargs["extra_body"] = {"top_k": params.top_k}  # vLLM, TGI and llama.cpp read it
        return lambda: self._request(prompt, **kwargs)

    def _request(
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
    ) -> list[Any]:
        """One request; the choices of the response. Transport errors become one CandorError."""
        openai = _openai_module()
        common: dict[str, Any] = {"model": self.model_name, "max_tokens": max_tokens, "temperature": temperature}
        for key, value in (("n", n if n != 1 else None), ("stop", stop), ("seed", seed), ("top_p", top_p)):
            if value is not None:
                common[key] = value
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
            raise CandorError(f"cannot reach the server at {self.base_url} ({exc}); is it running?") from None
        except openai.APIStatusError as exc:
            raise CandorError(
                f"the server at {self.base_url} answered {exc.status_code} for model {self.model_name!r}: "
                f"{_short(exc.message)}"
            ) from None
        return list(response.choices or [])

    def _completion(self, choice: Any, stop: Sequence[str] = ()) -> Completion:
        if self.endpoint == "chat":
            message = _get(choice, "message")
            raw = (_get(message, "content") if message is not None else "") or ""
        else:
            raw = _get(choice, "text") or ""
        # Some servers (transformers serve) ignore ``stop``: cut here too, as the hf backend does.
        ends = [k for k in (raw.find(x) for x in stop if x) if k >= 0]
        raw = raw[: min(ends)] if ends else raw
        tokens, lps, tops = self._choice_logprobs(choice)
        if tokens and all(x is not None for x in lps):
            # Drop tokens past the returned text: the EOS or the token that completed a stop string.
            keep = _tokens_within(tokens, len(raw))
            tokens, lps, tops = tokens[:keep], lps[:keep], tops[:keep]
        else:
            tokens, lps, tops = [], [], []
        return Completion(
            text=raw.strip(),
            tokens=list(tokens),
            logprobs=[float(x) for x in lps],
            top_logprobs=[t for t in tops if t] if any(tops) else [],
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
            tops = [{_get(t, "token"): float(_get(t, "logprob")) for t in (_get(e, "top_logprobs") or [])}
                    for e in content]
            return tokens, lps, tops
        tokens = list(_get(block, "tokens") or [])
        lps = list(_get(block, "token_logprobs") or [])
        tops = [{str(k): float(v) for k, v in (d or {}).items()} for d in (_get(block, "top_logprobs") or [])]
        return tokens, lps, tops

    # ------------------------------------------------------------ scoring

    def score(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[float]]:
        """Log-probs of each continuation's tokens, from the server's prompt log-probs (``echo``)."""
        if len(prompts) != len(continuations):
            raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        self.require(SCORE, "scoring continuations")

        def one(pair: tuple[str, str]) -> list[float]:
            prompt, cont = pair
            choice = self._request(prompt + cont, max_tokens=1, temperature=0.0, logprobs=0, echo=True)[0]
            block = _get(choice, "logprobs")
            offsets = list(_get(block, "text_offset") or [])
            tokens, lps, _ = self._choice_logprobs(choice)
            end = len(prompt + cont)
            # Continuation tokens: those ending past the prompt (a token merged across the boundary counts).
            return [float(lp) for tok, off, lp in zip(tokens, offsets, lps, strict=False)
                    if off + len(tok) > len(prompt) and off < end and lp is not None]

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(one, zip(prompts, continuations, strict=True)))

    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        """Log-probs of ``token_ids`` at the next position, read from the server's top log-probs.

        A token outside the top ``MAX_TOP_LOGPROBS`` gets the smallest log-prob
        shown (an upper bound on its own); ``last_fallbacks`` counts the prompts
        where that happened.
        """
        self.require(NEXT_TOKEN_LOGPROBS, "next-token log-probs")
        texts = [self.decode([t]) for t in token_ids]

        def one(prompt: str) -> tuple[list[float], bool]:
            choice = self._request(prompt, max_tokens=1, temperature=0.0, logprobs=MAX_TOP_LOGPROBS)[0]
            _, _, tops = self._choice_logprobs(choice)
            shown = tops[0] if tops else {}
            floor = min(shown.values()) if shown else float("-inf")
            return [shown.get(t, floor) for t in texts], any(t not in shown for t in texts)

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            rows = list(pool.map(one, prompts))
        self.last_fallbacks = sum(missed for _, missed in rows)
        return np.array([values for values, _ in rows], dtype=float).reshape(len(prompts), len(token_ids))

    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        raise CandorError(f"the server at {self.base_url} gives no hidden states; use a white-box backend such as hf")


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


def _tokens_within(tokens: Sequence[str], text_length: int) -> int:
    """How many leading tokens lie inside a text of ``text_length`` characters."""
    seen = 0
    for count, token in enumerate(tokens):
        if seen >= text_length:
            return count
        seen += len(token)
    return len(tokens)


def _get(obj: Any, key: str) -> Any:
    """A field of a response object or dict (servers add fields the client does not model)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _short(text: Any, limit: int = 200) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"
