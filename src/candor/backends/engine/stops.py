"""Stop strings: deciding that a generated row has hit one, and cutting the text there.

A token whose decoded text contains a stop string ends the row (a set
lookup). A stop string longer than one character, or one that is not ASCII,
may also be split across tokens, so for those a short decoded tail of each
row is checked as well.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

# Decoded vocabularies, one per tokenizer object (decoding 50k tokens takes ~0.4 s).
_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def decoded_vocab(tokenizer: Any) -> list[str]:
    """The text of every token id decoded on its own."""
    try:
        return _VOCAB_CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _VOCAB_CACHE[tokenizer] = vocab
    return vocab


class StopMatcher:
    """Decides whether a row has hit a stop string, mostly by set lookup."""

    def __init__(self, tokenizer: Any, vocab: list[str], stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.token_ids = frozenset(i for i, text in enumerate(vocab) if any(s in text for s in self.stops))
        # A stop string that can span tokens needs a look at the decoded tail.
        spanning = [s for s in self.stops if len(s) > 1 or not s.isascii()]
        self.tail_tokens = 4 * max((len(s.encode()) for s in spanning), default=0)

    def hit(self, ids: list[int]) -> bool:
        if ids[-1] in self.token_ids:
            return True
        if not self.tail_tokens or len(ids) < 2:
            return False
        tail = self.tokenizer.decode(ids[-self.tail_tokens :], skip_special_tokens=True)
        return any(s in tail for s in self.stops)

    def cut(self, text: str) -> str:
        """Text up to the first stop string."""
        ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return text[: min(ends)] if ends else text
