"""The ``sglang`` backend: an SGLang server, on its OpenAI-compatible endpoints and its native ``/generate``.

Everything the ``openai`` backend does goes through SGLang's OpenAI-compatible
endpoints unchanged. What SGLang adds is the prompt's hidden states from the
pass that generates (the capability ``prompt_hidden_states``), so an EliCal
head served in front of it reads its input from that pass: no second prefill,
no classify server. What is read, as confirmed in SGLang's source (2026-12):

- the server runs with ``--enable-return-hidden-states``; a request asks with
  ``"return_hidden_states": true`` (``examples/runtime/hidden_states/hidden_states_server.py``);
- on the native ``POST /generate`` (``{"text": ..., "sampling_params": {...}, ...}``; a list of
  ``n`` results when ``sampling_params.n > 1``), each result's ``meta_info["hidden_states"]``
  is a list: first the prefill's states, one row per prompt position it computed (a prefix
  served from the radix cache is not recomputed, but the prompt's last position always is),
  then one vector per generated token. The prompt's last token is the last row of the first
  entry;
- the states are those the logits processor receives: the last layer, after the model's final
  norm (transformers' last ``output_hidden_states`` entry), so only a head trained on the last
  layer (``-1``, candor's default) reads them;
- the OpenAI endpoints return only the last generated token's state
  (``process_hidden_states_from_ret`` in ``sglang/srt/entrypoints/openai/utils.py`` keeps
  ``hidden_states[-1]``), never the prompt's, so ``generate(..., prompt_states=True)`` uses
  ``/generate``, with ``return_logprob``, ``top_logprobs_num`` and ``return_text_in_logprobs``
  for the answers' token log-probs (``meta_info["output_token_logprobs"]``: ``[logprob, token
  id, text]`` per token; ``output_top_logprobs`` likewise per position), ``output_ids`` for the
  token ids, ``meta_info["finish_reason"]["type"]`` and ``prompt_tokens``.

The model's layer count comes from the tokenizer's folder (``config.json``); without it the
capability is not offered, and said so.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from candor.backends.base import (
    LOGPROBS,
    PROMPT_HIDDEN_STATES,
    TOP_LOGPROBS,
    Completion,
    Generations,
    SamplingParams,
)
from candor.backends.constraints import JsonConstraint
from candor.backends.extracted_states import model_config
from candor.backends.openai import FINISH_REASONS, OpenAIBackend, request_seed, structured_output
from candor.backends.server_tokens import tokens_within
from candor.util.errors import CandorError, UpstreamError

logger = logging.getLogger(__name__)

NATIVE_PATH = "/generate"


class SGLangError(UpstreamError):
    """SGLang's native endpoint could not be reached, refused a request, or answered another shape."""


class SGLangBackend(OpenAIBackend):
    """An SGLang server: the ``openai`` backend, plus the prompt's hidden states from the generation pass."""

    def __init__(self, model: str, *, num_hidden_layers: int | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.root = self.base_url.rstrip("/").removesuffix("/v1")  # /generate sits at the root
        self.timeout = float(kwargs.get("timeout", 120.0))
        if num_hidden_layers is None:
            folder = getattr(self.tokenizer, "name_or_path", None)
            found = model_config(folder).get("num_hidden_layers") if folder and Path(folder).is_dir() else None
            num_hidden_layers = found if isinstance(found, int) else None
        self.num_hidden_layers = num_hidden_layers
        # SGLang hands out the last layer only (the logits processor's input).
        self.prompt_state_layers = (num_hidden_layers,) if num_hidden_layers is not None else ()
        self.describe_kind = f"sglang ({self.base_url})"

    def _probe(self) -> frozenset[str]:
        caps = set(super()._probe())
        if self.num_hidden_layers is None:
            logger.warning(
                "%s: the model's layer count is unknown (give --tokenizer, the model's folder): the prompt's "
                "hidden states are not read from the generation pass",
                self.base_url,
            )
            return frozenset(caps)
        try:
            state = last_prompt_state(self._native("Hello", SamplingParams(max_new_tokens=1), 0.0, 1, None, 0)[0])
        except (SGLangError, CandorError) as exc:
            logger.warning(
                "%s gives no prompt hidden states (%s); is it run with --enable-return-hidden-states?",
                self.base_url,
                exc,
            )
            return frozenset(caps)
        if state.ndim == 1 and state.size:
            caps.add(PROMPT_HIDDEN_STATES)
        return frozenset(caps)

    # ------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
        prompt_states: bool = False,
        constraint: JsonConstraint | None = None,
    ) -> list[Generations]:
        """As the ``openai`` backend; with ``prompt_states``, through ``/generate`` with the prompt's states.

        ``constraint`` is SGLang's structured output either way (``response_format``, or ``json_schema`` in the
        native sampling parameters); one that allows plain text is refused.
        """
        schema = structured_output(
            constraint, f"the server at {self.base_url}"
        )  # refuses allow_text before any request
        if not prompt_states:
            return super().generate(prompts, n, params, greedy=greedy, seeds=seeds, constraint=constraint)
        if PROMPT_HIDDEN_STATES not in self.capabilities:
            raise CandorError(f"the server at {self.base_url} gives no prompt hidden states")
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise CandorError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        seeds = list(seeds) if seeds is not None else [self.seed + i for i in range(len(prompts))]
        caps = self.capabilities
        top = self.top_logprobs if TOP_LOGPROBS in caps else 0
        tasks = []  # (prompt index, greedy row?, temperature, n, seed)
        for i in range(len(prompts)):
            if greedy:
                tasks.append((i, True, 0.0, 1, None))
            if n:
                tasks.append((i, False, params.temperature, n, request_seed(seeds[i])))

        json_schema = json.dumps(schema["response_format"]["json_schema"]["schema"]) if schema else None

        def run(task: tuple[int, bool, float, int, int | None]) -> list[dict[str, Any]]:
            i, _, temperature, count, seed = task
            return self._native(prompts[i], params, temperature, count, seed, top, json_schema)

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            replies = list(pool.map(run, tasks))
        results = [Generations(greedy=None, samples=[]) for _ in prompts]
        for (i, is_greedy, *_), reply in zip(tasks, replies, strict=True):
            completions = [native_completion(r, params.stop, LOGPROBS in caps) for r in reply]
            if is_greedy:
                results[i].greedy = completions[0]
            else:
                results[i].samples = completions
            if results[i].prompt_states is None:
                results[i].prompt_states = {self.num_hidden_layers: last_prompt_state(reply[0])}  # type: ignore[dict-item]
                results[i].prompt_tokens = _count(_meta(reply[0]).get("prompt_tokens"))
        if any(len(g.samples) != n for g in results):
            raise UpstreamError(f"{self.base_url} returned fewer samples than the {n} requested")
        return results

    def _native(
        self,
        prompt: str,
        params: SamplingParams,
        temperature: float,
        n: int,
        seed: int | None,
        top: int,
        json_schema: str | None = None,
    ) -> list[dict[str, Any]]:
        """One ``/generate`` request asking for the hidden states: its ``n`` results (JSON for ``json_schema``)."""
        sampling: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "temperature": temperature, "n": n}
        if params.stop:
            sampling["stop"] = list(params.stop)
        if temperature > 0:
            sampling["top_p"] = params.top_p
            if params.top_k > 0:
                sampling["top_k"] = params.top_k
        if seed is not None:
            sampling["sampling_seed"] = seed
        if json_schema is not None:
            sampling["json_schema"] = json_schema
        body = {
            "text": prompt,
            "sampling_params": sampling,
            "return_hidden_states": True,
            "return_logprob": True,
            "top_logprobs_num": top,
            "return_text_in_logprobs": True,
        }
        answer = self._post(NATIVE_PATH, body)
        results = answer if isinstance(answer, list) else [answer]
        if len(results) != n or not all(isinstance(r, dict) and isinstance(r.get("meta_info"), dict) for r in results):
            raise SGLangError(
                f"{self.root}{NATIVE_PATH} answered {_short(answer)}; expected {n} results with meta_info"
            )
        return results

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.root + path, data=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise SGLangError(f"{self.root}{path} answered {exc.code}: {_short(detail)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SGLangError(f"cannot reach {self.root}{path} ({getattr(exc, 'reason', exc)})") from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise SGLangError(f"{self.root}{path} answered something that is not JSON: {_short(raw)}") from None


def last_prompt_state(result: dict[str, Any]) -> np.ndarray:
    """The prompt's last token's state in one ``/generate`` result (see the module docstring)."""
    states = _meta(result).get("hidden_states")
    if not isinstance(states, list) or not states:
        raise CandorError(f"no meta_info.hidden_states in the answer: {_short(result)}")
    prefill = states[0]
    if isinstance(prefill, list) and prefill and isinstance(prefill[0], list):
        prefill = prefill[-1]  # rows: the prompt positions the prefill computed
    vector = np.asarray(prefill, dtype=np.float32)
    if vector.ndim != 1 or vector.size == 0 or not np.isfinite(vector).all():
        raise CandorError(f"meta_info.hidden_states[0] is not a state vector (shape {vector.shape})")
    return vector


def native_completion(result: dict[str, Any], stop: Sequence[str], with_logprobs: bool) -> Completion:
    """A :class:`Completion` from one ``/generate`` result, trimmed to its text as the ``openai`` backend trims."""
    meta = _meta(result)
    raw = str(result.get("text") or "")
    ends = [k for k in (raw.find(x) for x in stop if x) if k >= 0]
    raw = raw[: min(ends)] if ends else raw
    finish = meta.get("finish_reason")
    reason = "stop" if ends else FINISH_REASONS.get(finish.get("type") if isinstance(finish, dict) else None)
    entries = (meta.get("output_token_logprobs") or []) if with_logprobs else []
    tops = meta.get("output_top_logprobs") or []
    tokens = [str(e[2]) if len(e) > 2 and e[2] is not None else "" for e in entries]
    lps = [float(e[0]) if e[0] is not None else math.nan for e in entries]
    ids = [int(e[1]) for e in entries] if entries else [int(t) for t in result.get("output_ids") or []]
    keep = tokens_within(tokens, len(raw)) if tokens else 0
    alternatives = [
        {str(t[2]): float(t[0]) for t in (pos or []) if len(t) > 2 and t[0] is not None} for pos in tops[:keep]
    ]
    return Completion(
        text=raw.strip(),
        token_ids=ids[:keep],
        tokens=tokens[:keep],
        logprobs=lps[:keep],
        top_logprobs=alternatives if any(alternatives) else [],
        finish_reason=reason,
        completion_tokens=_count(meta.get("completion_tokens")),
    )


def _meta(result: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("meta_info") if isinstance(result, dict) else None
    return meta if isinstance(meta, dict) else {}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _short(value: Any, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"
