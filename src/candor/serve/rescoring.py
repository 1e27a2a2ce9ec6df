"""A question's answers re-read alone, so its confidence never depends on the requests decoded beside it.

A continuous (or micro-) batch decodes a question's rows next to other
questions' rows, and float32 matrix products round differently for different
batch shapes: a token's log-prob moves by ~1e-6 with its neighbours. The
token ids do not move (the greedy pick and the seeded sampling draws are the
same), so :func:`read_alone` recomputes the log-probs (and top-k alternatives)
of a question's greedy answer and samples in one teacher-forced pass whose
batch holds that question's rows only: one row per answer, the prompt (past
the shared prefix) then the answer, right-padded. What an answer-level
estimator reads then depends on the question alone, bit for bit. An estimator
that reads neither log-probs nor top-k (``Estimator.requires``) is not re-read:
texts and token ids are already the question's own
(``HonestModel.rereads_answers``).

The token prefix every prompt of the template shares (the few-shot block) is
run once and its KV cache reused (:class:`candor.backends.engine.shared_prefix.SharedPrefix`); a question's split
between that prefix and the rest is always the same, so re-reading it gives
the same numbers whatever ran before.

Only the ``hf`` backend's public plumbing is used (``encode``, ``new_cache``,
``forward``, ``model``, ``device``, ``tokenizer``, ``top_logprobs``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from candor.backends.base import Completion, Generations
from candor.backends.engine import SharedPrefix, decoded_vocab
from candor.backends.hf import HFBackend

# Logit floats held at once (rows × answer tokens × vocabulary): 2^26 floats is 256 MiB.
MAX_LOGIT_FLOATS = 1 << 26


def can_read_alone(backend: Any) -> bool:
    """Whether :func:`read_alone` can re-read ``backend``'s answers (an in-process ``hf`` model)."""
    return isinstance(backend, HFBackend)


@torch.inference_mode()
def read_alone(backend: HFBackend, prompt: str, gens: Generations, prefix: SharedPrefix | None = None) -> Generations:
    """``gens`` with each completion's log-probs and top-k recomputed over this question's rows alone.

    One forward pass per question (per ``MAX_LOGIT_FLOATS`` of rows): each row is
    the prompt past the shared prefix, then one answer, right-padded. Texts,
    token ids, finish reasons and ``stop_logprob`` are kept as generated.
    """
    rows = [c for c in (gens.greedy, *gens.samples) if c is not None and c.token_ids]
    if not rows:
        return gens
    prompt_ids = backend.encode([prompt])[0]
    start = len(prefix.ids) if prefix is not None and prefix.starts(prompt_ids) else 0
    width = max(len(c.token_ids) for c in rows)
    per_pass = max(1, MAX_LOGIT_FLOATS // (width * int(backend.model.config.vocab_size)))
    reread: dict[int, Completion] = {}
    for first in range(0, len(rows), per_pass):
        part = rows[first : first + per_pass]
        cache = prefix.cache() if start else backend.new_cache()  # type: ignore[union-attr]
        logits = _answer_logits(backend, cache, prompt_ids, start, part)
        for c, row in zip(part, logits, strict=True):
            reread[id(c)] = _with_logprobs(backend, c, row[: len(c.token_ids)])

    def new(c: Completion | None) -> Completion | None:
        return reread.get(id(c), c) if c is not None else None

    return Generations(new(gens.greedy), [new(s) for s in gens.samples], gens.prompt_tokens)  # type: ignore[misc]


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


def _with_logprobs(backend: HFBackend, c: Completion, logits: torch.Tensor) -> Completion:
    """``c`` with the log-probs of its tokens (raw distribution, as generation reports them) from ``logits``."""
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, torch.tensor(c.token_ids, device=logits.device).unsqueeze(1)).squeeze(1)
    logprobs = (chosen - log_z).tolist()
    tops = c.top_logprobs
    if c.top_logprobs and backend.top_logprobs:
        values, top_ids = logits.topk(min(backend.top_logprobs, logits.shape[-1]), dim=-1)
        text = decoded_vocab(backend.tokenizer)
        tops = []
        for step_ids, step_lps in zip(top_ids.tolist(), (values - log_z.unsqueeze(1)).tolist(), strict=True):
            alternatives: dict[str, float] = {}
            for i, lp in zip(step_ids, step_lps, strict=True):  # keyed by text, the larger log-prob kept
                alternatives.setdefault(text[i] if i < len(text) else backend.tokenizer.decode([i]), lp)
            tops.append(alternatives)
    return replace(c, logprobs=logprobs, top_logprobs=tops)
