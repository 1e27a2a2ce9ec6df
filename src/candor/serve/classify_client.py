"""A question-level confidence read from a classify endpoint that serves an exported EliCal head.

``candor export HEAD --to seq-cls OUT`` writes the head as a one-label
``*ForSequenceClassification`` checkpoint. An engine serves it (vLLM with
``--runner pooling``, or ``candor serve-head OUT`` where vLLM is absent), and
:class:`ClassifySource` reads the confidence from there, so the process that
answers holds no model weights: the tokenizer and ``candor_export.json`` of
OUT are all it reads.

The wire format is vLLM's classify API::

    POST {url}/classify   {"model": NAME, "input": [prompt, ...]}
    ->  {"data": [{"index": i, "label": "confident", "probs": [p], "num_classes": 1}, ...], ...}

For a one-label classifier ``probs[0]`` is the sigmoid of the logit; vLLM adds
the head's bias back only with the ``--pooler-config`` the export prints
(``candor serve-head`` adds it itself). Each prompt is the head's own
template rendered here, exactly as the head was trained on it.

At startup the source asks ``{url}/v1/models`` for the served model's name
and sends the export's probe question: a server that is unreachable, answers
another shape, or answers a confidence that is not the head's (no bias, half
precision, another model) is refused there, before any request is served.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.prompts import render_prompts
from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.backends.chat import TokenizerChat
from candor.data.items import QAItem
from candor.train.elical.export import EXPORT_FILE, read_export
from candor.util.errors import CandorError, UpstreamError

logger = logging.getLogger(__name__)

EXPORT_DIR = "classify-head"  # in a saved honest model: the export's tokenizer and candor_export.json
# How far the server's confidence on the probe may sit from the head's: float32 engines agree within
# about 1e-5; a dropped bias or a half-precision engine is off by about 1e-2 (see the export's notes).
PROBE_TOLERANCE = 2e-3


class ClassifyServerError(UpstreamError):
    """The classify server could not be reached, refused a request, or answered another shape."""


def server_root(url: str) -> str:
    """The server's address without a trailing ``/`` or ``/v1`` (vLLM's ``/classify`` sits at the root)."""
    root = url.rstrip("/")
    if not root.startswith(("http://", "https://")):
        raise CandorError(f"--confidence-url must be an http(s) address such as http://127.0.0.1:8001, got {url!r}")
    return root.removesuffix("/v1")


class ClassifyClient:
    """vLLM's classify API over HTTP (the standard library's client: one request per call)."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.root = server_root(url)
        self.timeout = timeout

    def models(self) -> list[str]:
        """The names the server serves (``GET /v1/models``)."""
        body = self._call("GET", "/v1/models", None)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ClassifyServerError(f"{self.root}/v1/models answered an unexpected shape: {_short(body)}")
        return [m["id"] for m in data]

    def classify(self, model: str, prompts: Sequence[str]) -> np.ndarray:
        """``probs[0]`` of each prompt, in the order sent."""
        if not prompts:
            return np.zeros(0, dtype=float)
        body = self._call("POST", "/classify", {"model": model, "input": list(prompts)})
        return one_label_probs(body, len(prompts), f"{self.root}/classify")

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            self.root + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise ClassifyServerError(f"{self.root}{path} answered {exc.code}: {_short(detail)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClassifyServerError(f"the classify server at {self.root} is unreachable ({reason})") from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise ClassifyServerError(f"{self.root}{path} answered something that is not JSON: {_short(raw)}") from None


def one_label_probs(body: Any, expected: int, where: str) -> np.ndarray:
    """The one probability per input of a classify response, checked (count, indices, one label, in [0, 1])."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        raise ClassifyServerError(f"{where} answered {_short(body)}; expected 'data' with {expected} entries")
    probs = np.full(expected, np.nan)
    for entry in data:
        index = entry.get("index") if isinstance(entry, dict) else None
        values = entry.get("probs") if isinstance(entry, dict) else None
        if not isinstance(index, int) or not 0 <= index < expected or not isinstance(values, list):
            raise ClassifyServerError(f"{where} answered an entry without 'index' and 'probs': {_short(entry)}")
        if len(values) != 1:
            raise ClassifyServerError(
                f"{where} answered {len(values)} probabilities per input; an exported EliCal head has one label"
            )
        value = values[0]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ClassifyServerError(f"{where} answered a probability outside [0, 1]: {value!r}")
        probs[index] = float(value)
    if np.isnan(probs).any():
        raise ClassifyServerError(f"{where} answered the same index twice: {_short(body)}")
    return probs


class ClassifySource:
    """An exported EliCal head served elsewhere: confidence from the question alone, before any answer."""

    kind = "classify"
    name = "elical"
    before_generation = True
    samples = 0
    runs_in_engine = False  # an HTTP call: scored in a worker thread, never holding the engine

    def __init__(self, url: str, export: str | Path, timeout: float = 60.0) -> None:
        from transformers import AutoTokenizer

        self.export = Path(export)
        info = read_export(self.export)
        self.template = str(info["template"])
        self.backbone = str(info["backbone"])
        self.probe = info.get("probe")
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.export))
        self.client = ClassifyClient(url, timeout=timeout)
        self.model = self._served_model()
        self._check_probe()
        logger.info("confidence from %s (model %r, template %r)", self.client.root, self.model, self.template)

    @property
    def url(self) -> str:
        return self.client.root

    def _served_model(self) -> str:
        models = self.client.models()
        if len(models) != 1:
            raise ClassifyServerError(
                f"the classify server at {self.client.root} serves {len(models)} models ({', '.join(models)}); "
                "run it with the exported head alone"
            )
        return models[0]

    def _check_probe(self) -> None:
        """The server's confidence on the export's probe question is the head's (else: refused at startup)."""
        if not self.probe:
            logger.warning(
                "%s has no probe (exported by an older candor): the server's confidences are not "
                "checked against the head's; re-export to check them",
                self.export,
            )
            return
        if self.prompts([self.probe["question"]])[0] != self.probe["prompt"]:
            raise CandorError(f"{self.export}: the tokenizer renders the probe prompt differently from the export")
        got = float(self.client.classify(self.model, [self.probe["prompt"]])[0])
        want = float(self.probe["confidence"])
        if abs(got - want) > PROBE_TOLERANCE:
            raise ClassifyServerError(
                f"the classify server at {self.client.root} gives {got:.6f} on the export's probe question, the head "
                f"gives {want:.6f}: is it serving {self.export} with the head's bias (vLLM: --pooler-config "
                f"'{read_export(self.export).get('vllm_pooler_config')}') in float32 (--dtype float32)?"
            )

    def prompts(self, inputs: Sequence[Record | QAItem | str]) -> list[str]:
        """The head's prompt for each question or record, rendered with the template it was trained on."""
        return render_prompts(inputs, self.template, TokenizerChat(self.tokenizer, self.backbone))

    def check(self, backend: Backend) -> None:
        return None  # the head reads the question alone, whatever generates the answer

    def score_questions(self, questions: Sequence[str]) -> np.ndarray:
        return self.client.classify(self.model, self.prompts(list(questions)))

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return self.client.classify(self.model, self.prompts(list(records)))

    def save(self, folder: Path) -> dict[str, Any]:
        """The server's address and what renders its prompts (tokenizer, export description); no weights."""
        target = folder / EXPORT_DIR
        self.tokenizer.save_pretrained(str(target))
        shutil.copy2(self.export / EXPORT_FILE, target / EXPORT_FILE)
        return {"kind": self.kind, "url": self.client.root, "export": EXPORT_DIR, "timeout": self.client.timeout}

    @classmethod
    def load(cls, config: dict[str, Any], folder: Path) -> ClassifySource:
        return cls(config["url"], folder / config["export"], timeout=float(config.get("timeout", 60.0)))


def _short(value: Any, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"
