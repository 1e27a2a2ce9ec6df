"""``Estimator.requires`` says what an estimator reads: checked for every registered estimator by perturbing it.

Every estimator runs on records a real (tiny) model annotated, then on the same
records with the completions' token log-probs (``logprobs`` and
``stop_logprob``) made NaN, removed or shifted, and with their top-k
alternatives made NaN, removed or shifted. An estimator whose output moves (or
that raises) under a perturbation reads that field and must declare
:data:`LOGPROBS` / :data:`TOP_LOGPROBS`; one that declares it must move. Serving
relies on it: it re-reads answers alone only for estimators that read them
(``HonestModel.rereads_answers``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers import BlackBox

from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.prompts import TEMPLATES
from candor.annotation.records import Record, read_records
from candor.backends.base import LOGPROBS, TOP_LOGPROBS, Completion, SamplingParams
from candor.backends.hf import HFBackend
from candor.data.items import QAItem
from candor.estimators import ESTIMATORS, get_estimator, score_records
from candor.util.errors import CandorError

QUESTIONS = [
    ("What is the capital of France?", ("Paris",)),
    ("Who wrote Hamlet?", ("Shakespeare",)),
    ("How many legs does a spider have?", ("8", "eight")),
    ("Which planet is known as the Red Planet?", ("Mars",)),
]

# Options an estimator's default cannot do without (a trained artifact), filled in by the fixture below;
# and option sets that change what an estimator reads, checked on top of each default.
VARIANTS: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in ESTIMATORS.names()] + [
    (name, {"source": "topk"}) for name in ("token-entropy-mean", "token-entropy-max", "prob-margin")
]

Perturb = Callable[[Completion], Completion]
NAN = float("nan")


def shifted(x: float | None) -> float | None:
    return None if x is None else x - 0.5


LOGPROB_PERTURBATIONS: dict[str, Perturb] = {
    "nan": lambda c: replace(c, logprobs=[NAN] * len(c.logprobs), stop_logprob=None if c.stop_logprob is None else NAN),
    "removed": lambda c: replace(c, logprobs=[], stop_logprob=None),
    "shifted": lambda c: replace(c, logprobs=[shifted(x) for x in c.logprobs], stop_logprob=shifted(c.stop_logprob)),
}
TOP_PERTURBATIONS: dict[str, Perturb] = {
    "nan": lambda c: replace(c, top_logprobs=[dict.fromkeys(pos, NAN) for pos in c.top_logprobs]),
    "removed": lambda c: replace(c, top_logprobs=[]),
    "shifted": lambda c: replace(c, top_logprobs=[{t: v - 0.5 for t, v in pos.items()} for pos in c.top_logprobs]),
}


def perturbed(records: list[Record], change: Perturb) -> list[Record]:
    return [replace(r, greedy=change(r.greedy), samples=[change(s) for s in r.samples]) for r in records]


@pytest.fixture(scope="module")
def backend(lively_model, tokenizer) -> HFBackend:
    return HFBackend(lively_model, tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def records(backend, tmp_path_factory) -> list[Record]:
    """Records the real annotator wrote: greedy answer and 3 samples with token log-probs and top-k."""
    items = [
        QAItem(id=f"t:{i}", dataset="toy", split="test", question=q, answers=a) for i, (q, a) in enumerate(QUESTIONS)
    ]
    out = tmp_path_factory.mktemp("requires") / "records.jsonl"
    config = AnnotateConfig(k=3, params=SamplingParams(max_new_tokens=5), batch_size=4, seed=1)
    annotate(items, backend, out, TEMPLATES.get("fewshot"), config, progress=False)
    recs = read_records(out)
    completions = [c for r in recs for c in (r.greedy, *r.samples)]
    # Every field the perturbations change is there to change.
    assert all(c.token_ids and c.logprobs and c.top_logprobs for c in completions)
    return recs


@pytest.fixture(scope="module")
def artifact_options(backend, records, tiny_model_dir, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """A trained artifact for each estimator that reads one (an EliCal head, an answer probe), the ensemble's dev."""
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig
    from candor.train.probe import train_probe

    folder = tmp_path_factory.mktemp("artifacts")
    lm, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(lm, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=5)
    labelled = [replace(r, greedy_correct=i % 2) for i, r in enumerate(records)]
    train_probe(labelled, backend, folder / "probe")
    # The ensemble's dev: the same answers under other questions (a dev sharing the scored questions is refused).
    dev = [
        replace(r, item=replace(r.item, id=f"dev-{r.item.id}", question=f"(dev) {r.item.question}")) for r in labelled
    ]
    return {
        "elical": {"head": str(head.save_pretrained(folder / "head")), "allow_other_backbone": True},
        "probe": {"path": str(folder / "probe")},
        # fitted on unperturbed labelled records, so only the scored records' fields can move it
        "ensemble": {"members": "n-prob,consis-lex", "dev": dev},
    }


def outcome(name: str, options: dict[str, Any], recs: list[Record], backend: HFBackend) -> np.ndarray | str:
    """The estimator's values on ``recs`` (a fresh estimator each time), or what it raised."""
    try:
        return get_estimator(name, **options).estimate(recs, backend)
    except Exception as exc:  # noqa: BLE001 - any failure on a perturbed field means the estimator reads it
        return f"raised {type(exc).__name__}: {exc}"


def moved(base: np.ndarray, other: np.ndarray | str) -> bool:
    return isinstance(other, str) or not np.array_equal(base, other)


@pytest.mark.parametrize("name, options", VARIANTS, ids=[n + "".join(f"-{v}" for v in o.values()) for n, o in VARIANTS])
def test_every_estimator_declares_the_log_probs_it_reads(name, options, records, backend, artifact_options):
    options = {**artifact_options.get(name, {}), **options}
    est = get_estimator(name, **options)
    base = outcome(name, options, records, backend)
    assert not isinstance(base, str), f"{name} cannot score the annotated records: {base}"
    assert np.array_equal(base, outcome(name, options, records, backend)), f"{name} is not deterministic here"
    for field, capability, perturbations in (
        ("logprobs", LOGPROBS, LOGPROB_PERTURBATIONS),
        ("top_logprobs", TOP_LOGPROBS, TOP_PERTURBATIONS),
    ):
        outcomes = {
            kind: outcome(name, options, perturbed(records, change), backend) for kind, change in perturbations.items()
        }
        reads = {kind for kind, got in outcomes.items() if moved(base, got)}
        if capability in est.requires:
            assert reads, f"{name} declares {capability} but reads no {field}: its output never moved"
        else:
            assert not reads, (
                f"{name} reads the completions' {field} (its output moved with them {sorted(reads)}: "
                f"{[outcomes[k] for k in sorted(reads)]}) but does not declare {capability} in its requires"
            )


def test_a_generator_without_log_probs_is_refused_for_a_method_that_reads_them(backend, records):
    """Scoring records needs nothing of the scoring backend's log-probs; generating answers to score does."""
    black_box = BlackBox(backend)  # generates text only: no log-probs with its answers
    with pytest.raises(CandorError, match="'n-prob' needs logprobs.*BlackBox.*with the answers it generates"):
        get_estimator("n-prob").check_generator(black_box)
    with pytest.raises(CandorError, match="'prob-margin' needs top_logprobs"):
        get_estimator("prob-margin", source="topk").check_generator(black_box)
    get_estimator("consis-lex").check_generator(black_box)  # texts only: nothing to refuse
    get_estimator("n-prob").check_generator(backend)
    # Records annotated earlier keep their log-probs: a text-only backend beside them (for verbal-0) takes nothing away.
    table = score_records(records, ["n-prob", "verbal-0"], black_box, progress=False)
    expected = [math.exp(float(np.mean(r.greedy.logprobs))) for r in records]
    np.testing.assert_allclose(table.arrays("n-prob")[0], expected, rtol=1e-12)
