"""Splitting an answer into claims: the decomposers, in a registry (docs/claims.md "Claims").

- ``sentence`` (default, no model): one claim per sentence, list item or line,
  and clauses split at ``;``. List markers (numbering such as ``1.``, ``2)``,
  ``(a)``, ``iv.``; bullets such as ``-``, ``*``, ``•``), at a line's start or
  inside it, are left out of the claim and are never a claim of their own; a
  Markdown heading line is no claim. A token belongs to a claim when its
  characters overlap the claim's.
- ``llm``: FactScore-style atomic facts from a backend. Each sentence of the
  answer is sent with :data:`FACTS_PROMPT`; each reply line starting with ``- ``
  is one fact. **Mapping back to tokens**: a fact rests on the tokens of its
  sentence whose word (lower-cased, punctuation stripped) is one of the fact's
  words, function words left out; a fact sharing no such word rests on the
  whole sentence. Its span runs from its first to its last token's characters.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any

from candor.annotation.claims import FUNCTION_WORDS, Claim, sentence_spans, token_offsets, tokens_in_span
from candor.backends.base import Backend, Completion, SamplingParams
from candor.util.errors import CandorError
from candor.util.registry import Registry

Decomposer = Callable[..., list[Claim]]
DECOMPOSERS: Registry[Decomposer] = Registry("claim decomposer")


@DECOMPOSERS.register("sentence")
def split_sentences(
    answer_text: str, completion: Completion, *, decode: Callable[[Sequence[int]], str] | None = None
) -> list[Claim]:
    """One claim per sentence or clause (see the module docstring)."""
    offsets = token_offsets(completion, decode) if completion.tokens else []
    return [
        Claim(text=answer_text[start:end], start=start, end=end, tokens=tokens_in_span(offsets, start, end))
        for start, end in sentence_spans(answer_text)
    ]


def split_claims(answer_text: str, completion: Completion, decomposer: str = "sentence", **options: Any) -> list[Claim]:
    """Split an answer into claims with the named decomposer (``sentence``, ``llm``).

    ``answer_text`` must be ``completion.text`` (the spans index it).
    Options go to the decomposer (``decode``; ``backend`` for ``llm``).
    """
    if answer_text != completion.text:
        raise CandorError("split_claims: answer_text is not the completion's text; claim spans index that text")
    return DECOMPOSERS.get(decomposer)(answer_text, completion, **options)


FACTS_PROMPT = (
    "Please breakdown the following sentence into independent facts. "
    'Write one fact per line, each starting with "- ".\n'
    "Sentence: {sentence}"
)


def facts_of(reply: str) -> list[str]:
    """The facts of a reply: its lines that start with ``- ``, marker removed."""
    return [
        line.strip()[2:].strip()
        for line in reply.splitlines()
        if line.strip().startswith("- ") and line.strip()[2:].strip()
    ]


def _word(text: str) -> str:
    return text.strip(string.punctuation + string.whitespace).lower()


def fact_tokens(fact: str, sentence_tokens: Sequence[int], token_texts: Sequence[str]) -> list[int]:
    """The sentence's tokens whose word is one of the fact's content words (all of them when none is)."""
    words = {_word(w) for w in fact.split()} - FUNCTION_WORDS - {""}
    hits = [t for t in sentence_tokens if _word(token_texts[t]) in words]
    return hits or list(sentence_tokens)


@DECOMPOSERS.register("llm")
def split_facts(
    answer_text: str,
    completion: Completion,
    *,
    backend: Backend | None = None,
    decode: Callable[[Sequence[int]], str] | None = None,
    max_new_tokens: int = 128,
) -> list[Claim]:
    """Atomic facts of each sentence, asked of ``backend`` (see the module docstring)."""
    if backend is None:
        raise CandorError("the llm claim decomposer needs a backend (the model that writes the facts)")
    offsets = token_offsets(completion, decode)
    sentences = sentence_spans(answer_text)
    prompts = [
        backend.render_chat([{"role": "user", "content": FACTS_PROMPT.format(sentence=answer_text[a:b])}])
        for a, b in sentences
    ]
    gens = backend.generate(prompts, 0, SamplingParams(max_new_tokens=max_new_tokens), greedy=True) if prompts else []
    claims = []
    for (a, b), gen in zip(sentences, gens, strict=True):
        sentence_tokens = tokens_in_span(offsets, a, b)
        for fact in facts_of(gen.greedy.text if gen.greedy is not None else ""):
            tokens = fact_tokens(fact, sentence_tokens, completion.tokens)
            start = max(a, min(offsets[t][0] for t in tokens)) if tokens else a
            end = min(b, max(offsets[t][1] for t in tokens)) if tokens else b
            claims.append(Claim(text=fact, start=start, end=end, tokens=tokens))
    return claims
