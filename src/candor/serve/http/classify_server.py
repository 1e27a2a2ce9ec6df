"""``candor serve-head OUT``: vLLM's classify API for an exported EliCal head, where vLLM is absent.

``transformers serve`` has no classify endpoint, so this small app serves the
folder ``candor export HEAD --to seq-cls OUT`` wrote, loaded with
``AutoModelForSequenceClassification``, with the request and response shapes
of vLLM's ``POST /classify``:

- request ``{"model": NAME, "input": "prompt" | ["prompt", ...]}`` (``model``
  may be left out; another name is a 404, as in vLLM);
- response ``{"id", "object": "list", "created", "model", "data": [{"index",
  "label", "probs": [p], "num_classes": 1}], "usage"}``, where ``p`` is the
  head's confidence: the sigmoid of the logit plus ``candor_logit_bias`` (the
  bias vLLM adds back through ``--pooler-config``).

Prompts are encoded as the head encodes them, which the export checked is
what an engine feeds the model (the export's tokenizer with its special tokens). Requests
run one at a time under a lock, each as one padded batch. Also ``GET
/v1/models`` and ``GET /health``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from candor.train.elical.export import LABEL, read_export, seq_cls_confidence
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


class HeadClassifier:
    """The exported classifier and its tokenizer, scoring rendered prompts one batch at a time."""

    def __init__(self, folder: str | Path, name: str | None = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.folder = Path(folder)
        self.info = read_export(self.folder)  # refuses a folder that is not a candor export
        self.name = name or str(self.folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(str(self.folder)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.lock = threading.Lock()

    def confidences(self, prompts: list[str]) -> tuple[list[float], int]:
        """Each prompt's confidence and the number of prompt tokens read."""
        with self.lock:
            probs = seq_cls_confidence(self.model, self.tokenizer, prompts)
            tokens = sum(len(self.tokenizer(p)["input_ids"]) for p in prompts)
        return [float(p) for p in probs], tokens


def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    """vLLM's (and OpenAI's) error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def parse_inputs(body: Any, served: str) -> list[str] | JSONResponse:
    """The prompts of a classify request, or the error response that refuses it."""
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served:
        return error(404, f"The model `{model}` does not exist.", "NotFoundError")
    if body.get("use_activation") is False:
        return error(400, "this server returns probabilities only (use_activation must be true or absent)")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(p, str) and p for p in inputs):
        return error(400, "'input' must be a non-empty string or a non-empty list of non-empty strings")
    return inputs


def create_classify_app(classifier: HeadClassifier) -> FastAPI:
    """The classify service around ``classifier``."""
    app = FastAPI(title="candor serve-head")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": classifier.name, "object": "model", "created": 0, "owned_by": "candor", "root": classifier.name}
            ],
        }

    @app.post("/classify")
    async def classify(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the request body is not JSON")
        inputs = parse_inputs(body, classifier.name)
        if isinstance(inputs, JSONResponse):
            return inputs
        import anyio.to_thread

        probs, tokens = await anyio.to_thread.run_sync(classifier.confidences, inputs)
        data = [{"index": i, "label": LABEL, "probs": [p], "num_classes": 1} for i, p in enumerate(probs)]
        return JSONResponse(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": classifier.name,
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
            }
        )

    return app


def load_classify_app(folder: str | Path, name: str | None = None) -> FastAPI:
    """Load the export in ``folder`` and wrap it in the classify service."""
    if not Path(folder).is_dir():
        raise CandorError(f"{folder}: no such folder")
    classifier = HeadClassifier(folder, name)
    logger.info(
        "serving %s (%s, template %r) as %r",
        folder,
        classifier.info.get("architecture"),
        classifier.info.get("template"),
        classifier.name,
    )
    return create_classify_app(classifier)
