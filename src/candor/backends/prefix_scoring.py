"""Score a closed set of continuations after each prompt, reusing the prompt's KV cache.

Verbalized confidence (DESIGN.md §4.3) and P(True) ask, for every prompt, how
likely each of a fixed set of short continuations is ("A".."E", "0%".."100%").
Scoring each (prompt, candidate) pair with ``backend.score`` recomputes the
prompt once per candidate. For the ``hf`` backend :func:`score_candidates`
instead prefills each prompt once and runs only the candidate tokens against
its KV cache: as one token trie under a 4-D attention mask, or, where the
attention kernel cannot take such a mask, against the cache repeated once per
candidate (``DynamicCache.batch_repeat_interleave``); see :class:`_CachedScorer`.
Other backends take the generic path through ``backend.score``; all paths give
the same numbers (up to float round-off).

Tokens follow ``HFBackend.score``: a candidate's tokens are those of
``prompt + candidate`` past the longest common prefix with the prompt's own
tokens, so a token merged across the boundary belongs to the candidate.

:func:`candidate_distribution` turns the scores into a distribution over
labels, each read in several surface forms (by default with and without a
leading space) whose probabilities add up. When every form of every label is
one token in context, a single ``next_token_logprobs`` call suffices. When any
form is longer (SmolLM2 writes "Confidence: 9" as ``:``, ``Ġ``, ``9``, so the
spaced digit is two tokens), all forms are scored as continuations: reading
only the single-token forms would drop the model's most likely path.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.backends.base import Backend
from candor.errors import CandorError

# Bounds per candidate chunk: cached tokens (rows × sequence) and logits (rows × tail × vocab).
MAX_CACHE_TOKENS = 16384
MAX_LOGIT_ENTRIES = 64_000_000
# Trie nodes per forward pass on the tree path (the 4-D mask is nodes × (prompt + nodes)).
MAX_TREE_NODES = 1024

SURFACE_PREFIXES = ("", " ")


def score_candidates(backend: Backend, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
    """Total log-prob of every candidate after every prompt: shape ``(len(prompts), len(candidates))``."""
    if any(not c for c in candidates):
        raise CandorError("score_candidates: a candidate continuation is empty")
    if not prompts or not candidates:
        return np.zeros((len(prompts), len(candidates)))
    if _is_hf(backend):
        return _CachedScorer(backend).score(prompts, candidates)
    return _score_generic(backend, prompts, candidates)


def _is_hf(backend: Backend) -> bool:
    # Without candor.backends.hf imported, no HFBackend exists; this avoids importing torch.
    module = sys.modules.get("candor.backends.hf")
    return module is not None and isinstance(backend, module.HFBackend)


def _score_generic(backend: Backend, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
    pairs_p = [p for p in prompts for _ in candidates]
    pairs_c = [c for _ in prompts for c in candidates]
    sums = [float(np.sum(lps)) for lps in backend.score(pairs_p, pairs_c)]
    return np.asarray(sums, dtype=float).reshape(len(prompts), len(candidates))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class _CachedScorer:
    """The ``hf`` fast path: one prefill per prompt, then only the candidate tokens.

    Two strategies score the candidate tails against the prompt's cache:

    - ``tree`` (eager and SDPA attention): the tails are merged into a token
      trie and its nodes run as one sequence after the prompt, each node
      attending to the prompt and its own ancestors through a 4-D attention
      mask. Candidates sharing a start ("8", "80", "80%") share its tokens, so
      the 101 percentages cost about 200 tokens instead of 800, and nothing is
      copied.
    - ``repeat`` (other attention kernels, or a sliding window shorter than the
      sequence): the cache is repeated once per candidate
      (``DynamicCache.batch_repeat_interleave``) and the tails run as a batch.

    Both use the backend's own encoding and forward helpers, so the numbers
    match ``HFBackend.score`` (same tokens, positions and dtype).
    """

    def __init__(self, backend: Any, strategy: str | None = None) -> None:
        self.backend = backend
        config = backend.model.config
        tree_ok = getattr(config, "_attn_implementation", None) in ("eager", "sdpa")
        self.strategy = strategy or ("tree" if tree_ok else "repeat")
        self.window = getattr(config, "sliding_window", None)

    def score(self, prompts: Sequence[str], candidates: Sequence[str]) -> np.ndarray:
        import torch

        out = np.zeros((len(prompts), len(candidates)))
        with torch.inference_mode():
            for i, prompt in enumerate(prompts):
                out[i] = self._score_prompt(prompt, candidates)
        return out

    def _score_prompt(self, prompt: str, candidates: Sequence[str]) -> np.ndarray:
        import torch

        b = self.backend
        context = b._encode([prompt])[0]
        fulls = b._encode([prompt + c for c in candidates])
        commons = [_common_prefix(context, f) for f in fulls]
        shared = min(commons)
        if shared == 0:  # nothing to cache (the first token itself changed): score plainly
            return _score_generic(b, [prompt], candidates)[0]
        # Candidate j's scored tokens are fulls[j][max(common_j, 1):], all past the cached prefix.
        offsets = [max(c, 1) - shared for c in commons]
        tails = [f[shared:] for f in fulls]
        ids = torch.tensor([context[:shared]], dtype=torch.long, device=b.device)
        cache = b._new_cache()
        last = b._forward(ids, torch.ones_like(ids), cache, _arange(0, shared, b.device))
        first = torch.log_softmax(last.float(), -1)[0]
        longest = max(len(t) for t in tails)
        if self.strategy == "tree" and (self.window is None or shared + longest * len(tails) <= self.window):
            return self._tree(cache, first, shared, tails, offsets)
        return self._repeat(cache, first, shared, tails, offsets)

    # ---------------------------------------------------------------- tree

    def _tree(self, cache: Any, first: Any, shared: int, tails: list[list[int]], offsets: list[int]) -> np.ndarray:
        scores = np.zeros(len(tails))
        for chunk in _tree_chunks(tails, self._max_nodes()):
            scores[chunk] = self._tree_chunk(
                cache, first, shared, [tails[j] for j in chunk], [offsets[j] for j in chunk]
            )
            extra = cache.get_seq_length() - shared
            if extra:  # drop this chunk's nodes, keep the prompt (a negative crop works on every version)
                cache.crop(-extra)
        return scores

    def _max_nodes(self) -> int:
        vocab = int(self.backend.model.config.vocab_size)
        return max(1, min(MAX_TREE_NODES, MAX_LOGIT_ENTRIES // vocab))

    def _tree_chunk(
        self, cache: Any, first: Any, shared: int, tails: list[list[int]], offsets: list[int]
    ) -> np.ndarray:
        """Sum of log-probs of tails[r][offsets[r]:]; tail token 0 follows the cached prefix."""
        import torch

        b = self.backend
        trie = _Trie(tails)
        # Rows of context log-probs: one per trie node, and the prompt's own last row at the end.
        rows = first.unsqueeze(0)
        if trie.tokens:
            n = len(trie.tokens)
            dtype = next(b.model.parameters()).dtype
            mask = torch.zeros((1, 1, n, shared + n), dtype=dtype, device=b.device)
            mask[0, 0, :, shared:].masked_fill_(~trie.ancestry().to(b.device), torch.finfo(dtype).min)
            ids = torch.tensor([trie.tokens], dtype=torch.long, device=b.device)
            positions = torch.tensor([trie.depths], dtype=torch.long, device=b.device) + shared
            logits = b._forward(ids, mask, cache, positions, keep=n, last_only=False)[0]
            rows = torch.cat([torch.log_softmax(logits.float(), -1), rows])
        context, target, owner = [], [], []
        for r, (tail, off) in enumerate(zip(tails, offsets, strict=True)):
            for t in range(off, len(tail)):
                context.append(trie.node(tail[:t]) if t else len(trie.tokens))
                target.append(tail[t])
                owner.append(r)
        picked = rows[torch.tensor(context, device=b.device), torch.tensor(target, device=b.device)]
        out = np.zeros(len(tails))
        np.add.at(out, owner, picked.double().cpu().numpy())
        return out

    # ---------------------------------------------------------------- repeat

    def _repeat(self, cache: Any, first: Any, shared: int, tails: list[list[int]], offsets: list[int]) -> np.ndarray:
        longest = max(len(t) for t in tails)
        vocab = int(self.backend.model.config.vocab_size)
        rows = min(MAX_CACHE_TOKENS // (shared + longest), MAX_LOGIT_ENTRIES // max(1, longest * vocab))
        rows = max(1, rows)
        scores = np.zeros(len(tails))
        for k in range(0, len(tails), rows):
            chunk = list(range(k, min(k + rows, len(tails))))
            scores[chunk] = self._repeat_chunk(
                cache, first, shared, [tails[j] for j in chunk], [offsets[j] for j in chunk]
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
            logits = b._forward(targets[:, :-1], mask, cache, positions, keep=width - 1, last_only=False)
            # gather − logsumexp: a full log_softmax would copy the (rows, width, vocab) logits.
            rest = logits.gather(2, targets[:, 1:].unsqueeze(2)).squeeze(2) - torch.logsumexp(logits, -1)
            picked = torch.cat([picked, rest], dim=1)
        return (picked * scored).sum(1).double().cpu().numpy()


class _Trie:
    """The proper prefixes of the tails as trie nodes, in insertion order (parents first).

    Node i stands for feeding ``tokens[i]`` at depth ``depths[i]`` after its
    parent; its output row predicts the token after that prefix.
    """

    def __init__(self, tails: Sequence[Sequence[int]]) -> None:
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

    def node(self, prefix: Sequence[int]) -> int:
        return self._index[tuple(prefix)]

    def ancestry(self) -> Any:
        """Boolean (n, n): row i is True at node i and at each of its ancestors."""
        import torch

        n = len(self.tokens)
        allowed = torch.zeros((n, n), dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                allowed[i] = allowed[parent]
            allowed[i, i] = True
        return allowed


def _tree_chunks(tails: Sequence[Sequence[int]], max_nodes: int) -> list[list[int]]:
    """Candidate groups whose tries stay within ``max_nodes`` (a longer single tail gets its own group)."""
    chunks: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for j, tail in enumerate(tails):
        new = {tuple(tail[:t]) for t in range(1, len(tail))} - seen
        if chunks and new and len(seen) + len(new) > max_nodes:
            chunks.append([])
            seen = set()
            new = {tuple(tail[:t]) for t in range(1, len(tail))}
        if not chunks:
            chunks.append([])
        chunks[-1].append(j)
        seen |= new
    return chunks


def _arange(start: int, stop: int, device: Any) -> Any:
    import torch

    return torch.arange(start, stop, dtype=torch.long, device=device).unsqueeze(0)


# ---------------------------------------------------------------- distributions over labels


def surface_forms(labels: Sequence[str], prefixes: Sequence[str] = SURFACE_PREFIXES) -> list[tuple[int, str]]:
    """``(label index, text)`` for each label written with each prefix, without duplicates."""
    seen: set[str] = set()
    out = []
    for k, label in enumerate(labels):
        for prefix in prefixes:
            text = prefix + label
            if text not in seen:
                seen.add(text)
                out.append((k, text))
    return out


def single_token_ids(backend: Backend, prompts: Sequence[str], forms: Sequence[str]) -> list[int] | None:
    """The one token id of each form after every prompt, or None when some form is not one token.

    A form is one token in context when tokenizing ``prompt + form`` gives the
    prompt's tokens plus exactly one more, the same one after every prompt.
    """
    ids: list[int] | None = None
    for prompt in prompts:
        context = backend.tokenize(prompt)
        found = []
        for form in forms:
            full = backend.tokenize(prompt + form)
            if len(full) != len(context) + 1 or full[:-1] != context:
                return None
            found.append(full[-1])
        if ids is not None and found != ids:
            return None
        ids = found
    return ids


def candidate_distribution(
    backend: Backend,
    prompts: Sequence[str],
    labels: Sequence[str],
    prefixes: Sequence[str] = SURFACE_PREFIXES,
) -> np.ndarray:
    """P(label | prompt) renormalized over ``labels``: shape ``(len(prompts), len(labels))``.

    Each label's probability is the sum over its surface forms (``prefix +
    label`` for each prefix); see the module docstring for the two paths.
    """
    if not labels:
        raise CandorError("candidate_distribution: no labels")
    forms = surface_forms(labels, prefixes)
    texts = [text for _, text in forms]
    ids = single_token_ids(backend, prompts, texts) if prompts else None
    if ids is not None:
        form_lp = np.asarray(backend.next_token_logprobs(list(prompts), ids), dtype=float)
    else:
        form_lp = score_candidates(backend, prompts, texts)
    owner = np.array([k for k, _ in forms])
    label_lp = np.stack([_logsumexp(form_lp[:, owner == k]) for k in range(len(labels))], axis=1)
    return _softmax(label_lp)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return (top + np.log(np.exp(x - top).sum(axis=1, keepdims=True)))[:, 0]


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
