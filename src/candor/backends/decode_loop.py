"""The decode loop of the ``hf`` backend: rows that join and leave between steps.

A :class:`DecodeJob` is one prompt's greedy answer and samples. Its prompt is
prefilled once, then it gets one row per answer; the loop picks one token
per running row each step, and a row that finishes (EOS, a stop string, the
token cap, its hook) leaves the batch at once, so finished answers stop
costing compute. A job's work is done when its last row ends.

What joins the loop, and when, is a :class:`Feed`'s decision, asked before
every step:

- :class:`ChunkFeed` (``HFBackend.generate``): a finite list of prompts in
  chunks of ``batch_size``, left-padded, over the KV cache of the token prefix
  all prompts share; the next chunk joins once the batch is down to
  :data:`REFILL_AT` of its size, so the long answers of one chunk decode
  alongside the next chunk instead of alone;
- the live engine (:mod:`candor.backends.live_engine`): requests from a
  queue, each prefilled alone, joining at the next step.

Errors: a job's hook that raises fails that job only when the job has an
``on_error`` handler (its rows leave, the others go on); without one (as in
``generate``) the error propagates.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from candor.backends.base import (
    Completion,
    Generations,
    PrefillHook,
    RequestTokenHook,
    SamplingParams,
)
from candor.backends.kv_batch import KVBatch
from candor.backends.sampling import pick_tokens, row_uniforms
from candor.backends.stops import StopMatcher, decoded_vocab
from candor.backends.tokens import pad_batch, positions_from_mask

logger = logging.getLogger(__name__)

# Prefill the next chunk once the running batch is down to this fraction of its full size.
REFILL_AT = 0.5


@dataclass(eq=False)
class DecodeJob:
    """One prompt's greedy answer (if ``greedy``) and ``n`` samples, and where they go."""

    prompt_ids: list[int]
    n: int
    greedy: bool
    params: SamplingParams
    seed: int
    matcher: StopMatcher
    on_token: RequestTokenHook | None = None
    on_prefill: PrefillHook | None = None
    on_done: Callable[[DecodeJob], None] | None = None
    on_error: Callable[[DecodeJob, BaseException], None] | None = None
    result: Generations = field(init=False)
    rows_left: int = field(init=False)
    failed: bool = False

    def __post_init__(self) -> None:
        samples: list[Any] = [None] * self.n  # filled as the rows end
        self.result = Generations(greedy=None, samples=samples, prompt_tokens=len(self.prompt_ids))
        self.rows_left = self.rows_needed

    @property
    def rows_needed(self) -> int:
        return int(self.greedy) + self.n

    def decline(self) -> None:
        """End the job before any row is decoded (its prefill hook said no)."""
        self.result = Generations(greedy=None, samples=[], prompt_tokens=len(self.prompt_ids))
        self.rows_left = 0
        if self.on_done is not None:
            self.on_done(self)

    def row_ended(self, sample: int, completion: Completion) -> None:
        if sample < 0:
            self.result.greedy = completion
        else:
            self.result.samples[sample] = completion
        self.rows_left -= 1
        if self.rows_left == 0 and self.on_done is not None:
            self.on_done(self)

    def fail(self, exc: BaseException) -> None:
        """Fail this job alone when it has an error handler; otherwise raise."""
        if self.on_error is None:
            raise exc
        if not self.failed:
            self.failed = True
            self.on_error(self, exc)


@dataclass(eq=False)
class Row:
    """One generated sequence (a greedy answer or one sample) of a job."""

    job: DecodeJob
    sample: int  # -1 for the greedy row
    uniforms: list[float]  # the sample row's draws, one per step (empty for the greedy row)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[list[int], list[float]]] = field(default_factory=list)  # top-k ids and log-probs per step
    ended_by: str = "length"  # "length", "eos" or "stop"


class Feed(Protocol):
    """What joins a :class:`DecodeLoop`, asked before every step."""

    def top_up(self, loop: DecodeLoop) -> None:
        """Prefill and admit work while the loop has room (may wait while the loop is empty)."""
        ...

    @property
    def exhausted(self) -> bool:
        """Nothing more will come: the loop stops once its rows are done."""
        ...


class DecodeLoop:
    """Running rows and their KV cache; :meth:`run` decodes until the feed is exhausted."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.rows: list[Row] = []
        self.kv: KVBatch | None = None

    # ------------------------------------------------------------ driving

    def run(self, feed: Feed) -> None:
        while True:
            feed.top_up(self)
            if not self.rows:
                if feed.exhausted:
                    return
                continue
            self.step()

    @property
    def mergeable(self) -> bool:
        """Whether new rows can join the running ones now."""
        return self.kv is None or self.kv.mergeable

    def abort(self, exc: BaseException) -> None:
        """Fail every running job (each through its own handler) and drop all rows."""
        jobs = {id(row.job): row.job for row in self.rows}
        self.rows, self.kv = [], None
        for job in jobs.values():
            job.fail(exc)

    # ------------------------------------------------------------ joining

    def prefill(self, jobs: Sequence[DecodeJob], prefix_cache: Any = None, prefix: int = 0) -> None:
        """Run the jobs' prompts once (one left-padded batch), call their prefill hooks, and admit their rows.

        ``prefix_cache`` holds the KV cache of the first ``prefix`` prompt
        tokens, shared by every job: only the rest of each prompt runs.
        """
        backend = self.backend
        ready = [job for job in jobs if job.rows_needed > 0]
        for job in jobs:
            if job.rows_needed == 0:
                job.decline()
        if not ready:
            return
        ids, mask = pad_batch([job.prompt_ids[prefix:] for job in ready], backend.pad_id, device=backend.device)
        if prefix_cache is None:
            cache = backend.new_cache()
        else:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(ready))
            mask = torch.cat([mask.new_ones(len(ready), prefix), mask], dim=1)
        positions = positions_from_mask(mask)[:, -ids.shape[1] :]
        if any(job.on_prefill is not None for job in ready):
            logits, states = backend.forward_with_states(ids, mask, cache, positions)
        else:
            logits, states = backend.forward(ids, mask, cache, positions), None
        kept = [i for i, job in enumerate(ready) if self._passes_prefill(job, states, i)]
        rows = [Row(ready[i], s, self._uniforms(ready[i], s)) for i in kept for s in self._samples(ready[i])]
        if not rows:
            return
        index = torch.tensor([i for i in kept for _ in range(ready[i].rows_needed)], device=backend.device)
        cache.batch_select_indices(index)  # drops declined prompts, repeats the others once per row
        mask = mask[index]
        self.admit(rows, KVBatch(cache=cache, mask=mask, next_pos=mask.sum(-1), logits=logits[index]))

    def admit(self, rows: list[Row], kv: KVBatch) -> None:
        if self.kv is None or not self.rows:
            self.rows, self.kv = rows, kv
        else:
            self.kv.merge(kv)
            self.rows = self.rows + rows

    @staticmethod
    def _passes_prefill(job: DecodeJob, states: list[torch.Tensor] | None, i: int) -> bool:
        if job.on_prefill is None or states is None:
            return True
        try:
            keep = job.on_prefill([layer[i].numpy() for layer in states])
        except Exception as exc:  # the hook's error is its job's, not the loop's
            job.fail(exc)
            return False
        if not keep:
            job.decline()
        return bool(keep)

    @staticmethod
    def _samples(job: DecodeJob) -> range:
        """The sample index of each of the job's rows: -1 for the greedy answer, then 0 .. n-1."""
        return range(-int(job.greedy), job.n)

    @staticmethod
    def _uniforms(job: DecodeJob, sample: int) -> list[float]:
        return row_uniforms(job.seed, sample, job.params.max_new_tokens) if sample >= 0 else []

    # ------------------------------------------------------------ stepping

    def step(self) -> None:
        """Pick one token per row, end the rows that finished, run the rest one step."""
        assert self.kv is not None
        rows = self.rows
        tokens, logprobs, top = pick_tokens(self.kv.logits, self._samplers(rows), self.backend.top_logprobs)
        keep, ended = [], []
        for j, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
            row = rows[j]
            if row.job.failed:
                continue
            row.ids.append(token)
            row.logprobs.append(logprob)
            if top is not None:
                row.top.append((top[0][j], top[1][j]))
            try:
                finished = self._finished(row, token)
            except Exception as exc:  # a token hook that raises fails its own job
                row.job.fail(exc)
                continue
            (ended if finished else keep).append(j)
        for j in ended:
            if not rows[j].job.failed:
                rows[j].job.row_ended(rows[j].sample, self.completion(rows[j]))
        keep = [j for j in keep if not rows[j].job.failed]
        if not keep:
            self.rows, self.kv = [], None
            return
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=self.backend.device)
            self.kv.select(index)
            tokens = tokens[index]
            self.rows = [rows[j] for j in keep]
        self.kv.advance(self.backend, tokens)

    def _finished(self, row: Row, token: int) -> bool:
        job = row.job
        if token in self.backend.eos_ids:
            row.ended_by = "eos"
        elif job.matcher.stops and job.matcher.hit(row.ids):
            row.ended_by = "stop"
        elif job.on_token is not None and not job.on_token(row.sample, token):
            row.ended_by = "length"  # ended by the caller: what is there is kept, as at the cap
        elif len(row.ids) < job.params.max_new_tokens:
            return False
        return True

    @staticmethod
    def _samplers(rows: list[Row]) -> list[tuple[SamplingParams, list[int], list[float]]]:
        """The sample rows grouped by sampling settings, with this step's uniform for each."""
        groups: dict[SamplingParams, tuple[list[int], list[float]]] = {}
        for j, row in enumerate(rows):
            if row.sample >= 0:
                index, draws = groups.setdefault(row.job.params, ([], []))
                index.append(j)
                draws.append(row.uniforms[len(row.ids)])
        return [(params, index, draws) for params, (index, draws) in groups.items()]

    # ------------------------------------------------------------ results

    def completion(self, row: Row) -> Completion:
        tokenizer = self.backend.tokenizer
        ids, logprobs, top = row.ids, row.logprobs, row.top
        stop_logprob = logprobs[-1] if row.ended_by != "length" and logprobs else None
        if row.ended_by == "stop":
            # The stop token may carry text before the stop string ("Paris\n"), so cut the full text.
            text = row.job.matcher.cut(tokenizer.decode(ids, skip_special_tokens=True))
            ids, logprobs, top = ids[:-1], logprobs[:-1], top[:-1]
        else:
            if row.ended_by == "eos":
                ids, logprobs, top = ids[:-1], logprobs[:-1], top[:-1]
            text = tokenizer.decode(ids, skip_special_tokens=True)
        vocab = decoded_vocab(tokenizer)

        def token_text(i: int) -> str:
            return vocab[i] if i < len(vocab) else tokenizer.decode([i])

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


class ChunkFeed:
    """``generate``'s feed: chunks of prompts, the next one joining once half the rows have left."""

    def __init__(self, chunks: list[list[DecodeJob]], capacity: int, prefix_cache: Any = None, prefix: int = 0):
        self.chunks = chunks
        self.capacity = capacity
        self.prefix_cache, self.prefix = prefix_cache, prefix

    @property
    def exhausted(self) -> bool:
        return not self.chunks

    def top_up(self, loop: DecodeLoop) -> None:
        while self.chunks and (not loop.rows or (loop.mergeable and len(loop.rows) <= self.capacity * REFILL_AT)):
            loop.prefill(self.chunks.pop(0), self.prefix_cache, self.prefix)
