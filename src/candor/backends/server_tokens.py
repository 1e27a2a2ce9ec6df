"""The token strings an OpenAI-compatible server sends, read as text (for the ``openai`` backend).

An echoed prompt's tokens are laid over the prompt's text (:func:`echoed_spans`),
since ``text_offset`` need not index it; the names of top log-prob
alternatives are made comparable across servers (:func:`canonical_token`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def aligned(
    tokens: list[str], lps: list[float | None], tops: list[dict[str, float]]
) -> tuple[list[str], list[float | None], list[dict[str, float]]]:
    """The three lists position by position; a list that does not match the tokens' length is dropped."""
    if len(lps) != len(tokens):
        return [], [], []
    return tokens, lps, tops if len(tops) == len(tokens) else []


def echoed_spans(tokens: Sequence[str], text: str, max_leading: int = 4) -> list[tuple[int, tuple[int, int]]] | None:
    """``(token index, (start, end))`` of the echoed tokens that spell ``text``; None when they do not.

    Servers echo the prompt's tokens as strings, and vLLM counts ``text_offset``
    over those strings, a leading special token (``<|begin_of_text|>``) included,
    so offsets need not index the text. The strings are laid over the text
    instead: after at most ``max_leading`` leading tokens the text lacks, they
    must spell it exactly; what follows is the generated token.
    """
    for first in range(min(max_leading, len(tokens)) + 1):
        spans, at = [], 0
        for i in range(first, len(tokens)):
            if at == len(text):
                break
            token = tokens[i]
            if not token or not text.startswith(token, at):
                break
            spans.append((i, (at, at + len(token))))
            at += len(token)
        if at == len(text) and spans:
            return spans
    return None


# SentencePiece marks a word-initial space with U+2581 and spells a byte-fallback token as <0xNN>.
SENTENCEPIECE_SPACE = "\u2581"
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def canonical_token(token: str) -> str:
    """A token string as text: SentencePiece's space marker as a space, an ASCII byte token as its character.

    Servers differ in how they name a token in ``top_logprobs`` (llama.cpp
    and older vLLM send the vocabulary piece ``▁A``, current vLLM the decoded
    `` A``); both sides of a comparison go through this. A non-ASCII byte
    token stays as it is (one byte of a character is no text).
    """
    token = token.replace(SENTENCEPIECE_SPACE, " ")
    return BYTE_TOKEN.sub(lambda m: chr(int(m.group(1), 16)) if int(m.group(1), 16) < 0x80 else m.group(0), token)


def shown_tokens(top: dict[str, float]) -> dict[str, float]:
    """A position's top log-probs keyed by :func:`canonical_token`; names that collide keep the larger."""
    out: dict[str, float] = {}
    for token, lp in top.items():
        key = canonical_token(token)
        out[key] = max(lp, out.get(key, float("-inf")))
    return out


def tokens_within(tokens: Sequence[str], text_length: int) -> int:
    """How many leading tokens lie inside a text of ``text_length`` characters."""
    seen = 0
    for count, token in enumerate(tokens):
        if seen >= text_length:
            return count
        seen += len(token)
    return len(tokens)
