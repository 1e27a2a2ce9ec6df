"""The report's abstention-aware scores and judge-noise correction: computed, and rendered for the page and CLI.

See docs/methods.md "Abstention-aware scores" and "Judge noise". Given
thresholds (method → threshold), :func:`trust_sections` adds the scores of
:mod:`candor.evaluation.abstention` per dataset and pooled; given a hand-labelled
sample, the corrected accuracy and the AUROC label-flip spread of
:mod:`candor.evaluation.judge_noise`. Both use the evaluation's bootstrap
count for their intervals, or :data:`DEFAULT_BOOTSTRAP` when it ran none (they
are cheap). :func:`trust_html` renders them as report.html sections and
:func:`trust_lines` as plain lines for the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.abstention import COUNTS, LABELS, SCORES, abstention_table, format_score
from candor.evaluation.judge_noise import HandLabels, judge_noise_report
from candor.util.errors import CandorError
from candor.util.pages import esc

DEFAULT_BOOTSTRAP = 1000


def trust_sections(
    table: ConfidenceTable,
    *,
    thresholds: Mapping[str, float] | None = None,
    hand_labels: HandLabels | None = None,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """``{"abstention": …}`` and/or ``{"judge_noise": …}``, for what was asked (empty when nothing was)."""
    resamples = bootstrap or DEFAULT_BOOTSTRAP
    out: dict[str, Any] = {}
    if thresholds:
        unknown = sorted(set(thresholds) - set(table.methods))
        if unknown:
            raise CandorError(
                f"a threshold names {', '.join(unknown)}, which the confidences do not hold "
                f"(methods: {', '.join(table.methods)})"
            )
        out["abstention"] = abstention_table(table, thresholds, bootstrap=resamples, seed=seed)
    if hand_labels is not None:
        out["judge_noise"] = judge_noise_report(table, hand_labels, bootstrap=resamples, seed=seed)
    if out:
        out["bootstrap"] = resamples
    return out


def _interval(values: list[Any]) -> str:
    low, high = values
    return "" if low is None or high is None else f" [{100 * low:.1f}, {100 * high:.1f}]"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def abstention_rows(sections: Mapping[str, Any]) -> list[list[str]]:
    """Header and rows: method, dataset, threshold, counts, scores (×100 with intervals)."""
    rows = [["method", "dataset", "threshold", *COUNTS, *(LABELS[s] for s in SCORES)]]
    for method, per in sections.get("abstention", {}).items():
        for dataset, entry in per.items():
            rows.append(
                [
                    method,
                    dataset,
                    f"{entry['threshold']:.3g}",
                    *(str(entry[c]) for c in COUNTS),
                    *(format_score(entry, s) for s in SCORES),
                ]
            )
    return rows


def judge_rows(sections: Mapping[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """(corrected accuracy per dataset, AUROC spread per method and dataset), each with a header row."""
    noise = sections.get("judge_noise", {})
    accuracy = [["dataset", "n", "judged accuracy", "corrected accuracy", "bootstrap draws dropped", "note"]]
    for dataset, entry in noise.get("accuracy", {}).items():
        corrected = "–" if entry["corrected"] is None else _pct(entry["corrected"]) + _interval(entry["ci"])
        notes = [n for n in (entry["undefined"], entry.get("hand_labels_note")) if n]
        accuracy.append(
            [
                dataset,
                str(entry["n"]),
                _pct(entry["observed"]),
                corrected,
                dropped_draws(entry),
                "; ".join(notes),
            ]
        )
    flips = [["method", "dataset", "AUROC", "AUROC sd under judge noise", "2.5–97.5%", "draws left out"]]
    for method, per in noise.get("auroc_flip", {}).items():
        for dataset, entry in per.items():
            flips.append(
                [
                    method,
                    dataset,
                    _pct(entry["auroc"]),
                    _pct(entry["sd"]),
                    f"{_pct(entry['low'])} – {_pct(entry['high'])}",
                    f"{entry['undefined_draws']} of {entry['draws']}",
                ]
            )
    return accuracy, flips


def dropped_draws(entry: Mapping[str, Any]) -> str:
    """``117 of 1000``: the bootstrap draws left out of a corrected accuracy's interval (Se + Sp ≤ 1 there)."""
    if entry.get("corrected") is None:
        return "–"
    total = entry.get("draws")
    return f"{entry['draws_dropped']} of {total}" if total else str(entry["draws_dropped"])


def _html_table(rows: list[list[str]], table_id: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def trust_html(sections: Mapping[str, Any]) -> str:
    """The report.html sections (empty when there is nothing to show)."""
    parts = []
    if "abstention" in sections:
        parts.append(f"""<h2 id="abstention">Abstention-aware scores</h2>
<p class="note">Answer when the confidence is at least the method's threshold. Correct, incorrect and abstained are
counts; the scores are ×100 with [95% bootstrap interval, {sections["bootstrap"]} resamples]. SimpleQA F is the
harmonic mean of correct (overall) and correct | attempted; incorrect (overall) = incorrect / all; hallucination rate
(AA-Omniscience) = incorrect / (incorrect + abstained), over the questions not answered right; penalized score =
(correct − incorrect) / all, in [−100, 100].</p>
{_html_table(abstention_rows(sections), "abstention-table")}""")
    if "judge_noise" in sections:
        hand = sections["judge_noise"]["hand_labels"]
        accuracy, flips = judge_rows(sections)
        parts.append(f"""<h2 id="judge-noise">Judge noise</h2>
<p class="note">From {hand["n"]} hand labels{" drawn by verdict" if hand["sampled_by_verdict"] else ""}: the judge's
sensitivity {_pct(hand["sensitivity"])}%, specificity {_pct(hand["specificity"])}%. Corrected accuracy: Rogan–Gladen,
with a bootstrap over both the evaluated records and the hand labels; the draws where the resampled judge was no
better than a coin (Se + Sp ≤ 1) are left out of the interval and counted. A row whose sensitivity and specificity
come from hand labels of other datasets says so. The AUROC spread is over 200 simulations that flip labels at the
measured error rates (draws left with one class are left out and counted).</p>
{_html_table(accuracy, "judge-accuracy-table")}
{_html_table(flips, "judge-auroc-table")}""")
    return "\n".join(parts)


def trust_lines(sections: Mapping[str, Any]) -> list[str]:
    """The same numbers as tab-separated lines (pooled rows only), for the command line."""
    lines = []
    for row in abstention_rows(sections) if "abstention" in sections else []:
        if row[1] in ("dataset", "all"):
            lines.append("\t".join(row))
    if "judge_noise" in sections:
        accuracy, flips = judge_rows(sections)
        lines += ["\t".join(r) for r in accuracy]
        lines += ["\t".join(r) for r in flips if r[1] in ("dataset", "all")]
    return lines
