"""A question's answers re-read alone, so its confidence never depends on the requests decoded beside it.

A continuous (or micro-) batch decodes a question's rows next to other
questions' rows, and float32 matrix products round differently for different
batch shapes: a token's log-prob moves by ~1e-6 with its neighbours. The
token ids do not move (the greedy pick and the seeded sampling draws are the
same), so a :class:`Reread` recomputes the log-probs (and top-k alternatives)
of a question's greedy answer and samples teacher-forced, over this
question's tokens alone: its prompt (past the shared prefix) once, then each
answer after it, one at a time over the prompt's KV cache. What an
answer-level estimator reads then depends on the question alone, bit for bit.
An estimator that reads neither log-probs nor top-k (``Estimator.requires``)
is not re-read: texts and token ids are already the question's own
(``HonestModel.rereads_answers``).

A question whose prompt (past the shared prefix) and answers each fit one
piece of :data:`~candor.backends.engine.chunked_prefill.DEFAULT_PREFILL_CHUNK`
tokens, the common case, is re-read in one forward pass: every answer a row
after the prompt. A longer one is re-read in pieces of about that many tokens
(:meth:`Reread.step`): the prompt cut as the live engine's chunked prefill
cuts it (:mod:`candor.backends.engine.chunked_prefill`), or taken over from
the engine where it prefilled the prompt in chunks, then each answer after
it. Serving runs one step per ``engine.call``, so a 4,000-token prompt's
re-read holds the engine for one piece at a time, between the running
requests' decode steps, never for the whole prompt. Which way a question
goes, and its pieces, are fixed by its own lengths, so its numbers are too.
Where the chunked cache cannot run the model, every question is read in one
pass.

The token prefix every prompt of the template shares (the few-shot block) is
run once and its KV cache reused (:class:`candor.backends.engine.shared_prefix.SharedPrefix`); a question's split
between that prefix and the rest is always the same, so re-reading it gives
the same numbers whatever ran before.

Only the ``hf`` backend's public plumbing is used (``encode``, ``new_cache``,
``forward``, ``model``, ``device``, ``tokenizer``, ``top_logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from candor.backends.base import Completion, Generations
from candor.backends.engine import DEFAULT_PREFILL_CHUNK, ChunkedPrefill, SharedPrefix, chunking_runs, decoded_vocab
from candor.backends.hf import HFBackend

# Logit floats held at once by the one-pass re-read (rows × answer tokens × vocabulary): 2^26 floats is 256 MiB.
MAX_LOGIT_FLOATS = 1 << 26


def can_read_alone(backend: Any) -> bool:
    """Whether a :class:`Reread` can re-read ``backend``'s answers (an in-process ``hf`` model)."""
    return isinstance(backend, HFBackend)


def read_alone(backend: HFBackend, prompt: str, gens: Generations, prefix: SharedPrefix | None = None) -> Generations:
    """``gens`` with each completion's log-probs and top-k recomputed over this question's tokens alone."""
    reread = Reread(backend, prompt, gens, prefix)
    while not reread.step():
        pass
    return reread.result()


@dataclass(eq=False)
class _Row:
    """One answer being re-read: its completion, and the log-probs and top-k read so far."""

    completion: Completion
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[str, float]] = field(default_factory=list)

    @property
    def read(self) -> int:
        return len(self.logprobs)

    def add(self, logprobs: list[float], tops: list[dict[str, float]]) -> None:
        self.logprobs += logprobs
        self.tops += tops

    def completion_read(self) -> Completion:
        """The completion with the log-probs read (and top-k, where they were read)."""
        return replace(self.completion, logprobs=self.logprobs, top_logprobs=self.tops or self.completion.top_logprobs)


class Reread:
    """A question's answers re-read alone, about ``chunk`` tokens per :meth:`step` (see the module docstring).

    Texts, token ids, finish reasons and ``stop_logprob`` are kept as
    generated. Steps must run in one thread at a time (serving's engine thread).
    """

    def __init__(
        self,
        backend: HFBackend,
        prompt: str,
        gens: Generations,
        prefix: SharedPrefix | None = None,
        chunk: int = DEFAULT_PREFILL_CHUNK,
        prefilled: ChunkedPrefill | None = None,
    ) -> None:
        """``prefilled``: the prompt's own chunked prefill, as the live engine ran it for these generations
        (``DecodeRequest.on_chunked_prefill``); the re-read then reads the answers after it, not the prompt again.
        """
        self.backend, self.gens, self.prefix, self.chunk = backend, gens, prefix, chunk
        self.rows = [_Row(c) for c in (gens.greedy, *gens.samples) if c is not None and c.token_ids]
        self.prompt_ids = backend.encode([prompt])[0] if self.rows else []
        self.start = len(prefix.ids) if prefix is not None and prefix.starts(self.prompt_ids) else 0
        if self.rows and prefilled is not None and (prefilled.ids != self.prompt_ids or not prefilled.finished):
            raise ValueError("the prefill handed to a re-read is not this prompt's, or not finished")
        self._given = prefilled if self.rows else None  # no answer to read (an empty answer): nothing to keep
        self._prefill: ChunkedPrefill | None = None
        self._finished = not self.rows

    def step(self) -> bool:
        """Run the next pieces, about ``chunk`` tokens in all; True once every answer is read."""
        budget = self.chunk
        with torch.inference_mode():
            while budget > 0 and not self._finished:
                if self._prefill is None and self._given is None and self._in_one_pass():
                    budget = self._read_in_one_pass()
                elif self._prefill is None or not self._prefill.finished:
                    budget -= self._prompt_piece()
                else:
                    budget = self._answer_pieces(self._prefill, budget)
                self._finished = all(r.read == len(r.completion.token_ids) for r in self.rows)
        return self._finished

    def result(self) -> Generations:
        """The generations with the re-read log-probs (after the last :meth:`step`)."""
        if not self._finished:
            raise RuntimeError("the re-read has steps left to run")
        read = {id(r.completion): r.completion_read() for r in self.rows}

        def new(c: Completion | None) -> Completion | None:
            return read.get(id(c), c) if c is not None else None

        g = self.gens
        return Generations(new(g.greedy), [new(s) for s in g.samples], g.prompt_tokens)  # type: ignore[misc]

    def _in_one_pass(self) -> bool:
        """Whether the answers are read in one pass: the prompt (past the prefix) and every answer fit one piece,
        so one forward over the answers' rows holds the engine no longer than a piece (the common case), or the
        chunked cache cannot run the model. Decided by the question's own lengths, so always the same for it."""
        short = len(self.prompt_ids) - self.start <= self.chunk
        short = short and max(len(r.completion.token_ids) for r in self.rows) <= self.chunk
        return short or not chunking_runs(self.backend, self.chunk)

    # ------------------------------------------------------------ in pieces

    def _prompt_piece(self) -> int:
        """The prompt's next chunk (its token count returned); after its last, every answer's first token is read."""
        if self._prefill is None:
            room = max(len(r.completion.token_ids) for r in self.rows) - 1
            if self._given is not None:  # the engine's own prefill of this prompt: copied, with room for the answers
                self._prefill, self._given = self._given.with_room(room), None
                self._read_first_tokens(self._prefill)
                return 0
            cache = self.prefix.computed() if self.start else None  # type: ignore[union-attr]  # read, not written
            self._prefill = ChunkedPrefill.start(
                self.backend, self.prompt_ids, self.chunk, cache, self.start, room=room
            )
        done = self._prefill.cache.done
        if self._prefill.step():
            self._read_first_tokens(self._prefill)
        return self._prefill.cache.done - done

    def _read_first_tokens(self, prefill: ChunkedPrefill) -> None:
        """Every answer's first token, predicted by the prompt's last position."""
        assert prefill.logits is not None
        for row in self.rows:
            row.add(*_scored(self.backend, row.completion, row.completion.token_ids[:1], prefill.logits))

    def _answer_pieces(self, prefill: ChunkedPrefill, budget: int) -> int:
        """The next answer tokens, up to ``budget`` of them, each answer after the prompt in turn; the budget left."""
        for row in self.rows:
            ids = row.completion.token_ids
            while budget > 0 and row.read < len(ids):
                fed = ids[row.read - 1 : min(len(ids), row.read + budget) - 1]  # token t-1 predicts token t
                logits = prefill.extend(fed, len(self.prompt_ids) + row.read - 1)
                row.add(*_scored(self.backend, row.completion, ids[row.read : row.read + len(fed)], logits))
                budget -= len(fed)
        return budget

    # ------------------------------------------------------------ in one pass

    def _read_in_one_pass(self) -> int:
        """Every answer at once: one forward per ``MAX_LOGIT_FLOATS`` of rows, each the prompt then one answer."""
        width = max(len(r.completion.token_ids) for r in self.rows)
        per_pass = max(1, MAX_LOGIT_FLOATS // (width * int(self.backend.model.config.vocab_size)))
        for first in range(0, len(self.rows), per_pass):
            part = self.rows[first : first + per_pass]
            cache = self.prefix.cache() if self.start else self.backend.new_cache()  # type: ignore[union-attr]
            logits = _answer_logits(self.backend, cache, self.prompt_ids, self.start, [r.completion for r in part])
            for row, row_logits in zip(part, logits, strict=True):
                ids = row.completion.token_ids
                row.add(*_scored(self.backend, row.completion, ids, row_logits[: len(ids)]))
        return 0


def _answer_logits(
    backend: HFBackend, cache: Any, prompt_ids: list[int], start: int, part: list[Completion]
) -> torch.Tensor:
    """``[rows, width, vocab]``: at step t, the logits that predicted each row's answer token t.

    ``cache`` holds the prompt's first ``start`` tokens; each row feeds the rest
    of the prompt and its answer but the last token, right-padded.
    """
    rest = prompt_ids[start:]
    width = max(len(c.token_ids) for c in part)
    fed = len(rest) + width - 1
    ids = torch.zeros((len(part), fed), dtype=torch.long, device=backend.device)
    own = torch.zeros((len(part), fed), dtype=torch.long, device=backend.device)
    for j, c in enumerate(part):
        tokens = rest + c.token_ids[:-1]
        ids[j, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        own[j, : len(tokens)] = 1
    if start:
        cache.batch_repeat_interleave(len(part))
    mask = torch.cat([own.new_ones(len(part), start), own], dim=1)
    positions = torch.arange(start, start + fed, device=backend.device).expand(len(part), fed)
    # The prompt's last position predicts each answer's first token.
    return backend.forward(ids, mask, cache, positions, keep=width, last_only=False)


def _scored(
    backend: HFBackend, c: Completion, token_ids: list[int], logits: torch.Tensor
) -> tuple[list[float], list[dict[str, float]]]:
    """The log-probs of ``token_ids`` (raw distribution, as generation reports them) under ``logits`` (one row each),
    and their top-k alternatives when ``c`` carries them."""
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, torch.tensor(token_ids, device=logits.device).unsqueeze(1)).squeeze(1)
    logprobs = (chosen - log_z).tolist()
    tops: list[dict[str, float]] = []
    if c.top_logprobs and backend.top_logprobs:
        values, top_ids = logits.topk(min(backend.top_logprobs, logits.shape[-1]), dim=-1)
        text = decoded_vocab(backend.tokenizer)
        for step_ids, step_lps in zip(top_ids.tolist(), (values - log_z.unsqueeze(1)).tolist(), strict=True):
            alternatives: dict[str, float] = {}
            for i, lp in zip(step_ids, step_lps, strict=True):  # keyed by text, the larger log-prob kept
                alternatives.setdefault(text[i] if i < len(text) else backend.tokenizer.decode([i]), lp)
            tops.append(alternatives)
    return logprobs, tops
