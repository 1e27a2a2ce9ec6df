"""A long prompt prefilled in chunks, between the running batch's decode steps, to the same bits as in one piece.

The live engine (:mod:`candor.backends.engine.live_engine`) prefills a request
alone before its rows join. Done in one piece, a 4,000-token prompt holds the
engine thread (and every running request) for its whole prefill, and its
attention materializes a mask and scores over all its tokens at once. A
:class:`ChunkedPrefill` runs it ``chunk`` tokens at a time over its own KV
cache, one chunk between two decode steps, as vLLM's chunked prefill does;
when the last chunk has run, the request's rows join as if it had been
prefilled in one piece.

Same bits. Splitting a prefill's query rows changes no product a row sees
except attention's, and torch's CPU flash-attention kernel computes a row
from blocks: keys cut into blocks of :data:`KV_BLOCK` columns counted from
column 0 (one block when there are fewer), query rows into blocks of 32, 64 or
256 by the call's query count (:func:`row_block`). So:

- each chunk attends to keys padded (zeros, masked) up to the next multiple
  of :data:`KV_BLOCK`, or the prompt's end if nearer: every key block a row
  sees is the block it sees in one piece;
- chunks are cut at multiples of the chunk size (a multiple of
  :data:`CHUNK_MULTIPLE`) from the prefill's first token, so a chunk's row
  blocks lie inside the blocks of one piece;
- the last chunk has at least 192 rows, and is widened further when its
  last row block would be a sliver of 1 to 3 rows that one piece does not
  have (measured: rows in a sliver block come out differently in the last
  bits).

Measured on this rule: 0 of 600 (length, prefix, chunk) cases differ from
one piece in any bit at the attention kernel, against 42 of 600 without the
last two points. Whether it holds for this model, dtype, device and torch is
checked once per backend (:func:`chunking_agrees`) as a live engine starts;
where it does not, prompts are prefilled in one piece, as before.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

logger = logging.getLogger(__name__)

_AGREES: weakref.WeakKeyDictionary[Any, dict[int, bool | None]] = weakref.WeakKeyDictionary()  # _checked's answers

KV_BLOCK = 512  # the key block of torch's CPU flash attention (kv_split_size in its kernel)
CHUNK_MULTIPLE = 64  # chunk sizes that cut the query rows where the kernels' own row blocks are cut
LAST_CHUNK_ROWS = 192  # the fewest rows of a last chunk: the kernel cuts them in blocks of 64, as one piece
SLIVER_ROWS = 3  # a last row block this small is computed apart: it must be one piece's own last block
DEFAULT_PREFILL_CHUNK = 64  # tokens per chunk: a chunk holds everyone else for its time, so it is kept small


def row_block(rows: int) -> int:
    """The query-row block of torch's CPU flash attention for a call with ``rows`` query rows."""
    return 256 if rows >= 768 else 64 if rows >= 192 else 32


def chunk_ends(start: int, total: int, chunk: int) -> list[int]:
    """Where the chunks of a prefill of tokens ``start .. total`` end (see the module docstring)."""
    ends = [*range(start + chunk, total, chunk), total]
    rows = total - start

    def last_chunk_fits() -> bool:
        if len(ends) == 1:
            return True
        first, length = ends[-2], total - ends[-2]
        block = row_block(length)
        tail, whole_tail = rows % block, rows % row_block(rows)
        sliver = 0 < tail <= SLIVER_ROWS and tail != whole_tail
        return length >= LAST_CHUNK_ROWS and not sliver and (first - start) % block == 0

    while not last_chunk_fits():
        ends.pop(-2)  # the last chunk takes the one before it
    return ends


def check_chunk(chunk: int) -> int:
    """``chunk`` if it is a usable chunk size (a positive multiple of :data:`CHUNK_MULTIPLE`), else ValueError."""
    if chunk < CHUNK_MULTIPLE or chunk % CHUNK_MULTIPLE:
        raise ValueError(
            f"the prefill chunk must be a positive multiple of {CHUNK_MULTIPLE} tokens, got {chunk} "
            "(other sizes change the prompt's numbers in the last bits)"
        )
    return chunk


class _ChunkLayer(DynamicLayer):
    """One layer's keys and values of the prompt, preallocated; a chunk's attention sees them padded to a block."""

    def __init__(self, owner: ChunkedCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        # A weak reference: a strong one would make a cycle, and the prompt's cache (hundreds of megabytes for
        # a long prompt) would wait for Python's cycle collector instead of being freed when dropped.
        self._owner = weakref.ref(owner)
        self.keys, self.values = keys, values
        self.is_initialized = True

    @property
    def owner(self) -> ChunkedCache:
        owner = self._owner()
        assert owner is not None, "a chunked cache's layer outlived its cache"
        return owner

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        done, width = self.owner.done, key_states.shape[2]
        self.keys[:, :, done : done + width] = key_states
        self.values[:, :, done : done + width] = value_states
        end = self.owner.attended(done + width)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.owner.done

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.attended(self.owner.done + query_length), 0


class ChunkedCache(Cache):
    """A prompt's KV cache for chunked prefill: ``total`` columns per layer, the first ``done`` written."""

    def __init__(self, layers: list[_ChunkLayer], total: int, done: int) -> None:
        super().__init__(layers=layers)
        self.total, self.done = total, done

    @classmethod
    def over(cls, template: Any, total: int, prefix: Any = None, prefix_length: int = 0) -> ChunkedCache:
        """An empty cache shaped like ``template``'s layers (a filled cache of the model), ``prefix`` copied in."""
        made = cls([], total, prefix_length)
        for layer in template.layers:
            batch, heads, _, dim = layer.keys.shape
            keys = layer.keys.new_zeros((1, heads, total, dim))
            made.layers.append(_ChunkLayer(made, keys, torch.zeros_like(keys)))
        if prefix is not None:
            for mine, theirs in zip(made.layers, prefix.layers, strict=True):
                mine.keys[:, :, :prefix_length] = theirs.keys[:1, :, :prefix_length]
                mine.values[:, :, :prefix_length] = theirs.values[:1, :, :prefix_length]
        return made

    def attended(self, end: int) -> int:
        """The key columns a chunk ending at ``end`` attends to: up to the next block boundary or the prompt's end."""
        return min(self.total, -(-end // KV_BLOCK) * KV_BLOCK)


@dataclass(eq=False)
class ChunkedPrefill:
    """One prompt (``ids``, the first ``start`` already in ``cache``) run ``chunk`` tokens per :meth:`step`."""

    backend: Any
    ids: list[int]
    cache: ChunkedCache
    chunk: int
    with_states: bool = False
    logits: torch.Tensor | None = field(default=None, init=False)
    states: list[torch.Tensor] | None = field(default=None, init=False)
    ends: list[int] = field(default_factory=list, init=False)  # where each chunk ends

    @classmethod
    def start(
        cls,
        backend: Any,
        ids: list[int],
        chunk: int,
        prefix: Any = None,
        prefix_length: int = 0,
        with_states: bool = False,
        room: int = 0,
    ) -> ChunkedPrefill:
        """A prefill of ``ids`` past their first ``prefix_length`` tokens, whose KV cache ``prefix`` holds.

        ``room``: cache columns kept past the prompt for tokens fed after it (:meth:`extend`).
        """
        template = prefix if prefix is not None else _one_token_cache(backend, ids[0])
        cache = ChunkedCache.over(template, len(ids) + room, prefix, prefix_length)
        return cls(backend=backend, ids=ids, cache=cache, chunk=check_chunk(chunk), with_states=with_states)

    @property
    def finished(self) -> bool:
        return self.cache.done >= len(self.ids)

    @property
    def remaining(self) -> int:
        return len(self.ids) - self.cache.done

    def __post_init__(self) -> None:
        self.ends = chunk_ends(self.cache.done, len(self.ids), self.chunk)

    def step(self) -> bool:
        """Run the next chunk; True when the prompt is done (its ``logits``, and ``states`` if asked, are set)."""
        backend, cache = self.backend, self.cache
        start = cache.done
        end = next(e for e in self.ends if e > start)
        ids = torch.tensor([self.ids[start:end]], dtype=torch.long, device=backend.device)
        mask = _chunk_mask(start, end, cache.attended(end), backend.model.dtype, backend.device)
        positions = torch.arange(start, end, device=backend.device).unsqueeze(0)
        last = end == len(self.ids)
        if last and self.with_states:
            self.logits, self.states = backend.forward_with_states(ids, mask, cache, positions)
        else:
            self.logits = backend.forward(ids, mask, cache, positions)
        cache.done = end
        return last

    def with_room(self, room: int) -> ChunkedPrefill:
        """This finished prefill copied into a cache with ``room`` more columns, for tokens fed after the prompt."""
        if not self.finished:
            raise ValueError("only a finished prefill can be copied with room")
        cache = ChunkedCache.over(self.cache, len(self.ids) + room, self.cache, len(self.ids))
        copied = ChunkedPrefill(backend=self.backend, ids=self.ids, cache=cache, chunk=self.chunk)
        copied.logits = self.logits
        return copied

    def extend(self, ids: list[int], at: int) -> torch.Tensor:
        """The logits ``[len(ids), vocab]`` of ``ids`` fed at columns ``at ..`` after the finished prompt.

        Each position's logits predict the next token. The columns from ``at``
        on are overwritten, so several continuations of the prompt are read
        one after another over one cache (``at`` back at the prompt's end).
        """
        backend, cache = self.backend, self.cache
        if not self.finished or not len(self.ids) <= at <= cache.done or at + len(ids) > cache.total:
            raise ValueError(
                f"cannot feed {len(ids)} tokens at column {at} (prompt {len(self.ids)}, cache {cache.total} columns)"
            )
        end = at + len(ids)
        cache.done = at
        tensor = torch.tensor([ids], dtype=torch.long, device=backend.device)
        mask = _chunk_mask(at, end, cache.attended(end), backend.model.dtype, backend.device)
        positions = torch.arange(at, end, device=backend.device).unsqueeze(0)
        logits = backend.forward(tensor, mask, cache, positions, keep=len(ids), last_only=False)
        cache.done = end
        return logits[0]


def _chunk_mask(start: int, end: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive mask ``[1, 1, end - start, width]``: query ``start + i`` sees keys ``0 .. start + i``."""
    rows = torch.arange(start, end, device=device).unsqueeze(1)
    columns = torch.arange(width, device=device).unsqueeze(0)
    blocked = torch.finfo(dtype).min
    return torch.where(columns <= rows, 0.0, blocked).to(dtype)[None, None]


def _one_token_cache(backend: Any, token: int) -> Any:
    """A model cache holding one token, to read the layers' shapes and dtypes from."""
    cache = backend.new_cache()
    ids = torch.tensor([[token]], dtype=torch.long, device=backend.device)
    backend.forward(ids, torch.ones_like(ids), cache, torch.zeros_like(ids))
    return cache


def chunking_agrees(backend: Any, chunk: int) -> bool:
    """Whether a prompt prefilled ``chunk`` tokens at a time gives the bits of one piece on this backend.

    Runs one synthetic prompt (two key blocks and an odd tail) both ways and
    compares the last logits, every layer's last hidden state and the cache;
    the answer is kept per backend and chunk size. False also where the
    chunked cache cannot run this model at all (logged once).
    """
    return _checked(backend, chunk) is True


def chunking_runs(backend: Any, chunk: int) -> bool:
    """Whether the chunked cache runs this model at all (its numbers may differ from one piece's in the last bits)."""
    return _checked(backend, chunk) is not None


def _checked(backend: Any, chunk: int) -> bool | None:
    """:func:`chunking_agrees`' answer, kept per backend and chunk; None where the chunked cache failed to run."""
    known = _AGREES.setdefault(backend, {})
    if chunk not in known:
        try:
            known[chunk] = _chunking_agrees(backend, chunk)
        except Exception:  # a model the chunked cache cannot run (a cache layout of its own)
            logger.exception("chunked prefill failed its check; long prompts are prefilled in one piece")
            known[chunk] = None
    return known[chunk]


def _chunking_agrees(backend: Any, chunk: int) -> bool:
    length = KV_BLOCK + chunk + 45
    vocab = int(backend.model.config.vocab_size)
    ids = [(7919 * i + 13) % vocab for i in range(length)]
    tensor = torch.tensor([ids], dtype=torch.long, device=backend.device)
    mask = torch.ones_like(tensor)
    whole_cache = backend.new_cache()
    logits, states = backend.forward_with_states(tensor, mask, whole_cache, torch.arange(length)[None].to(tensor))
    chunked = ChunkedPrefill.start(backend, ids, chunk, with_states=True)
    while not chunked.step():
        pass
    assert chunked.logits is not None and chunked.states is not None
    same = torch.equal(chunked.logits, logits) and all(
        torch.equal(a, b) for a, b in zip(chunked.states, states, strict=True)
    )
    same = same and all(
        torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        for a, b in zip(chunked.cache.layers, whole_cache.layers, strict=True)
    )
    if not same:
        logger.warning(
            "a prompt prefilled in chunks of %d tokens does not give the bits of one piece here "
            "(%s, %s); long prompts are prefilled in one piece",
            chunk,
            backend.device,
            backend.model.dtype,
        )
    return same
