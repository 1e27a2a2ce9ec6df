"""The ``hf`` backend's ``score_candidates``: a closed set of continuations after many prompts, sharing prefixes.

Verbalized confidence (docs/methods.md "Verbalized answer-level confidence") and P(True) ask, for every prompt, how
likely each of a fixed set of short continuations is ("A".."E", "0%".."100%").
Scoring each (prompt, candidate) pair with ``backend.score`` recomputes the
prompt once per candidate. :func:`score_candidates` (what
``HFBackend.score_candidates`` runs) shares the work at three levels:

- the token prefix common to all prompts of the call (chat header, system
  text, "Question: ") runs once, and its KV cache is copied into each batch;
- each prompt's own suffix runs once, batched with other prompts' suffixes
  (left-padded, with explicit positions and a 4-D attention mask);
- the candidates' tokens are merged into a token trie per prompt and its nodes
  run in the same batch, each node attending to the prompt and its own
  ancestors, so "8", "80" and "80%" share their tokens and logits are
  computed only at the suffix's last position and at trie nodes.

Where the attention kernel cannot take a 4-D mask (or a sliding window is
shorter than the rows), each prompt is prefilled alone and its cache repeated
once per candidate (``DynamicCache.batch_repeat_interleave``). Backends
without the capability take the generic path through ``backend.score``
(:func:`candor.backends.base.score_candidates`). All paths give the same
numbers up to float round-off.

Tokens follow ``HFBackend.score``: a candidate's tokens are those of
``prompt + candidate`` past the longest common prefix with the prompt's own
tokens, so a token merged across the boundary belongs to the candidate.
Prompts that end with the same line (say ``\\nConfidence:``) are tokenized
with the candidates once per line, not once per prompt, when the line's
tokens do not depend on the text before it (checked on every prompt; see
:func:`~candor.backends.engine.candidate_tokens.encode_candidates`).

The kernel runs only through the backend's public plumbing (``encode``,
``forward``, ``new_cache``, ``tokenize``, ``model``, ``device``).
:func:`candor.verbal.distribution.candidate_distribution` turns the scores
into a distribution over labels.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.backends.base import score_pairs
from candor.backends.engine.candidate_tokens import CandidateTokens, encode_candidates
from candor.backends.tokens import MIN_SHARED_PREFIX, shared_prefix_length

# Bounds per forward pass: logits kept (rows × positions × vocab) and tokens fed (rows × width).
MAX_LOGIT_ENTRIES = 64_000_000
MAX_BATCH_TOKENS = 2048
# Trie nodes a row feeds per forward pass (more make more passes).
MAX_TREE_NODES = 1024
# Repeat path: cached tokens per candidate chunk (rows × sequence).
MAX_CACHE_TOKENS = 16384


def score_candidates(backend: Any, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
    """Total log-prob of every candidate after every prompt on an ``HFBackend``: ``(len(prompts), len(candidates))``.

    Call it through :func:`candor.backends.base.score_candidates`, which checks the inputs.
    """
    return _CachedScorer(backend).score(prompts, candidates)


# ---------------------------------------------------------------- the trie of candidate tails


class _Trie:
    """The proper prefixes of the tails as trie nodes, in insertion order (parents first).

    Node i stands for feeding ``tokens[i]`` at depth ``depths[i]`` after its
    parent; its output row predicts the token after that prefix. A *read* is
    one log-prob to look up, ``(context node, target token)`` with context -1
    for the prompt's own last position; a candidate's score is the sum of its
    reads (those of its scored tokens, from its offset on).
    """

    def __init__(self, tails: Sequence[Sequence[int]], offsets: Sequence[int] | None = None) -> None:
        self._index: dict[tuple[int, ...], int] = {}
        self.tokens: list[int] = []
        self.depths: list[int] = []
        self.parents: list[int] = []
        for tail in tails:
            for t in range(1, len(tail)):
                key = tuple(tail[:t])
                if key not in self._index:
                    self._index[key] = len(self.tokens)
                    self.tokens.append(tail[t - 1])
                    self.depths.append(t - 1)
                    self.parents.append(self._index.get(key[:-1], -1))
        self.reads: list[tuple[int, int]] = []
        read_index: dict[tuple[int, int], int] = {}
        owners, picks = [], []
        for j, (tail, off) in enumerate(zip(tails, offsets or [0] * len(tails), strict=True)):
            for t in range(off, len(tail)):
                key = (self.node(tail[:t]) if t else -1, tail[t])
                if key not in read_index:
                    read_index[key] = len(self.reads)
                    self.reads.append(key)
                owners.append(j)
                picks.append(read_index[key])
        self.read_index = read_index  # (context node, target token) -> read
        self.unscored_heads = any(offsets or [])  # some candidate starts with the prompt's own tokens
        self.n_candidates = len(tails)
        self._owners = np.array(owners, dtype=np.int64)
        self._picks = np.array(picks, dtype=np.int64)
        at: dict[int, list[int]] = {}
        for r, (context, _) in enumerate(self.reads):
            at.setdefault(context, []).append(r)
        self.reads_at = {context: np.array(rs, dtype=np.int64) for context, rs in at.items()}
        self.read_targets = np.array([target for _, target in self.reads], dtype=np.int64)
        self._ancestry: np.ndarray | None = None

    def node(self, prefix: Sequence[int]) -> int:
        return self._index[tuple(prefix)]

    def ancestry(self) -> np.ndarray:
        """Boolean (n, n): row i is True at node i and at each of its ancestors."""
        if self._ancestry is None:
            n = len(self.tokens)
            allowed = np.zeros((n, n), dtype=bool)
            for i, parent in enumerate(self.parents):
                if parent >= 0:
                    allowed[i] = allowed[parent]
                allowed[i, i] = True
            self._ancestry = allowed
        return self._ancestry

    def candidate_scores(self, read_logprobs: np.ndarray) -> np.ndarray:
        """Each candidate's summed log-prob, from the log-prob of every read."""
        out = np.zeros(self.n_candidates)
        np.add.at(out, self._owners, read_logprobs[self._picks])
        return out

    def passes(self, max_nodes: int) -> list[list[int]]:
        """The nodes in forward passes of at most ``max_nodes`` (parents always in an earlier or the same pass)."""
        nodes = list(range(len(self.tokens)))
        return [nodes[k : k + max_nodes] for k in range(0, len(nodes), max_nodes)] or [[]]


# ---------------------------------------------------------------- the hf scorer


class _CachedScorer:
    """The ``hf`` fast path; ``strategy`` is ``tree`` or ``repeat`` (see the module docstring).

    - ``tree`` (eager and SDPA attention): prompts run in batches against the
      shared prefix's cache, each row holding one prompt's suffix and its
      candidate trie (:class:`_TreeBatch`).
    - ``repeat`` (other attention kernels, or a sliding window shorter than
      the rows): each prompt is prefilled alone, its cache repeated once per
      candidate and the tails run as a batch.

    Both use the backend's own encoding and forward helpers, so the numbers
    match ``HFBackend.score`` (same tokens, positions and dtype).
    """

    def __init__(self, backend: Any, strategy: str | None = None, min_mass: float = 0.0) -> None:
        self.backend = backend
        self.min_mass = min_mass
        self.unexpanded = np.zeros(0)  # per prompt of the last call: probability of the trie nodes not expanded
        config = backend.model.config
        tree_ok = getattr(config, "_attn_implementation", None) in ("eager", "sdpa")
        self.strategy = strategy or ("tree" if tree_ok else "repeat")
        self.window = getattr(config, "sliding_window", None)
        vocab = int(config.vocab_size)
        self.vocab = vocab
        self.max_nodes = max(1, min(MAX_TREE_NODES, MAX_LOGIT_ENTRIES // vocab))

    def score(self, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        import torch

        out = np.zeros((len(prompts), len(candidates)))
        self.unexpanded = np.zeros(len(prompts))
        with torch.inference_mode():
            encoded = encode_candidates(self.backend, prompts, candidates)
            plain = [i for i, e in enumerate(encoded) if e.keep == 0]
            if plain:  # nothing to cache (the first token itself changed): score plainly
                out[plain] = score_pairs(self.backend, [prompts[i] for i in plain], candidates)
            cached = [i for i, e in enumerate(encoded) if e.keep > 0]
            if cached:
                out[cached], self.unexpanded[cached] = self._score_cached([encoded[i] for i in cached])
        return out

    def _score_cached(self, encoded: list[CandidateTokens]) -> tuple[np.ndarray, np.ndarray]:
        tries: dict[tuple[Any, Any], _Trie] = {}
        for e in encoded:
            if (e.tails, e.offsets) not in tries:
                tries[(e.tails, e.offsets)] = _Trie(e.tails, e.offsets)
        row_tries = [tries[(e.tails, e.offsets)] for e in encoded]
        if self.strategy == "tree":
            prefix = self._shared_prefix(encoded)
            if self.window is None or self._columns(encoded, tries.values(), prefix) <= self.window:
                return self._tree(encoded, row_tries, prefix)
        exact = np.stack([self._repeat(e, t) for e, t in zip(encoded, row_tries, strict=True)])
        return exact, np.zeros(len(encoded))  # the repeat path expands every node

    # ---------------------------------------------------------------- tree

    @staticmethod
    def _shared_prefix(encoded: list[CandidateTokens]) -> int:
        length = shared_prefix_length([e.context[: e.keep] for e in encoded])
        return length if length >= MIN_SHARED_PREFIX else 0

    def _columns(self, encoded: list[CandidateTokens], tries: Any, prefix: int) -> int:
        """Cache columns a row may reach, padding included (for the sliding-window check)."""
        widths: dict[int, int] = {}
        for trie in tries:
            for k, nodes in enumerate(trie.passes(self.max_nodes)):
                widths[k] = max(widths.get(k, 0), len(nodes))
        return max(e.keep for e in encoded) + sum(widths.values())

    def _tree(self, encoded: list[CandidateTokens], tries: list[_Trie], prefix: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.backend
        prefix_cache = None
        if prefix:
            import torch

            ids = torch.tensor([encoded[0].context[:prefix]], dtype=torch.long, device=b.device)
            prefix_cache = b.new_cache()
            b.forward(ids, torch.ones_like(ids), prefix_cache, _arange(0, prefix, b.device))
        out = np.zeros((len(encoded), len(encoded[0].tails)))
        unexpanded = np.zeros(len(encoded))
        # Pruning reads a node's probability from its path's reads; a candidate that starts with
        # the prompt's own (unscored) tokens has no such path, so those calls stay exact.
        prune = self.min_mass > 0 and not any(t.unscored_heads for t in tries)
        chunks = self._suffix_chunks(encoded, prefix) if prune else self._row_chunks(encoded, tries, prefix)
        for chunk in chunks:
            batch = _TreeBatch(b, [encoded[i] for i in chunk], [tries[i] for i in chunk], prefix_cache, prefix)
            if prune:
                out[chunk], unexpanded[chunk] = batch.run_pruned(self.min_mass, self.max_nodes)
            else:
                out[chunk] = batch.run(self.max_nodes)
        return out, unexpanded

    def _suffix_chunks(self, encoded: list[CandidateTokens], prefix: int) -> list[list[int]]:
        """Rows per batch when pruning: sized by the suffixes alone (each later pass caps its own nodes)."""
        order = sorted(range(len(encoded)), key=lambda i: encoded[i].keep - prefix)
        chunks: list[list[int]] = []
        widest = 0
        for i in order:
            width = encoded[i].keep - prefix
            n = len(chunks[-1]) + 1 if chunks else 0
            if chunks and n * max(widest, width) <= MAX_BATCH_TOKENS and n <= self.max_nodes:
                chunks[-1].append(i)
                widest = max(widest, width)
            else:
                chunks.append([i])
                widest = width
        return chunks

    def _row_chunks(self, encoded: list[CandidateTokens], tries: list[_Trie], prefix: int) -> list[list[int]]:
        """Rows per batch: similar rows together, within the token and logit bounds of every pass."""
        order = sorted(range(len(encoded)), key=lambda i: (id(tries[i]), encoded[i].keep - prefix))
        chunks: list[list[int]] = []
        widths: list[int] = []  # per pass, the widest row of the current chunk (tokens fed)
        kept: list[int] = []  # per pass, the most positions whose logits a row of the chunk keeps
        for i in order:
            nodes = [len(n) for n in tries[i].passes(self.max_nodes)]
            row_widths = [nodes[0] + encoded[i].keep - prefix, *nodes[1:]]
            row_kept = [nodes[0] + 1, *nodes[1:]]
            if chunks:
                new_widths, new_kept = _widest(widths, row_widths), _widest(kept, row_kept)
                n = len(chunks[-1]) + 1
                if n * max(new_widths) <= MAX_BATCH_TOKENS and n * max(new_kept) * self.vocab <= MAX_LOGIT_ENTRIES:
                    chunks[-1].append(i)
                    widths, kept = new_widths, new_kept
                    continue
            chunks.append([i])
            widths, kept = row_widths, row_kept
        return chunks

    # ---------------------------------------------------------------- repeat

    def _repeat(self, e: CandidateTokens, trie: _Trie) -> np.ndarray:
        import torch

        b = self.backend
        ids = torch.tensor([e.context[: e.keep]], dtype=torch.long, device=b.device)
        cache = b.new_cache()
        last = b.forward(ids, torch.ones_like(ids), cache, _arange(0, e.keep, b.device))
        first = torch.log_softmax(last.float(), -1)[0]
        tails = [list(t) for t in e.tails]
        longest = max(len(t) for t in tails)
        rows = min(MAX_CACHE_TOKENS // (e.keep + longest), MAX_LOGIT_ENTRIES // max(1, longest * self.vocab))
        rows = max(1, rows)
        scores = np.zeros(len(tails))
        for k in range(0, len(tails), rows):
            chunk = list(range(k, min(k + rows, len(tails))))
            scores[chunk] = self._repeat_chunk(
                cache, first, e.keep, [tails[j] for j in chunk], [e.offsets[j] for j in chunk]
            )
        return scores

    def _repeat_chunk(
        self, prefix_cache: Any, first: Any, shared: int, tails: list[list[int]], offsets: list[int]
    ) -> np.ndarray:
        """Sum of log-probs of tails[r][offsets[r]:]; tail token 0 follows the cached prefix."""
        import torch

        b = self.backend
        width = max(len(t) for t in tails)
        targets = torch.full((len(tails), width), 0, dtype=torch.long)
        scored = torch.zeros((len(tails), width), dtype=torch.bool)
        for r, (tail, off) in enumerate(zip(tails, offsets, strict=True)):
            targets[r, : len(tail)] = torch.tensor(tail, dtype=torch.long)
            scored[r, off : len(tail)] = True
        targets, scored = targets.to(b.device), scored.to(b.device)
        # Tail token 0 is predicted by the prefix's last logits.
        picked = first[targets[:, 0]].unsqueeze(1)
        if width > 1:
            # Feed tail tokens 0..width-2 (right-padded; causal attention never looks at the padding).
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(tails))
            mask = torch.ones((len(tails), shared + width - 1), dtype=torch.long, device=b.device)
            positions = _arange(shared, shared + width - 1, b.device).expand(len(tails), -1)
            logits = b.forward(targets[:, :-1], mask, cache, positions, keep=width - 1, last_only=False)
            # gather − logsumexp: a full log_softmax would copy the (rows, width, vocab) logits.
            rest = logits.gather(2, targets[:, 1:].unsqueeze(2)).squeeze(2) - torch.logsumexp(logits, -1)
            picked = torch.cat([picked, rest], dim=1)
        return (picked * scored).sum(1).double().cpu().numpy()


def _widest(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Element-wise maximum of two lists, the shorter one padded with zeros."""
    n = max(len(a), len(b))
    return [max(a[k] if k < len(a) else 0, b[k] if k < len(b) else 0) for k in range(n)]


def _arange(start: int, stop: int, device: Any) -> Any:
    import torch

    return torch.arange(start, stop, dtype=torch.long, device=device).unsqueeze(0)


class _TreeBatch:
    """Rows (one prompt each) that run together against copies of the shared prefix's cache.

    The first pass feeds each row's suffix, left-padded so that every suffix
    ends in the same column, followed by the row's trie nodes (more nodes than
    a pass takes go in later passes). Each pass appends its columns to the
    cache; the 4-D mask lets a suffix token see the prefix and the suffix up
    to itself, a node the prefix, the whole suffix, its ancestors and itself,
    and a padding column only itself. Logits are kept only from the suffix's
    last column on.
    """

    def __init__(
        self, backend: Any, rows: list[CandidateTokens], tries: list[_Trie], prefix_cache: Any, prefix: int
    ) -> None:
        self.b = backend
        self.rows, self.tries, self.prefix = rows, tries, prefix
        if prefix_cache is None:
            self.cache = backend.new_cache()
        else:
            self.cache = copy.deepcopy(prefix_cache)
            self.cache.batch_repeat_interleave(len(rows))
        self.columns = [np.full(len(t.tokens), -1, dtype=np.int64) for t in tries]  # cache column of each node
        self.suffix_columns: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(rows)
        self.read_logprobs = [np.full(len(t.reads), np.nan) for t in tries]
        self.suffix_done = False

    def run(self, max_nodes: int) -> np.ndarray:
        """Every row's candidate scores, shape ``(rows, candidates)``."""
        plans = [t.passes(max_nodes) for t in self.tries]
        for k in range(max(len(p) for p in plans)):
            self._feed([p[k] if k < len(p) else [] for p in plans])
        return np.stack([t.candidate_scores(lp) for t, lp in zip(self.tries, self.read_logprobs, strict=True)])

    def run_pruned(self, min_mass: float, max_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores expanding only trie nodes whose path probability is at least ``min_mass``, level by level.

        A candidate under a node left unexpanded scores -inf. Also returns, per
        row, the summed probability of the unexpanded nodes whose probability
        is known (their parent was expanded): every dropped candidate lies
        under one of them, so it bounds the probability dropped.
        """
        n_rows = len(self.rows)
        per_row = max(1, min(MAX_BATCH_TOKENS, max_nodes) // n_rows)  # nodes a row feeds per pass
        self._feed([[] for _ in range(n_rows)])  # the suffix: the first tokens' log-probs
        node_lp = [np.full(len(t.tokens), np.nan) for t in self.tries]
        fed = [np.zeros(len(t.tokens), dtype=bool) for t in self.tries]
        while True:
            todo = []
            for r in range(len(self.tries)):
                self._update_node_logprobs(r, node_lp[r])
                # NaN (not reached yet) compares False; parents come first, so a pass never needs a later node.
                ready = np.flatnonzero(~fed[r] & (node_lp[r] >= np.log(min_mass)))[:per_row]
                todo.append(ready.tolist())
                fed[r][ready] = True
            if not any(todo):
                break
            self._feed(todo)
        scores = np.stack([t.candidate_scores(lp) for t, lp in zip(self.tries, self.read_logprobs, strict=True)])
        unexpanded = np.array([np.exp(lp[~f & ~np.isnan(lp)]).sum() for lp, f in zip(node_lp, fed, strict=True)])
        return np.where(np.isnan(scores), -np.inf, scores), unexpanded

    def _update_node_logprobs(self, r: int, node_lp: np.ndarray) -> None:
        """Fill each node's path log-prob from its parent's and the read that reaches it (parents come first)."""
        trie, reads = self.tries[r], self.read_logprobs[r]
        for n, (parent, token) in enumerate(zip(trie.parents, trie.tokens, strict=True)):
            if np.isnan(node_lp[n]):
                base = 0.0 if parent < 0 else node_lp[parent]
                node_lp[n] = base + reads[trie.read_index[(parent, token)]]

    def _feed(self, nodes: list[list[int]]) -> None:
        """One forward pass: each row's suffix (the first time) and then the given nodes."""
        import torch

        b = self.b
        suffixes = [[] if self.suffix_done else e.context[self.prefix : e.keep] for e in self.rows]
        left = max(len(s) for s in suffixes)
        width = left + max(len(n) for n in nodes)
        if width == 0:
            return
        start = self.cache.get_seq_length()
        ids = np.zeros((len(self.rows), width), dtype=np.int64)  # padding: any token, masked out
        pos = np.zeros((len(self.rows), width), dtype=np.int64)
        allowed = np.zeros((len(self.rows), width, start + width), dtype=bool)
        allowed[:, np.arange(width), start + np.arange(width)] = True  # every column sees itself
        for r, (suffix, row_nodes) in enumerate(zip(suffixes, nodes, strict=True)):
            self._layout_row(r, suffix, row_nodes, left, start, ids[r], pos[r], allowed[r])
        dtype = next(b.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(torch.from_numpy(~allowed), torch.finfo(dtype).min)
        keep = width - left + (0 if self.suffix_done else 1)
        logits = b.forward(
            torch.from_numpy(ids).to(b.device),
            mask.unsqueeze(1).to(b.device),
            self.cache,
            torch.from_numpy(pos).to(b.device),
            keep=keep,
            last_only=False,
        )
        self._gather(logits, nodes, width - keep, left)
        self.suffix_done = True

    def _layout_row(
        self,
        r: int,
        suffix: list[int],
        nodes: list[int],
        left: int,
        start: int,
        ids: np.ndarray,
        pos: np.ndarray,
        allowed: np.ndarray,
    ) -> None:
        """Fill one row's tokens, positions and attention (``allowed[query, key]``) for this pass."""
        trie, p, keep = self.tries[r], self.prefix, self.rows[r].keep
        s0 = left - len(suffix)
        if suffix:
            ids[s0:left] = suffix
            pos[s0:left] = np.arange(p, keep)
            self.suffix_columns[r] = start + np.arange(s0, left)
            allowed[s0:left, :p] = True
            allowed[s0:left, start + s0 : start + left] = np.tril(np.ones((len(suffix), len(suffix)), dtype=bool))
        if not nodes:
            return
        queries = left + np.arange(len(nodes))
        self.columns[r][nodes] = start + queries
        ids[queries] = np.asarray(trie.tokens)[nodes]
        pos[queries] = keep + np.asarray(trie.depths)[nodes]
        allowed[queries, :p] = True
        allowed[np.ix_(queries, self.suffix_columns[r])] = True
        q, a = np.nonzero(trie.ancestry()[nodes])
        allowed[queries[q], self.columns[r][a]] = True

    def _gather(self, logits: Any, nodes: list[list[int]], first_kept: int, left: int) -> None:
        """Store the log-probs of the reads whose context ran in this pass."""
        import torch

        rows, cols, targets, dest = [], [], [], []
        for r, row_nodes in enumerate(nodes):
            trie = self.tries[r]
            contexts = [(n, left + k) for k, n in enumerate(row_nodes)]
            if not self.suffix_done:
                contexts.append((-1, left - 1))  # the suffix's last column predicts each tail's first token
            for context, col in contexts:
                reads = trie.reads_at.get(context)
                if reads is not None:
                    rows.append(np.full(len(reads), r))
                    cols.append(np.full(len(reads), col - first_kept))
                    targets.append(trie.read_targets[reads])
                    dest.append((r, reads))
        if not dest:
            return
        row_t, col_t, tgt_t = (torch.from_numpy(np.concatenate(x)).to(logits.device) for x in (rows, cols, targets))
        # gather − logsumexp: a full log_softmax would copy the (rows, positions, vocab) logits.
        values = (logits[row_t, col_t, tgt_t] - torch.logsumexp(logits, -1)[row_t, col_t]).double().cpu().numpy()
        k = 0
        for r, reads in dest:
            self.read_logprobs[r][reads] = values[k : k + len(reads)]
            k += len(reads)


def score_candidates_pruned(
    backend: Any, prompts: Sequence[str], candidates: Sequence[str], min_mass: float
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`score_candidates` expanding only the candidate-trie nodes of probability ``min_mass`` or more.

    Returns the scores (-inf for a candidate under an unexpanded node; the
    others exact) and, per prompt, the probability of the unexpanded nodes,
    which bounds the total probability of the dropped candidates. Only the
    tree path prunes; elsewhere every candidate is scored and that mass is 0.
    """
    scorer = _CachedScorer(backend, min_mass=min_mass)
    scores = scorer.score(prompts, candidates)
    return scores, scorer.unexpanded


def scoring_work(backend: Any, prompts: Sequence[str], candidates: Sequence[str]) -> dict[str, Any]:
    """What the ``hf`` tree path feeds through the model for these prompts (for cost reports).

    ``shared_prefix`` tokens run once per call; per prompt, ``suffix`` tokens
    (its own part) and ``trie_nodes`` (the candidates' proper prefixes) run
    once each, and logits are kept at the suffix's last position and at each node.
    """
    encoded = encode_candidates(backend, prompts, candidates)
    prefix = shared_prefix_length([e.context[: e.keep] for e in encoded]) if len(encoded) > 1 else 0
    prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
    return {
        "shared_prefix": prefix,
        "suffix": [e.keep - prefix for e in encoded],
        "trie_nodes": [len(_Trie(e.tails, e.offsets).tokens) for e in encoded],
    }
