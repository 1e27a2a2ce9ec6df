"""Text matching: how the lexical judges and similarities compare a response with a gold alias or another response.

The choices, made once here and used by every lexical judge (:mod:`candor.annotation.judges`):

- :func:`normalize` is SQuAD-style (lower-case, drop punctuation and the
  articles a/an/the, squeeze whitespace) and additionally folds accents with
  Unicode NFKD, so "Zürich" matches "Zurich", and case-folds, so "ß" matches "ss".
  Punctuation is deleted, not replaced by a space, as in SQuAD: "U.S." -> "us".
- Containment is on word boundaries: the alias "5" is not found in "15", and
  "paris" is not found in "parisian".
- An *empty answer* is one with no letter or digit (:func:`is_empty_answer`:
  "", ".", "..."), exactly the answers ROUGE-L finds no tokens in. It is never
  equivalent to anything, another empty answer included: saying nothing twice
  is not agreeing on an answer. Every consistency judge and every sample
  similarity (:mod:`candor.estimators.semantic`) applies this one rule.
- A single-letter alias (a multiple-choice option letter such as "B") cannot go
  through :func:`normalize` ("A" is an article), so it has its own rule: it
  matches a response that is exactly that letter, or starts with it followed by
  a non-letter ("B", "B.", "(B) Paris"). It is not searched for inside longer
  responses, where a lone letter is too ambiguous.
- A numeric alias ("100", "1,000", "3.5") also matches a number in the response
  of the same value (:func:`contains_number`): "100.00" is "100", although
  normalization alone would read it as "10000".
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
# Opening characters allowed before an option letter: "(B)", "[B]", '"B"'.
_LETTER_OPENERS = "([{\"'*`"


def fold_accents(text: str) -> str:
    """Strip combining marks after NFKD decomposition ("Zürich" -> "Zurich")."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize(text: str) -> str:
    """SQuAD-style normalization with accent folding (see the module docstring)."""
    text = fold_accents(text).casefold()
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# A number as written: digits, optional thousands commas and decimals, not inside a word or a longer number.
_NUMBER = re.compile(r"(?<![\w.,])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?![\w]|[.,]\d)")


def number_value(text: str) -> Decimal | None:
    """The value of ``text`` when it is one number and nothing else ("1,000" -> 1000), else None."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def contains_number(response: str, alias: str) -> bool:
    """Whether ``alias`` is a number and ``response`` holds a number of the same value ("100.00" for "100")."""
    value = number_value(alias)
    if value is None:
        return False
    return any(Decimal(m.group().replace(",", "")) == value for m in _NUMBER.finditer(response))


def contains_words(haystack: str, needle: str) -> bool:
    """Whether normalized ``needle`` occurs in normalized ``haystack`` on word boundaries."""
    return bool(needle) and f" {needle} " in f" {haystack} "


def rouge_tokens(text: str) -> list[str]:
    """Tokens for ROUGE-L: accent-folded, lower-cased, punctuation split off.

    Like the rouge-score package, articles are kept and every non-alphanumeric
    character separates tokens.
    """
    text = fold_accents(text).casefold()
    return "".join(ch if ch.isalnum() else " " for ch in text).split()


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def is_empty_answer(text: str) -> bool:
    """Whether an answer says nothing: no letter or digit, so no ROUGE-L token."""
    return not rouge_tokens(text)


def rouge_l_f1(a: str, b: str) -> float:
    """ROUGE-L F1 between two strings (0.0 when either has no tokens)."""
    ta, tb = rouge_tokens(a), rouge_tokens(b)
    if not ta or not tb:
        return 0.0
    # F1 of P = lcs/|b| and R = lcs/|a| simplifies to 2·lcs / (|a| + |b|).
    return 2 * _lcs_length(ta, tb) / (len(ta) + len(tb))


def token_f1(response: str, gold: str) -> float:
    """SQuAD token F1 between the normalized strings (0.0 when either is empty)."""
    pred, ref = normalize(response).split(), normalize(gold).split()
    overlap = sum((Counter(pred) & Counter(ref)).values())
    if overlap == 0:
        return 0.0
    return 2 * overlap / (len(pred) + len(ref))


def single_letter(alias: str) -> str | None:
    """The lower-cased letter when ``alias`` is one letter (an option letter), else None."""
    stripped = alias.strip()
    if len(stripped) == 1 and stripped.isalpha():
        return stripped.casefold()
    return None


def _letter_head(response: str) -> str:
    return fold_accents(response).strip().lstrip(_LETTER_OPENERS).casefold()


def letter_matches(response: str, letter: str) -> bool:
    """Whether ``response`` is option ``letter`` alone or followed by a non-letter ("B. Paris")."""
    head = _letter_head(response)
    return head[:1] == letter and (len(head) == 1 or not head[1].isalpha())


def letter_equals(response: str, letter: str) -> bool:
    """Whether ``response`` is exactly option ``letter``, up to punctuation and case."""
    head = "".join(ch for ch in _letter_head(response) if not _is_punct(ch)).strip()
    return head == letter
