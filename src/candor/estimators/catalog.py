"""The table of every registered estimator: name, family, level, what it needs, its reference.

What an estimator needs is read from the estimator itself (its ``requires``,
``needs_hidden_states``, ``needs_backend``, ``default_samples``), so the table
cannot drift from the code; the family and reference come from
:data:`FAMILIES`, keyed by the module that registers the estimator, and a new
estimator module without a row there is an error (the test of this table
lists it). ``candor score -e list`` prints the table and the estimator table of
docs/estimators.md is this module's :func:`markdown_table`.
"""

from __future__ import annotations

from dataclasses import dataclass

from candor.backends.base import LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE, TOP_LOGPROBS
from candor.estimators.base import ESTIMATORS
from candor.util.errors import CandorError

# Module that registers an estimator → (family, reference).
FAMILIES: dict[str, tuple[str, str]] = {
    "candor.estimators.logprob": ("token probability", "EliCal's baselines (Ni et al., 2025)"),
    "candor.estimators.annotated_consistency": ("sample consistency", "EliCal's baselines (Ni et al., 2025)"),
    "candor.estimators.verbal_question": ("verbalized, question", "EliCal's baselines (Ni et al., 2025)"),
    "candor.estimators.ptrue": ("self-evaluation", "Kadavath et al., 2022"),
    "candor.estimators.verbal_answer": ("verbalized, answer", "ADVICE (arXiv 2510.10913)"),
    "candor.estimators.selfconsistency": ("sample consistency", "ADVICE's baseline (arXiv 2510.10913)"),
    "candor.estimators.tokenstats": ("next-token distribution", "LM-Polygraph (Fadeeva et al., 2023)"),
    "candor.estimators.sample_entropy": ("sample entropy", "Kuhn et al., 2023; Farquhar et al., 2024"),
    "candor.estimators.spectral": ("sample similarity graph", "Lin et al., 2023"),
    "candor.estimators.kernel_entropy": ("sample similarity graph", "Nikitin et al., 2024"),
    "candor.estimators.cocoa": ("probability × consistency", "CoCoA (Vashurin et al., 2025)"),
    "candor.estimators.eigenscore": ("hidden states", "INSIDE (Chen et al., 2024)"),
    "candor.estimators.length": ("baseline", "answer length"),
    "candor.estimators.ensemble": ("stacked", "logistic stacking on dev, as uqlm's tuned ensemble"),
    "candor.train.elical.estimator": ("trained head", "EliCal (Ni et al., 2025, arXiv 2510.17509)"),
    "candor.train.probe": ("trained probe", "a linear probe on hidden states"),
}
# Estimators that read a consistency judge's verdicts (at annotation, or their own).
JUDGED = frozenset({"consis-sem", "self-consistency", "semantic-entropy", "semantic-entropy-discrete", "num-sem-sets"})
# Estimators that read a folder a trainer wrote.
TRAINED = frozenset({"elical", "probe"})
# Estimators fitted on a labelled dev file when scoring.
DEV_FITTED = frozenset({"ensemble"})


@dataclass(frozen=True)
class EstimatorRow:
    name: str
    family: str
    level: str
    needs: str
    reference: str


def _class_of(entry: object) -> type:
    return getattr(entry, "func", entry)  # a functools.partial registers a configured class


def _needs(name: str, estimator: object) -> str:
    requires = frozenset(getattr(estimator, "requires", ()))
    needs = []
    if getattr(estimator, "default_samples", 0) or getattr(estimator, "min_samples", 0):
        needs.append("samples")
    if requires & {LOGPROBS, TOP_LOGPROBS}:
        needs.append("token log-probs")
    if requires & {NEXT_TOKEN_LOGPROBS, SCORE}:
        needs.append("next-token log-probs")
    if getattr(estimator, "needs_hidden_states", False):
        needs.append("hidden states")
    if name in JUDGED:
        needs.append("a judge")
    if name in TRAINED:
        needs.append("a trained folder")
    if name in DEV_FITTED:
        needs.append("its members and a labelled dev file")
    if getattr(estimator, "needs_backend", False):
        needs.append("the model when scoring")
    return ", ".join(needs) or "the greedy answer"


def estimator_rows() -> list[EstimatorRow]:
    """One row per registered estimator, sorted by family then name."""
    rows = []
    for name in ESTIMATORS.names():
        entry = ESTIMATORS.get(name)
        module = _class_of(entry).__module__
        if module not in FAMILIES:
            raise CandorError(f"estimator {name!r} ({module}) has no family in candor.estimators.catalog.FAMILIES")
        try:
            estimator: object = ESTIMATORS.build(name)  # an instance knows its options' needs
        except CandorError:
            estimator = _class_of(entry)  # one that needs an option (a trained folder): its class defaults
        family, reference = FAMILIES[module]
        rows.append(
            EstimatorRow(
                name=name,
                family=family,
                level=getattr(estimator, "level", "question"),
                needs=_needs(name, estimator),
                reference=reference,
            )
        )
    order = list(dict.fromkeys(family for family, _ in FAMILIES.values()))
    return sorted(rows, key=lambda r: (order.index(r.family), r.name))


HEADER = ("name", "family", "level", "needs", "reference")


def markdown_table() -> str:
    """The estimator table of docs/estimators.md."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in estimator_rows():
        lines.append(f"| `{row.name}` | {row.family} | {row.level} | {row.needs} | {row.reference} |")
    return "\n".join(lines) + "\n"
