"""One call that diagnoses a model (and its adapter) and writes the report.

Stages are registered by name (:data:`STAGES`): how many questions each
uses (picked by :func:`spread`, balanced over datasets), a function of the
backend, those candidate sets and the config, and the result type it returns,
so a cached result can be read back. With a ``cache_dir`` every finished
stage of every model is saved as JSON, keyed by the model's name and weights,
the adapter's weights, the config and the stage's questions
(:mod:`candor.util.digests`); a rerun with the same inputs loads it instead of
recomputing, so a killed run resumes at the stage it was in, and another
model (or a retrained adapter) saved under the same name is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.annotation.records import Record
from candor.backends.default_model import DEFAULT_MODEL
from candor.diagnose.attribution import AttributionResult, integrated_gradients
from candor.diagnose.candidates import CandidateSet, build_candidates
from candor.diagnose.config_and_results import DiagnoseConfig, ModelDiagnosis
from candor.diagnose.diagnosis_report import write_diagnosis_report
from candor.diagnose.masking import MaskingResult, masking_counterfactual
from candor.diagnose.rollout import RolloutResult, rollout_masses
from candor.diagnose.sensitivity import SensitivityResult, answer_sensitivity
from candor.util.digests import backend_identity, path_digest
from candor.util.errors import CandorError
from candor.util.files import read_keyed_json, write_keyed_json
from candor.util.registry import Registry
from candor.util.resource_meter import ResourceMeter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """A diagnostic: which questions it uses, how it runs on them, and the result type (for the cache)."""

    count: Callable[[DiagnoseConfig], int | None]  # how many questions; None = all
    run: Callable[[Any, Sequence[CandidateSet], DiagnoseConfig], Any]
    result_type: Any


STAGES: Registry[Stage] = Registry("diagnose stage")


def spread(candidates: Sequence[CandidateSet], n: int | None) -> list[CandidateSet]:
    """``n`` candidate sets, shared out over the datasets as evenly as they allow, in their original order.

    Within a dataset the picks are evenly spaced through its questions. All
    of them when ``n`` is None or at least their number.
    """
    if n is None or n >= len(candidates):
        return list(candidates)
    groups: dict[str, list[int]] = {}
    for index, c in enumerate(candidates):
        groups.setdefault(c.item.dataset, []).append(index)
    quota = dict.fromkeys(groups, 0)
    while sum(quota.values()) < n:  # round robin, skipping datasets already used up
        for name, members in groups.items():
            if quota[name] < len(members) and sum(quota.values()) < n:
                quota[name] += 1
    picked = [
        members[int(k * len(members) / quota[name])] for name, members in groups.items() for k in range(quota[name])
    ]
    return [candidates[i] for i in sorted(picked)]


def _own_answers(chosen: Sequence[CandidateSet]) -> tuple[list[Any], list[str]]:
    return [c.item for c in chosen], [c.answers[0] for c in chosen]


def _sensitivity(backend: Any, cands: Sequence[CandidateSet], cfg: DiagnoseConfig) -> SensitivityResult:
    return answer_sensitivity(backend, cands, cfg.fmt, cfg.variant)


def _masking(backend: Any, cands: Sequence[CandidateSet], cfg: DiagnoseConfig) -> MaskingResult:
    items, answers = _own_answers(cands)
    return masking_counterfactual(backend, items, answers, cfg.fmt, cfg.variant, batch_size=cfg.batch_size)


def _rollout(backend: Any, cands: Sequence[CandidateSet], cfg: DiagnoseConfig) -> RolloutResult:
    items, answers = _own_answers(cands)
    return rollout_masses(backend, items, answers, cfg.fmt, cfg.variant)


def _attribution(backend: Any, cands: Sequence[CandidateSet], cfg: DiagnoseConfig) -> AttributionResult:
    items, answers = _own_answers(cands)
    return integrated_gradients(
        backend, items, answers, cfg.fmt, cfg.variant, steps=cfg.ig_steps, internal_batch_size=cfg.ig_batch_size
    )


STAGES.register("sensitivity")(Stage(lambda cfg: None, _sensitivity, SensitivityResult))
STAGES.register("masking")(Stage(lambda cfg: cfg.mask_examples, _masking, MaskingResult))
STAGES.register("rollout")(Stage(lambda cfg: cfg.rollout_examples, _rollout, RolloutResult))
STAGES.register("attribution")(Stage(lambda cfg: cfg.ig_examples, _attribution, AttributionResult))


@dataclass
class DiagnosisReport:
    """What :func:`run_diagnosis` found and wrote: one :class:`ModelDiagnosis` per model, and the files."""

    config: DiagnoseConfig
    candidates: list[CandidateSet]
    diagnoses: dict[str, ModelDiagnosis]
    files: dict[str, Path] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {name: d.summary(self.config.top_k) for name, d in self.diagnoses.items()}


def diagnose_model(
    backend: Any,
    candidates: Sequence[CandidateSet],
    config: DiagnoseConfig,
    *,
    name: str = "base",
    model: str = "",
    adapter: str | None = None,
    cache_dir: str | Path | None = None,
) -> ModelDiagnosis:
    """Run the configured stages for one loaded model (cached per stage when ``cache_dir`` is given)."""
    if not candidates:
        raise CandorError("diagnose: no questions with candidate answers")
    diagnosis = ModelDiagnosis(name=name, model=model or getattr(backend, "model_name", ""), adapter=adapter)
    identity = {**backend_identity(backend), "model": diagnosis.model} if cache_dir is not None else {}
    if cache_dir is not None and adapter:
        identity["adapter"] = {"path": str(adapter), "sha256": path_digest(adapter)}
    for stage_name in config.stages:
        stage = STAGES.get(stage_name)
        chosen = spread(candidates, stage.count(config))
        key = _fingerprint(identity, config, stage_name, chosen)
        path = Path(cache_dir) / name / f"{stage_name}.json" if cache_dir is not None else None
        cached = read_keyed_json(path, key)
        if cached is not None:
            setattr(diagnosis, stage_name, stage.result_type.from_dict(cached["result"]))
            diagnosis.costs[stage_name] = cached.get("cost", {})
            logger.info("diagnose %s/%s: loaded from %s", name, stage_name, path)
            continue
        logger.info("diagnose %s/%s: running on %d questions", name, stage_name, len(chosen))
        with ResourceMeter() as meter:
            result = stage.run(backend, chosen, config)
        setattr(diagnosis, stage_name, result)
        diagnosis.costs[stage_name] = meter.cost.as_dict()
        if path is not None:
            write_keyed_json(path, key, {"cost": diagnosis.costs[stage_name], "result": result.to_dict()})
    return diagnosis


def run_diagnosis(
    questions: Sequence[CandidateSet] | Sequence[Record],
    out_dir: str | Path,
    *,
    model: str = DEFAULT_MODEL,
    adapter: str | None = None,
    adapter_name: str = "adapter",
    config: DiagnoseConfig | None = None,
    backends: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    title: str = "Diagnose",
) -> DiagnosisReport:
    """Diagnose ``model`` (as "base") and, given ``adapter``, the model with it (as ``adapter_name``).

    ``questions`` are candidate sets, or records to build them from
    (:func:`~candor.diagnose.candidates.build_candidates` with the config's
    cap, seed and judge). ``backends`` (name → loaded backend) replaces the
    loading of ``model`` and ``adapter``. Writes the report to ``out_dir``
    and returns the results.
    """
    config = config or DiagnoseConfig()
    candidates = _as_candidates(questions, config)
    diagnoses = {}
    for name, backend, adapter_dir in _backends(model, adapter, adapter_name, backends):
        diagnoses[name] = diagnose_model(
            backend,
            candidates,
            config,
            name=name,
            model=getattr(backend, "model_name", model),
            adapter=adapter_dir,
            cache_dir=cache_dir,
        )
        del backend  # free this model before the generator loads the next
    files = write_diagnosis_report(diagnoses, out_dir, config, title)
    return DiagnosisReport(config, candidates, diagnoses, files)


def _as_candidates(questions: Sequence[CandidateSet] | Sequence[Record], config: DiagnoseConfig) -> list[CandidateSet]:
    if all(isinstance(q, CandidateSet) for q in questions):
        return list(questions)  # type: ignore[arg-type]
    if all(isinstance(q, Record) for q in questions):
        return build_candidates(
            questions,
            max_candidates=config.max_candidates,
            seed=config.seed,  # type: ignore[arg-type]
            judge=config.judge,
        )
    raise CandorError("diagnose: pass candidate sets or records, not a mix")


def _backends(
    model: str, adapter: str | None, adapter_name: str, given: Mapping[str, Any] | None
) -> Iterator[tuple[str, Any, str | None]]:
    """``(name, backend, adapter dir)`` one at a time, so only one loaded model is alive at once."""
    if given is not None:
        for name, backend in given.items():
            yield name, backend, getattr(backend, "adapter", None)
        return
    from candor.backends.hf import HFBackend

    if adapter is not None and adapter_name == "base":
        raise CandorError("the adapter side cannot be called 'base'")
    yield "base", HFBackend.from_pretrained(model), None
    if adapter is not None:
        yield adapter_name, HFBackend.from_pretrained(model, adapter=adapter), adapter


def _fingerprint(
    identity: Mapping[str, Any], config: DiagnoseConfig, stage: str, chosen: Sequence[CandidateSet]
) -> str:
    """The cache key of one stage: model and adapter (names and weights), settings, the stage's questions."""
    settings = {k: v for k, v in config.to_dict().items() if k != "stages"}
    payload = json.dumps([dict(identity), settings, stage, [c.to_dict() for c in chosen]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
