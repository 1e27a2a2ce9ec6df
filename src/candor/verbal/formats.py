"""Verbalized answer-level confidence: the five formats of ADVICE and their prompt.

See docs/methods.md "Verbalized answer-level confidence".

A format says how the model is asked to state its confidence ({SCORE} in the
prompt), which values it may state, and what each value means on [0, 1]:

============  =====================================  ==========================
format        labels (what the model writes)         value
============  =====================================  ==========================
ScoreLetter   A, B, C, D, E                          0.9, 0.7, 0.5, 0.3, 0.1
ScoreNumber   0 … 9                                  i / 9
ScoreText     very high, high, medium, low, very low 0.9, 0.7, 0.5, 0.3, 0.1
ScoreFloat    0.0, 0.1, … 1.0                        the number
ScorePercent  0%, 1%, … 100%                         n / 100
============  =====================================  ==========================

To score a given answer ``a`` the prompt ends with the assistant turn
``Answer: {a}\\nConfidence:`` and P(C | q, a) is the model's distribution over
the labels at the next position, renormalized over the labels; the
answer-level confidence is μ = Σ_c P(c)·value(c). Each label is read in two
surface forms, with and without a leading space, whose probabilities add up;
see :func:`candor.verbal.distribution.candidate_distribution` for how
single-token and multi-token labels are scored.

Two choices made here:

- ScorePercent labels carry the "%" sign. Without it "8" would be a prefix of
  "80" and its probability would include every percentage starting with 8;
  the prompt asks for "a confidence score in percentage", so the model's own
  reply is "80%".
- ScoreFloat labels have one decimal, so "0.1" also collects "0.15" and the
  like: a float reply is truncated to its first decimal.

Black-box backends (no exact next-token log-probs) generate the confidence
text instead; it is parsed into one label (a one-hot distribution), and a
reply with no label gets the uniform distribution, whose μ is 0.5 in every
format. The count of such replies is logged and returned. A numeric reply
follows one rule, the white-box one: its first number must lie in the
format's range and is truncated (never rounded) to the format's grid, as the
label "0.2" collects the continuation "0.25" when log-probs are read. So
"0.25" and "0.29" are 0.2 and "0.35" is 0.3 in ScoreFloat, "7.5" is 7 in
ScoreNumber and "37.5%" is 37%. A fraction below 1 written with a decimal
point where the scale is 0–9 or a percentage without the "%" sign ("0.8") is
a probability on another scale, not a label: it counts as a reply with no
label rather than being read as 0 or 0.8%.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

import numpy as np
from jinja2 import TemplateError

from candor.annotation.prompts import question_text
from candor.backends.base import NEXT_TOKEN_LOGPROBS, SCORE, Backend, SamplingParams, backend_capabilities
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.util.registry import Registry
from candor.verbal.distribution import candidate_distribution

logger = logging.getLogger(__name__)

TASK_OPEN = "Provide only a short answer in the form of keywords to the following question."
TASK_MC = (
    "The following multiple-choice question has only one correct answer. "
    "Provide only the option letter of the correct answer."
)
SYSTEM_TEMPLATE = (
    "{task} After your answer, provide {score} which measures how confident you are in your answer."
    "{extra} Use the following format to respond:\n"
    "Answer: [Write your answer here.]\n"
    "Confidence: [Write your confidence score here.]"
)
PROMPTING_SENTENCE = (
    "Take your uncertainty in the prompt, the task difficulty, your knowledge availability and other "
    "sources of uncertainty into account. Ideally, the score should correspond to the empirical "
    "accuracy of your answer."
)
CONFIDENCE_CUE = "Confidence:"


# ---------------------------------------------------------------- formats


@dataclass(frozen=True)
class VerbalFormat:
    """One way of stating confidence: the {SCORE} phrase, the labels and their values."""

    name: str
    key: str
    score_phrase: str
    labels: tuple[str, ...]
    values: tuple[float, ...]
    parse: Callable[[str], int | None]  # generated confidence text → label index, or None

    @property
    def n_values(self) -> int:
        return len(self.labels)

    @property
    def value_array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=float)


_LETTER = re.compile(r"(?<![A-Za-z])([A-E])(?![A-Za-z])")
_LEVEL = re.compile(r"\b(very high|very low|high|medium|low)\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?|\.\d+)(\s*%)?")


def _parse_letter(text: str) -> int | None:
    m = _LETTER.search(text)
    return "ABCDE".index(m.group(1)) if m else None


_LEVELS = ("very high", "high", "medium", "low", "very low")


def _parse_level(text: str) -> int | None:
    m = _LEVEL.search(text)
    return _LEVELS.index(m.group(1).lower()) if m else None


def _parse_scaled(text: str, top: int, steps: int) -> int | None:
    """The label index of the first number in [0, top], truncated to ``steps + 1`` equally spaced labels.

    Decimal arithmetic, so "0.3" is exactly label 3 of ScoreFloat (0.3 * 10 in
    floats is 2.9999…). On a 0–``top`` scale with ``top`` > 1, a fraction below
    1 with a decimal point and no "%" is a probability, not a label: None.
    """
    m = _NUMBER.search(text)
    if not m:
        return None
    number, percent = m.group(1), bool(m.group(2))
    x = Decimal(number)
    if not 0 <= x <= top:
        return None
    if top > 1 and x < 1 and "." in number and not percent:
        return None
    return int((x * steps / top).to_integral_value(rounding=ROUND_FLOOR))


FORMATS: Registry[VerbalFormat] = Registry("verbalized confidence format")

_FORMAT_LIST = (
    VerbalFormat(
        name="ScoreLetter",
        key="letter",
        score_phrase="a confidence score between A (very high confidence) and E (very low confidence)",
        labels=tuple("ABCDE"),
        values=(0.9, 0.7, 0.5, 0.3, 0.1),
        parse=_parse_letter,
    ),
    VerbalFormat(
        name="ScoreNumber",
        key="number",
        score_phrase="a confidence score between 0 and 9",
        labels=tuple(str(i) for i in range(10)),
        values=tuple(i / 9 for i in range(10)),
        parse=lambda text: _parse_scaled(text, 9, 9),
    ),
    VerbalFormat(
        name="ScoreText",
        key="text",
        score_phrase="one of: very high, high, medium, low, very low",
        labels=_LEVELS,
        values=(0.9, 0.7, 0.5, 0.3, 0.1),
        parse=_parse_level,
    ),
    VerbalFormat(
        name="ScoreFloat",
        key="float",
        score_phrase="a confidence score between 0.0 and 1.0",
        labels=tuple(f"{i / 10:.1f}" for i in range(11)),
        values=tuple(i / 10 for i in range(11)),
        parse=lambda text: _parse_scaled(text, 1, 10),
    ),
    VerbalFormat(
        name="ScorePercent",
        key="percent",
        score_phrase="a confidence score in percentage",
        labels=tuple(f"{n}%" for n in range(101)),
        values=tuple(n / 100 for n in range(101)),
        parse=lambda text: _parse_scaled(text, 100, 100),
    ),
)
for _fmt in _FORMAT_LIST:
    FORMATS.register(_fmt.key)(_fmt)


def get_format(name: str | VerbalFormat) -> VerbalFormat:
    """A format by key (``letter``) or by its paper name (``ScoreLetter``)."""
    if isinstance(name, VerbalFormat):
        return name
    key = name.strip().lower()
    return FORMATS.get(key[len("score") :] if key.startswith("score") else key)


VARIANTS: Registry[str] = Registry("verbalized confidence variant")
VARIANTS.register("default")("")
VARIANTS.register("prompting")(PROMPTING_SENTENCE)


# ---------------------------------------------------------------- prompts


def system_text(fmt: str | VerbalFormat, multiple_choice: bool, variant: str = "default") -> str:
    """The §4.3 system text for one format, task kind and variant."""
    extra = VARIANTS.get(variant)
    return SYSTEM_TEMPLATE.format(
        task=TASK_MC if multiple_choice else TASK_OPEN,
        score=get_format(fmt).score_phrase,
        extra=f" {extra}" if extra else "",
    )


def render_turns(backend: Backend, system: str | None, user: str, assistant_prefix: str = "") -> str:
    """Render (system +) user turns with the chat template, then open the assistant turn with a prefix.

    The prefix is appended after the template's generation prompt rather than
    rendered as an assistant message, so the template cannot close the turn
    and the prompt ends exactly with ``assistant_prefix``. A template that
    rejects the system role gets the system text at the top of the user turn;
    a backend without a chat template gets plain text.
    """
    merged = f"{system}\n\n{user}" if system else user
    attempts = [[{"role": "user", "content": merged}]]
    if system:
        attempts.insert(0, [{"role": "system", "content": system}, {"role": "user", "content": user}])
    for messages in attempts:
        try:
            return backend.render_chat(messages, add_generation_prompt=True) + assistant_prefix
        except TemplateError:
            continue  # e.g. "System role not supported": try the merged turn
        except CandorError:
            break  # no chat template at all
    return f"{merged}\n{assistant_prefix}"


def user_text(item: QAItem) -> str:
    return f"Question: {question_text(item)}"


def format_prompt(
    backend: Backend, item: QAItem, answer: str, fmt: str | VerbalFormat, variant: str = "default"
) -> str:
    """The prompt that scores ``answer``: it ends with ``Answer: {a}\\nConfidence:``."""
    system = system_text(fmt, item.is_multiple_choice, variant)
    return render_turns(backend, system, user_text(item), f"Answer: {answer.strip()}\n{CONFIDENCE_CUE}")


def answer_prompt(backend: Backend, item: QAItem, fmt: str | VerbalFormat, variant: str = "default") -> str:
    """The format prompt with an open assistant turn, for generating answer and confidence."""
    system = system_text(fmt, item.is_multiple_choice, variant)
    return render_turns(backend, system, user_text(item))


_ANSWER_LINE = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


def parse_answer(reply: str) -> str:
    """The answer in a ``Answer: …\\nConfidence: …`` reply (the first line when no ``Answer:``)."""
    head = re.split(r"\n|confidence\s*:", reply, maxsplit=1, flags=re.IGNORECASE)[0]
    m = _ANSWER_LINE.search(head)
    return (m.group(1) if m else head).strip()


# ---------------------------------------------------------------- P(C | q, a) and μ


def distribution_from_prompts(
    backend: Backend, prompts: Sequence[str], fmt: str | VerbalFormat
) -> tuple[np.ndarray, int]:
    """P(C) over ``fmt``'s labels at the end of each prompt, and the number of unparsed replies.

    Backends that give next-token and continuation log-probs (hf, vllm, a
    vLLM server) read log-probs (no replies, so the count is 0); black-box
    backends generate and parse (see the module docstring).
    """
    fmt = get_format(fmt)
    if {NEXT_TOKEN_LOGPROBS, SCORE} <= backend_capabilities(backend):
        return candidate_distribution(backend, prompts, fmt.labels), 0
    return _generated_distribution(backend, prompts, fmt)


def _generated_distribution(backend: Backend, prompts: Sequence[str], fmt: VerbalFormat) -> tuple[np.ndarray, int]:
    params = SamplingParams(max_new_tokens=8, stop=("\n",))
    gens = backend.generate(list(prompts), 0, params, greedy=True)
    out = np.full((len(prompts), fmt.n_values), 1.0 / fmt.n_values)
    failures = 0
    for row, gen in zip(out, gens, strict=True):
        index = fmt.parse(gen.greedy.text if gen.greedy is not None else "")
        if index is None:
            failures += 1
            continue
        row[:] = 0.0
        row[index] = 1.0
    if failures:
        logger.warning(
            "%s: %d of %d replies stated no confidence; they get the uniform distribution",
            fmt.name,
            failures,
            len(prompts),
        )
    return out, failures


def confidence_distribution(
    backend: Backend,
    items: Sequence[QAItem],
    answers: Sequence[str],
    fmt: str | VerbalFormat,
    variant: str = "default",
) -> np.ndarray:
    """P(C | q, a) over the format's labels, shape ``(len(items), n_values)``, rows summing to 1."""
    if len(items) != len(answers):
        raise CandorError(f"confidence_distribution: {len(items)} items but {len(answers)} answers")
    prompts = [format_prompt(backend, it, a, fmt, variant) for it, a in zip(items, answers, strict=True)]
    return distribution_from_prompts(backend, prompts, fmt)[0]


def mu_error_bound(dropped_share: np.ndarray, mu: np.ndarray, fmt: str | VerbalFormat) -> np.ndarray:
    """The most μ can differ from the exact μ when at most ``dropped_share`` of the exact mass was dropped.

    With the kept labels renormalized, μ_exact = (1 - s)·μ + s·μ_dropped for
    the share s ≤ ``dropped_share`` of the exact distribution on the dropped
    labels, so |μ_exact - μ| = s·|μ_dropped - μ| ≤ ``dropped_share`` · max_c |value(c) - μ|.
    """
    values = get_format(fmt).value_array
    mu = np.asarray(mu, dtype=float)
    spread = np.maximum(np.abs(values.max() - mu), np.abs(mu - values.min()))
    return np.asarray(dropped_share, dtype=float) * spread


def expected_confidence(distribution: np.ndarray, fmt: str | VerbalFormat) -> np.ndarray:
    """μ = Σ_c P(c)·value(c) for each row of ``distribution``."""
    fmt = get_format(fmt)
    dist = np.asarray(distribution, dtype=float)
    if dist.ndim != 2 or dist.shape[1] != fmt.n_values:
        raise CandorError(f"{fmt.name}: expected a (n, {fmt.n_values}) distribution, got shape {dist.shape}")
    return dist @ fmt.value_array
