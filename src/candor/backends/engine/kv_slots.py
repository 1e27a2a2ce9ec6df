"""An in-place KV cache for the decode loop: one buffer per layer, rows written where they run.

Each layer's keys and values live in one buffer ``[slots, kv_heads, columns,
head_dim]`` allocated once for the loop (grown, rarely, when a request needs
more). Every row of the running batch owns a slot. All rows share one write
column ``t``: a step writes each row's new key and value at column ``t``
(one indexed write per layer) and attention reads the window
``[lo, t]``, where ``lo`` is the first column a live row uses; a row that
joins at column ``t`` gets its prompt's keys and values (the shared few-shot
prefix copied, not recomputed) in the columns just before ``t`` of a free slot,
laid out as in its prefill batch (the rows joining together are copied in one
indexed write per layer; the padding between them is masked).
An additive mask ``[slots, columns]`` hides the columns before each row's
start, and position ids count each row's own tokens, so a row's numbers do
not depend on where it sits. A finished row's slot is reused by the next
prompt in place: a step runs only live rows, free slots below the last live
one being filled by moving the last rows into them (only those rows are
copied) and new rows joining at the end; when ``t`` reaches
the last column the window moves back to column 0 (one copy).

A decode step's small ops run on one thread (:mod:`candor.backends.engine.op_threads`):
a layer's ``update`` gives the attention that follows it the full count back,
and the copies of rows moved by compaction run on it too.

A cache opened with ``split_prefix`` (with a lean decode step,
:mod:`candor.backends.engine.llama_step`: ``generate``, and a live engine opened
with a shared prefix) keeps the prefix prompts share (the few-shot block)
once per layer instead of in every slot: rows join with only their own
columns copied, compaction moves only those, and the lean step's attention
reads the prefix once for all rows (:mod:`candor.backends.engine.prefix_attention`).
A row whose prompt does not start with the prefix joins whole and does not
see it (an additive bias per row, as the mask). transformers' forward over
such a cache still sees each row's whole key sequence: ``update`` returns the
prefix joined to the window, and the step's mask covers both.

Works for models whose cache layers are all plain full-attention layers and
whose attention takes a 4-D additive mask (``sdpa``, ``eager``): see
:func:`slots_supported`.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from transformers.cache_utils import Cache, DynamicLayer

from candor.backends.engine import prefix_attention
from candor.backends.engine.op_threads import all_threads, widen_for_attention
from candor.util.memory import give_back_memory

# Free columns kept after the window when the buffer is (re)allocated, so the window moves rarely.
SLACK_COLUMNS = 64
# Buffers are given back (reallocated to what the live rows use) when they exceed this many bytes and hold
# SHRINK_FACTOR times the columns or rows the live rows need: one long prompt widens every slot, and without
# this the cache would stay that wide for the server's life.
SHRINK_BYTES = 32 * 2**20
SHRINK_FACTOR = 4
# An emptied cache keeps its buffers (the next request reuses them) unless they are wider than this many
# columns (a long prompt passed) or have twice the rows of the hint (a burst of requests passed).
RESTING_COLUMNS = 1024


def slots_supported(model: Any, cache: Any) -> bool:
    """Whether the slot cache can run ``model`` (``cache``: an empty cache of it)."""
    plain = all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))
    return plain and getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")


class SplitKV(NamedTuple):
    """What a slot layer gives the lean step: the kept-apart prefix (None if none) and each row's window.

    ``prefix_bias`` ``[rows]``: 0 for a row that sees the prefix, the mask's
    blocked value for one whose prompt does not start with it.
    """

    prefix_keys: torch.Tensor | None
    prefix_values: torch.Tensor | None
    prefix_bias: torch.Tensor | None
    keys: torch.Tensor
    values: torch.Tensor


class _SlotLayer(DynamicLayer):
    """One layer's buffers; ``update`` writes the step's column and returns the window."""

    def __init__(self, store: SlotKV, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        # A weak reference: the store owns its layers, and a strong one back would make a cycle that only the
        # garbage collector frees, keeping each finished call's buffers (a GB on a long batch) until it runs.
        self.store = weakref.proxy(store)
        self.keys, self.values = keys, values
        # The shared prefix's keys and values, [1, kv_heads, P, head_dim], when the store keeps it apart.
        self.prefix_keys: torch.Tensor | None = None
        self.prefix_values: torch.Tensor | None = None
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        """transformers' call: write the step's column; every row's keys and values, the shared prefix first."""
        keys, values = self._write(key_states, value_states)
        if self.prefix_keys is None or self.prefix_values is None:
            return keys, values
        rows = keys.shape[0]
        return (
            torch.cat([self.prefix_keys.expand(rows, -1, -1, -1), keys], dim=2),
            torch.cat([self.prefix_values.expand(rows, -1, -1, -1), values], dim=2),
        )

    def update_split(self, key_states: torch.Tensor, value_states: torch.Tensor) -> SplitKV:
        """The lean step's call: write the step's column; the shared prefix apart (if kept) and the window."""
        keys, values = self._write(key_states, value_states)
        if self.prefix_keys is None or self.prefix_values is None:
            return SplitKV(prefix_keys=None, prefix_values=None, prefix_bias=None, keys=keys, values=values)
        bias = self.store.sees_prefix[: keys.shape[0]]
        return SplitKV(
            prefix_keys=self.prefix_keys, prefix_values=self.prefix_values, prefix_bias=bias, keys=keys, values=values
        )

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Only decode steps (one new token per row) run on this cache; prompts are prefilled apart.
        s = self.store
        widen_for_attention(s.active)  # the attention over the window returned runs next; the next product narrows
        self.keys[: s.active, :, s.t] = key_states[:, :, 0]
        self.values[: s.active, :, s.t] = value_states[:, :, 0]
        return self.keys[: s.active, :, s.lo : s.t + 1], self.values[: s.active, :, s.lo : s.t + 1]

    def get_seq_length(self) -> int:
        return self.store.prefix_length + self.store.t - self.store.lo

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


class _SlotCache(Cache):
    def __init__(self, layers: list[_SlotLayer]) -> None:
        super().__init__(layers=layers)


class SlotKV:
    """The running rows' KV cache, positions and next-token logits, by slot (see the module docstring)."""

    mergeable = True  # rows can always join
    widens_attention = True  # its layers give attention all threads inside a one-thread step (op_threads)
    refill_at = 1.0  # and are worth admitting as soon as their slots are free
    partial_admission = True  # the rows of one prefill can join one by one

    def __init__(self, backend: Any, rows: int, columns: int, split_prefix: bool = False) -> None:
        self.backend = backend
        self.capacity_rows, self.capacity_columns = max(1, rows), max(1, columns)
        self.hint = (self.capacity_rows, self.capacity_columns)  # the sizes a released cache starts from again
        # Keep a prefix all rows share once (see the module docstring), where attention can run split.
        self.split_prefix = split_prefix and prefix_attention.available(backend.device)
        self.prefix_length = 0  # the columns of that prefix, once kept
        self.active = 0  # slots [0, active) run in each step
        self.t = 0  # the column the next step writes
        self.lo = 0  # the first column a live row reads
        self.starts: list[int | None] = []  # per active slot, its row's first column (None: free)
        self.cache: _SlotCache | None = None
        # What the cache had to copy, for profiles and tests: window moves, rows moved, reallocations, shrinks.
        self.window_moves = self.rows_moved = self.reallocations = self.shrinks = 0
        self.mask = torch.empty(0)
        self.sees_prefix = torch.empty(0)  # per slot: 0 if its row sees the kept prefix, else blocked
        self.positions = torch.empty(0, dtype=torch.long)
        self.logits = torch.empty(0)

    # ------------------------------------------------------------ rows joining and leaving

    def admit(
        self,
        cache: Any,
        mask: torch.Tensor,
        logits: torch.Tensor,
        prompts: list[int],
        repeats: list[int],
        shared: int = 0,
    ) -> list[int]:
        """Give prompt ``prompts[i]`` of a prefill (its ``cache``, ``mask``, ``logits``) ``repeats[i]`` slots.

        ``shared``: the prefill's first columns, the same tokens in every
        prompt of the call (its shared prefix); a cache that splits the prefix
        keeps them once. Returns the slots of the new rows, prompt by prompt.
        """
        skip = self._split_columns(shared)
        width = mask.shape[1]
        # Each prompt's first real column past the prefix kept apart.
        firsts = [skip + int(mask[p, skip:].nonzero()[0]) for p in prompts]
        # The prefill's columns from the earliest first real column on, copied as they lie (padding masked).
        copied = width - min(firsts)
        if self.cache is None and skip:
            self.capacity_columns = max(1, self.capacity_columns - skip)  # the hint counted the prefix
        self._ensure_buffers(cache, copied, sum(repeats))
        assert self.cache is not None
        if skip and not self.prefix_length:
            self._keep_prefix(cache, skip)
        elif skip:
            self._check_prefix(cache)
        free = [s for s, start in enumerate(self.starts) if start is None]
        needed = sum(repeats) - len(free)
        if needed > 0:
            self._grow_active(needed, logits)
            free += list(range(self.active - needed, self.active))
        sources = [p for p, count in zip(prompts, repeats, strict=True) for _ in range(count)]
        slots = free[: len(sources)]
        self._write_rows(cache, mask, sources, slots, copied)
        if self.split_prefix:
            index = torch.tensor(slots, device=self.mask.device)
            self.sees_prefix[index] = 0.0 if skip else self._blocked
            self.positions[index] += skip  # the prefix's tokens count in the rows' positions
        first_of = dict(zip(prompts, firsts, strict=True))
        for slot, p in zip(slots, sources, strict=True):
            self.starts[slot] = self.t - (width - first_of[p])  # where the row's first real token landed
        self.logits[slots] = logits[sources].to(self.logits.dtype)
        return slots

    def free(self, slots: list[int]) -> None:
        """Release the slots of rows that ended: their columns stop counting, their slots are reused."""
        if not slots:
            return
        for s in slots:
            self.starts[s] = None
        index = torch.tensor(slots, device=self.mask.device)
        self.mask[index] = self._blocked
        if all(start is None for start in self.starts):
            self.clear()
        else:
            self._shrink_if_oversized()

    @property
    def live(self) -> int:
        return sum(start is not None for start in self.starts)

    # ------------------------------------------------------------ one step

    def advance(self, tokens: torch.Tensor) -> list[int] | None:
        """Run one step for the live rows. Returns the new order of the slots if rows moved."""
        with all_threads():  # copies of whole rows' windows
            order = self._compact()
        if order is not None:
            tokens = tokens[torch.tensor(order, device=tokens.device)]
        if self.t >= self.capacity_columns:
            self._move_window(self.t - self._lowest_start())
        self.lo = self._lowest_start()
        self.mask[: self.active, self.t] = 0.0
        window = self.mask[: self.active, None, None, self.lo : self.t + 1]
        if self.prefix_length:  # the prefix kept apart, seen by the rows whose prompts start with it
            prefix = self.sees_prefix[: self.active, None, None, None].expand(-1, 1, 1, self.prefix_length)
            window = torch.cat([prefix, window], dim=-1)
        self.logits = self.backend.decode_forward(
            tokens.unsqueeze(1), window, self.cache, self.positions[: self.active].unsqueeze(1)
        )
        self.positions[: self.active] += 1
        self.t += 1
        return order

    def clear(self) -> None:
        """No rows left: the buffers stay for the next ones, unless a long prompt or a burst left them large."""
        self.active, self.starts = 0, []
        if self.cache is None or self.nbytes <= SHRINK_BYTES:
            return
        if self.capacity_columns > RESTING_COLUMNS or self.capacity_rows > 2 * self.hint[0]:
            self._release()

    @property
    def nbytes(self) -> int:
        """The bytes of the keys and values buffers (0 before the first row joins)."""
        if self.cache is None:
            return 0
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self._layers())

    # ------------------------------------------------------------ internals

    @property
    def _blocked(self) -> float:
        return torch.finfo(self.mask.dtype).min

    def _split_columns(self, shared: int) -> int:
        """How many of a prefill's first columns this cache keeps apart (0: it copies every column to the slots)."""
        if not self.split_prefix or not shared:
            return 0
        if self.prefix_length and shared != self.prefix_length:
            raise ValueError(f"a shared prefix of {shared} columns joins a slot cache keeping {self.prefix_length}")
        return shared

    def _keep_prefix(self, cache: Any, length: int) -> None:
        """Keep the first ``length`` columns of a prefill's first row, the prefix every row shares, once per layer."""
        for mine, theirs in zip(self._layers(), cache.layers, strict=True):
            mine.prefix_keys = theirs.keys[:1, :, :length].clone()
            mine.prefix_values = theirs.values[:1, :, :length].clone()
        self.prefix_length = length

    def _check_prefix(self, cache: Any) -> None:
        """Refuse a prefill whose prefix is not the kept one (other tokens, or other weights since).

        The last layer's keys and values depend on every token of the prefix and every layer below.
        """
        mine, theirs = self._layers()[-1], cache.layers[-1]
        length = self.prefix_length
        assert mine.prefix_keys is not None and mine.prefix_values is not None
        if not (
            torch.equal(mine.prefix_keys, theirs.keys[:1, :, :length])
            and torch.equal(mine.prefix_values, theirs.values[:1, :, :length])
        ):
            raise ValueError("a different shared prefix joins a slot cache keeping another one")

    def _lowest_start(self) -> int:
        return min((s for s in self.starts if s is not None), default=self.t)

    def _layers(self) -> list[_SlotLayer]:
        assert self.cache is not None
        return self.cache.layers  # type: ignore[return-value]

    def _ensure_buffers(self, cache: Any, prompt_length: int, new_rows: int) -> None:
        """Allocate on first use; make room for ``new_rows`` slots and a prompt of ``prompt_length``."""
        if self.cache is None:
            self.t = self.lo = prompt_length
            self.capacity_columns = max(self.capacity_columns, prompt_length + SLACK_COLUMNS)
            self.capacity_rows = max(self.capacity_rows, new_rows)
            self._allocate(cache)
            return
        free = sum(start is None for start in self.starts) + self.capacity_rows - self.active
        if new_rows > free:
            self._resize(rows=max(self.capacity_rows + new_rows - free, self.capacity_rows * 3 // 2))
        if self.t < prompt_length or self.t >= self.capacity_columns:
            self._move_window(max(prompt_length, self.t - self._lowest_start()))

    def _allocate(self, cache: Any) -> None:
        layers = []
        for layer in cache.layers:
            batch, heads, _, dim = layer.keys.shape
            shape = (self.capacity_rows, heads, self.capacity_columns, dim)
            keys = layer.keys.new_zeros(shape)
            layers.append(_SlotLayer(self, keys, torch.zeros_like(keys)))
        self.cache = _SlotCache(layers)
        dtype, device = layers[0].keys.dtype, layers[0].keys.device
        shape = (self.capacity_rows, self.capacity_columns)
        self.mask = torch.full(shape, torch.finfo(dtype).min, dtype=dtype, device=device)
        self.sees_prefix = self.mask.new_full((self.capacity_rows,), torch.finfo(dtype).min)
        self.positions = torch.zeros(self.capacity_rows, dtype=torch.long, device=device)

    def _resize(self, rows: int | None = None, columns: int | None = None) -> None:
        """Reallocate the buffers larger (when rows or tokens outgrow the hints), keeping their content.

        Callers grow by at least half, so a cache that keeps growing is copied a logarithmic number of times.
        """
        rows, columns = rows or self.capacity_rows, columns or self.capacity_columns
        self.reallocations += 1
        for layer in self._layers():
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[: old.shape[0], :, : old.shape[2]] = old
                setattr(layer, name, new)
        mask = self.mask.new_full((rows, columns), self._blocked)
        mask[: self.mask.shape[0], : self.mask.shape[1]] = self.mask
        positions = self.positions.new_zeros(rows)
        positions[: self.positions.shape[0]] = self.positions
        sees_prefix = self.sees_prefix.new_full((rows,), self._blocked)
        sees_prefix[: self.sees_prefix.shape[0]] = self.sees_prefix
        self.mask, self.positions, self.sees_prefix = mask, positions, sees_prefix
        self.capacity_rows, self.capacity_columns = rows, columns

    def _release(self) -> None:
        """Drop the buffers (and the kept prefix): the next row to join allocates them afresh, from the hints."""
        self.cache = None
        self.prefix_length = 0
        self.capacity_rows, self.capacity_columns = self.hint
        self.t = self.lo = 0
        self.shrinks += 1
        give_back_memory()

    def _shrink_if_oversized(self) -> None:
        """Reallocate the buffers to what the live rows use when they hold far more (a long prompt has left)."""
        span = self.t - self._lowest_start()
        columns = span + 2 * SLACK_COLUMNS
        rows = max(self.hint[0], self.active)
        wide = self.capacity_columns > SHRINK_FACTOR * columns
        tall = self.capacity_rows > SHRINK_FACTOR * rows
        if not (wide or tall) or self.nbytes <= SHRINK_BYTES:
            return
        lo = self._lowest_start()
        live_rows = slice(0, self.active)
        for layer in self._layers():
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[live_rows, :, :span] = old[live_rows, :, lo : self.t]
                setattr(layer, name, new)
        mask = self.mask.new_full((rows, columns), self._blocked)
        mask[live_rows, :span] = self.mask[live_rows, lo : self.t]
        self.mask = mask
        self.positions = self.positions[:rows].clone()
        self.sees_prefix = self.sees_prefix[:rows].clone()
        self.starts = [None if s is None else s - lo for s in self.starts]
        self.t, self.lo = span, 0
        self.capacity_rows, self.capacity_columns = rows, columns
        self.shrinks += 1
        give_back_memory()

    def _move_window(self, new_t: int) -> None:
        """Move the live columns ``[lo, t)`` so that ``t`` becomes ``new_t`` (growing the buffers if needed)."""
        lo = self._lowest_start()
        if new_t + 1 > self.capacity_columns:
            self._resize(columns=max(new_t + SLACK_COLUMNS, self.capacity_columns * 3 // 2))
        shift = new_t - self.t
        if shift != 0 and self.active:
            self.window_moves += 1
            rows, src, dst = slice(0, self.active), slice(lo, self.t), slice(lo + shift, new_t)
            for layer in self._layers():
                layer.keys[rows, :, dst] = layer.keys[rows, :, src].clone()
                layer.values[rows, :, dst] = layer.values[rows, :, src].clone()
            moved = self.mask[rows, src].clone()
            self.mask[rows] = self._blocked
            self.mask[rows, dst] = moved
        self.starts = [None if s is None else s + shift for s in self.starts]
        self.t, self.lo = new_t, lo + shift

    def _grow_active(self, count: int, logits: torch.Tensor) -> None:
        """Open ``count`` more slots at the end of the active range."""
        start = self.active
        self.active += count
        self.starts += [None] * count
        self.mask[start : self.active] = self._blocked
        extra = logits.new_zeros((count, logits.shape[-1]))
        self.logits = extra if start == 0 else torch.cat([self.logits, extra])

    def _write_rows(self, cache: Any, mask: torch.Tensor, sources: list[int], slots: list[int], copied: int) -> None:
        """Copy the last ``copied`` columns of prefill rows ``sources`` into ``slots``, ending before column ``t``.

        One copy per layer for all the joining rows: the columns lie as in the
        prefill (the shared prefix, then each prompt left-padded), and the slot
        mask hides the padding, so a row sees exactly its own prompt's tokens.
        """
        device = self.mask.device
        index = torch.tensor(slots, device=device)
        source = torch.tensor(sources, device=mask.device)
        target, columns = slice(self.t - copied, self.t), slice(mask.shape[1] - copied, mask.shape[1])
        for mine, theirs in zip(self._layers(), cache.layers, strict=True):
            copy_rows(mine.keys[:, :, target], index, theirs.keys[:, :, columns], source)
            copy_rows(mine.values[:, :, target], index, theirs.values[:, :, columns], source)
        real = mask[source, columns].to(device=device, dtype=torch.bool)
        self.mask[index] = self._blocked
        self.mask[index, target] = torch.where(real, 0.0, self._blocked).to(self.mask.dtype)
        self.positions[index] = real.sum(dim=1).to(self.positions.dtype)

    def _compact(self) -> list[int] | None:
        """Fill free slots below the live count with the last live rows; returns the new slot order.

        Only the moved rows are copied: cheaper than running a free slot for
        even one step (a row's KV window against a row of every weight matrix).
        """
        if all(start is not None for start in self.starts):
            return None
        live = [s for s, start in enumerate(self.starts) if start is not None]
        count = len(live)
        holes = [s for s in range(count) if self.starts[s] is None]
        movers = [s for s in live if s >= count]
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            self.rows_moved += len(holes)
            dst = torch.tensor(holes, device=self.mask.device)
            src = torch.tensor(movers, device=self.mask.device)
            cols = slice(self._lowest_start(), self.t)
            for layer in self._layers():
                for window in (layer.keys[:, :, cols], layer.values[:, :, cols]):
                    copy_rows(window, dst, window, src)
            self.mask[dst] = self.mask[src]
            self.positions[dst] = self.positions[src]
            self.sees_prefix[dst] = self.sees_prefix[src]
        self.starts = [self.starts[s] for s in order]
        self.active = count
        return order


def copy_rows(target: torch.Tensor, rows: torch.Tensor, source: torch.Tensor, source_rows: torch.Tensor) -> None:
    """``target[rows] = source[source_rows]`` along the first dimension, in place.

    A gather then ``index_copy_``, for the rows' windows copied at admission
    and compaction: faster than the same assignment through advanced
    indexing (``benchmarks/decode_step_parts.py`` measures both).
    """
    target.index_copy_(0, rows, source.index_select(0, source_rows))
