"""The Backend protocol: the seam between candor's methods and a model engine.

Every method in candor talks to a model through these calls only, so the same
estimator runs on transformers (``hf``), vLLM or an OpenAI-compatible server.
Prompts are plain strings that are already templated (see ``candor.annotation.prompts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from candor.backends.constraints import JsonConstraint
from candor.util.errors import CandorError

# What a backend can do, by name. An estimator lists the ones it needs
# (``Estimator.requires``) and is refused before any request when one is missing.
GENERATE = "generate"  # greedy answers and samples (every backend)
LOGPROBS = "logprobs"  # log-probs of the generated tokens
TOP_LOGPROBS = "top_logprobs"  # the top-k alternatives at each generated position
NEXT_TOKEN_LOGPROBS = "next_token_logprobs"  # log-probs of given token ids after a prompt
SCORE = "score"  # log-probs of a given continuation (prompt log-probs)
HIDDEN_STATES = "hidden_states"
TOKENIZER = "tokenizer"  # tokenize/decode with the served model's tokenizer
# ``score_candidates``: a closed set of continuations after many prompts, sharing the work
# (see :func:`score_candidates`; backends without it are served through ``score``).
SCORE_CANDIDATES = "score_candidates"
# ``generate(..., on_token=...)``: a per-row callback after each kept token, which can end the row
# (token streaming and cancellation when serving); see :data:`TokenHook`.
TOKEN_HOOK = "token_hook"
# ``score_candidates_pruned``: ``score_candidates`` that skips candidates of low probability
# (an opt-in approximation with a bound on what it drops; the ``hf`` backend).
PRUNED_CANDIDATES = "score_candidates_pruned"
# ``continuation_hidden_states``: the hidden states after a prompt's several continuations, the
# prompt run once (see :func:`continuation_hidden_states`; others go through ``hidden_states``).
CONTINUATION_STATES = "continuation_hidden_states"
# ``live_engine()``: a decode engine that requests join at its next step and leave when they finish
# (continuous batching, for serving); see :class:`LiveEngine`.
LIVE_DECODE = "live_decode"
# ``generate(..., prompt_states=True)``: each ``Generations`` also carries the hidden states of the prompt's
# last token from the engine's own generation pass (no second prefill), for the layers in the backend's
# ``prompt_state_layers``; see :attr:`Generations.prompt_states` (vLLM's ``extract_hidden_states``, SGLang's
# ``return_hidden_states``).
PROMPT_HIDDEN_STATES = "prompt_hidden_states"
# ``token_hidden_states(sequences, layer)``: every position's hidden state at one layer over given token ids
# (a served prompt's ids and the answer's generated ids), the forward stopped at that layer; a claim head
# reads the served answer from the served model's own weights this way (the ``hf`` backend, which also
# tells its ``num_hidden_layers``).
TOKEN_STATES = "token_hidden_states"
# ``generate(..., constraint=...)`` and ``DecodeRequest.constraint``: every answer is JSON valid for a schema
# (or, with ``allow_text``, plain text), by a token mask per step (:mod:`candor.backends.constraints`; the ``hf``
# backend). The served backends pass a constraint without ``allow_text`` as the upstream's structured output.
CONSTRAINED = "constrained_decoding"
# ``generate_tool_calls(...)``: OpenAI ``tools``/``tool_choice`` passed to the upstream server, its calls returned
# as the canonical JSON of the calls (the ``openai`` backend; see :meth:`OpenAIBackend.generate_tool_calls`).
UPSTREAM_TOOLS = "upstream_tools"

WHITE_BOX = frozenset({GENERATE, LOGPROBS, TOP_LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE, HIDDEN_STATES, TOKENIZER})

# Top alternatives kept per generated token in records (a cheap top-k on logits already computed).
DEFAULT_TOP_LOGPROBS = 5


def backend_capabilities(backend: Any) -> frozenset[str]:
    """What ``backend`` can do: its ``capabilities`` when declared, else all of it for a white-box one."""
    declared = getattr(backend, "capabilities", None)
    if declared is not None:
        return frozenset(declared)
    return WHITE_BOX if getattr(backend, "white_box", False) else frozenset({GENERATE})


def applied_params(backend: Any, params: SamplingParams) -> SamplingParams:
    """The samples' decoding as ``backend`` applies it: ``params``, less what its engine refused.

    A backend that may drop a setting (the ``openai`` backend drops ``top_k`` where the server refuses it)
    says so through its own ``applied_params``; the others apply ``params`` whole.
    """
    own = getattr(backend, "applied_params", None)
    return own(params) if callable(own) else params


def score_candidates(backend: Any, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
    """Total log-prob of every candidate after every prompt: shape ``(len(prompts), len(candidates))``.

    A backend with the :data:`SCORE_CANDIDATES` capability computes it itself
    (the ``hf`` backend shares prompt prefixes and candidate tokens); any other
    sums ``backend.score`` over every (prompt, candidate) pair. Either way the
    numbers are those of ``score``.
    """
    if any(not c for c in candidates):
        raise CandorError("score_candidates: a candidate continuation is empty")
    if not prompts or not candidates:
        return np.zeros((len(prompts), len(candidates)))
    if SCORE_CANDIDATES in backend_capabilities(backend):
        return np.asarray(backend.score_candidates(list(prompts), list(candidates)), dtype=float)
    return score_pairs(backend, prompts, candidates)


def continuation_hidden_states(
    backend: Any, prompts: Sequence[str], continuations: Sequence[Sequence[str]], layer: int = -1
) -> list[np.ndarray]:
    """Per prompt, the ``hidden_states`` of ``prompt + c`` for each of its continuations c.

    One ``(len(continuations[i]), hidden)`` array per prompt. A backend with the
    :data:`CONTINUATION_STATES` capability runs each prompt once for all its
    continuations (the ``hf`` backend); any other runs ``hidden_states`` on
    every joined text. Either way the numbers are those of ``hidden_states``.
    """
    if len(prompts) != len(continuations):
        raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} lists of continuations")
    if CONTINUATION_STATES in backend_capabilities(backend):
        return list(backend.continuation_hidden_states(list(prompts), [list(c) for c in continuations], layer))
    return hidden_states_one_by_one(backend, prompts, continuations, layer)


def hidden_states_one_by_one(
    backend: Any, prompts: Sequence[str], continuations: Sequence[Sequence[str]], layer: int = -1
) -> list[np.ndarray]:
    """:func:`continuation_hidden_states` through ``backend.hidden_states`` on every joined text."""
    texts = [p + c for p, conts in zip(prompts, continuations, strict=True) for c in conts]
    states = backend.hidden_states(texts, layer=layer) if texts else None
    out, start = [], 0
    for conts in continuations:
        out.append(states[start : start + len(conts)] if states is not None else np.zeros((0, 0), dtype=np.float32))
        start += len(conts)
    return out


def score_pairs(backend: Any, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
    """:func:`score_candidates` through ``backend.score``, one (prompt, candidate) pair at a time."""
    pairs_p = [p for p in prompts for _ in candidates]
    pairs_c = [c for _ in prompts for c in candidates]
    sums = [float(np.sum(lps)) for lps in backend.score(pairs_p, pairs_c)]
    return np.asarray(sums, dtype=float).reshape(len(prompts), len(candidates))


# ``on_token(prompt, sample, token_id) -> keep going``: ``sample`` is -1 for the greedy row.
TokenHook = Callable[[int, int, int], bool]


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for the sampled answers (docs/methods.md "Generation and judging" defaults)."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 50
    stop: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": list(self.stop),
        }


@dataclass
class Completion:
    """One generated answer: text (stop string removed), tokens and their log-probs.

    ``logprobs[i]`` is log p(token_i | prefix) under the model's own
    distribution (temperature 1, no top-p/top-k truncation), whatever the
    decoding that chose the token. ``top_logprobs[i]`` maps the most likely
    tokens at position i (their text, as OpenAI-compatible servers report
    them) to their log-probs under the same distribution; it is empty when
    the backend cannot give them, and records written before it existed
    simply lack the key.

    ``finish_reason`` is why generation ended, as OpenAI names it: ``"stop"``
    (end of sequence or a stop string) or ``"length"`` (the token cap); None
    when the backend cannot tell. ``completion_tokens`` counts the tokens the
    engine generated for it (the stop token included, as servers report
    usage); None when unknown. Neither is written to records.

    ``stop_logprob`` is the log-prob of the token that ended the answer (the
    end-of-sequence token, or the one that completed a stop string), which
    ``logprobs`` leaves out; None when the answer ran to the token cap or the
    backend cannot give it. An answer that is only a stop has no tokens of its
    own, and this is its probability (see
    :func:`candor.estimators.semantic.sequence_logprob`). Written to records
    when known.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    stop_logprob: float | None = None
    # Engine metadata, not part of what a record holds: left out of equality and of ``to_dict``.
    finish_reason: str | None = field(default=None, compare=False)
    completion_tokens: int | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "tokens": list(self.tokens),
            "logprobs": [float(x) for x in self.logprobs],
        }
        if self.top_logprobs:  # optional: older readers and records without it stay as they were
            out["top_logprobs"] = [{t: float(v) for t, v in pos.items()} for pos in self.top_logprobs]
        if self.stop_logprob is not None:  # optional too: records written before it lack the key
            out["stop_logprob"] = float(self.stop_logprob)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Completion:
        return cls(
            text=str(d["text"]),
            token_ids=list(d.get("token_ids", [])),
            tokens=list(d.get("tokens", [])),
            logprobs=[float(x) for x in d.get("logprobs", [])],
            top_logprobs=[{str(t): float(v) for t, v in pos.items()} for pos in d.get("top_logprobs") or []],
            stop_logprob=None if d.get("stop_logprob") is None else float(d["stop_logprob"]),
        )


@dataclass
class Generations:
    """What one prompt produced: an optional greedy answer and ``n`` samples.

    ``prompt_tokens`` is the length of the prompt the engine read, in its own
    tokens (None when the backend cannot tell).

    ``prompt_states`` (asked for with ``generate(..., prompt_states=True)`` on a
    backend with :data:`PROMPT_HIDDEN_STATES`): the hidden state of the prompt's
    last token from the pass that generated these answers, one float32 vector
    per layer, keyed as transformers' ``output_hidden_states`` counts them
    (0 the embeddings, ``num_hidden_layers`` the final normed output; see
    :func:`absolute_layer`). None when not asked for.
    """

    greedy: Completion | None
    samples: list[Completion]
    prompt_tokens: int | None = field(default=None, compare=False)
    prompt_states: dict[int, np.ndarray] | None = field(default=None, compare=False)


def absolute_layer(layer: int, num_hidden_layers: int) -> int:
    """``layer`` as an index into transformers' ``output_hidden_states`` (``num_hidden_layers + 1`` entries).

    Negative layers count from the end (-1 is the final normed output, ``num_hidden_layers``).
    """
    count = num_hidden_layers + 1
    if not -count <= layer < count:
        raise CandorError(f"layer {layer} is out of range for a model of {num_hidden_layers} layers")
    return layer % count


@runtime_checkable
class Backend(Protocol):
    """What candor needs from a model engine.

    ``white_box`` backends also provide ``hidden_states`` and exact
    ``next_token_logprobs``. A backend that offers less (a served model)
    declares ``capabilities``, a set of the names above; estimators check it
    through :func:`backend_capabilities` and fail clearly before any request.
    """

    model_name: str
    white_box: bool

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
    ) -> list[Generations]:
        """Greedy answer (if ``greedy``) and ``n`` samples for every prompt.

        ``seeds`` gives one seed per prompt, so a prompt's samples do not depend
        on which other prompts share its batch (shards equal a single run).
        """
        ...

    def score(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[float]]:
        """Per-token log-probs of each continuation given its prompt (pairwise)."""
        ...

    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        """Log-softmax over the full vocabulary at the next position, at ``token_ids``.

        Returns an array of shape ``(len(prompts), len(token_ids))``.
        """
        ...

    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        """Hidden state of the last prompt token at ``layer``: ``(len(prompts), hidden)``."""
        ...

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the model's chat template into a prompt string."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    # Optional, with the SCORE_CANDIDATES capability (call it through :func:`score_candidates`):
    # def score_candidates(self, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray


# ``on_prefill(states) -> keep going``: called once a request's prompt is prefilled, before its
# first token is picked, with the hidden states at the prompt's last position, one float32 vector
# per layer (embeddings first, as transformers' ``output_hidden_states``). False ends the request
# there: nothing is decoded, its rows are freed (a question declined before generating).
PrefillHook = Callable[[Sequence[np.ndarray]], bool]

# ``on_token(sample, token_id) -> keep going`` for one request (``sample`` is -1 for the greedy row).
RequestTokenHook = Callable[[int, int], bool]

T = TypeVar("T")


@dataclass
class DecodeRequest:
    """One prompt's greedy answer (if ``greedy``) and ``n`` samples, as ``generate`` makes them.

    ``seed`` seeds the samples as ``generate``'s per-prompt seed does, so a
    request's samples equal those of ``generate([prompt], n, params, seeds=[seed])``.
    """

    prompt: str
    n: int
    params: SamplingParams
    greedy: bool = True
    seed: int = 0
    on_token: RequestTokenHook | None = None
    on_prefill: PrefillHook | None = None
    # Ask the engine for the prompt's hidden states from this request's own pass
    # (:attr:`Generations.prompt_states`; a backend with :data:`PROMPT_HIDDEN_STATES`).
    prompt_states: bool = False
    # Handed the prompt's prefill when an engine ran it in chunks (a finished
    # ``candor.backends.engine.chunked_prefill.ChunkedPrefill``: its KV cache and last logits),
    # for work that reads the same prompt again (serving's re-read of the answers).
    on_chunked_prefill: Callable[[Any], None] | None = None
    # Every answer of the request is JSON valid for this schema (a backend with :data:`CONSTRAINED`).
    constraint: JsonConstraint | None = None


class LiveEngine(Protocol):
    """A running decode loop that requests join between steps (capability :data:`LIVE_DECODE`).

    One engine thread owns the model. ``submit`` queues a request; it joins
    the running batch at the next step, its prompt prefilled alone (so what a
    request gets never depends on which others are running), and its future
    resolves when its last row ends. ``call`` runs other model work (scoring)
    in the same thread between steps. ``close`` finishes nothing new, fails
    what is queued, and stops the thread.

    A backend's ``live_engine(max_rows=..., shared_prefix=...)`` may take the
    token ids its prompts start with (a template's fixed prefix, fixed for the
    engine): it runs them once and prefills each prompt past them only.
    """

    def submit(self, request: DecodeRequest) -> Future[Generations]: ...

    def call(self, work: Callable[[], T]) -> Future[T]: ...

    def close(self) -> None: ...
