"""``candor demo``: the whole pipeline on the embedded default and the starter set.

Annotate (small k) → score with the training-free and verbalized estimators →
evaluate → report → a tuned honest model in ``OUT_DIR/honest`` (n-prob, the
threshold that answers the more confident half of the starter questions), ready
for ``candor serve --honest OUT_DIR/honest``. Every stage caches to files under
the output folder, so a rerun reuses the annotations and the confidences
already computed.

The honest model's threshold is tuned on the starter questions themselves: it
is a working example, not an evaluated one; tune on your own dev set
(``HonestModel.tune``) for real use.

With a ``system_prompt`` every starter question is asked after that one system
message (rendered by the QA template as the server renders a chat request with
it), so the honest model is tuned, and reported calibrated, for requests with
that system prompt (:mod:`candor.serve.shapes`); its records and confidences are
cached in files named for the prompt's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.prompts import resolve_template
from candor.annotation.records import read_records
from candor.backends import load_backend
from candor.backends.default_model import DEFAULT_MODEL
from candor.data import load_items
from candor.estimators import ESTIMATORS
from candor.estimators.confidences import ConfidenceTable, score_into
from candor.evaluation.report import ReportResult, write_report
from candor.serve.answering import Decoding
from candor.serve.model import HonestModel
from candor.serve.shapes import SYSTEM_PREFIX, system_shape

logger = logging.getLogger(__name__)

DEMO_ESTIMATORS: tuple[str, ...] = (
    "prob",
    "n-prob",
    "min-prob",
    "consis-lex",
    "consis-sem",
    "verbal-number",
    "length",
)
# One verbalized format keeps `make demo` near 3 minutes on 2 cores: each LM-scored estimator
# costs about as much CPU as half the annotation (benchmarks/demo_cost.py). The training-free
# estimators read the annotations and cost nothing. Ask for more with `candor demo -e ...`
# (p-true, verbal-0, verbal-letter, verbal-text, verbal-float, verbal-percent) or `candor score`;
# verbal-percent, exact over its 101 values, costs about 5x a single-token format.
# `length` (the answer-length baseline, 1/(1+tokens) without a dev set) is there so every table
# shows what a method must beat.
DEMO_BOOTSTRAP = 200  # resamples for the 95% intervals of the report's main table


HONEST_METHOD = "n-prob"
HONEST_COVERAGE = 0.5  # the demo's honest model answers the more confident half of its questions


@dataclass
class DemoResult:
    records: Path
    confidences: Path
    report: ReportResult
    table: ConfidenceTable
    honest: Path | None = None


def run_demo(
    out_dir: str | Path = "candor-out/demo",
    *,
    model: str = DEFAULT_MODEL,
    k: int = 5,
    limit: int | None = None,
    estimators: Sequence[str] = DEMO_ESTIMATORS,
    batch_size: int = 16,
    command: str | None = None,
    system_prompt: str | None = None,
) -> DemoResult:
    """Run the demo pipeline; each stage resumes from the files already in ``out_dir``.

    ``system_prompt``: ask every question after this system message (the deployment's), and tune for it.
    """
    out_dir = Path(out_dir)
    for name in estimators:  # an unknown name fails before any model work
        ESTIMATORS.get(name)
    items = load_items("starter", limit=limit)
    # Files of questions asked after a system prompt are named for it: a rerun never mixes two prompts.
    suffix = ""
    if system_prompt is not None:
        items = [replace(item, history=(("system", system_prompt),)) for item in items]
        suffix = "-system-" + system_shape(system_prompt)[len(SYSTEM_PREFIX) :]
    backend = load_backend(model, batch_size=batch_size)
    template = resolve_template("auto", model, backend)
    records_path = out_dir / f"records{suffix}.jsonl"
    logger.info("1/4 annotate %d starter questions (k=%d) → %s", len(items), k, records_path)
    annotate(items, backend, records_path, template, AnnotateConfig(k=k, batch_size=batch_size))

    wanted = {item.id for item in items}
    records = [r for r in read_records(records_path) if r.id in wanted]
    confidences_path = out_dir / f"confidences{suffix}.jsonl"
    logger.info("2/4 score with %d estimators → %s", len(estimators), confidences_path)
    table = score_into(records, estimators, confidences_path, backend)

    logger.info("3/4 evaluate → %s", out_dir / "report")
    report = write_report(
        table,
        out_dir / "report",
        title=f"candor demo: {model} on the starter set{' after a system prompt' if system_prompt else ''}",
        bootstrap=DEMO_BOOTSTRAP,
        records=records,
        command=command,
    )

    honest = out_dir / "honest"
    logger.info("4/4 tune an honest model (%s, coverage %.1f) → %s", HONEST_METHOD, HONEST_COVERAGE, honest)
    tuned = HonestModel(
        backend,
        HONEST_METHOD,
        template=template.name,
        decoding=Decoding(max_new_tokens=AnnotateConfig().params.max_new_tokens),
    )
    tuned.tune(records, "coverage", HONEST_COVERAGE)  # tuned for the records' shape: alone, or after the system prompt
    tuned.save_pretrained(honest)
    return DemoResult(records=records_path, confidences=confidences_path, report=report, table=table, honest=honest)
