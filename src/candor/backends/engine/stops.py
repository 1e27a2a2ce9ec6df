"""Stop strings: deciding that a generated row has hit one, and cutting the text there.

A token whose decoded text contains a stop string ends the row (a lookup in
a per-token byte map). A stop string longer than one character, or one that
is not ASCII, may also be split across tokens, so for those a short decoded
tail of each row is checked as well.

A matcher costs one byte per vocabulary entry (49 KB for a 49k vocabulary),
and finding the tokens that contain a stop string is one regular-expression
scan of the vocabulary joined into one string (:class:`VocabText`), not a
Python loop over 49k tokens. Matchers are kept per stop tuple in a bounded
:class:`StopMatchers` cache: clients choose their stop lists, so a cache
without a bound is memory a client can take.
"""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

# Decoded vocabularies, one per tokenizer object (decoding 50k tokens takes ~0.4 s).
_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
_TEXT_CACHE: weakref.WeakKeyDictionary[Any, VocabText] = weakref.WeakKeyDictionary()

# Matchers kept per backend: the serving defaults and the few stop lists clients reuse fit many times over.
MATCHER_CACHE_SIZE = 64

_SEPARATOR = "\x00"  # between tokens in the joined vocabulary; a stop string holding it is searched token by token


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


class VocabText:
    """A vocabulary joined into one string, so the tokens containing a string are found by one scan."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab
        self.text = _SEPARATOR.join(vocab)
        lengths = np.fromiter((len(t) + 1 for t in vocab), dtype=np.int64, count=len(vocab))
        self.starts = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)[:-1]])
        # The joined text's code points, where a one-character stop (often in half the tokens) is found at once.
        self.codes = np.frombuffer(self.text.encode("utf-32-le"), dtype=np.uint32)

    @classmethod
    def of(cls, tokenizer: Any, vocab: list[str]) -> VocabText:
        """The joined text of ``vocab`` (cached per tokenizer while ``vocab`` is its decoded vocabulary)."""
        with contextlib.suppress(KeyError, TypeError):
            cached = _TEXT_CACHE[tokenizer]
            if cached.vocab is vocab:
                return cached
        made = cls(vocab)
        with contextlib.suppress(TypeError):
            _TEXT_CACHE[tokenizer] = made
        return made

    def containing(self, stops: Sequence[str]) -> np.ndarray:
        """Per token id, whether its text contains any of ``stops`` (a bool array)."""
        found = np.zeros(len(self.vocab), dtype=bool)
        for stop in stops:
            if _SEPARATOR in stop:
                found |= np.fromiter((stop in t for t in self.vocab), dtype=bool, count=len(self.vocab))
                continue
            # A match cannot run across the separator, so each one lies inside one token.
            if len(stop) == 1:
                at = np.flatnonzero(self.codes == ord(stop))
            else:
                at = np.fromiter((m.start() for m in re.finditer(re.escape(stop), self.text)), dtype=np.int64)
            found[np.searchsorted(self.starts, at, side="right") - 1] = True
        return found


class TokenSet:
    """The token ids whose own text contains a stop string: one byte per vocabulary entry."""

    def __init__(self, flags: np.ndarray) -> None:
        self._flags = np.asarray(flags, dtype=bool).tobytes()

    def __contains__(self, token: object) -> bool:
        return isinstance(token, int) and 0 <= token < len(self._flags) and self._flags[token] == 1

    def __len__(self) -> int:
        return self._flags.count(1)

    @property
    def nbytes(self) -> int:
        return len(self._flags)


class StopMatcher:
    """Decides whether a row has hit a stop string, mostly by one lookup."""

    def __init__(self, tokenizer: Any, vocab: list[str], stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        flags = VocabText.of(tokenizer, vocab).containing(self.stops) if self.stops else np.zeros(0, dtype=bool)
        self.token_ids = TokenSet(flags)
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


class StopMatchers:
    """A tokenizer's matchers by stop tuple, the ``size`` most recently used kept (thread-safe)."""

    def __init__(self, tokenizer: Any, size: int = MATCHER_CACHE_SIZE) -> None:
        if size < 1:
            raise ValueError(f"the stop-matcher cache needs room for at least one matcher, got {size}")
        self.tokenizer = tokenizer
        self.size = size
        self._kept: OrderedDict[tuple[str, ...], StopMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._none = StopMatcher(tokenizer, [], ())  # the matcher of no stop string, kept apart (it costs nothing)

    def __len__(self) -> int:
        return len(self._kept)

    def cached(self, stops: Sequence[str]) -> StopMatcher | None:
        """The kept matcher of ``stops`` (marked as just used), or None: nothing is built but the empty one."""
        key = tuple(stops)
        if not any(key):
            return self._none  # no stop string: no vocabulary to scan
        with self._lock:
            matcher = self._kept.get(key)
            if matcher is not None:
                self._kept.move_to_end(key)
            return matcher

    def get(self, stops: Sequence[str]) -> StopMatcher:
        """The matcher of ``stops``, built (outside the lock) if not kept; the least recently used one goes."""
        matcher = self.cached(stops)
        if matcher is not None:
            return matcher
        key = tuple(stops)
        matcher = StopMatcher(self.tokenizer, decoded_vocab(self.tokenizer), key)
        with self._lock:
            self._kept[key] = matcher
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return matcher
