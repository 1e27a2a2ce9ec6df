"""QA prompt templates (DESIGN.md §4.1), in a registry.

A template turns a QA item into a prompt string for a backend and says where
an answer stops. The template's name goes into every record's provenance.

- ``chat``: "Answer the following question." inside the model's chat template.
- ``fewshot``: three ``Question: …\\nAnswer: …`` examples, no chat template, the
  answer cut at the first newline. Measured on SmolLM2-135M, this gives short
  keyword answers where the chat prompt gives full sentences, which keeps the
  lexical consistency judge honest; it is the embedded default's template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from candor.backends.base import Backend
from candor.backends.default_model import DEFAULT_MODEL
from candor.data.items import OPTION_LETTERS, QAItem
from candor.errors import CandorError
from candor.registry import Registry

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
    instruction = (
        "Answer the following multiple-choice question with the option letter."
        if item.is_multiple_choice
        else "Answer the following question."
    )
    user = f"{instruction}\nQuestion: {question_text(item)}"
    return backend.render_chat([{"role": "user", "content": user}])


def _render_fewshot(item: QAItem, backend: Backend) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n" for q, a in FEWSHOT_EXAMPLES)
    return f"{shots}Question: {question_text(item)}\nAnswer:"


TEMPLATES.register("chat")(QATemplate("chat", _render_chat))
TEMPLATES.register("fewshot")(QATemplate("fewshot", _render_fewshot, stop=("\n",)))


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
