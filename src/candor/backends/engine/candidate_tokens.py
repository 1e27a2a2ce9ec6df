"""A prompt's candidates cut into tokens as ``HFBackend.score`` cuts them (for candidate scoring).

Used by :mod:`~candor.backends.engine.prefix_scoring`.

A candidate's tokens are those of ``prompt + candidate`` past the longest
common prefix with the prompt's own tokens, so a token merged across the
boundary belongs to the candidate. Prompts that end with the same line (say
``\\nConfidence:``) are tokenized with the candidates once per line, not once
per prompt, when the line's tokens do not depend on the text before it
(checked on every prompt; see :func:`encode_candidates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class CandidateTokens:
    """A prompt's tokens and its candidates' tokens past the part they all keep."""

    context: list[int]
    keep: int  # leading context tokens every candidate keeps (0: nothing can be cached)
    tails: tuple[tuple[int, ...], ...]  # per candidate, the tokens of prompt + candidate from ``keep`` on
    offsets: tuple[int, ...]  # per candidate, leading tail tokens that are the prompt's own (not scored)


def split_candidates(context: Sequence[int], fulls: Sequence[Sequence[int]]) -> CandidateTokens:
    """Encode one prompt from its own tokens and the tokens of ``prompt + candidate`` for each candidate."""
    commons = [common_prefix_length(context, f) for f in fulls]
    keep = min(commons)
    tails = tuple(tuple(f[keep:]) for f in fulls)
    offsets = tuple(c - keep for c in commons)
    return CandidateTokens(list(context), keep, tails, offsets)


def encode_candidates(backend: Any, prompts: Sequence[str], candidates: Sequence[str]) -> list[CandidateTokens]:
    """Every prompt's tokens and its candidates' tails, as ``HFBackend.score`` would cut them.

    Tokenizing ``prompt + candidate`` for every pair dominates when candidates
    are many (101 percentages × 2 forms), so prompts ending with the same line
    share one tokenization of that line plus each candidate. This relies on
    the line break before it being a token boundary no matter what follows;
    it is checked on every prompt's own tokens and on all candidates of one
    prompt per line, and prompts that fail the check are tokenized in full.
    """
    contexts = backend.encode(list(prompts))
    out: list[CandidateTokens | None] = [None] * len(prompts)
    for line, members in _line_groups(prompts):
        _encode_group(backend, prompts, contexts, candidates, line, members, out)
    rest = [i for i, e in enumerate(out) if e is None]
    if rest:
        flat = backend.encode([prompts[i] + c for i in rest for c in candidates])
        n = len(candidates)
        for k, i in enumerate(rest):
            out[i] = split_candidates(contexts[i], flat[k * n : (k + 1) * n])
    return out  # type: ignore[return-value]


def _line_groups(prompts: Sequence[str]) -> list[tuple[str, list[int]]]:
    """Prompts grouped by their last line (when it starts with a non-space), two or more per group."""
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        cut = prompt.rfind("\n") + 1
        if 0 < cut < len(prompt) and not prompt[cut].isspace():
            groups.setdefault(prompt[cut:], []).append(i)
    return [(line, members) for line, members in groups.items() if len(members) > 1]


def _encode_group(
    backend: Any,
    prompts: Sequence[str],
    contexts: list[list[int]],
    candidates: Sequence[str],
    line: str,
    members: list[int],
    out: list[CandidateTokens | None],
) -> None:
    """Fill ``out`` for the prompts ending with ``line`` from one tokenization of it with each candidate."""
    line_ids = backend.tokenize(line)
    n = len(line_ids)
    if n == 0:
        return
    members = [i for i in members if len(contexts[i]) > n and contexts[i][-n:] == line_ids]
    if len(members) < 2:
        return
    rep = members[0]
    head = len(contexts[rep]) - n
    fulls = backend.encode([prompts[rep] + c for c in candidates])
    if any(f[:head] != contexts[rep][:head] for f in fulls):
        return  # the line break is no token boundary for this tokenizer: tokenize in full
    shared = split_candidates(line_ids, [f[head:] for f in fulls])
    for i in members:
        start = len(contexts[i]) - n
        out[i] = CandidateTokens(contexts[i], start + shared.keep, shared.tails, shared.offsets)
