"""QA prompts: the templates, in a registry, and the prompt each record was answered with.

See docs/methods.md "Generation and judging".

A template turns a QA item into a prompt string for a backend and says where
an answer stops. The template's name goes into every record's provenance.

- ``chat``: "Answer the following question." inside the model's chat template.
- ``compound``: a numbered list of questions, one short sentence per answer, after one worked
  example in the chat (the long-answer benchmark, docs/claims.md).
- ``fewshot``: three ``Question: …\\nAnswer: …`` examples, no chat template, the
  answer cut at the first newline. Measured on SmolLM2-135M, this gives short
  keyword answers where the chat prompt gives full sentences, which keeps the
  lexical consistency judge honest; it is the embedded default's template.

Whatever re-runs the model on a record's question (a teacher-forced pass, a
hidden state, EliCal's head, which reads the QA prompt alone, before any
answer exists) must see exactly the context the answer was generated in:
:func:`record_prompts` renders each record under the template named in its
provenance, and :func:`records_template` picks that template, taking the one
asked for (``auto``: the model's default) for records without one (imported
HonestyBench files). Raw questions are rendered with :func:`render_prompts`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.backends.chat import TokenizerChat
from candor.backends.default_model import DEFAULT_MODEL
from candor.data.items import OPTION_LETTERS, QAItem
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)


# Written for candor; deliberately not drawn from any benchmark.
FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("In which year did the Berlin Wall fall?", "1989"),
)


def question_text(item: QAItem) -> str:
    """The question as shown to the model: passage and lettered options for multiple choice."""
    parts = []
    if item.context:
        parts.append(item.context.strip())
    parts.append(item.question.strip())
    if item.choices is not None:
        parts.extend(f"{OPTION_LETTERS[i]}. {c}" for i, c in enumerate(item.choices))
    return "\n".join(parts)


@dataclass(frozen=True)
class QATemplate:
    name: str
    render: Callable[[QAItem, Backend], str]
    stop: tuple[str, ...] = ()

    def __call__(self, item: QAItem, backend: Backend) -> str:
        return self.render(item, backend)


TEMPLATES: Registry[QATemplate] = Registry("prompt template")


def _render_chat(item: QAItem, backend: Backend) -> str:
    """The instruction and question as the last user turn, after the conversation it was asked in."""
    instruction = (
        "Answer the following multiple-choice question with the option letter."
        if item.is_multiple_choice
        else "Answer the following question."
    )
    user = f"{instruction}\nQuestion: {question_text(item)}"
    earlier = [{"role": role, "content": text} for role, text in item.history]
    return backend.render_chat([*earlier, {"role": "user", "content": user}])


def _render_fewshot(item: QAItem, backend: Backend) -> str:
    """The examples, then the conversation as more ``Question:``/``Answer:`` lines, then the question.

    A system message comes first, as plain text. Line breaks inside earlier turns
    become spaces: a newline ends an answer in this template.
    """
    system = "".join(f"{_one_line(text)}\n" for role, text in item.history if role == "system")
    shots = "".join(f"Question: {q}\nAnswer: {a}\n" for q, a in FEWSHOT_EXAMPLES)
    turns = "".join(f"{FEWSHOT_ROLES[role]}: {_one_line(text)}\n" for role, text in item.history if role != "system")
    return f"{system}{shots}{turns}Question: {question_text(item)}\nAnswer:"


FEWSHOT_ROLES = {"user": "Question", "assistant": "Answer"}


def _one_line(text: str) -> str:
    return " ".join(text.split())


TEMPLATES.register("chat")(QATemplate("chat", _render_chat))
TEMPLATES.register("fewshot")(QATemplate("fewshot", _render_fewshot, stop=("\n",)))

# ``compound``: several questions in one prompt (an item whose ``question`` is the numbered list),
# answered one short sentence per question after one worked example in the conversation. Without
# the example the embedded model echoes the questions back (docs/claims.md "The compound benchmark").
COMPOUND_INSTRUCTION = "Answer each question in one short sentence."
COMPOUND_EXAMPLE: tuple[tuple[str, str], ...] = (  # written for candor, not drawn from any benchmark
    ("Which animal is known as the ship of the desert?", "The camel is known as the ship of the desert."),
    ("What color do you get by mixing blue and yellow?", "Mixing blue and yellow gives green."),
    ("How many strings does a standard violin have?", "A standard violin has four strings."),
)


def numbered(lines: Sequence[str]) -> str:
    """``1. first\n2. second…``: the form of a compound question and of its answer."""
    return "\n".join(f"{i}. {line}" for i, line in enumerate(lines, start=1))


def _render_compound(item: QAItem, backend: Backend) -> str:
    shot_q = numbered([q for q, _ in COMPOUND_EXAMPLE])
    shot_a = numbered([a for _, a in COMPOUND_EXAMPLE])
    return backend.render_chat(
        [
            {"role": "user", "content": f"{COMPOUND_INSTRUCTION}\n{shot_q}"},
            {"role": "assistant", "content": shot_a},
            {"role": "user", "content": f"{COMPOUND_INSTRUCTION}\n{question_text(item)}"},
        ]
    )


TEMPLATES.register("compound")(QATemplate("compound", _render_compound))


def resolve_template(name: str, model_name: str, backend: Backend | None = None) -> QATemplate:
    """``auto`` picks ``fewshot`` for the embedded default and for models without a chat template."""
    if name != "auto":
        return TEMPLATES.get(name)
    if model_name == DEFAULT_MODEL:
        return TEMPLATES.get("fewshot")
    if backend is not None:
        try:
            backend.render_chat([{"role": "user", "content": "x"}])
        except CandorError:
            return TEMPLATES.get("fewshot")
    return TEMPLATES.get("chat")


def records_template(records: Sequence[Record], requested: str, chat: TokenizerChat) -> str:
    """The template name to train with: the records' own, else ``requested`` (``auto`` resolved)."""
    named = sorted({str(r.provenance["template"]) for r in records if r.provenance.get("template")})
    if len(named) > 1:
        raise CandorError(
            f"the records were annotated with different prompt templates {named}; "
            "train on records made with one template"
        )
    if named:
        if requested not in ("auto", named[0]):
            logger.warning(
                "the records were annotated with template %r but %r was asked for; training on %r prompts",
                named[0],
                requested,
                requested,
            )
            return TEMPLATES.get(requested).name
        return TEMPLATES.get(named[0]).name
    return resolve_template(requested, chat.model_name, chat).name  # type: ignore[arg-type]


def as_items(inputs: Sequence[Record | QAItem | str]) -> list[QAItem]:
    """QA items from records, items or raw question strings."""
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, Record):
            out.append(x.item)
        elif isinstance(x, QAItem):
            out.append(x)
        elif isinstance(x, str):
            out.append(QAItem(id=f"q{i}", dataset="", split="", question=x, answers=()))
        else:
            raise CandorError(f"input {i} is a {type(x).__name__}; expected a record, a QA item or a question string")
    return out


def render_prompts(inputs: Sequence[Record | QAItem | str], template: str, chat: TokenizerChat) -> list[str]:
    """The QA prompt of each input under ``template``."""
    qa: QATemplate = TEMPLATES.get(template)
    return [qa(item, chat) for item in as_items(inputs)]  # type: ignore[arg-type]


def record_prompts(records: Sequence[Record], backend: Backend) -> tuple[list[str], str]:
    """Each record's QA prompt and the template's name."""
    template = records_template(records, "auto", backend)  # type: ignore[arg-type]
    return render_prompts(records, template, backend), template  # type: ignore[arg-type]
