"""The decode loop of the ``hf`` backend: rows that join and leave between steps.

A :class:`DecodeJob` is one prompt's greedy answer and samples. Its prompt is
prefilled once, then it gets one row per answer; the loop picks one token
per running row each step, and a row that finishes (EOS, a stop string, the
token cap, its hook) leaves the batch at once, so finished answers stop
costing compute. A job's work is done when its last row ends.

What joins the loop, and when, is a :class:`Feed`'s decision, asked before
every step:

- :class:`ChunkFeed` (``HFBackend.generate``): a finite list of prompts,
  prefilled up to ``batch_size`` at a time (left-padded, over the KV cache of
  the token prefix all prompts share), joining as soon as their rows fit, so
  the long answers of one prompt decode alongside the next prompts instead of
  alone;
- the live engine (:mod:`candor.backends.engine.live_engine`): requests from a
  queue, each prefilled alone, joining at the next step.

The rows' KV cache is written in place (:mod:`candor.backends.engine.kv_slots`)
where the model allows, else it is transformers' own cache joined by
padding (:mod:`candor.backends.engine.kv_batch`).

A job with a ``constraint`` (:class:`candor.backends.constraints.JsonConstraint`)
gives each of its rows an xgrammar matcher: each step, the constrained rows'
allowed tokens are filled into one bitmask and applied to a copy of their
logits, which they choose from (:func:`candor.backends.engine.sampling.pick_tokens`);
the log-probs recorded stay the model's, before the mask. The matcher accepts
each chosen token; once the JSON is complete it allows only the end of
sequence, and the row ends there (``finish_reason`` ``"stop"``). Rows without a
constraint in the same batch are untouched: no copy, no mask, and a step with
no constrained row does no grammar work at all.

Errors: a job's hook that raises fails that job only when the job has an
``on_error`` handler (its rows leave, the others go on); without one (as in
``generate``) the error propagates.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
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
from candor.backends.constraints import JsonConstraint, apply_bitmask, bitmask_for
from candor.backends.engine.kv_batch import KVBatch
from candor.backends.engine.kv_slots import SlotKV, slots_supported
from candor.backends.engine.op_threads import SMALL_OP_ELEMENTS, all_threads
from candor.backends.engine.sampling import pick_tokens, row_uniforms
from candor.backends.engine.stops import StopMatcher, decoded_vocab
from candor.backends.tokens import pad_batch, positions_from_mask

logger = logging.getLogger(__name__)


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
    constraint: JsonConstraint | None = None  # what every row of the job must generate (None: anything)
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
    grammar: Any = None  # the row's xgrammar matcher when its job has a constraint


class Feed(Protocol):
    """What joins a :class:`DecodeLoop`, asked before every step."""

    def top_up(self, loop: DecodeLoop) -> None:
        """Prefill and admit work while the loop has room (may wait while the loop is empty)."""
        ...

    @property
    def exhausted(self) -> bool:
        """Nothing more will come: the loop stops once its rows are done."""
        ...


@dataclass(eq=False)
class Prefilled:
    """Prompts run once whose rows wait to join: their KV cache, padding mask and next-token logits.

    ``rows`` lists the waiting rows in order as ``(prompt, job, sample)``,
    ``prompt`` being the job's row in the prefill batch; ``shared``, the
    leading columns that are the same prefix in every prompt.
    """

    cache: Any
    mask: torch.Tensor
    logits: torch.Tensor
    rows: list[tuple[int, DecodeJob, int]]
    shared: int = 0


class DecodeLoop:
    """Running rows by KV slot; :meth:`run` decodes until the feed is exhausted.

    ``rows`` and ``columns`` size the KV cache at its first use (the rows
    decoded together, and prompt plus answer tokens); it grows if a request
    needs more. ``split_prefix``: the prefills of this loop that come with a
    shared prefix all come with the same one, which the slot cache may keep
    once for all rows (:mod:`candor.backends.engine.kv_slots`).
    """

    def __init__(self, backend: Any, rows: int, columns: int, split_prefix: bool = False) -> None:
        self.backend = backend
        self.slots: list[Row | None] = []  # the row in each KV slot (None: free)
        # A row's activations in a step (its hidden state); unknown: never counted as small.
        self.row_width: int = getattr(backend.model.config, "hidden_size", None) or SMALL_OP_ELEMENTS + 1
        empty = backend.new_cache()
        self.kv: SlotKV | KVBatch = (
            SlotKV(backend, rows, columns, split_prefix) if slots_supported(backend.model, empty) else KVBatch(backend)
        )

    # ------------------------------------------------------------ driving

    def run(self, feed: Feed) -> None:
        while True:
            feed.top_up(self)
            if not self.kv.live:
                if feed.exhausted:
                    return
                continue
            self.step()

    @property
    def live_rows(self) -> int:
        return self.kv.live

    @property
    def mergeable(self) -> bool:
        """Whether new rows can join the running ones now."""
        return not self.kv.live or self.kv.mergeable

    @property
    def partial_admission(self) -> bool:
        """Whether the prompts of one prefill may join at different steps."""
        return self.kv.partial_admission

    @property
    def refill_at(self) -> float:
        """The share of its rows the batch is down to when new rows are worth admitting."""
        return self.kv.refill_at

    def abort(self, exc: BaseException) -> None:
        """Fail every running job (each through its own handler) and drop all rows."""
        jobs = {id(row.job): row.job for row in self.slots if row is not None}
        self.slots = []
        self.kv.clear()
        for job in jobs.values():
            job.fail(exc)

    # ------------------------------------------------------------ joining

    def prefill(self, jobs: Sequence[DecodeJob], prefix_cache: Any = None, prefix: int = 0) -> Prefilled | None:
        """Run the jobs' prompts once (one left-padded batch) and call their prefill hooks.

        ``prefix_cache`` holds the KV cache of the first ``prefix`` prompt
        tokens, shared by every job: only the rest of each prompt runs.
        Returns the jobs still wanting rows, to :meth:`admit` (None if none).
        """
        backend = self.backend
        ready = [job for job in jobs if job.rows_needed > 0]
        for job in jobs:
            if job.rows_needed == 0:
                job.decline()
        if not ready:
            return None
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
        return self.prefilled(ready, cache, mask, logits, states, prefix if prefix_cache is not None else 0)

    def prefilled(
        self,
        jobs: Sequence[DecodeJob],
        cache: Any,
        mask: torch.Tensor,
        logits: torch.Tensor,
        states: list[torch.Tensor] | None,
        shared: int = 0,
    ) -> Prefilled | None:
        """The rows of prompts run (row i of ``cache``, ``mask``, ``logits``: ``jobs[i]``) that pass prefill hooks.

        ``states``: the last position's hidden state per layer (None when no
        job has a prefill hook); ``shared``: the leading columns that are the
        same prefix in every prompt. None if no row is left to :meth:`admit`.
        """
        kept = [(i, job) for i, job in enumerate(jobs) if self._passes_prefill(job, states, i)]
        rows = [(i, job, s) for i, job in kept for s in self._samples(job)]
        return Prefilled(cache=cache, mask=mask, logits=logits, rows=rows, shared=shared) if rows else None

    def admit(self, prefilled: Prefilled, count: int | None = None) -> None:
        """Give the first ``count`` (default: all) waiting rows of ``prefilled`` their slots in the batch."""
        count = len(prefilled.rows) if count is None else count
        joining, prefilled.rows = prefilled.rows[:count], prefilled.rows[count:]
        joining = [(i, job, s) for i, job, s in joining if not job.failed]
        if not joining:
            return
        prompts: list[int] = []
        repeats: list[int] = []
        for i, _, _ in joining:  # consecutive rows of one prompt share its cache entry
            if prompts and prompts[-1] == i:
                repeats[-1] += 1
            else:
                prompts.append(i)
                repeats.append(1)
        slots = self.kv.admit(prefilled.cache, prefilled.mask, prefilled.logits, prompts, repeats, prefilled.shared)
        rows = [
            Row(job=job, sample=s, uniforms=self._uniforms(job, s), grammar=self._grammar(job)) for _, job, s in joining
        ]
        if len(self.slots) <= max(slots):
            self.slots += [None] * (max(slots) + 1 - len(self.slots))
        for slot, row in zip(slots, rows, strict=True):
            self.slots[slot] = row

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

    def _grammar(self, job: DecodeJob) -> Any:
        """A fresh matcher of the job's constraint for one of its rows (None without one)."""
        return None if job.constraint is None else self.backend.grammars.matcher(job.constraint)

    @staticmethod
    def _uniforms(job: DecodeJob, sample: int) -> list[float]:
        return row_uniforms(job.seed, sample, job.params.max_new_tokens) if sample >= 0 else []

    # ------------------------------------------------------------ stepping

    def step(self) -> None:
        """Pick one token per row, end the rows that finished, run the rest one step.

        The step's small ops run on one thread, its products, attention and
        token picking on all (:mod:`candor.backends.engine.op_threads`).
        """
        with self._small_ops(self.kv.live):
            self._step()

    def _small_ops(self, tokens: int) -> AbstractContextManager[None]:
        """A block whose ops (but its products and attention) run on one thread, for ``tokens`` rows' activations.

        Only over a cache whose layers widen for attention (the slot cache).
        """
        if not self.kv.widens_attention:
            return nullcontext()
        return self.backend.packed_linears.small_ops_on_one_thread(tokens * self.row_width)

    def _step(self) -> None:
        slots = self.slots
        masked = self._masked_logits(slots)
        with all_threads():  # argmax, softmax and top-k over the vocabulary for every row
            tokens, logprobs, top = pick_tokens(
                self.kv.logits, self._samplers(slots), self.backend.top_logprobs, masked
            )
        ended: list[int] = []
        for j, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
            row = slots[j]
            if row is None:
                continue
            if row.job.failed:
                ended.append(j)
                continue
            row.ids.append(token)
            row.logprobs.append(logprob)
            if top is not None:
                row.top.append((top[0][j], top[1][j]))
            try:
                if row.grammar is not None and not row.grammar.accept_token(token):
                    raise RuntimeError(f"the grammar matcher refused token {token}, which its own mask allowed")
                if self._finished(row, token):
                    ended.append(j)
            except Exception as exc:  # a token hook that raises fails its own job
                row.job.fail(exc)
                ended.append(j)
        for j, row in enumerate(slots):  # rows of a job that failed later in this step leave too
            if row is not None and row.job.failed and j not in ended:
                ended.append(j)
        for j in ended:
            row = slots[j]
            assert row is not None
            if not row.job.failed:
                row.job.row_ended(row.sample, self.completion(row))
            slots[j] = None
        self.kv.free(ended)
        if not self.kv.live:
            self.slots = []
            self.kv.clear()
            return
        order = self.kv.advance(tokens)
        if order is not None:
            self.slots = [slots[j] for j in order]

    def _masked_logits(self, slots: list[Row | None]) -> tuple[list[int], torch.Tensor] | None:
        """The constrained rows and a copy of their logits with what their grammars forbid at -inf (None: none)."""
        rows = [j for j, row in enumerate(slots) if row is not None and row.grammar is not None and not row.job.failed]
        if not rows:
            return None
        logits = self.kv.logits
        bitmask = bitmask_for([slots[j].grammar for j in rows], logits.shape[-1])  # type: ignore[union-attr]
        masked = logits[torch.tensor(rows, device=logits.device)]
        apply_bitmask(masked, bitmask)
        return rows, masked

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
    def _samplers(slots: list[Row | None]) -> list[tuple[SamplingParams, list[int], list[float]]]:
        """The sample rows grouped by sampling settings, with this step's uniform for each."""
        groups: dict[SamplingParams, tuple[list[int], list[float]]] = {}
        for j, row in enumerate(slots):
            if row is not None and row.sample >= 0:
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
            text=text.strip(),
            token_ids=list(ids),
            tokens=tokens,
            logprobs=list(logprobs),
            top_logprobs=tops,
            stop_logprob=stop_logprob,
            finish_reason="length" if row.ended_by == "length" else "stop",
            completion_tokens=len(row.ids),
        )


class ChunkFeed:
    """``generate``'s feed: prompts prefilled ``batch_size`` at a time, joining as their rows fit.

    With the slot cache each row of a prefilled chunk joins as soon as a slot
    is free (the batch stays full); with the fallback cache, whose
    joins copy the whole cache, a full chunk joins once the batch is down to
    its ``refill_at``.
    """

    def __init__(
        self, jobs: list[DecodeJob], batch_size: int, capacity: int, prefix_cache: Any = None, prefix: int = 0
    ) -> None:
        self.jobs = jobs
        self.batch_size, self.capacity = batch_size, capacity
        self.prefix_cache, self.prefix = prefix_cache, prefix
        self.ready: Prefilled | None = None  # the prefilled chunk whose prompts are joining

    @property
    def exhausted(self) -> bool:
        return not self.jobs and not self._waiting

    @property
    def _waiting(self) -> list[tuple[int, DecodeJob, int]]:
        return self.ready.rows if self.ready is not None else []

    def top_up(self, loop: DecodeLoop) -> None:
        while True:
            live = loop.live_rows
            if live and not (loop.mergeable and live <= self.capacity * loop.refill_at):
                return
            room = self.capacity - live if loop.partial_admission else self.capacity
            if not self._waiting:
                if not self.jobs or (live and room <= 0):
                    return
                chunk, self.jobs = self.jobs[: self.batch_size], self.jobs[self.batch_size :]
                self.ready = loop.prefill(chunk, self.prefix_cache, self.prefix)
                continue
            count = min(room, len(self._waiting)) if loop.partial_admission else len(self._waiting)
            if count <= 0:
                return
            assert self.ready is not None
            loop.admit(self.ready, count)
