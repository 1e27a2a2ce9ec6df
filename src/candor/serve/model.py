"""``HonestModel``: a generator, a confidence source, an optional calibrator and an abstention threshold.

    from candor.serve import HonestModel
    model = HonestModel(load_backend("smollm2-135m"), confidence="n-prob", threshold=0.3)
    model.answer("Who wrote Hamlet?").to_dict()
    # {"answer": ..., "confidence": 0.41, "abstained": False, "reason": "...", "method": "n-prob", ...}

A question-level source (an EliCal head) decides before generating, so a
declined question is never generated. An answer-level source generates first,
then scores the answer. The question is rendered with the QA prompt template
the confidence was made for (``fewshot`` for the embedded default).

One folder holds a tuned model (:meth:`HonestModel.save_pretrained`)::

    honest.json   generator (model, backend, template, decoding), confidence source,
                  calibrator (name and the dev data it was fitted on), threshold
    head/         the EliCal head (head sources only)
    adapter/      the generator's PEFT adapter (when it has one; ADVICE)

The calibrator is stored in its own JSON form (``Calibrator.to_dict``), with
the number of dev questions it was fitted on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.prompts import QATemplate, resolve_template
from candor.annotation.records import Record
from candor.backends.base import Backend, Completion, SamplingParams
from candor.evaluation.calibration import Calibrator, calibrator_from_dict, get_calibrator
from candor.serve import thresholds as th
from candor.serve.confidence import ConfidenceSource, answer_records, as_source, load_source, question_item
from candor.util.errors import CandorError
from candor.util.files import atomic_folder

logger = logging.getLogger(__name__)

CONFIG_FILE = "honest.json"
ADAPTER_DIR = "adapter"
DEFAULT_REFUSAL = "I don't know."


@dataclass(frozen=True)
class Decoding:
    """How answers are generated: greedy (temperature 0, the default) or sampled."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def params(self, stop: Sequence[str] = ()) -> SamplingParams:
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, self.top_k, tuple(stop))


@dataclass
class HonestAnswer:
    """One answer with its confidence; ``answer`` is None when the model abstained."""

    answer: str | None
    confidence: float
    abstained: bool
    reason: str
    method: str
    calibrated: bool = False
    threshold: float | None = None
    finish_reason: str = "stop"  # "stop", "length" or "abstained"
    completion_tokens: int = 0
    withheld: str | None = field(default=None, repr=False)  # an answer-level source's answer it declined

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("withheld")
        return out


class HonestModel:
    """Answers questions with a confidence, abstaining below ``threshold`` (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        confidence: str | ConfidenceSource = "n-prob",
        calibrator: Calibrator | None = None,
        threshold: th.Threshold | float | None = None,
        *,
        template: str = "auto",
        decoding: Decoding | None = None,
        backend_name: str = "hf",
    ) -> None:
        self.backend = backend
        self.backend_name = backend_name  # the registry name that reloads the generator
        self.source = as_source(confidence)
        self.calibrator = calibrator
        self._calibrated_on = 0  # dev questions the calibrator was fitted on (0: unknown)
        self.threshold = th.Threshold(float(threshold)) if isinstance(threshold, (int, float)) else threshold
        self.template: QATemplate = resolve_template(template, backend.model_name, backend)
        self.decoding = decoding or Decoding()

    @property
    def method(self) -> str:
        return self.source.name

    # ------------------------------------------------------------ answering

    def answer(self, question: str) -> HonestAnswer:
        """The greedy answer to one question, or an abstention, with its confidence."""
        return self.answer_batch([question])[0][0]

    def answer_batch(
        self, questions: Sequence[str], n: int = 1, decoding: Decoding | None = None, stop: Sequence[str] = ()
    ) -> list[list[HonestAnswer]]:
        """``n`` answers per question, all generated in one backend call (the micro-batcher's unit of work)."""
        if not questions:
            return []
        decoding = decoding or self.decoding
        if self.source.before_generation:
            conf = self._calibrated(self.source.score_questions(questions))
            keep = [i for i, c in enumerate(conf) if not self._declines(c)]
            out = [[self._abstention(c, "declined before generating")] * n for c in conf]
            if keep:
                answers = self._generate([questions[i] for i in keep], n, decoding, stop)
                for i, choices in zip(keep, answers, strict=True):
                    out[i] = [self._answered(c, conf[i], decoding) for c in choices]
            return out
        return self._answer_then_score(questions, n, decoding, stop)

    def _answer_then_score(
        self, questions: Sequence[str], n: int, decoding: Decoding, stop: Sequence[str]
    ) -> list[list[HonestAnswer]]:
        gens = self._raw_generate(questions, n, decoding, stop)
        flat_q, flat_a, flat_s = [], [], []
        for q, (choices, samples) in zip(questions, gens, strict=True):
            for c in choices:
                flat_q.append(q)
                flat_a.append(c)
                flat_s.append(samples)
        conf = self._calibrated(self.source.score_records(answer_records(flat_q, flat_a, flat_s), self.backend))
        out, j = [], 0
        for choices, _ in gens:
            row = []
            for c in choices:
                if self._declines(conf[j]):
                    row.append(self._abstention(conf[j], "answer scored below the threshold", withheld=c.text))
                else:
                    row.append(self._answered(c, conf[j], decoding))
                j += 1
            out.append(row)
        return out

    def _generate(
        self, questions: Sequence[str], n: int, decoding: Decoding, stop: Sequence[str]
    ) -> list[list[Completion]]:
        return [choices for choices, _ in self._raw_generate(questions, n, decoding, stop)]

    def _raw_generate(
        self, questions: Sequence[str], n: int, decoding: Decoding, stop: Sequence[str]
    ) -> list[tuple[list[Completion], list[Completion]]]:
        """Per question: the ``n`` returned answers and the source's extra samples, from one generate call."""
        prompts = [self.template(question_item(q, i), self.backend) for i, q in enumerate(questions)]
        greedy = decoding.temperature == 0
        n_choices = 0 if greedy else n
        params = decoding.params(tuple(self.template.stop) + tuple(stop))
        if greedy and self.source.samples:
            # The source's samples follow DESIGN.md §4.1 (temperature 1, top-p 0.95, top-k 50).
            params = SamplingParams(decoding.max_new_tokens, stop=params.stop)
        gens = self.backend.generate(
            prompts, n_choices + self.source.samples, params, greedy=greedy, seeds=[question_seed(q) for q in questions]
        )
        out = []
        for g in gens:
            choices = [g.greedy] * n if greedy else g.samples[:n]
            out.append((choices, g.samples[n_choices:]))
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------ deciding

    def _calibrated(self, raw: np.ndarray) -> np.ndarray:
        return self.calibrator.predict(raw) if self.calibrator is not None else np.asarray(raw, dtype=float)

    def _declines(self, confidence: float) -> bool:
        return self.threshold is not None and self.threshold.abstains(float(confidence))

    def _threshold_value(self) -> float | None:
        return None if self.threshold is None else self.threshold.value

    def _abstention(self, confidence: float, reason: str, withheld: str | None = None) -> HonestAnswer:
        return HonestAnswer(
            None, float(confidence), True, f"{reason} ({confidence:.3f} < {self._threshold_value():.3f})",
            self.method, self.calibrator is not None, self._threshold_value(), "abstained", 0, withheld,
        )  # fmt: skip

    def _answered(self, completion: Completion, confidence: float, decoding: Decoding) -> HonestAnswer:
        reason = "no threshold set" if self.threshold is None else f"confidence ≥ {self.threshold.value:.3f}"
        return HonestAnswer(
            completion.text, float(confidence), False, reason, self.method, self.calibrator is not None,
            self._threshold_value(), self._finish(completion, decoding), len(completion.token_ids),
        )  # fmt: skip

    @staticmethod
    def _finish(completion: Completion, decoding: Decoding) -> str:
        # A row that stopped on EOS or a stop string dropped its last token, so it is shorter than the cap.
        return "length" if len(completion.token_ids) >= decoding.max_new_tokens else "stop"

    # ------------------------------------------------------------ tuning on dev

    def confidences(self, records: Sequence[Record]) -> np.ndarray:
        """Raw (uncalibrated) confidence of annotated records' greedy answers."""
        return self.source.score_records(records, self.backend)

    def tune(
        self,
        dev: Sequence[Record],
        rule: str,
        target: float,
        *,
        delta: float = 0.1,
        calibrator: str | None = None,
        seed: int = 0,
    ) -> th.Threshold:
        """Choose the threshold (and optionally fit a calibrator) on annotated dev records.

        With a calibrator, dev is split in two seeded halves: the calibrator is
        fitted on one and the threshold chosen on the other, so the threshold's
        dev estimates (and the risk-control guarantee) come from data the
        calibrator never saw.
        """
        labelled = [r for r in dev if r.greedy_correct is not None]
        if len(labelled) < len(dev):
            logger.warning("tune: skipped %d dev records without greedy correctness", len(dev) - len(labelled))
        if not labelled:
            raise CandorError("tune: no dev record has a greedy-correctness label")
        conf = self.confidences(labelled)
        correct = np.array([int(r.greedy_correct) for r in labelled])  # type: ignore[arg-type]
        if calibrator is not None:
            order = np.random.default_rng(seed).permutation(len(labelled))
            fit, held = order[: len(order) // 2], order[len(order) // 2 :]
            self.fit_calibrator(calibrator, conf[fit], correct[fit])
            conf, correct = self._calibrated(conf[held]), correct[held]
        self.threshold = th.choose(conf, correct, rule, target, delta=delta)
        return self.threshold

    def fit_calibrator(self, name: str, confidence: np.ndarray, correct: np.ndarray) -> Calibrator:
        self.calibrator = get_calibrator(name).fit(confidence, correct)
        self._calibrated_on = len(confidence)
        return self.calibrator

    # ------------------------------------------------------------ save / load

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write everything needed to answer into one folder (swapped in whole)."""
        folder = Path(folder)
        with atomic_folder(folder) as tmp:
            config = {
                "generator": self._generator_config(tmp),
                "confidence": self.source.save(tmp),
                "calibrator": self._calibrator_config(),
                "threshold": None if self.threshold is None else self.threshold.to_dict(),
            }
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return folder

    def _generator_config(self, folder: Path) -> dict[str, Any]:
        adapter = getattr(self.backend, "adapter", None)
        if adapter:
            shutil.copytree(adapter, folder / ADAPTER_DIR)
        return {
            "model": self.backend.model_name,
            "backend": self.backend_name,
            "adapter": ADAPTER_DIR if adapter else None,
            "template": self.template.name,
            "decoding": asdict(self.decoding),
        }

    def _calibrator_config(self) -> dict[str, Any] | None:
        if self.calibrator is None:
            return None
        return {**self.calibrator.to_dict(), "fitted_on": self._calibrated_on}

    @classmethod
    def from_pretrained(cls, folder: str | Path, backend: Backend | None = None, **backend_kwargs: Any) -> HonestModel:
        """Reload a saved model; the generator is loaded by name unless ``backend`` is given."""
        folder = Path(folder)
        path = folder / CONFIG_FILE
        if not path.exists():
            raise CandorError(f"{folder}: not a saved honest model (no {CONFIG_FILE})")
        try:
            config = json.loads(path.read_text())
            gen = config["generator"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CandorError(f"{path}: not a valid honest-model config ({exc})") from None
        if backend is None:
            from candor.backends import load_backend

            if gen.get("adapter"):
                backend_kwargs["adapter"] = str(folder / gen["adapter"])
            backend = load_backend(gen["model"], gen.get("backend", "hf"), **backend_kwargs)
        threshold = th.Threshold.from_dict(config["threshold"]) if config.get("threshold") else None
        cal = config.get("calibrator")
        calibrator = calibrator_from_dict(cal) if cal else None
        model = cls(backend, load_source(config["confidence"], folder), calibrator, threshold,
                    template=gen.get("template", "auto"), decoding=Decoding(**gen.get("decoding", {})),
                    backend_name=gen.get("backend", "hf"))  # fmt: skip
        model._calibrated_on = int(cal.get("fitted_on", 0)) if cal else 0
        return model


def question_seed(question: str) -> int:
    """A seed from the question's text, so its samples never depend on the batch it shares."""
    return int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "little") >> 1
