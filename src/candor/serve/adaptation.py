"""``candor adapt``: a served honest model recalibrated on its own traffic (docs/methods.md "EliCal").

From the served answers and their labels (a store, ``candor serve --store``:
:mod:`candor.annotation.served_store`, or a served log file,
:mod:`candor.annotation.served_labels`) to a new honest-model folder:

1. The labels it may use are chosen (:mod:`candor.annotation.label_selection`):
   from the trusted sources (``label_sources``), on the text the served
   confidence scored, one per served response. They are split, seeded, into a
   **stage-2 part** and a **held-out part** (``holdout`` of them) that nothing
   trains on, **by question**: every served record of one question (its text
   normalized as :func:`candor.annotation.text_matching.normalize` does) lands
   on one side, so the threshold is never certified on a question a stage saw.
2. **Stage 1** (Eli) resumes the served EliCal head (a fresh head when the
   served confidence is not a head) on the consistency rate of every served
   question except the held-out ones; no label is read. Served records without
   samples (a head decides from the question alone) get ``k`` samples
   regenerated with the served generator at the protocol's sampling settings,
   seeded by the question, and are judged against the served answer.
3. **Stage 2** (Cal) trains on the stage-2 labels (the served answer's
   correctness: ``hard`` targets), stopping early on a seeded slice of them.
4. The threshold is chosen by risk control (:func:`certify`: :func:`candor.serve.thresholds.risk_control` with
   three fixed sequences, from the most confident held-out answers, from half of them answered and from all of
   them, each at δ/3, so one wrong most-confident answer no longer ends the scan)
   on the held-out labels: with probability at least 1 − δ over their draw, the
   error rate of the questions the new model answers is at most α, *assuming
   later traffic is exchangeable with the labelled questions* (drawn from the
   same distribution, labelled without regard to their confidence). When the
   threshold answers none of the held-out questions, the guarantee is reported
   as not exercised (0 answered), never as holding.

Too few labels for α and δ is refused with the number needed (exit 2 from
the CLI): the held-out part must be able to certify α even with no error at
all (:func:`candor.serve.thresholds.min_evidence` at δ/3), and stage 2 needs
:data:`MIN_STAGE2` labels. The new folder's ``honest.json`` carries
a new ``version`` (a name the server reports; ``adapt.json`` says which version it was adapted
from and how many adaptations deep it is) and the folder holds
``adapt.json``: the counts, the held-out AUROC and ECE, the threshold and the
guarantee.

5. **Promotion** (:mod:`candor.serve.promotion`): the same held-out labels score the
   model it started from and the adapted head; a one-sided paired bootstrap by question
   at level δ marks the folder ``promotable`` (the adapted head ranks better) or ``kept``,
   with the numbers, in ``adapt.json``'s ``promotion``. ``POST /admin/reload`` refuses a
   kept folder unless forced. A kept model never replaces the served folder itself
   (``--out`` equal to ``--honest``): nothing is written, and the report says so.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE, get_consistency_judge, judge_consistency
from candor.annotation.label_selection import DEFAULT_LABEL_SOURCES, LabelSelection, parse_label_sources, select_labels
from candor.annotation.records import Record
from candor.annotation.served_labels import ServedLog, read_served, served_records
from candor.annotation.served_store import ServedStore, is_store_url
from candor.annotation.text_matching import normalize
from candor.backends.base import Backend
from candor.data.splits import seeded_shuffle
from candor.evaluation.metrics import auroc, ece
from candor.serve import thresholds as th
from candor.serve.answering import PROTOCOL_SAMPLES, question_seed
from candor.serve.confidence_sources import HeadSource
from candor.serve.honest_folder import CONFIG_FILE, read_config
from candor.serve.model import HonestModel
from candor.serve.promotion import KEPT, PROMOTION_KEY, SUMMARY_FILE, Comparison, compare, not_compared
from candor.serve.shapes import QUESTION, shape_words, shapes_of, system_prompts_of, system_shape
from candor.train.elical.config import EliCalConfig
from candor.train.elical.model import ConfidenceHead, HeadConfig
from candor.train.elical.pipeline import StageResult, head_features, train_stage
from candor.train.elical.pool import carve_dev
from candor.util.errors import CandorError
from candor.util.files import atomic_folder, check_replaceable

logger = logging.getLogger(__name__)

VERSION_KEY = "version"  # in honest.json: the name the server gives this model
MIN_STAGE2 = 10  # stage 2 trains and stops early on these; fewer is noise
STAGE_DEV_FRACTION = 0.2  # of each stage's questions, for early stopping
GUARANTEE_ASSUMES = (
    "later traffic is exchangeable with the labelled questions: drawn from the same distribution, "
    "and labelled without regard to their confidence"
)


class NotEnoughLabels(CandorError):
    """Too few labels to certify α at δ; the message says how many are needed."""


@dataclass(frozen=True)
class AdaptSettings:
    """What ``candor adapt`` is asked for: the guarantee (α, δ), the held-out share, samples, seed, trusted sources."""

    alpha: float = 0.1
    delta: float = 0.1
    holdout: float = 0.5
    k: int = 5
    seed: int = 0
    max_epochs: int | None = None
    feature_cache: str | None = None
    label_sources: tuple[str, ...] = DEFAULT_LABEL_SOURCES  # patterns: ("human", "judge:*")
    system_prompt: str | None = None  # the deployment's: stage 2 must hold labels asked with it (None: no check)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_sources", parse_label_sources(self.label_sources))
        if not 0.0 < self.alpha < 1.0:
            raise CandorError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0.0 < self.delta < 1.0:
            raise CandorError(f"delta must be in (0, 1), got {self.delta}")
        if not 0.0 < self.holdout < 1.0:
            raise CandorError(f"the held-out share must be in (0, 1), got {self.holdout}")
        if self.k < 2:
            raise CandorError(f"stage 1 needs at least 2 samples per question, got k={self.k}")


def held_out_size(n_labels: int, holdout: float) -> int:
    return math.ceil(holdout * n_labels)


def certify(confidence: np.ndarray, correct: np.ndarray, alpha: float, delta: float) -> th.Threshold:
    """The held-out threshold: risk control at (α, δ) with the sequences of :data:`candor.serve.thresholds.SPLIT_STARTS`
    (each at δ/3; the union bound keeps the guarantee at 1 − δ)."""
    return th.risk_control(confidence, correct, alpha, delta, starts=th.SPLIT_STARTS)


def held_out_evidence(alpha: float, delta: float) -> int:
    """The fewest answered held-out labels with which no error at all certifies α (each sequence runs at δ/3)."""
    return th.min_evidence(alpha, delta / len(th.SPLIT_STARTS))


def labels_needed(alpha: float, delta: float, holdout: float) -> int:
    """The fewest labels whose held-out part can certify α at δ and whose rest can run stage 2."""
    evidence = held_out_evidence(alpha, delta)
    n = MIN_STAGE2
    while held_out_size(n, holdout) < evidence or n - held_out_size(n, holdout) < MIN_STAGE2:
        n += 1
    return n


def question_key(record: Record) -> str:
    """What makes two served records the same question for the split: the question text, normalized."""
    return normalize(record.item.question)


def split_labels(labelled: Sequence[Record], settings: AdaptSettings) -> tuple[list[Record], list[Record]]:
    """(stage 2, held out): a seeded split of the labelled records by question; refuses too few for α and δ.

    The questions are shuffled (seeded) and taken for the held-out part until it has
    ``holdout`` of the labels; every record of a question goes where its question goes.
    """
    needed = labels_needed(settings.alpha, settings.delta, settings.holdout)
    evidence = held_out_evidence(settings.alpha, settings.delta)
    wanted = (
        f"certifying an answered error rate of at most α={settings.alpha:g} with probability "
        f"1-δ={1 - settings.delta:g} needs at least {needed}"
    )
    parts = (
        f"{held_out_size(needed, settings.holdout)} held out for the threshold (at least {evidence} answered) "
        f"and {MIN_STAGE2} or more for stage 2"
    )
    if len(labelled) < needed:
        raise NotEnoughLabels(
            f"{len(labelled)} labelled answers; {wanted} ({needed - len(labelled)} more): {parts}; "
            f"labels count from the sources {','.join(settings.label_sources)} only (--label-sources)"
        )
    groups: dict[str, list[Record]] = {}
    for record in labelled:
        groups.setdefault(question_key(record), []).append(record)
    target = held_out_size(len(labelled), settings.holdout)
    stage2: list[Record] = []
    held: list[Record] = []
    for key in seeded_shuffle(list(groups), f"adapt:{settings.seed}"):
        (held if len(held) < target else stage2).extend(groups[key])
    if len(stage2) < MIN_STAGE2:
        raise NotEnoughLabels(
            f"{len(labelled)} labelled answers on {len(groups)} distinct questions: held out by question, "
            f"{len(held)} labels go to the threshold and {len(stage2)} are left for stage 2, fewer than "
            f"{MIN_STAGE2}; {wanted} ({parts}): label more distinct questions"
        )
    return stage2, held


def check_system_prompt(stage2: Sequence[Record], settings: AdaptSettings) -> None:
    """With a deployment system prompt, refuse stage-2 labels none of which was asked with it.

    The adapted model is calibrated for the request shapes of its stage-2 labels
    (:func:`candor.serve.shapes.shapes_of`); without a label asked after that system prompt (and no
    other turn) it could not be calibrated for the deployment's requests.
    """
    if settings.system_prompt is None:
        return
    wanted = system_shape(settings.system_prompt)
    shapes = shapes_of(r.item.history for r in stage2)
    if wanted not in shapes:
        raise NotEnoughLabels(
            f"--system-prompt-file: none of the {len(stage2)} stage-2 labels was asked with that system prompt "
            f"({wanted}) and no other turn, so the adapted model could not be calibrated for it; the stage-2 "
            f"labels hold {'; '.join(shape_words(s) for s in shapes)}"
        )


def with_consistency(
    records: Sequence[Record], backend: Backend | None, template: Any, k: int
) -> tuple[list[Record], int]:
    """Every record with samples and consistency verdicts, and how many had samples regenerated (none were logged).

    Regenerated samples follow the serving protocol (temperature 1, top-p 0.95,
    top-k 50, the template's stops), seeded by the question.
    """
    missing = [i for i, r in enumerate(records) if len(r.samples) < 2]
    out = list(records)
    if missing:
        if backend is None:
            raise CandorError(f"{len(missing)} served records have no samples and no generator is loaded")
        logger.info("adapt: regenerating %d samples for %d served questions", k, len(missing))
        params = replace(PROTOCOL_SAMPLES, stop=tuple(template.stop))
        prompts = [template(out[i].item, backend) for i in missing]
        seeds = [question_seed(out[i].item.question, out[i].item.history) for i in missing]
        gens = backend.generate(prompts, k, params, greedy=False, seeds=seeds)
        for i, gen in zip(missing, gens, strict=True):
            out[i] = replace(out[i], samples=list(gen.samples), consistency=None)
    todo = [i for i, r in enumerate(out) if not r.consistency or len(r.consistency) != len(r.samples)]
    if todo:
        verdicts = judge_consistency(
            get_consistency_judge(DEFAULT_CONSISTENCY_JUDGE),
            [out[i].greedy.text for i in todo],
            [[s.text for s in out[i].samples] for i in todo],
            [out[i].item.question for i in todo],
        )
        for i, v in zip(todo, verdicts, strict=True):
            out[i] = replace(out[i], consistency=[int(x) for x in v])
    return out, len(missing)


def head_confidences(head: ConfidenceHead, records: Sequence[Record], feature_cache: str | None) -> np.ndarray:
    """The head's confidence on records' questions, through the feature cache in ``head`` mode."""
    if head.config.mode != "head" or not records:
        return head.predict(records)
    features = head_features(head, head.prompts(records), feature_cache)
    with torch.no_grad():
        return head.head(torch.from_numpy(features).to(head.device)).cpu().numpy().astype(float)


def starting_head(model: HonestModel, config: EliCalConfig) -> tuple[ConfidenceHead, bool]:
    """The served head, trainable (and False: not fresh), or a fresh head on the generator (True)."""
    source = model.source
    if isinstance(source, HeadSource):
        head_source = source.estimator.head_source
        if isinstance(head_source, (str, Path)):
            return ConfidenceHead.from_pretrained(head_source, trainable=True), False
        return head_source, False  # type: ignore[return-value]
    from candor.train.common import load_causal_lm

    causal_lm, tokenizer = load_causal_lm(config.model, dtype=config.dtype, device=config.device)
    spec = HeadConfig(
        backbone=config.model,
        template=model.template.name,
        layer=config.layer,
        mode=config.mode,
        lora=config.lora_settings(),
    )
    return ConfidenceHead.create(causal_lm, tokenizer, spec, seed=config.seed), True


def serving_confidences(
    model: HonestModel, head: ConfidenceHead, fresh: bool, held: Sequence[Record], feature_cache: str | None
) -> np.ndarray | str:
    """The serving model's confidence on the held-out records, or why it cannot be computed.

    A served head is scored as it is before training (the same features); any other source by its own
    estimator (uncalibrated: the AUROC does not change under a monotone calibrator).
    """
    if not fresh:
        return head_confidences(head, held, feature_cache)
    try:
        return np.asarray(model.confidences(held), dtype=float)
    except (CandorError, ValueError) as exc:
        return f"the serving confidence {model.method!r} could not score the held-out records: {exc}"


def held_out_comparison(
    serving: np.ndarray | str, adapted: np.ndarray, correct: np.ndarray, held: Sequence[Record], settings: AdaptSettings
) -> Comparison:
    """The serving model against the adapted head on the held-out labels, paired by question, at level δ."""
    questions = [question_key(r) for r in held]
    if isinstance(serving, str):
        return not_compared(serving, settings.delta, len(held), len(set(questions)), int(correct.sum()))
    return compare(serving, adapted, correct, questions, settings.delta, seed=settings.seed)


@dataclass
class Adapted:
    """What :func:`adapt_model` trained: the head, its threshold, and the summary ``adapt.json`` holds."""

    head: ConfidenceHead
    threshold: th.Threshold
    summary: dict[str, Any]


def adapt_model(model: HonestModel, log: ServedLog, settings: AdaptSettings) -> Adapted:
    """Stage 1 on the served questions, stage 2 on the stage-2 labels, risk control on the held-out ones."""
    started = time.perf_counter()
    selection = select_labels(log.answers, settings.label_sources)
    stage2, held = split_labels(selection.records, settings)
    check_system_prompt(stage2, settings)
    held_questions = {question_key(r) for r in held}
    traffic = [r for r in served_records(log) if question_key(r) not in held_questions]
    traffic, regenerated = with_consistency(traffic, model.backend, model.template, settings.k)
    config = EliCalConfig(
        mode="head",
        model=model.backend.model_name,
        cal_target="hard",
        seed=settings.seed,
        max_epochs=settings.max_epochs,
        feature_cache=settings.feature_cache,
    )
    head, fresh = starting_head(model, config)
    config = replace(config, mode=head.config.mode, model=head.config.backbone)
    serving = serving_confidences(model, head, fresh, held, settings.feature_cache)  # before training moves the head
    s1_train, s1_dev = carve_dev(traffic, STAGE_DEV_FRACTION, settings.seed)
    s2_train, s2_dev = carve_dev(stage2, STAGE_DEV_FRACTION, settings.seed)
    stages = [
        train_stage(head, s1_train, s1_dev, "eli", config, fresh=fresh, full_set=True),
        train_stage(head, s2_train, s2_dev, "cal", config, fresh=False, full_set=False),
    ]
    # The head's provenance says stage 2 ran on labels: the served value is then a calibrated probability.
    head.config.meta = {
        **(head.config.meta or {}),
        "method": "adapt",
        "cal_target": config.cal_target,
        "stages": [s.name for s in stages],
    }
    confidence = head_confidences(head, held, settings.feature_cache)
    correct = np.array([int(r.greedy_correct) for r in held])  # type: ignore[arg-type]
    threshold = certify(confidence, correct, settings.alpha, settings.delta)
    summary = _summary(log, selection, settings, stages, regenerated, confidence, correct, threshold, stage2)
    summary[PROMOTION_KEY] = held_out_comparison(serving, confidence, correct, held, settings).to_dict()
    summary["seconds"] = round(time.perf_counter() - started, 2)
    return Adapted(head, threshold, summary)


def _summary(
    log: ServedLog,
    selection: LabelSelection,
    settings: AdaptSettings,
    stages: Sequence[StageResult],
    regenerated: int,
    confidence: np.ndarray,
    correct: np.ndarray,
    threshold: th.Threshold,
    stage2: Sequence[Record],
) -> dict[str, Any]:
    answered = int((confidence >= threshold.value).sum()) if confidence.size else 0
    return {
        "settings": asdict(settings),
        "counts": {
            "served_answers": len(log.answers),
            "served_questions": len(served_records(log)),
            "stage1_questions": stages[0].n_train + stages[0].n_dev,
            "samples_regenerated_for": regenerated,
            "labelled_answers": len(log.labelled()),
            "labels_used": len(selection.records),
            "stage2_labels": len(stage2),
            "held_out_labels": int(correct.size),
            "held_out_answered": answered,
            "bad_lines": log.bad_lines,
            "orphan_labels": log.orphan_labels,
        },
        "held_out": {
            "auroc": _finite(auroc(confidence, correct)),
            "ece": _finite(ece(confidence, correct)),
            "accuracy": float(correct.mean()),
        },
        "labels": selection.to_dict(),
        "threshold": threshold.to_dict(),
        "guarantee": _guarantee(threshold, settings, answered),
        "guarantee_exercised": answered > 0,
        # The request shapes the labels came from: the calibration holds for those (docs/serving.md
        # "Calibrated for your system prompt"), and the text of each system prompt among them.
        "tuned_on": list(shapes_of(r.item.history for r in stage2)),
        "system_prompts": system_prompts_of(r.item.history for r in stage2),
        "stages": [{k: v for k, v in asdict(s).items() if k != "history"} for s in stages],
    }


def _guarantee(threshold: th.Threshold, settings: AdaptSettings, answered: int) -> str:
    """The guarantee in words: "not exercised (0 answered)" when the threshold answers no held-out question."""
    if answered == 0 or threshold.expected_coverage == 0.0:
        return (
            f"not exercised (0 answered): no threshold certifies an answered error rate of at most "
            f"{settings.alpha:g} at δ={settings.delta:g} on the held-out labels, so the model abstains on everything"
        )
    return (
        f"with probability at least {1 - settings.delta:g}, the error rate of answered questions is at most "
        f"{settings.alpha:g} (threshold {threshold.value:.3f}, {answered} of {threshold.n_dev} held-out labels "
        f"answered), assuming {GUARANTEE_ASSUMES}"
    )


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


@dataclass(frozen=True)
class Lineage:
    """Which model an adaptation starts from: its version (None if unnamed) and how many adaptations made it."""

    version: str | None
    generation: int

    @classmethod
    def of(cls, folder: str | Path) -> Lineage:
        folder = Path(folder)
        value = read_config(folder).get(VERSION_KEY)
        try:
            previous = json.loads((folder / SUMMARY_FILE).read_text()) if (folder / SUMMARY_FILE).exists() else {}
        except (OSError, json.JSONDecodeError) as exc:
            raise CandorError(f"{folder / SUMMARY_FILE}: cannot read it ({exc})") from None
        generation = previous.get("generation", 0)
        return cls(None if value in (None, "") else str(value), generation if isinstance(generation, int) else 0)

    def next_version(self) -> str:
        """A new version name: the UTC time and the adaptation's generation (``20261203T171500Z-adapt2``)."""
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-adapt{self.generation + 1}"


def save_adapted(model: HonestModel, adapted: Adapted, out: str | Path, lineage: Lineage) -> str:
    """The adapted model as one folder, swapped in whole: honest.json (with a new ``version``), head/, adapt.json.

    Returns the version. Where ``save_pretrained`` names the version itself, that name is kept.
    """
    new = HonestModel(
        model.backend,
        HeadSource(adapted.head),
        None,
        adapted.threshold,
        template=model.template.name,
        decoding=model.decoding,
        backend_name=model.backend_name,
    )
    new.tuned_on = tuple(adapted.summary.get("tuned_on") or (QUESTION,))
    new.system_prompts = dict(adapted.summary.get("system_prompts") or {})
    version = new.version = lineage.next_version()  # never the served model's name: a new time and generation
    out = Path(out)
    with atomic_folder(out) as staging:
        new.save_pretrained(staging)
        summary = {
            **adapted.summary,
            "version": version,
            "generation": lineage.generation + 1,
            "adapted_from": lineage.version,
        }
        (staging / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return version


def read_served_answers(source: str | Path) -> ServedLog:
    """The served answers with their latest labels: from a store (indexed queries) or a served log file."""
    if not is_store_url(source):
        return read_served(source)
    with ServedStore(str(source)) as store:
        return store.served_log()


def adapt(source: str | Path, honest: str | Path, out: str | Path, settings: AdaptSettings) -> dict[str, Any]:
    """``candor adapt``: read the served answers (a store URL or a log file), check the labels, train, and write
    the new folder; returns the summary."""
    honest, out = Path(honest), Path(out)
    if Path(out).resolve() != honest.resolve():
        check_replaceable(out, CONFIG_FILE, inputs=() if is_store_url(source) else (Path(source),))
    log = read_served_answers(source)
    if not log.answers:
        raise CandorError(f"{source}: no served records")
    stage2, _ = split_labels(select_labels(log.answers, settings.label_sources).records, settings)
    check_system_prompt(stage2, settings)  # both refuse before any model loads
    lineage = Lineage.of(honest)
    model = HonestModel.from_pretrained(honest)
    adapted = adapt_model(model, log, settings)
    if out.resolve() == honest.resolve() and adapted.summary[PROMOTION_KEY]["status"] == KEPT:
        # A kept model never replaces the serving folder: the report carries the numbers, nothing is written.
        return {**adapted.summary, "version": None, "generation": None, "adapted_from": lineage.version, "folder": None}
    version = save_adapted(model, adapted, out, lineage)
    return {
        **adapted.summary,
        "version": version,
        "generation": lineage.generation + 1,
        "adapted_from": lineage.version,
        "folder": str(out),
    }
