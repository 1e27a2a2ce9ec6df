"""The ``hf`` backend: any transformers causal LM, on CPU or GPU.

Generation uses candor's own decode loop (:mod:`candor.backends.engine.decode_loop`)
instead of ``model.generate``, because annotation asks for a greedy answer
and ``n`` samples of the same prompt, and a per-call ``generate`` recomputes
the prompt for each of them:

- prompts are prefilled in chunks of ``batch_size``, left-padded; a token
  prefix shared by every prompt of the call (the few-shot block, a system
  prompt) is computed once and its KV cache copied into each chunk;
- each prompt's KV cache is prefilled once and copied into one row for the
  greedy answer and one per sample;
- the rows' KV cache is written in place (:mod:`candor.backends.engine.kv_slots`):
  a row that finishes (EOS, a stop string, ``max_new_tokens``) leaves the
  batch at once, so finished answers stop costing compute, and the next
  prompt's rows take its place, so the batch stays full and the long answers
  of one chunk decode alongside the next prompts instead of alone. Pass many
  prompts per call to benefit.

:meth:`HFBackend.live_engine` runs the same loop in a thread of its own, fed
by requests that join the running batch at the next step
(:mod:`candor.backends.engine.live_engine`).

On a CPU shared with other busy processes, OpenMP's default spin-waiting made
every forward pass five to six times slower with 2 threads on 2 cores; set
``OMP_WAIT_POLICY=PASSIVE`` (before torch starts) or use one thread there.

Sampling is described in :mod:`candor.backends.engine.sampling` (seeded per prompt
and sample, so a prompt's samples never depend on its batch), stop strings in
:mod:`candor.backends.engine.stops`. The text is cut at the first stop string, and
the token that completed it is dropped together with its log-prob; when a
stop string spans tokens, the earlier tokens of it stay in ``token_ids``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from candor.backends.base import (
    CONSTRAINED,
    CONTINUATION_STATES,
    DEFAULT_TOP_LOGPROBS,
    LIVE_DECODE,
    PRUNED_CANDIDATES,
    SCORE_CANDIDATES,
    TOKEN_HOOK,
    TOKEN_STATES,
    WHITE_BOX,
    Generations,
    LiveEngine,
    RequestTokenHook,
    SamplingParams,
    TokenHook,
)
from candor.backends.constraints import GrammarCache, JsonConstraint
from candor.backends.default_model import DEFAULT_MODEL, is_embedded, resolve_embedded
from candor.backends.engine import (
    DEFAULT_PREFILL_CHUNK,
    ChunkFeed,
    DecodeJob,
    DecodeLoop,
    HFLiveEngine,
    PackedLinears,
    StopMatcher,
    StopMatchers,
    continuation_hidden_states,
    lean_decode_step,
    packed_linears_of,
    row_seed,
    score_candidates,
    score_candidates_pruned,
    token_hidden_states,
    with_packed_linears,
)
from candor.backends.tokenizer_mixin import TokenizerMixin
from candor.backends.tokens import (
    accepts_logits_to_keep,
    cache_keyword,
    pad_batch,
    positions_from_mask,
    prefill_shared_prefix,
    usable_prefix_length,
)
from candor.backends.tokens import new_cache as new_kv_cache
from candor.util.cpu import NATIVE_16BIT, describe, native_16bit
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFBackend(TokenizerMixin):
    """A white-box backend around a transformers causal LM and its tokenizer."""

    white_box = True
    capabilities = WHITE_BOX | {
        SCORE_CANDIDATES,
        PRUNED_CANDIDATES,
        CONTINUATION_STATES,
        TOKEN_HOOK,
        LIVE_DECODE,
        TOKEN_STATES,
        CONSTRAINED,
    }

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 16,
        device: str | None = None,
        model_name: str | None = None,
        seed: int = 0,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        pack_linears: bool = True,
    ) -> None:
        if batch_size < 1:
            raise CandorError(f"batch_size must be at least 1, got {batch_size}")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self.top_logprobs = max(0, top_logprobs)  # alternatives kept per generated token (0: none)
        self.device = next(model.parameters()).device
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # e.g. "float32", for provenance
        self.model_name = model_name or str(getattr(model.config, "name_or_path", "") or "model")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_ids = self._find_eos_ids()  # every id that ends a row
        self._cache_kw = cache_keyword(model)
        self._keeps_logits = accepts_logits_to_keep(model)
        # Matchers by stop tuple, bounded: a client picks its stop lists (engine.stops).
        self.stop_matchers = StopMatchers(tokenizer)
        self._grammars: GrammarCache | None = None  # compiled JSON-schema grammars, made at the first constraint
        self._grammars_lock = threading.Lock()
        self.adapter: str | None = None
        # Inference runs the linear layers on prepacked oneDNN weights (same math, faster on CPU);
        # ``pack_linears=False`` keeps nn.Linear's own kernels (the benchmarks' baseline).
        packs = pack_linears and self.device.type == "cpu"
        self.packed_linears = packed_linears_of(model) if packs else PackedLinears(model, enabled=False)
        # Decode steps of a plain Llama run leaner than transformers' forward, same numbers (llama_step).
        self.lean_step = lean_decode_step(model, self.packed_linears)
        # With it, ``generate`` keeps a prefix all its prompts share once, not in every row (kv_slots).
        self.split_prefix = True
        if self.device.type == "cpu":
            self._warm_up()

    @torch.inference_mode()
    @with_packed_linears
    def _warm_up(self) -> None:
        """One forward of a few tokens, so that the first real call repeats exactly.

        Without it, in about a third of fresh processes the first ``generate``
        on CPU computed the rotary embedding's cosines with errors up to 1.5e-4
        against float64 (1.7e-6 in every later call; the sines were always
        right), so its prefill, and every log-prob of its first prompts,
        drifted by up to 3e-4 from a second identical call. With this forward
        first, none of 30 fresh processes drifted
        (``tests/test_backend_hf.py::test_the_first_generate_call_of_a_process_repeats_exactly``).
        Which torch kernel misbehaves, and why only then, was not found.
        """
        self.model(input_ids=torch.arange(4, device=self.device).unsqueeze(0), use_cache=False)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = DEFAULT_MODEL,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | None = None,
        batch_size: int = 16,
        adapter: str | None = None,
        seed: int = 0,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        pack_linears: bool = True,
    ) -> HFBackend:
        """Load the embedded default, a local directory, or a Hugging Face id already cached.

        ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA. ``adapter``
        is a PEFT adapter directory, merged into the weights for speed.
        ``pack_linears=False`` keeps ``nn.Linear``'s own CPU kernels
        (:mod:`candor.backends.engine.packed_linear`).
        """
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=resolve_dtype(dtype, device))
        if adapter is not None:
            model = _load_adapter(model, adapter)
        backend = cls(
            model,
            tokenizer,
            batch_size=batch_size,
            device=device,
            model_name=name_or_path,
            seed=seed,
            top_logprobs=top_logprobs,
            pack_linears=pack_linears,
        )
        backend.adapter = adapter
        return backend

    @property
    def context_length(self) -> int | None:
        """Tokens the model attends to (prompt plus answer); None when its config does not say."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    # ------------------------------------------------------------ generation

    @torch.inference_mode()
    @with_packed_linears
    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
        on_token: TokenHook | None = None,
        constraint: JsonConstraint | Sequence[JsonConstraint | None] | None = None,
    ) -> list[Generations]:
        """Greedy answer (if ``greedy``) and ``n`` samples per prompt; see the module docstring.

        Without ``seeds``, prompt i gets a seed derived from the backend's
        ``seed`` and i, so the same call twice gives the same samples.
        ``on_token(prompt, sample, token_id)`` is called after each token a
        row keeps (not the EOS or stop token); returning False ends the row
        there (its completion is then partial). ``constraint``: every answer
        is JSON valid for its schema (see :mod:`candor.backends.constraints`;
        a schema that cannot be compiled is refused before any work); a
        sequence gives each prompt its own (None: unconstrained), decoded in
        the same batches.
        """
        self.check_request(n, params)
        constraints = per_prompt(constraint, len(prompts))
        for one in dict.fromkeys(c for c in constraints if c is not None):
            self.grammars.get(one)  # compiled (or refused) once, before any prompt runs
        if seeds is not None and len(seeds) != len(prompts):
            raise CandorError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        if not prompts:
            return []
        if not greedy and n == 0:
            return [Generations(greedy=None, samples=[]) for _ in prompts]
        if seeds is None:
            seeds = [row_seed(self.seed, i) for i in range(len(prompts))]
        encoded = self.encode(prompts)
        prefix = usable_prefix_length(self.model, encoded, params.max_new_tokens)
        prefix_cache = prefill_shared_prefix(self.model, encoded[0][:prefix]) if prefix else None
        matcher = self.stop_matcher(params.stop)
        jobs = [
            DecodeJob(
                prompt_ids=ids,
                n=n,
                greedy=greedy,
                params=params,
                seed=seeds[i],
                matcher=matcher,
                on_token=_prompt_hook(on_token, i),
                constraint=constraints[i],
            )
            for i, ids in enumerate(encoded)
        ]
        # Similar lengths in a prefill waste less on padding; results do not depend on the order.
        order = sorted(range(len(jobs)), key=lambda i: len(encoded[i]))
        capacity = self.batch_size * (int(greedy) + n)
        columns = max(len(ids) for ids in encoded) + 2 * params.max_new_tokens
        split = self.split_prefix and self.lean_step is not None  # the lean step attends to it split
        loop = DecodeLoop(self, rows=capacity, columns=columns, split_prefix=split)
        loop.run(ChunkFeed([jobs[i] for i in order], self.batch_size, capacity, prefix_cache, prefix))
        return [job.result for job in jobs]

    def check_request(self, n: int, params: SamplingParams) -> None:
        """Refuse a sample count or sampling settings the decode loop cannot honour."""
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        _check_params(params)

    @property
    def grammars(self) -> GrammarCache:
        """The compiled grammars of this backend's tokenizer (made at first use: it scans the vocabulary)."""
        with self._grammars_lock:
            if self._grammars is None:
                vocab = int(self.model.get_output_embeddings().weight.shape[0])
                self._grammars = GrammarCache(self.tokenizer, vocab, self.eos_ids)
            return self._grammars

    def grammar_ready(self, constraint: JsonConstraint | None) -> bool:
        """Whether ``constraint`` needs no compiling (none, or its grammar is kept): the live engine
        compiles the others on its builder thread, never on the engine thread."""
        if constraint is None:
            return True
        return self._grammars is not None and self._grammars.cached(constraint) is not None

    def stop_matcher(self, stops: Sequence[str]) -> StopMatcher:
        """The matcher of one tuple of stop strings (the most recently used ones kept, see ``stop_matchers``)."""
        return self.stop_matchers.get(stops)

    def live_engine(
        self,
        max_rows: int | None = None,
        shared_prefix: Sequence[int] | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
    ) -> LiveEngine:
        """A decode loop running in its own thread that requests join between steps.

        ``max_rows`` caps the rows decoded together (a request takes one row
        for its greedy answer and one per sample); by default
        ``batch_size`` x 6, a full batch of greedy answers with 5 samples.
        ``shared_prefix``: token ids the prompts start with (a template's
        few-shot block, see :class:`candor.backends.engine.shared_prefix.SharedPrefix`),
        run once; each prompt that starts with them is prefilled past them only.
        ``prefill_chunk``: a prompt with more tokens than this to prefill is
        prefilled that many at a time between decode steps, to the same bits
        (a multiple of 64; None: in one piece; see
        :mod:`candor.backends.engine.chunked_prefill`).
        Close it when done (it is a context manager).
        """
        rows = max_rows if max_rows is not None else self.batch_size * 6
        return HFLiveEngine(self, rows, shared_prefix=shared_prefix, prefill_chunk=prefill_chunk)

    # --------------------------------------------------------------- scoring

    @torch.inference_mode()
    @with_packed_linears
    def score(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[float]]:
        """Log-probs of each continuation's tokens after its prompt.

        The continuation's tokens are those of ``prompt + continuation`` past
        the longest common prefix with the prompt's own tokens, so a token
        merged across the boundary counts as part of the continuation.
        """
        if len(prompts) != len(continuations):
            raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        out: list[list[float]] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = range(start, min(start + self.batch_size, len(prompts)))
            out.extend(self._score_chunk([prompts[i] for i in chunk], [continuations[i] for i in chunk]))
        return out

    def _score_chunk(self, prompts: list[str], continuations: list[str]) -> list[list[float]]:
        prompt_ids = self.encode(prompts)
        full_ids = self.encode([p + c for p, c in zip(prompts, continuations, strict=True)])
        starts = []
        for p, f in zip(prompt_ids, full_ids, strict=True):
            common = 0
            while common < min(len(p), len(f)) and p[common] == f[common]:
                common += 1
            starts.append(max(common, 1))  # the first token of a sequence has no log-prob
        lengths = [len(f) - s for f, s in zip(full_ids, starts, strict=True)]
        ids, mask = pad_batch(full_ids, self.pad_id, device=self.device)
        keep = max(lengths) + 1
        logits = self.forward(ids, mask, None, positions_from_mask(mask), keep=keep, last_only=False)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        width = ids.shape[1]
        out = []
        for row, length in enumerate(lengths):
            if length == 0:
                out.append([])
                continue
            targets = ids[row, width - length :]
            # logits kept at positions width-keep .. width-1; position t predicts token t+1.
            pred = logprobs[row, keep - 1 - length : keep - 1]
            out.append(pred.gather(1, targets.unsqueeze(1)).squeeze(1).tolist())
        return out

    @torch.inference_mode()
    @with_packed_linears
    def token_distribution_stats(
        self, prompts: Sequence[str], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Full-vocabulary statistics at each continuation token, by one teacher-forced pass.

        ``continuations[i]`` are token ids (e.g. a stored answer's
        ``token_ids``) appended to the tokens of ``prompts[i]``. For each
        continuation token t the row ``[entropy, top1, top2]`` holds the
        entropy (nats) of the model's next-token distribution before t and the
        two largest log-probs of that distribution: shape ``[len(cont), 3]``.
        """
        if len(prompts) != len(continuations):
            raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        out: list[np.ndarray] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = range(start, min(start + self.batch_size, len(prompts)))
            out.extend(self._stats_chunk([prompts[i] for i in chunk], [list(continuations[i]) for i in chunk]))
        return out

    def _stats_chunk(self, prompts: list[str], continuations: list[list[int]]) -> list[np.ndarray]:
        full = [p + c for p, c in zip(self.encode(prompts), continuations, strict=True)]
        lengths = [len(c) for c in continuations]
        ids, mask = pad_batch(full, self.pad_id, device=self.device)
        keep = max(lengths) + 1
        logits = self.forward(ids, mask, None, positions_from_mask(mask), keep=keep, last_only=False)
        # float64: a float32 sum over a 50k vocabulary drifts by ~1e-6 nats.
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        entropy = -(logprobs.exp() * logprobs).sum(-1)  # [rows, keep]
        top2 = logprobs.topk(2, dim=-1).values  # [rows, keep, 2]
        stats = torch.cat([entropy.unsqueeze(-1), top2], dim=-1).cpu().numpy()
        # Position t predicts token t+1, so the last ``length`` tokens are predicted at keep-1-length .. keep-2.
        return [stats[row, keep - 1 - n : keep - 1].astype(float) for row, n in enumerate(lengths)]

    @torch.inference_mode()
    @with_packed_linears
    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        columns = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        rows = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = self.encode(prompts[start : start + self.batch_size])
            ids, mask = pad_batch(chunk, self.pad_id, device=self.device)
            logits = self.forward(ids, mask, None, positions_from_mask(mask))
            rows.append(torch.log_softmax(logits.float(), dim=-1)[:, columns].cpu())
        if not rows:
            return np.zeros((0, len(columns)), dtype=np.float32)
        return torch.cat(rows).numpy()

    @torch.inference_mode()
    @with_packed_linears
    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        """Hidden state of the last prompt token at ``layer`` of ``output_hidden_states``.

        Index 0 is the embedding output and -1 the last layer; for Llama-style
        models the last entry is taken after the final norm (transformers'
        convention), the others before it.
        """
        rows = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = self.encode(prompts[start : start + self.batch_size])
            ids, mask = pad_batch(chunk, self.pad_id, device=self.device)
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions_from_mask(mask),
                output_hidden_states=True,
                use_cache=False,
                **({"logits_to_keep": 1} if self._keeps_logits else {}),
            )
            states = out.hidden_states
            if not -len(states) <= layer < len(states):
                raise CandorError(f"layer {layer} is out of range: the model has {len(states)} hidden states")
            rows.append(states[layer][:, -1, :].float().cpu())
        if not rows:
            return np.zeros((0, int(self.model.config.hidden_size)), dtype=np.float32)
        return torch.cat(rows).numpy()

    @torch.inference_mode()
    @with_packed_linears
    def continuation_hidden_states(
        self, prompts: Sequence[str], continuations: Sequence[Sequence[str]], layer: int = -1
    ) -> list[np.ndarray]:
        """:meth:`hidden_states` of ``prompt + c`` for each continuation c of each prompt, each prompt run once.

        Call it through :func:`candor.backends.base.continuation_hidden_states`
        (:mod:`candor.backends.engine.continuation_states`).
        """
        return continuation_hidden_states(self, prompts, continuations, layer)

    @torch.inference_mode()
    @with_packed_linears
    def token_hidden_states(self, sequences: Sequence[Sequence[int]], layer: int = -1) -> list[np.ndarray]:
        """Per sequence of token ids, every position's ``layer`` hidden state, ``[len, hidden]`` float32.

        The forward stops at ``layer`` (:mod:`candor.backends.engine.layer_states`); ``layer`` indexes
        ``output_hidden_states`` as in :meth:`hidden_states`.
        """
        return token_hidden_states(self, sequences, layer, self.batch_size)

    @property
    def num_hidden_layers(self) -> int:
        """The model's decoder layers (``output_hidden_states`` has one entry more: the embeddings)."""
        return int(self.model.config.num_hidden_layers)

    # ------------------------------------------------ public model plumbing
    # The building blocks of the methods above (and ``encode``, from TokenizerMixin), public for the
    # engine's scoring kernels (candor.backends.engine.prefix_scoring); they keep its numbers equal to ``score``'s.

    @with_packed_linears
    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        cache: DynamicCache | None,
        position_ids: torch.Tensor,
        *,
        keep: int = 1,
        last_only: bool = True,
    ) -> torch.Tensor:
        """Float32 logits of the last ``keep`` positions (``[B, V]`` when ``last_only``), filling ``cache``.

        ``mask`` is a 2-D padding mask or a 4-D additive attention mask.
        """
        kwargs: dict[str, Any] = {self._cache_kw: cache, "use_cache": cache is not None}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, **kwargs)
        logits = out.logits[:, -keep:, :].float()
        return logits[:, -1, :] if last_only else logits

    def decode_forward(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: Any, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`forward` for one decode step over the slot cache (:mod:`candor.backends.engine.kv_slots`).

        ``ids`` ``[B, 1]``; ``mask`` the 4-D additive mask over the window the
        cache's layers return. Runs the lean step of a plain Llama
        (:mod:`candor.backends.engine.llama_step`) when there is one, inference is on
        and the linear layers are packed. Its first step runs transformers'
        forward on the same inputs first and keeps the lean step only if their
        logits agree; either way the step's result (and the KV column, which
        the slot cache writes in place, so the last write stands) is the one
        every later step would give, so a process's first call decodes as its
        next ones.
        """
        step = self.lean_step
        if step is None or torch.is_grad_enabled() or not self.packed_linears.active:
            return self.forward(ids, mask, cache, position_ids)
        if step.checked:
            return step(ids, mask, cache, position_ids)
        reference = self.forward(ids, mask, cache, position_ids)
        lean = step(ids, mask, cache, position_ids)
        if step.agrees(lean, reference):
            step.checked = True
            return lean
        self.lean_step = None
        return self.forward(ids, mask, cache, position_ids)  # its keys and values replace the lean step's

    @with_packed_linears
    def forward_with_states(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache | None, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward`'s last logits ``[B, V]``, and the last position's hidden state of every layer.

        The states are float32 CPU tensors ``[B, hidden]``, one per entry of
        ``output_hidden_states`` (embeddings first), as :meth:`hidden_states` reads them.
        """
        kwargs: dict[str, Any] = {self._cache_kw: cache, "use_cache": cache is not None}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, output_hidden_states=True, **kwargs
        )
        states = [layer[:, -1, :].float().cpu() for layer in out.hidden_states]
        return out.logits[:, -1, :].float(), states

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for this model."""
        return new_kv_cache(self.model)

    @torch.inference_mode()
    @with_packed_linears
    def score_candidates(self, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        """Total log-prob of every candidate after every prompt, ``(len(prompts), len(candidates))``.

        The same numbers as summing :meth:`score` over every pair, with the
        shared prompt prefix, each prompt and the candidates' common tokens
        computed once (:mod:`candor.backends.engine.prefix_scoring`).
        """
        return score_candidates(self, prompts, candidates)

    @torch.inference_mode()
    @with_packed_linears
    def score_candidates_pruned(
        self, prompts: Sequence[str], candidates: Sequence[str], min_mass: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_candidates` expanding only candidate-trie nodes of probability ``min_mass`` or more.

        Returns the scores (-inf for the candidates skipped) and, per prompt,
        the probability of the nodes left unexpanded, an upper bound on the
        probability of what was skipped (:func:`candor.backends.engine.prefix_scoring.score_candidates_pruned`).
        """
        return score_candidates_pruned(self, prompts, candidates, min_mass)

    def _find_eos_ids(self) -> frozenset[int]:
        ids = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif source is not None:
                ids.update(int(i) for i in source)
        return frozenset(ids)


def _prompt_hook(on_token: TokenHook | None, prompt: int) -> RequestTokenHook | None:
    """``generate``'s hook of all prompts, seen from one prompt's job."""
    if on_token is None:
        return None
    return lambda sample, token: on_token(prompt, sample, token)


def _check_params(params: SamplingParams) -> None:
    if params.max_new_tokens < 1:
        raise CandorError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise CandorError(f"temperature must be >= 0 (0 samples greedily), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise CandorError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise CandorError(f"top_k must be >= 0 (0 turns top-k off), got {params.top_k}")


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise CandorError(f"unknown dtype {dtype!r}; known: auto, {', '.join(_DTYPES)}") from None


def load_model_and_tokenizer(
    name_or_path: str = DEFAULT_MODEL, *, dtype: str | torch.dtype | None = None, device: str | None = None
) -> tuple[Any, Any]:
    """The model and tokenizer behind ``name_or_path``: the embedded default, a local directory, or a cached hub id.

    ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA; the model is
    moved to ``device`` when one is given. Nothing is downloaded: an unknown
    model is a :class:`CandorError` naming it.
    """
    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = str(resolve_embedded(name_or_path)) if is_embedded(name_or_path) else name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, target), local_files_only=True)
    except (OSError, ValueError) as exc:
        # transformers' own text ("check your internet connection") misleads for a model that is not there
        detail = f" ({type(exc).__name__}: {exc})" if Path(path).exists() else ""
        raise CandorError(
            f"cannot load model {name_or_path!r}: candor loads local files only, and this is neither a model "
            f"folder nor in the Hugging Face cache; pass a model folder (--model PATH), or fetch it first with "
            f"the hub's own tool: `huggingface-cli download {name_or_path}`{detail}"
        ) from None
    if device is not None:
        model = model.to(device)
    warn_if_emulated(model.dtype, target)
    return model, tokenizer


def warn_if_emulated(dtype: torch.dtype, device: str) -> bool:
    """Log a warning (and return True) when ``dtype`` on this CPU is widened to float32 for every product."""
    if not str(device).startswith("cpu") or native_16bit(dtype) is not False:
        return False
    logger.warning(
        "%s on a CPU without %s instructions (%s): every product widens it to float32, so expect it to "
        "run slower than float32 here (see benchmarks/README.md), with numbers that differ from float32's",
        str(dtype).removeprefix("torch."),
        " or ".join(NATIVE_16BIT[dtype]),
        describe()["name"],
    )
    return True


def _load_adapter(model: Any, adapter: str) -> Any:
    if not (Path(adapter) / "adapter_config.json").exists():
        raise CandorError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter).merge_and_unload()


def per_prompt(
    constraint: JsonConstraint | Sequence[JsonConstraint | None] | None, prompts: int
) -> list[JsonConstraint | None]:
    """``generate``'s ``constraint`` as one per prompt (one constraint, or none, is every prompt's)."""
    if constraint is None or isinstance(constraint, JsonConstraint):
        return [constraint] * prompts
    constraints = list(constraint)
    if len(constraints) != prompts:
        raise CandorError(f"got {len(constraints)} constraints for {prompts} prompts")
    return constraints
