"""An answer-level linear probe (SAPLMA-style): is the greedy answer correct, from the model's hidden state?

It is the answer-level counterpart of EliCal's question-level head: where the
head reads the QA prompt alone, the probe reads the last token of
``prompt + greedy answer`` at a hidden layer (the middle one by default) of the
frozen answering model and predicts ``greedy_correct`` with a logistic
regression on standardized features (scikit-learn, ``C`` = 1 by default).

Features go through EliCal's on-disk feature cache
(:class:`candor.train.elical.features.FeatureCache`), keyed by backbone, layer and
template (suffixed ``+greedy``) and by the text, so retraining with other
settings never re-runs the model. A trained probe is a folder::

    probe_config.json          backbone, layer, template, training sizes, C
    probe.npz                  mean, scale, coef, intercept
    training_questions.json    fingerprints of the training questions (contamination guard)

Train with ``candor train probe --records train.jsonl --out DIR`` and score
with ``candor score -e probe -O probe.path=DIR``: :class:`AnswerProbeEstimator`
is the ``probe`` estimator, which joins the estimator registry through the
``candor.estimators`` entry point. The backend must be the backbone the probe
was trained on, since the probe reads its hidden states.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.contamination import write_manifest
from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.estimators.hidden_layers import answer_texts, middle_layer
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


CONFIG_FILE = "probe_config.json"
WEIGHTS_FILE = "probe.npz"


@dataclass
class ProbeConfig:
    """Settings of ``candor train probe`` (``--set KEY=VALUE``)."""

    layer: int | None = None  # None: the middle layer
    C: float = 1.0  # inverse L2 strength of the logistic regression
    feature_cache: str | None = None  # FeatureCache root; None: compute without caching
    device: str | None = None
    batch_size: int = 16


@dataclass
class ProbeInfo:
    """What a saved probe needs besides its weights, and what it was trained on."""

    backbone: str
    layer: int
    template: str
    C: float
    meta: dict[str, Any] = field(default_factory=dict)


def backbone_name(backend: Backend) -> str:
    adapter = getattr(backend, "adapter", None)
    return f"{backend.model_name}+{adapter}" if adapter else backend.model_name


def answer_features(
    records: Sequence[Record], backend: Backend, layer: int, cache_root: str | Path | None = None
) -> tuple[np.ndarray, str]:
    """``[records, hidden]`` last-token states of prompt + greedy answer, and the template's name."""
    prompts, template = record_prompts(records, backend)
    texts = answer_texts(prompts, [r.greedy.text for r in records])

    def extract(batch: Sequence[str]) -> np.ndarray:
        return backend.hidden_states(list(batch), layer=layer)

    if cache_root is None:
        return extract(texts), template
    from candor.train.elical.features import FeatureCache

    dtype = getattr(backend, "dtype", None) or "float32"
    cache = FeatureCache(cache_root, backbone_name(backend), layer, f"{template}+greedy", dtype)
    return cache.get(texts, extract), template


class AnswerProbe:
    """Standardize, then a logistic regression: ``sigmoid(((x - mean) / scale) · coef + intercept)``."""

    def __init__(
        self, info: ProbeInfo, mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: float
    ) -> None:
        self.info = info
        self.mean, self.scale, self.coef, self.intercept = mean, scale, coef, float(intercept)

    @classmethod
    def fit(cls, features: np.ndarray, labels: np.ndarray, info: ProbeInfo) -> AnswerProbe:
        from sklearn.linear_model import LogisticRegression

        labels = np.asarray(labels, dtype=int)
        if len(set(labels.tolist())) < 2:
            raise CandorError("the probe needs both correct and incorrect greedy answers in its training records")
        mean = features.mean(axis=0)
        scale = np.maximum(features.std(axis=0), 1e-4)
        model = LogisticRegression(C=info.C, max_iter=2000)
        model.fit((features - mean) / scale, labels)
        return cls(info, mean, scale, model.coef_[0].astype(float), float(model.intercept_[0]))

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(greedy answer correct) for each feature row."""
        logits = ((np.asarray(features, dtype=float) - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-logits))

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(
            folder / WEIGHTS_FILE,
            mean=self.mean,
            scale=self.scale,
            coef=self.coef,
            intercept=np.array([self.intercept]),
        )
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self.info), indent=2) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> AnswerProbe:
        folder = Path(folder)
        if not (folder / CONFIG_FILE).exists() or not (folder / WEIGHTS_FILE).exists():
            raise CandorError(f"{folder}: not a saved answer probe (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
        try:
            info = ProbeInfo(**json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
        except (TypeError, json.JSONDecodeError) as exc:
            raise CandorError(f"{folder / CONFIG_FILE}: bad probe config ({exc})") from None
        with np.load(folder / WEIGHTS_FILE) as w:
            return cls(info, w["mean"], w["scale"], w["coef"], float(w["intercept"][0]))


def labelled(records: Sequence[Record]) -> list[Record]:
    """The records with a greedy-correctness label; the rest are skipped with a count."""
    kept = [r for r in records if r.greedy_correct is not None]
    if len(kept) < len(records):
        logger.warning("probe: skipped %d of %d records without greedy_correct", len(records) - len(kept), len(records))
    return kept


def train_probe(
    records: Sequence[Record],
    backend: Backend,
    out: str | Path,
    config: ProbeConfig | None = None,
    sources: Sequence[str] = (),
) -> AnswerProbe:
    """Fit the probe on ``records``' greedy answers and save it (with its training-question manifest) to ``out``."""
    config = config or ProbeConfig()
    train = labelled(records)
    if not train:
        raise CandorError("no training record has greedy_correct; annotate the training pool first")
    layer = config.layer if config.layer is not None else middle_layer(backend)
    features, template = answer_features(train, backend, layer, config.feature_cache)
    labels = np.array([r.greedy_correct for r in train])
    info = ProbeInfo(
        backbone=backbone_name(backend),
        layer=layer,
        template=template,
        C=config.C,
        meta={"n_train": len(train), "positives": int(labels.sum()), "sources": list(sources)},
    )
    probe = AnswerProbe.fit(features, labels, info)
    probe.save(out)
    write_manifest(out, [r.item.question for r in train], sources)
    return probe


@ESTIMATORS.register("probe")
class AnswerProbeEstimator(Estimator):
    """The trained probe's probability that the greedy answer is correct."""

    name = "probe"
    level = "answer"
    needs_backend = True
    needs_hidden_states = True

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            raise CandorError("estimator 'probe' needs a trained probe: -O probe.path=DIR (`candor train probe`)")
        self.path = Path(path)
        self.probe = AnswerProbe.load(self.path)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        info = self.probe.info
        if backbone_name(backend) != info.backbone:
            raise CandorError(
                f"probe {self.path} was trained on {info.backbone!r} hidden states but the backend is "
                f"{backbone_name(backend)!r}; score with --model {info.backbone}"
            )
        features, template = answer_features(records, backend, info.layer)
        if template != info.template:
            raise CandorError(
                f"probe {self.path} was trained on {info.template!r} prompts but these records use {template!r}"
            )
        return self.probe.predict(features)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path), "layer": self.probe.info.layer}
