"""Judge noise, corrected (docs/methods.md "Judge noise").

The evaluation's labels come from a judge, and the judge errs. A hand-labelled
sample measures how often: the judge's *sensitivity* Se (it says correct when
the answer is correct) and *specificity* Sp (it says wrong when it is wrong).
When the sample was drawn by verdict (a fixed number judged correct and a
fixed number judged wrong), the two strata are reweighted to the evaluated
records' judged-correct rate ``p``: with PPV and FOR the shares truly correct
among the judged-correct and judged-wrong rows,
Se = p·PPV / (p·PPV + (1 − p)·FOR) and Sp = (1 − p)(1 − FOR) / ((1 − p)(1 − FOR) + p(1 − PPV)).

**Rogan–Gladen** (Rogan and Gladen, 1978): the accuracy the judge reports,
``p``, is corrected to (p + Sp − 1) / (Se + Sp − 1), clipped to [0, 1]. It is
undefined when Se + Sp ≤ 1 (a judge no better than a coin), and then nothing
corrected is reported. The 95% interval is a percentile bootstrap over *both*
samples: each draw resamples the evaluated records' verdicts and the
hand-labelled sample (within its verdict strata when drawn by verdict) and
recomputes Se, Sp and the correction; draws with Se + Sp ≤ 1 are dropped, counted
(``draws_dropped`` of ``draws``) and shown in the tables beside the interval.

**Whose hand labels**: the judge's Se and Sp are measured on one hand-labelled
sample, and each dataset's row is corrected with them. When the sample's rows
come from other datasets than the row's (a pooled sample, or labels of another
dataset altogether), the row says so (``hand_labels_note``): the correction then
assumes the judge errs on this dataset as it did on those. ``hand_labels_from``
counts the labelled rows per dataset (a label's dataset is its row's in the
confidences, or the label's own ``"dataset"``).

**AUROC under judge noise**: taking the evaluation's labels as the truth, each
of ``draws`` (200) simulations flips a correct label to wrong with probability
1 − Se and a wrong one to correct with probability 1 − Sp; the spread of a
method's AUROC over the draws (sd, 2.5–97.5 percentiles) is how far judge
error of the measured size could move it.

Hand labels are one JSON object per line, ``{"id": …, "human": 0|1}``, or a
JSON document ``{"labels": [...], "sampled_by_verdict": true|false}``. The
judge's verdict on a labelled row is the ``correct`` of the same id in the
confidences (what the evaluation used), or the row's own ``"judge"`` (0/1) for
an id the confidences do not hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.aggregate import json_number, percentile_interval
from candor.evaluation.metrics import auroc, quietly
from candor.util.errors import CandorError, at_line

FLIP_DRAWS = 200
ALL = "all"


@dataclass(frozen=True)
class HandLabels:
    """A hand-labelled sample: the judge's verdict and the human label per row, and how it was drawn."""

    verdict: np.ndarray
    human: np.ndarray
    by_verdict: bool = False
    datasets: tuple[str, ...] | None = None  # each labelled row's dataset, where known

    def counts_by_dataset(self) -> dict[str, int] | None:
        """How many labelled rows come from each dataset (None where the datasets are not known)."""
        if self.datasets is None:
            return None
        names, counts = np.unique(np.asarray(self.datasets, dtype=str), return_counts=True)
        return {str(n): int(c) for n, c in zip(names, counts, strict=True)}

    def note_for(self, datasets: Sequence[str]) -> str | None:
        """What a row corrected for ``datasets`` must say about where its Se and Sp come from (None: nothing)."""
        counts = self.counts_by_dataset()
        if counts is None:
            return "sensitivity and specificity from hand labels of unknown datasets"
        own = sum(c for d, c in counts.items() if d in datasets)
        if own == sum(counts.values()):
            return None
        where = ", ".join(f"{d} {c}" for d, c in counts.items())
        return (
            f"sensitivity and specificity from hand labels of other datasets: {own} of {sum(counts.values())} "
            f"from {'/'.join(datasets)} ({where})"
        )


@dataclass(frozen=True)
class JudgeErrors:
    """The judge's sensitivity and specificity, as measured on a hand-labelled sample."""

    sensitivity: float
    specificity: float

    @property
    def informative(self) -> bool:
        """Whether the correction is defined (Se + Sp > 1)."""
        return self.sensitivity + self.specificity > 1


def _cell_counts(labels: HandLabels) -> tuple[int, int, int, int]:
    """(judge 1 & human 1, judge 1 & human 0, judge 0 & human 1, judge 0 & human 0)."""
    v, h = labels.verdict, labels.human
    return (
        int(((v == 1) & (h == 1)).sum()),
        int(((v == 1) & (h == 0)).sum()),
        int(((v == 0) & (h == 1)).sum()),
        int(((v == 0) & (h == 0)).sum()),
    )


def rates_from_counts(tp: Any, fp: Any, fn: Any, tn: Any, judged_rate: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(Se, Sp) from the four cells; with ``judged_rate`` the verdict strata are reweighted to it (see above)."""
    tp, fp, fn, tn = (np.asarray(x, dtype=float) for x in (tp, fp, fn, tn))
    with np.errstate(invalid="ignore", divide="ignore"):
        if judged_rate is None:
            return tp / (tp + fn), tn / (tn + fp)
        p = np.asarray(judged_rate, dtype=float)
        ppv, false_omission = tp / (tp + fp), fn / (fn + tn)
        se = p * ppv / (p * ppv + (1 - p) * false_omission)
        sp = (1 - p) * (1 - false_omission) / ((1 - p) * (1 - false_omission) + p * (1 - ppv))
        return se, sp


def judge_errors(labels: HandLabels, judged_rate: float | None = None) -> JudgeErrors:
    """Se and Sp of the judge on ``labels`` (``judged_rate`` is needed when they were drawn by verdict)."""
    _check_sample(labels)
    rate = judged_rate if labels.by_verdict else None
    se, sp = rates_from_counts(*_cell_counts(labels), judged_rate=rate)
    return JudgeErrors(float(se), float(sp))


def rogan_gladen(observed: Any, sensitivity: Any, specificity: Any) -> np.ndarray:
    """(observed + Sp − 1) / (Se + Sp − 1) clipped to [0, 1]; NaN where Se + Sp ≤ 1."""
    se, sp = np.asarray(sensitivity, dtype=float), np.asarray(specificity, dtype=float)
    denominator = se + sp - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.clip((np.asarray(observed, dtype=float) + sp - 1) / denominator, 0.0, 1.0)
    return np.where(denominator > 0, value, np.nan)


def corrected_accuracy(
    verdicts: Sequence[int] | np.ndarray,
    labels: HandLabels,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    datasets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Observed and Rogan–Gladen-corrected accuracy of ``verdicts`` (the judge's labels), with its interval.

    ``datasets``: what the verdicts are of; where given, the entry says whether the hand labels come from them.
    """
    y = np.asarray(verdicts, dtype=int)
    observed = float(y.mean())
    errors = judge_errors(labels, observed)
    out: dict[str, Any] = {
        "n": int(y.size),
        "observed": observed,
        "sensitivity": json_number(errors.sensitivity),
        "specificity": json_number(errors.specificity),
        "corrected": None,
        "ci": [None, None],
        "undefined": None,
        "draws": int(bootstrap),
        "draws_dropped": 0,
        "hand_labels_from": labels.counts_by_dataset(),
        "hand_labels_note": None if datasets is None else labels.note_for(datasets),
    }
    if not errors.informative:
        out["undefined"] = (
            f"the judge's sensitivity + specificity is {errors.sensitivity + errors.specificity:.3f}"
            " ≤ 1, so the Rogan–Gladen correction is undefined; nothing corrected is reported"
        )
        return out
    out["corrected"] = float(rogan_gladen(observed, errors.sensitivity, errors.specificity))
    if bootstrap > 0:
        draws = _bootstrap_corrections(y, labels, bootstrap, np.random.default_rng(seed))
        (low, high), dropped = percentile_interval(draws)
        out.update(ci=[json_number(low), json_number(high)], draws_dropped=dropped)
    return out


def _bootstrap_corrections(y: np.ndarray, labels: HandLabels, n: int, rng: np.random.Generator) -> np.ndarray:
    """The correction recomputed on ``n`` draws that resample both the evaluated verdicts and the hand labels."""
    observed = rng.binomial(y.size, y.mean(), size=n) / y.size  # the same as resampling the rows
    tp, fp, fn, tn = _cell_counts(labels)
    if labels.by_verdict:  # each verdict stratum keeps its size, as the sample was drawn
        tp_d = rng.binomial(tp + fp, tp / max(tp + fp, 1), size=n)
        fn_d = rng.binomial(fn + tn, fn / max(fn + tn, 1), size=n)
        cells = (tp_d, tp + fp - tp_d, fn_d, fn + tn - fn_d)
        se, sp = rates_from_counts(*cells, judged_rate=observed)
    else:
        drawn = rng.multinomial(tp + fp + fn + tn, np.array([tp, fp, fn, tn]) / (tp + fp + fn + tn), size=n)
        se, sp = rates_from_counts(*drawn.T)
    return rogan_gladen(observed, se, sp)


def auroc_flip_spread(
    confidence: np.ndarray, correct: np.ndarray, errors: JudgeErrors, *, draws: int = FLIP_DRAWS, seed: int = 0
) -> dict[str, Any]:
    """A method's AUROC and its spread over ``draws`` label flips at the judge's measured error rates."""
    y = np.asarray(correct, dtype=int)
    rng = np.random.default_rng(seed)
    keep = np.where(y == 1, errors.sensitivity, errors.specificity)
    values = []
    with quietly():  # a draw may leave one class; its AUROC is NaN and left out
        for _ in range(draws):
            flipped = np.where(rng.random(y.size) < keep, y, 1 - y)
            values.append(auroc(confidence, flipped))
        base = auroc(confidence, y)
    arr = np.asarray(values, dtype=float)
    (low, high), undefined = percentile_interval(arr)
    finite = arr[~np.isnan(arr)]
    return {
        "auroc": json_number(base),
        "draws": draws,
        "mean": json_number(float(finite.mean())) if finite.size else None,
        "sd": json_number(float(finite.std(ddof=1))) if finite.size > 1 else None,
        "low": json_number(low),
        "high": json_number(high),
        "undefined_draws": undefined,
    }


def judge_noise_report(
    table: ConfidenceTable, labels: HandLabels, *, bootstrap: int = 1000, draws: int = FLIP_DRAWS, seed: int = 0
) -> dict[str, Any]:
    """Corrected accuracy per dataset (and pooled) and every method's AUROC spread under judge noise."""
    datasets = [*table.datasets, ALL]
    verdicts = {d: np.array([r.correct for r in table.rows if d in (ALL, r.dataset)], dtype=int) for d in datasets}
    errors = judge_errors(labels, float(verdicts[ALL].mean()))
    flips: dict[str, dict[str, Any]] = {}
    for method in table.methods:
        flips[method] = {}
        for d in datasets:
            conf, y = table.arrays(method, None if d == ALL else d)
            flips[method][d] = auroc_flip_spread(conf, y, errors, draws=draws, seed=seed)
    return {
        "hand_labels": {
            "n": int(labels.human.size),
            "sampled_by_verdict": labels.by_verdict,
            "sensitivity": json_number(errors.sensitivity),
            "specificity": json_number(errors.specificity),
            "from": labels.counts_by_dataset(),
        },
        "accuracy": {
            d: corrected_accuracy(
                verdicts[d], labels, bootstrap=bootstrap, seed=seed, datasets=table.datasets if d == ALL else [d]
            )
            for d in datasets
        },
        "auroc_flip": flips,
    }


def _check_sample(labels: HandLabels) -> None:
    if labels.human.size == 0:
        raise CandorError("the hand-labelled sample is empty")
    if labels.by_verdict and (labels.verdict.min() == labels.verdict.max()):
        raise CandorError("a sample drawn by verdict needs rows the judge called correct and rows it called wrong")


# ---------------------------------------------------------------- reading hand labels


def read_hand_labels(path: str | Path, table: ConfidenceTable) -> HandLabels:
    """Hand labels from ``path`` (format in the module docstring), each paired with the judge's verdict."""
    path = Path(path)
    rows, by_verdict = _label_rows(path)
    correct = {r.id: r.correct for r in table.rows}
    dataset_of = {r.id: r.dataset for r in table.rows}
    verdict, human, datasets = [], [], []
    for line, row in rows:
        if not isinstance(row, Mapping) or "id" not in row or row.get("human") not in (0, 1, True, False):
            raise at_line(path, line, 'a hand label needs "id" and "human" (0 or 1)')
        judged = correct.get(str(row["id"]), row.get("judge"))
        if judged not in (0, 1, True, False):
            raise at_line(
                path,
                line,
                f'id {row["id"]!r} is not among the confidences and the row gives no "judge" verdict (0 or 1)',
            )
        verdict.append(int(judged))
        human.append(int(row["human"]))
        datasets.append(dataset_of.get(str(row["id"]), row.get("dataset")))
    if not human:
        raise CandorError(f"{path}: no hand labels")
    known = None if None in datasets else tuple(str(d) for d in datasets)
    return HandLabels(np.array(verdict, dtype=int), np.array(human, dtype=int), by_verdict, known)


def _label_rows(path: Path) -> tuple[list[tuple[int, Any]], bool]:
    """``[(line, row)]`` and whether the sample was drawn by verdict, from a JSON document or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CandorError(f"--hand-labels {path}: cannot read it ({exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, Mapping) and "labels" in doc:  # else one JSON line (a file of one label)
        labels = doc["labels"]
        if not isinstance(labels, list):
            raise at_line(path, 1, 'a JSON document of hand labels needs a "labels" list')
        return [(_line_of(text, i), row) for i, row in enumerate(labels)], bool(doc.get("sampled_by_verdict"))
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise at_line(path, lineno, f"not JSON ({exc.msg})") from None
    return rows, False


def _line_of(text: str, index: int) -> int:
    """The line of the ``index``-th ``{"id"`` in a JSON document (its label's line), else 1."""
    at = -1
    for _ in range(index + 1):
        at = text.find('"id"', at + 1)
        if at < 0:
            return 1
    return text.count("\n", 0, at) + 1
