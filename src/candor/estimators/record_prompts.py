"""The QA prompt each record was answered with, for estimators that re-run the model on it.

The template is the one named in the records' provenance (``auto`` picks the
model's default for records without one, e.g. HonestyBench imports), so a
teacher-forced pass or a hidden state sees exactly the context the answer was
generated in.
"""

from __future__ import annotations

from collections.abc import Sequence

from candor.backends.base import Backend
from candor.records import Record


def record_prompts(records: Sequence[Record], backend: Backend) -> tuple[list[str], str]:
    """Each record's QA prompt and the template's name."""
    from candor.elical.inputs import records_template, render_prompts  # imports torch: only when used

    template = records_template(records, "auto", backend)  # type: ignore[arg-type]
    return render_prompts(records, template, backend), template  # type: ignore[arg-type]
