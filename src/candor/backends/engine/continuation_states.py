"""The ``hf`` backend's ``continuation_hidden_states``: a prompt's continuations in one pass, the prompt run once.

EigenScore embeds each of a record's k samples as the hidden state of the last
token of ``prompt + sample``. Running those k texts through ``hidden_states``
recomputes the prompt k times, and the prompt is most of the tokens. Here:

- the token prefix common to every prompt of the call (the few-shot block) runs
  once, and its KV cache is copied for each batch;
- each prompt becomes one row: its own tokens, then its continuations' tokens
  one after another, with a 4-D attention mask that lets a continuation see the
  prefix, the prompt and itself but not its siblings, and position ids that
  restart after the prompt for each continuation; rows of several prompts run
  as one left-padded batch, so no continuation is padded to the longest one;
- the forward pass stops at the layer read (a hook on the next decoder layer,
  :mod:`candor.backends.engine.layer_states`), so the layers above it are never computed.

Tokens follow ``HFBackend.score``: a continuation's tokens are those of
``prompt + continuation`` past the longest prefix shared with the prompt's own
tokens and the other continuations', so a token merged across the boundary is
fed as part of the continuation. The states equal those of ``hidden_states`` on
the joined texts up to float round-off. Where the attention kernel cannot take
a 4-D mask, each prompt runs alone and its cache is repeated once per
continuation (right-padded). Only the backend's public plumbing is used
(``encode``, ``new_cache``, ``model``, ``device``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from candor.backends.engine.layer_states import StopForward, decoder_layer, stop_before
from candor.backends.tokens import (
    MIN_SHARED_PREFIX,
    accepts_logits_to_keep,
    cache_keyword,
    shared_prefix_length,
)
from candor.util.errors import CandorError

# Tokens fed per packed forward pass (rows × width).
MAX_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class _Prompt:
    """One prompt's tokens up to what every continuation keeps, and each continuation's tokens past it."""

    kept: list[int]
    tails: list[list[int]]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _split(context: list[int], fulls: list[list[int]]) -> _Prompt:
    """Each tail keeps at least one token: its last token is the one whose state is read."""
    if not fulls:
        return _Prompt(context, [])
    keep = min(min(_common_prefix(context, f) for f in fulls), min(len(f) for f in fulls) - 1)
    return _Prompt(context[:keep], [f[keep:] for f in fulls])


STRATEGIES = ("packed", "repeat")


def continuation_hidden_states(
    backend: Any,
    prompts: Sequence[str],
    continuations: Sequence[Sequence[str]],
    layer: int = -1,
    strategy: str | None = None,
) -> list[np.ndarray]:
    """Per prompt, the ``layer`` hidden state of the last token of ``prompt + c`` for each of its continuations c.

    Returns one ``(len(continuations[i]), hidden)`` float32 array per prompt;
    ``layer`` indexes ``output_hidden_states`` as in ``HFBackend.hidden_states``.
    ``strategy`` is ``packed`` (the default where the attention kernel takes a
    4-D mask) or ``repeat``.
    """
    if strategy is not None and strategy not in STRATEGIES:
        raise CandorError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    model = backend.model
    count = int(model.config.num_hidden_layers) + 1
    if not -count <= layer < count:
        raise CandorError(f"layer {layer} is out of range: the model has {count} hidden states")
    layer = layer % count
    contexts = backend.encode(list(prompts))
    encoded = [
        _split(context, backend.encode([p + c for c in conts]) if conts else [])
        for p, context, conts in zip(prompts, contexts, continuations, strict=True)
    ]
    hidden = int(model.config.hidden_size)
    out = [np.zeros((len(e.tails), hidden), dtype=np.float32) for e in encoded]
    todo = [i for i, e in enumerate(encoded) if e.tails]
    if not todo:
        return out
    runner = _Runner(backend, layer)
    packed = runner.packs if strategy is None else strategy == "packed"
    with torch.inference_mode():
        prefix = runner.shared_prefix([encoded[i].kept for i in todo])
        if packed:
            for chunk in _row_chunks(todo, encoded, prefix.length):
                states = runner.packed([encoded[i] for i in chunk], prefix)
                for i, s in zip(chunk, states, strict=True):
                    out[i] = s
        else:
            for i in todo:
                out[i] = runner.repeated(encoded[i], prefix)
    return out


def _row_chunks(todo: list[int], encoded: list[_Prompt], prefix: int) -> Iterator[list[int]]:
    """Prompts per packed batch, similar widths together, within :data:`MAX_BATCH_TOKENS`."""
    width = {i: len(encoded[i].kept) - prefix + sum(len(t) for t in encoded[i].tails) for i in todo}
    chunk: list[int] = []
    for i in sorted(todo, key=width.__getitem__):
        if chunk and (len(chunk) + 1) * width[i] > MAX_BATCH_TOKENS:
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


@dataclass
class _Prefix:
    length: int = 0
    cache: Any = None

    def copy_for(self, backend: Any, rows: int) -> Any:
        """A cache holding the prefix once per row (an empty cache without a prefix)."""
        if self.cache is None:
            return backend.new_cache()
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(rows)
        return cache


class _Runner:
    """Forward passes that return the ``layer`` hidden states of the fed tokens (and fill a cache)."""

    def __init__(self, backend: Any, layer: int) -> None:
        self.backend, self.layer = backend, layer
        model = backend.model
        self.cache_kw = cache_keyword(model)
        self.keeps_logits = accepts_logits_to_keep(model)
        self.packs = getattr(model.config, "_attn_implementation", None) in ("eager", "sdpa")
        self.window = getattr(model.config, "sliding_window", None)
        self.dtype = next(model.parameters()).dtype
        self.stop_at = decoder_layer(model, layer)  # None: run the whole model and read output_hidden_states

    def run(self, ids: Any, mask: Any, cache: Any, positions: Any) -> Any:
        kwargs: dict[str, Any] = {self.cache_kw: cache, "use_cache": cache is not None}
        if self.keeps_logits:
            kwargs["logits_to_keep"] = 1
        with stop_before(self.stop_at) as caught:
            try:
                out = self.backend.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    output_hidden_states=self.stop_at is None,
                    **kwargs,
                )
            except StopForward:
                return caught[0]
        return out.hidden_states[self.layer]

    def shared_prefix(self, kept: list[list[int]]) -> _Prefix:
        """The token prefix every prompt keeps, run once (none when short, or longer than a sliding window)."""
        length = shared_prefix_length(kept) if len(kept) > 1 and min(len(k) for k in kept) > 1 else 0
        if length < MIN_SHARED_PREFIX or self.window is not None:
            return _Prefix()
        device = self.backend.device
        ids = torch.tensor([kept[0][:length]], dtype=torch.long, device=device)
        cache = self.backend.new_cache()
        self.run(ids, torch.ones_like(ids), cache, _arange(0, length, device))
        return _Prefix(length, cache)

    def packed(self, rows: list[_Prompt], prefix: _Prefix) -> list[np.ndarray]:
        """One pass over several prompts, each row its own tokens then its continuations (see the module doc)."""
        p = prefix.length
        seqs = [r.kept[p:] + [t for tail in r.tails for t in tail] for r in rows]
        width = max(len(s) for s in seqs)
        ids = np.zeros((len(rows), width), dtype=np.int64)  # padding: any token, masked out
        pos = np.zeros((len(rows), width), dtype=np.int64)
        allowed = np.zeros((len(rows), width, p + width), dtype=bool)
        allowed[:, np.arange(width), p + np.arange(width)] = True  # every column sees itself
        reads = []
        for r, (row, seq) in enumerate(zip(rows, seqs, strict=True)):
            reads.append(_layout_row(row, seq, p, width, ids[r], pos[r], allowed[r]))
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(torch.from_numpy(~allowed), torch.finfo(self.dtype).min)
        device = self.backend.device
        states = self.run(
            torch.from_numpy(ids).to(device),
            mask.unsqueeze(1).to(device),
            prefix.copy_for(self.backend, len(rows)),
            torch.from_numpy(pos).to(device),
        )
        return [states[r, cols].float().cpu().numpy() for r, cols in enumerate(reads)]

    def repeated(self, row: _Prompt, prefix: _Prefix) -> np.ndarray:
        """One prompt alone, its cache repeated once per continuation (right-padded tails)."""
        device, p = self.backend.device, prefix.length
        cache = prefix.copy_for(self.backend, 1)
        own = row.kept[p:]
        if own:
            ids = torch.tensor([own], dtype=torch.long, device=device)
            mask = torch.ones((1, len(row.kept)), dtype=torch.long, device=device)
            self.run(ids, mask, cache, _arange(p, len(row.kept), device))
        context, tails = len(row.kept), row.tails
        if context:
            cache.batch_repeat_interleave(len(tails))
        width = max(len(t) for t in tails)
        ids = torch.zeros((len(tails), width), dtype=torch.long)
        mask = torch.zeros((len(tails), context + width), dtype=torch.long)
        mask[:, :context] = 1
        for r, tail in enumerate(tails):
            ids[r, : len(tail)] = torch.tensor(tail, dtype=torch.long)
            mask[r, context : context + len(tail)] = 1  # right padding: no real token ever sees it
        positions = _arange(context, context + width, device).expand(len(tails), -1)
        states = self.run(ids.to(device), mask.to(device), cache if context else None, positions)
        last = torch.tensor([len(t) - 1 for t in tails], device=states.device)
        return states[torch.arange(len(tails), device=states.device), last].float().cpu().numpy()


def _layout_row(
    row: _Prompt, seq: list[int], p: int, width: int, ids: np.ndarray, pos: np.ndarray, allowed: np.ndarray
) -> np.ndarray:
    """Fill one packed row (left-padded): tokens, positions, ``allowed[query, key]``; the columns to read."""
    start = width - len(seq)
    ids[start:] = seq
    own = len(row.kept) - p
    cols = p + start + np.arange(own)  # cache columns of the prompt's own tokens
    pos[start : start + own] = np.arange(p, p + own)
    allowed[start : start + own, :p] = True
    allowed[np.ix_(np.arange(start, start + own), cols)] = np.tril(np.ones((own, own), dtype=bool))
    reads, at = [], start + own
    for tail in row.tails:
        q = np.arange(at, at + len(tail))
        pos[q] = len(row.kept) + np.arange(len(tail))
        allowed[q, :p] = True
        allowed[np.ix_(q, cols)] = True
        allowed[np.ix_(q, p + q)] = np.tril(np.ones((len(tail), len(tail)), dtype=bool))
        reads.append(at + len(tail) - 1)
        at += len(tail)
    return np.asarray(reads)


def _arange(start: int, stop: int, device: Any) -> Any:
    return torch.arange(start, stop, dtype=torch.long, device=device).unsqueeze(0)
