"""What the confidence head reads: the QA prompt alone, before any answer exists (DESIGN.md §4.4).

The prompt is the one the records were annotated with: the template named in
each record's provenance. Records without one (imported HonestyBench files)
take the template the caller asks for, ``auto`` picking the backbone's
default. Raw questions are rendered with the template a trained head saved.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from candor.backends.chat import TokenizerChat
from candor.data.items import QAItem
from candor.errors import CandorError
from candor.prompts import TEMPLATES, QATemplate, resolve_template
from candor.records import Record

logger = logging.getLogger(__name__)



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
