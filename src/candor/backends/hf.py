"""The ``hf`` backend: any transformers causal LM, on CPU or GPU.

Generation uses candor's own decode loop instead of ``model.generate``,
because annotation asks for a greedy answer and ``n`` samples of the same
prompt, and a per-call ``generate`` recomputes the prompt for each of them:

- prompts run in chunks of ``batch_size``, left-padded; a token prefix shared
  by every prompt of the call (the few-shot block, a system prompt) is
  computed once and its KV cache copied into each chunk;
- each prompt's KV cache is prefilled once and then repeated, one row for the
  greedy answer and one per sample;
- a row that finishes (EOS, a stop string, ``max_new_tokens``) leaves the
  batch at once, so finished answers stop costing compute;
- once half the rows have left, the next chunk is prefilled and its rows join
  the running batch (caches left-padded to a common length), so the long
  answers of one chunk decode alongside the next chunk instead of alone. Pass
  many prompts per call to benefit: 64 prompts in one call ran about 1.3x
  faster than four calls of 16 (2-core CPU, SmolLM2-135M).

On a CPU shared with other busy processes, OpenMP's default spin-waiting made
every forward pass five to six times slower with 2 threads on 2 cores; set
``OMP_WAIT_POLICY=PASSIVE`` (before torch starts) or use one thread there.

Sampling is temperature, then top-k, then top-p, then a draw by inverse CDF
from a uniform taken from the row's own generator (seeded from the prompt's
seed and the sample index), so a prompt's samples never depend on which
prompts share its batch. Log-probs are always those of the raw model
distribution (temperature 1, no truncation), as ``Completion`` requires.

Stop strings: a token whose decoded text contains a stop string ends the row
(a set lookup). A stop string longer than one character, or one that is not
ASCII, may also be split across tokens, so for those a short decoded tail of
each row is checked as well. The text is cut at the first stop string, and the
token that completed it is dropped together with its log-prob; when a stop
string spans tokens, the earlier tokens of it stay in ``token_ids``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from candor.backends.base import (
    CONTINUATION_STATES,
    DEFAULT_TOP_LOGPROBS,
    PRUNED_CANDIDATES,
    SCORE_CANDIDATES,
    TOKEN_HOOK,
    WHITE_BOX,
    Completion,
    Generations,
    SamplingParams,
    TokenHook,
)
from candor.backends.chat import TokenizerChat
from candor.backends.default_model import DEFAULT_MODEL, is_embedded, resolve_embedded
from candor.backends.tokens import (
    accepts_logits_to_keep,
    cache_keyword,
    pad_batch,
    positions_from_mask,
    prefill_shared_prefix,
    usable_prefix_length,
)
from candor.backends.tokens import encode as encode_tokens
from candor.backends.tokens import new_cache as new_kv_cache
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

# Prefill the next chunk once the running batch is down to this fraction of its full size.
REFILL_AT = 0.5

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Decoded vocabularies, one per tokenizer object (decoding 50k tokens takes ~0.4 s).
_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def decoded_vocab(tokenizer: Any) -> list[str]:
    """The text of every token id decoded on its own."""
    try:
        return _VOCAB_CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _VOCAB_CACHE[tokenizer] = vocab
    return vocab


class StopMatcher:
    """Decides whether a row has hit a stop string, mostly by set lookup."""

    def __init__(self, tokenizer: Any, vocab: list[str], stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.token_ids = frozenset(i for i, text in enumerate(vocab) if any(s in text for s in self.stops))
        # A stop string that can span tokens needs a look at the decoded tail.
        spanning = [s for s in self.stops if len(s) > 1 or not s.isascii()]
        self.tail_tokens = 4 * max((len(s.encode()) for s in spanning), default=0)

    def hit(self, ids: list[int]) -> bool:
        if ids[-1] in self.token_ids:
            return True
        if not self.tail_tokens or len(ids) < 2:
            return False
        tail = self.tokenizer.decode(ids[-self.tail_tokens :], skip_special_tokens=True)
        return any(s in tail for s in self.stops)

    def cut(self, text: str) -> str:
        """Text up to the first stop string."""
        ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return text[: min(ends)] if ends else text


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One token per row: temperature, top-k, top-p, then an inverse-CDF draw at ``uniforms``."""
    vocab = logits.shape[-1]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    values, ids = logits.topk(k, dim=-1)  # sorted, largest first
    probs = torch.softmax(values / params.temperature, dim=-1)
    if params.top_p < 1.0:
        # Keep a token while the mass ranked above it is still below top_p (always keeps the first).
        mass_before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(mass_before >= params.top_p, 0.0)
    cdf = probs.cumsum(-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    choice = torch.searchsorted(cdf, target, right=True).clamp_(max=k - 1)
    return ids.gather(1, choice).squeeze(1)


def row_seed(prompt_seed: int, sample: int) -> int:
    """A well-mixed 63-bit seed for one sample row of one prompt."""
    state = np.random.SeedSequence([prompt_seed % (1 << 64), sample]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


@dataclass
class _Row:
    """Bookkeeping for one generated sequence (a greedy answer or one sample)."""

    prompt: int
    sample: int  # -1 for the greedy row
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[list[int], list[float]]] = field(default_factory=list)  # top-k ids and log-probs per step
    ended_by: str = "length"  # "length", "eos" or "stop"


@dataclass
class _Running:
    """Rows decoded together: their KV cache, masks, positions and next-token logits."""

    rows: list[_Row]
    cache: DynamicCache
    mask: torch.Tensor  # [rows, cache length], 0 on padding
    next_pos: torch.Tensor  # [rows], position id of the next token
    sampled: torch.Tensor  # [rows], False for greedy rows
    uniforms: torch.Tensor  # [rows, max_new_tokens], the draws of sample rows
    logits: torch.Tensor  # [rows, vocab], for the next pick

    @property
    def mergeable(self) -> bool:
        # Merging edits per-layer keys/values, which only plain (full-attention) layers have.
        return all(type(layer) is DynamicLayer for layer in getattr(self.cache, "layers", [None]))

    def select(self, index: torch.Tensor, rows: list[_Row]) -> None:
        self.rows = rows
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        self.sampled, self.uniforms = self.sampled[index], self.uniforms[index]

    def trim(self) -> None:
        """Drop leading columns that are padding in every row (left by rows that finished)."""
        lead = int(self.mask.any(dim=0).int().argmax())
        if lead == 0:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
        self.mask = self.mask[:, lead:]

    def merge(self, other: _Running) -> _Running:
        """Append ``other``'s rows, left-padding the shorter cache (masked, so outputs do not change)."""
        self.trim()
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_pad_seq(mine.keys, width), _pad_seq(theirs.keys, width)])
            mine.values = torch.cat([_pad_seq(mine.values, width), _pad_seq(theirs.values, width)])
            theirs.keys = theirs.values = None  # free layer by layer: the peak stays near one copy
        self.mask = torch.cat([_pad_seq(self.mask, width, dim=1), _pad_seq(other.mask, width, dim=1)])
        self.rows = self.rows + other.rows
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.sampled = torch.cat([self.sampled, other.sampled])
        self.uniforms = torch.cat([self.uniforms, other.uniforms])
        self.logits = torch.cat([self.logits, other.logits])
        return self


def _pad_seq(tensor: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Left-pad ``tensor`` with zeros along ``dim`` (the sequence axis) to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class HFBackend:
    """A white-box backend around a transformers causal LM and its tokenizer."""

    white_box = True
    capabilities = WHITE_BOX | {SCORE_CANDIDATES, PRUNED_CANDIDATES, CONTINUATION_STATES, TOKEN_HOOK}

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
        self._pad_id = int(tokenizer.pad_token_id)
        self._eos_ids = self._find_eos_ids()
        self._cache_kw = cache_keyword(model)
        self._keeps_logits = accepts_logits_to_keep(model)
        self._stop_matchers: dict[tuple[str, ...], StopMatcher] = {}
        self.adapter: str | None = None

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
    ) -> HFBackend:
        """Load the embedded default, a local directory, or a Hugging Face id already cached.

        ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA. ``adapter``
        is a PEFT adapter directory, merged into the weights for speed.
        """
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=resolve_dtype(dtype, device))
        if adapter is not None:
            model = _load_adapter(model, adapter)
        backend = cls(
            model, tokenizer, batch_size=batch_size, device=device, model_name=name_or_path, seed=seed,
            top_logprobs=top_logprobs,
        )
        backend.adapter = adapter
        return backend

    @property
    def context_length(self) -> int | None:
        """Tokens the model attends to (prompt plus answer); None when its config does not say."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    # ------------------------------------------------------------------ text

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return TokenizerChat(self.tokenizer, self.model_name).render_chat(messages, add_generation_prompt)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    # ------------------------------------------------------------ generation

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
        on_token: TokenHook | None = None,
    ) -> list[Generations]:
        """Greedy answer (if ``greedy``) and ``n`` samples per prompt; see the module docstring.

        Without ``seeds``, prompt i gets a seed derived from the backend's
        ``seed`` and i, so the same call twice gives the same samples.
        ``on_token(prompt, sample, token_id)`` is called after each token a
        row keeps (not the EOS or stop token); returning False ends the row
        there (its completion is then partial).
        """
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        _check_params(params)
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
        matcher = self._stop_matcher(params.stop)
        # Similar lengths in a chunk waste less on padding; results do not depend on the order.
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        chunks = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        capacity = self.batch_size * (int(greedy) + n)
        results: list[Generations] = [
            Generations(greedy=None, samples=[None] * n, prompt_tokens=len(encoded[i]))  # type: ignore[list-item]
            for i in range(len(prompts))
        ]
        running: _Running | None = None
        while chunks or running is not None:
            # Top the batch up with the next chunk once enough rows have finished.
            while chunks and (running is None or (running.mergeable and len(running.rows) <= capacity * REFILL_AT)):
                chunk = chunks.pop(0)
                suffixes = [encoded[i][prefix:] for i in chunk]
                fresh = self._prefill_chunk(chunk, suffixes, prefix_cache, prefix, seeds, n, greedy, params)
                running = fresh if running is None else running.merge(fresh)
            assert running is not None
            for row in self._step(running, params, matcher, on_token):
                completion = self._completion(row, matcher)
                if row.sample < 0:
                    results[row.prompt].greedy = completion
                else:
                    results[row.prompt].samples[row.sample] = completion
            if not running.rows:
                running = None
        return results

    def _prefill_chunk(
        self,
        chunk: list[int],
        suffixes: list[list[int]],
        prefix_cache: DynamicCache | None,
        prefix: int,
        seeds: Sequence[int],
        n: int,
        greedy: bool,
        params: SamplingParams,
    ) -> _Running:
        """Run a chunk's prompts once, then give each prompt one row per answer to generate."""
        ids, mask = pad_batch(suffixes, self._pad_id, device=self.device)
        if prefix_cache is None:
            cache = self.new_cache()
        else:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(suffixes))
            mask = torch.cat([mask.new_ones(len(suffixes), prefix), mask], dim=1)
        logits = self.forward(ids, mask, cache, positions_from_mask(mask)[:, -ids.shape[1] :])

        per_prompt = int(greedy) + n
        rows = [_Row(p, s) for p in chunk for s in range(-int(greedy), n)]
        cache.batch_repeat_interleave(per_prompt)
        mask = mask.repeat_interleave(per_prompt, dim=0)
        return _Running(
            rows=rows,
            cache=cache,
            mask=mask,
            next_pos=mask.sum(-1),
            sampled=torch.tensor([r.sample >= 0 for r in rows], device=self.device),
            uniforms=self._uniforms(rows, seeds, params.max_new_tokens),
            logits=logits.repeat_interleave(per_prompt, dim=0),
        )

    def _step(
        self, running: _Running, params: SamplingParams, matcher: StopMatcher, on_token: TokenHook | None = None
    ) -> list[_Row]:
        """Pick one token per row, drop the rows that finished (returned), run the rest one step."""
        steps = torch.tensor([len(r.ids) for r in running.rows], device=self.device)
        uniforms = running.uniforms.gather(1, steps.unsqueeze(1)).squeeze(1)
        tokens, logprobs, top = self._pick(running.logits, running.sampled, uniforms, params)
        keep, done = [], []
        for j, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
            row = running.rows[j]
            row.ids.append(token)
            row.logprobs.append(logprob)
            if top is not None:
                row.top.append((top[0][j], top[1][j]))
            if token in self._eos_ids:
                row.ended_by = "eos"
            elif matcher.stops and matcher.hit(row.ids):
                row.ended_by = "stop"
            elif on_token is not None and not on_token(row.prompt, row.sample, token):
                row.ended_by = "length"  # ended by the caller: what is there is kept, as at the cap
            elif len(row.ids) < params.max_new_tokens:
                keep.append(j)
                continue
            done.append(row)
        if not keep:
            running.rows = []
            return done
        if done:
            index = torch.tensor(keep, device=self.device)
            running.select(index, [running.rows[j] for j in keep])
            tokens = tokens[index]
        running.mask = torch.cat([running.mask, running.mask.new_ones(len(keep), 1)], dim=1)
        running.logits = self.forward(tokens.unsqueeze(1), running.mask, running.cache, running.next_pos.unsqueeze(1))
        running.next_pos = running.next_pos + 1
        return done

    def _pick(
        self, logits: torch.Tensor, sampled: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[list[list[int]], list[list[float]]] | None]:
        """Chosen tokens, their log-probs under the raw (temperature 1) distribution, and the top-k there."""
        tokens = logits.argmax(dim=-1)
        if params.temperature > 0 and bool(sampled.any()):
            rows = sampled.nonzero().squeeze(1)
            tokens[rows] = sample_tokens(logits[rows], uniforms[rows], params)
        chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1)
        log_z = torch.logsumexp(logits, dim=-1)
        top = None
        if self.top_logprobs:
            values, ids = logits.topk(min(self.top_logprobs, logits.shape[-1]), dim=-1)
            top = (ids.tolist(), (values - log_z.unsqueeze(1)).tolist())
        return tokens, chosen - log_z, top

    def _uniforms(self, rows: list[_Row], seeds: Sequence[int], steps: int) -> torch.Tensor:
        """Per-row uniform draws for every step, from generators seeded per prompt and sample."""
        table = torch.zeros(len(rows), steps, dtype=torch.float32)
        for i, row in enumerate(rows):
            if row.sample >= 0:
                gen = torch.Generator().manual_seed(row_seed(seeds[row.prompt], row.sample))
                table[i] = torch.rand(steps, generator=gen)
        return table.to(self.device)

    def _completion(self, row: _Row, matcher: StopMatcher) -> Completion:
        ids, logprobs, top = row.ids, row.logprobs, row.top
        stop_logprob = logprobs[-1] if row.ended_by != "length" and logprobs else None
        if row.ended_by == "stop":
            # The stop token may carry text before the stop string ("Paris\n"), so cut the full text.
            text = matcher.cut(self.tokenizer.decode(ids, skip_special_tokens=True))
            ids, logprobs, top = ids[:-1], logprobs[:-1], top[:-1]
        else:
            if row.ended_by == "eos":
                ids, logprobs, top = ids[:-1], logprobs[:-1], top[:-1]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        vocab = decoded_vocab(self.tokenizer)

        def token_text(i: int) -> str:
            return vocab[i] if i < len(vocab) else self.tokenizer.decode([i])

        tokens = [token_text(i) for i in ids]
        tops = []
        for top_ids, top_lps in top:
            # Keyed by text like OpenAI-compatible servers; ids that decode alike keep the larger log-prob.
            alternatives: dict[str, float] = {}
            for i, lp in zip(top_ids, top_lps, strict=True):
                alternatives.setdefault(token_text(i), lp)
            tops.append(alternatives)
        return Completion(
            text=text.strip(), token_ids=list(ids), tokens=tokens, logprobs=list(logprobs), top_logprobs=tops,
            stop_logprob=stop_logprob,
            finish_reason="length" if row.ended_by == "length" else "stop", completion_tokens=len(row.ids),
        )  # fmt: skip

    def _stop_matcher(self, stops: Sequence[str]) -> StopMatcher:
        key = tuple(stops)
        if key not in self._stop_matchers:
            vocab = decoded_vocab(self.tokenizer) if key else []
            self._stop_matchers[key] = StopMatcher(self.tokenizer, vocab, key)
        return self._stop_matchers[key]

    # --------------------------------------------------------------- scoring

    @torch.inference_mode()
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
        ids, mask = pad_batch(full_ids, self._pad_id, device=self.device)
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
        ids, mask = pad_batch(full, self._pad_id, device=self.device)
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
    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        columns = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        rows = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = self.encode(prompts[start : start + self.batch_size])
            ids, mask = pad_batch(chunk, self._pad_id, device=self.device)
            logits = self.forward(ids, mask, None, positions_from_mask(mask))
            rows.append(torch.log_softmax(logits.float(), dim=-1)[:, columns].cpu())
        if not rows:
            return np.zeros((0, len(columns)), dtype=np.float32)
        return torch.cat(rows).numpy()

    @torch.inference_mode()
    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        """Hidden state of the last prompt token at ``layer`` of ``output_hidden_states``.

        Index 0 is the embedding output and -1 the last layer; for Llama-style
        models the last entry is taken after the final norm (transformers'
        convention), the others before it.
        """
        rows = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = self.encode(prompts[start : start + self.batch_size])
            ids, mask = pad_batch(chunk, self._pad_id, device=self.device)
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
    def continuation_hidden_states(
        self, prompts: Sequence[str], continuations: Sequence[Sequence[str]], layer: int = -1
    ) -> list[np.ndarray]:
        """:meth:`hidden_states` of ``prompt + c`` for each continuation c of each prompt, each prompt run once.

        Call it through :func:`candor.backends.base.continuation_hidden_states`
        (:mod:`candor.backends.continuation_states`).
        """
        from candor.backends.continuation_states import continuation_hidden_states

        return continuation_hidden_states(self, prompts, continuations, layer)

    # ------------------------------------------------ public model plumbing
    # The building blocks of the methods above, public for the candidate-scoring kernel
    # (candor.backends.prefix_scoring); they keep its numbers equal to ``score``'s.

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids as every method here feeds them (special tokens, no doubled BOS)."""
        return encode_tokens(self.tokenizer, prompts)

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

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for this model."""
        return new_kv_cache(self.model)

    @torch.inference_mode()
    def score_candidates(self, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        """Total log-prob of every candidate after every prompt, ``(len(prompts), len(candidates))``.

        The same numbers as summing :meth:`score` over every pair, with the
        shared prompt prefix, each prompt and the candidates' common tokens
        computed once (:mod:`candor.backends.prefix_scoring`).
        """
        from candor.backends.prefix_scoring import score_candidates

        return score_candidates(self, prompts, candidates)

    @torch.inference_mode()
    def score_candidates_pruned(
        self, prompts: Sequence[str], candidates: Sequence[str], min_mass: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_candidates` expanding only candidate-trie nodes of probability ``min_mass`` or more.

        Returns the scores (-inf for the candidates skipped) and, per prompt,
        the probability of the nodes left unexpanded, an upper bound on the
        probability of what was skipped (:func:`candor.backends.prefix_scoring.score_candidates_pruned`).
        """
        from candor.backends.prefix_scoring import score_candidates_pruned

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
        raise CandorError(
            f"cannot load model {name_or_path!r}: it is neither a local model directory nor in the "
            "local Hugging Face cache, and candor downloads nothing; check the path, or download the "
            f"model first ({type(exc).__name__}: {exc})"
        ) from None
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def _load_adapter(model: Any, adapter: str) -> Any:
    if not (Path(adapter) / "adapter_config.json").exists():
        raise CandorError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter).merge_and_unload()
