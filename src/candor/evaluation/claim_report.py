"""The claim report: claim confidences scored, evaluated by answer, written with report.html.

See docs/claims.md "Evaluation". :func:`write_claim_report` takes records whose
claims are split and labelled, scores the claim estimators named, and writes:

- ``claim_confidences.jsonl``: one row per claim (``id`` ``<record id>#<claim index>``,
  ``answer``, ``dataset``, ``correct`` (its label), ``failure``, ``confidence``
  by method), the claim-level counterpart of the confidences file;
- ``claim_metrics.json``: AUROC, ECE, PRR, AURC per method with intervals
  bootstrapped by answer, and factual precision at 50 / 75 / 90% of claims kept;
- ``report/``: the evaluation report over scored claims (``report.html`` with
  the refinement plot). Its own intervals would resample claims, so it is
  written without a bootstrap: the intervals are those of ``claim_metrics.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.estimators.claim_scoring import score_record_claims
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable
from candor.evaluation.claims import claim_metrics, precision_at_kept, refinement_rows
from candor.evaluation.report import write_report
from candor.util.errors import CandorError
from candor.util.files import atomic_write_text
from candor.util.jsonl import write_json_lines

logger = logging.getLogger(__name__)


def claim_rows(records: Sequence[Record], values: dict[str, list[list[float]]]) -> list[dict[str, Any]]:
    """One row per claim with every method's confidence (see the module docstring)."""
    rows = []
    for i, rec in enumerate(records):
        for j, claim in enumerate(rec.claims or []):
            rows.append(
                {
                    "id": f"{rec.id}#{j}",
                    "answer": rec.id,
                    "dataset": rec.item.dataset,
                    "correct": claim.label,
                    "failure": claim.failure,
                    "text": claim.text,
                    "confidence": {m: float(v[i][j]) for m, v in values.items()},
                }
            )
    return rows


def write_claim_report(
    records: Sequence[Record],
    methods: Sequence[str],
    out_dir: str | Path,
    backend: Backend | None = None,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Score, evaluate and write (see the module docstring); returns the metrics written."""
    if not any(c.scored for r in records for c in r.claims or []):
        raise CandorError("no labelled claim to evaluate: split and label the answers' claims first")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    values = {m: score_record_claims(m, records, backend, **(options or {}).get(m, {})) for m in methods}
    rows = claim_rows(records, values)
    write_json_lines(out / "claim_confidences.jsonl", rows)
    scored = [r for r in rows if r["correct"] is not None and r["failure"] is None]
    labels, groups = [r["correct"] for r in scored], [r["answer"] for r in scored]
    metrics: dict[str, Any] = {
        "claims": len(rows),
        "scored": len(scored),
        "answers": len(set(groups)),
        "bootstrap": bootstrap,
        "methods": {},
    }
    for m in methods:
        conf = [r["confidence"][m] for r in scored]
        metrics["methods"][m] = claim_metrics(conf, labels, groups, bootstrap=bootstrap, seed=seed) | {
            "refinement": precision_at_kept(conf, labels, groups, bootstrap=bootstrap, seed=seed)
        }
    atomic_write_text(out / "claim_metrics.json", json.dumps(metrics, indent=2))
    table = ConfidenceTable([ConfidenceRow(r["id"], r["dataset"], r["correct"], dict(r["confidence"])) for r in scored])
    curves = refinement_rows({m: ([r["confidence"][m] for r in scored], labels) for m in methods})
    write_report(table, out / "report", title="candor claim report", claims=curves, command=command)
    logger.info("claim report: %d claims (%d scored) in %s", len(rows), len(scored), out)
    return metrics
