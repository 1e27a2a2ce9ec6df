"""An EliCal head as a standard transformers ``*ForSequenceClassification`` checkpoint.

See docs/architecture.md "Scale", Serving.

A serving engine cannot host candor's head, but it can host a sequence
classifier: vLLM's pooling runner (``--runner pooling``, the classify task)
and transformers' ``text-classification`` pipeline both score a prompt with
``score(final hidden state of the last prompt token)``, which is the head's
own computation. :func:`export_seq_cls` writes the head that way:

- the backbone (LoRA merged into it in ``lora`` mode) becomes the classifier's
  base model, unchanged;
- the head's input standardization is folded into one weight row,
  ``w / scale``, which becomes ``score.weight`` (``num_labels = 1``);
- ``pad_token_id`` in the config is the tokenizer's pad token, so transformers
  pools the last non-pad token, and the tokenizer pads on the right, so the
  positions of real tokens are those of an unpadded prompt.

**The bias.** Every decoder ``*ForSequenceClassification`` class in
transformers (and vLLM's) has a score layer without a bias, and no constant
can stand in for one: the pooled state is the output of the final RMSNorm,
``g * x / rms(x)``, so every linear function of it is divided by ``rms(x)``
and a constant term cannot be written as one. The exported checkpoint's raw
logit is therefore the head's logit minus its bias ``b``:

- vLLM adds it back exactly with ``--pooler-config '{"logit_mean": -b}'``
  (its classify pooler subtracts ``logit_mean`` before the sigmoid; vLLM
  releases before 0.32 named the field ``logit_bias``);
- transformers users add ``config.candor_logit_bias`` to the logit before the
  sigmoid (``function_to_apply="none"`` in the pipeline), as
  :func:`seq_cls_confidence` does.

Both numbers, and the prompt template the inputs must be rendered with, are
in ``candor_export.json`` and in ``config.json``. ``candor_export.json`` also
holds a probe (one question, its rendered prompt and the head's confidence on
it), so a client can check that a server answers with the head's confidence
(the bias added back, the right precision) before trusting it.

A head read from a layer other than the last cannot be exported: the
classifier always scores the final layer. Such a head is refused.
"""

from __future__ import annotations

import copy
import json
import logging
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from candor.backends.tokens import encode, pad_batch
from candor.train.elical.model import ConfidenceHead, HeadConfig, LinearHead
from candor.util.errors import CandorError
from candor.util.files import atomic_folder, check_replaceable

logger = logging.getLogger(__name__)

EXPORT_FILE = "candor_export.json"
BIAS_KEY = "candor_logit_bias"  # in config.json: add to the raw logit before the sigmoid
LABEL = "confident"
VLLM_BIAS_FIELD = "logit_mean"  # vLLM's PoolerConfig field subtracted from the logit (0.32; earlier: logit_bias)
PROBE_QUESTION = "What is the capital of France?"


@dataclass
class SeqClsExport:
    """What an export wrote, and how to serve it with the head's exact confidence."""

    folder: str
    source: str
    architecture: str
    mode: str
    template: str
    backbone: str
    logit_bias: float
    dtype: str = "float32"

    def vllm_pooler_config(self) -> str:
        """The ``--pooler-config`` value that makes vLLM's classify sigmoid the head's confidence."""
        return json.dumps({VLLM_BIAS_FIELD: -self.logit_bias})

    def vllm_command(self) -> str:
        """``vllm serve`` for the folder; ``--dtype`` keeps the exported precision (vLLM would pick half)."""
        return (
            f"vllm serve {shlex.quote(self.folder)} --runner pooling --dtype {self.dtype} "
            f"--pooler-config {shlex.quote(self.vllm_pooler_config())}"
        )


def export_seq_cls(
    head_dir: str | Path, out: str | Path, *, dtype: str | None = None, device: str = "cpu"
) -> SeqClsExport:
    """Write the head in ``head_dir`` to ``out`` as a ``*ForSequenceClassification`` checkpoint (swapped in whole)."""
    head_dir, out = Path(head_dir), Path(out)
    config = HeadConfig.read(head_dir)
    check_replaceable(out, EXPORT_FILE, inputs=(head_dir,))
    if config.layer < -1:  # a positive layer is checked against the backbone's depth once it is loaded
        raise _layer_error(head_dir, config.layer)
    head = ConfidenceHead.from_pretrained(head_dir, device=device, dtype=dtype)
    check_final_layer(head_dir, config, int(head.backbone.config.num_hidden_layers))
    tokenizer = exported_tokenizer(head)
    weight, bias = folded_linear(head.head)
    model = seq_cls_model(merged_backbone(head), weight, int(head.tokenizer.pad_token_id), bias)
    result = SeqClsExport(
        folder=str(out),
        source=str(head_dir),
        architecture=type(model).__name__,
        mode=config.mode,
        template=config.template,
        backbone=config.backbone,
        logit_bias=bias,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
    )
    with atomic_folder(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        info = {
            **asdict(result),
            "vllm_pooler_config": result.vllm_pooler_config(),
            "head_config": asdict(config),
            "probe": export_probe(head),
        }
        (tmp / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
    logger.info("exported %s (%s) to %s as %s; logit bias %.6g", head_dir, config.mode, out, result.architecture, bias)
    return result


def export_probe(head: ConfidenceHead) -> dict[str, Any]:
    """One question, its prompt as the head renders it, and the head's confidence on it (a server check)."""
    return {
        "question": PROBE_QUESTION,
        "prompt": head.prompts([PROBE_QUESTION])[0],
        "confidence": float(head.predict([PROBE_QUESTION])[0]),
    }


def check_final_layer(head_dir: Path, config: HeadConfig, num_layers: int) -> None:
    """Refuse a head that reads a layer other than the final one (``-1`` or ``num_layers``)."""
    if config.layer not in (-1, num_layers):
        raise _layer_error(head_dir, config.layer)


def _layer_error(head_dir: Path, layer: int) -> CandorError:
    return CandorError(
        f"{head_dir}: the head reads hidden layer {layer}, but a *ForSequenceClassification checkpoint "
        "scores the final layer; only heads trained on the last layer (layer -1) can be exported"
    )


def exported_tokenizer(head: ConfidenceHead) -> Any:
    """The head's tokenizer, set so that engines tokenize a rendered prompt to the ids the head reads.

    It pads on the right (real tokens keep the positions of the unpadded prompt),
    and it does not add a BOS that the template already writes (candor drops such
    a doubled BOS; an engine would not). Refused when the ids still differ, or
    when a prompt ends with the pad token (transformers would pool the token before it).
    """
    tokenizer = copy.deepcopy(head.tokenizer)
    tokenizer.padding_side = "right"
    prompt = head.prompts([PROBE_QUESTION])[0]
    expected = encode(head.tokenizer, [prompt])[0]
    if _engine_ids(tokenizer, prompt) != expected and hasattr(tokenizer, "add_bos_token"):
        # the template writes the BOS itself (the flag may read False on a reloaded tokenizer that still adds one)
        tokenizer.add_bos_token = False
    if _engine_ids(tokenizer, prompt) != expected:
        raise CandorError(
            f"the tokenizer of {head.config.backbone!r} encodes {head.config.template!r} prompts differently "
            "from the head (special tokens); an engine would not read the head's input"
        )
    if expected[-1] == tokenizer.pad_token_id:
        raise CandorError(
            f"template {head.config.template!r} ends its prompts with the pad token "
            f"{tokenizer.pad_token!r}; transformers' sequence classifiers would pool the token before it"
        )
    return tokenizer


def _engine_ids(tokenizer: Any, prompt: str) -> list[int]:
    """What transformers' pipeline and vLLM feed the model for ``prompt``: the tokenizer with its special tokens."""
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


@torch.no_grad()
def folded_linear(head: LinearHead) -> tuple[torch.Tensor, float]:
    """``(w / scale, b - (w / scale) . mean)``: the standardized head as one weight row and a bias."""
    w = head.linear.weight.detach().double().cpu()[0]
    weight = w / head.scale.detach().double().cpu()
    bias = float(head.linear.bias.detach().double().cpu()[0] - weight @ head.mean.detach().double().cpu())
    return weight.unsqueeze(0), bias


def merged_backbone(head: ConfidenceHead) -> nn.Module:
    """The backbone with its LoRA adapter merged into the weights (``lora`` mode), else the backbone."""
    if head.config.mode == "lora":
        return head.backbone.merge_and_unload()  # type: ignore[operator]
    return head.backbone


def seq_cls_model(backbone: nn.Module, weight: torch.Tensor, pad_token_id: int, bias: float) -> nn.Module:
    """The backbone's ``*ForSequenceClassification`` class with ``num_labels = 1``, the backbone's weights
    and ``weight`` as its score row; ``bias`` goes into the config (the class has no place for it)."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(backbone.config)  # type: ignore[union-attr]
    config.num_labels = 1
    config.id2label, config.label2id = {0: LABEL}, {LABEL: 0}
    config.pad_token_id = pad_token_id
    setattr(config, BIAS_KEY, bias)
    dtype = next(backbone.parameters()).dtype
    try:
        model = AutoModelForSequenceClassification.from_config(config, dtype=dtype)
    except ValueError as exc:
        raise CandorError(f"transformers has no sequence classifier for {config.model_type!r} ({exc})") from None
    score = getattr(model, "score", None)
    if not isinstance(score, nn.Linear) or score.out_features != 1:
        raise CandorError(f"{type(model).__name__} has no one-label linear 'score' layer to hold the head")
    base = getattr(model, model.base_model_prefix)
    missing, unexpected = base.load_state_dict(backbone.state_dict(), strict=False)
    if missing or unexpected:
        raise CandorError(
            f"the backbone's weights do not fit {type(model).__name__}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        score.weight.copy_(weight.to(score.weight.dtype))
    return model.to("cpu").eval()


def read_export(folder: str | Path) -> dict[str, Any]:
    """The ``candor_export.json`` of an exported folder."""
    path = Path(folder) / EXPORT_FILE
    if not path.exists():
        raise CandorError(f"{folder}: not a candor export (no {EXPORT_FILE})")
    return json.loads(path.read_text())


@torch.no_grad()
def seq_cls_confidence(model: nn.Module, tokenizer: Any, prompts: list[str]) -> np.ndarray:
    """The head's confidence from an exported classifier: ``sigmoid(logit + candor_logit_bias)``.

    Prompts are rendered ones (the head's template) and are encoded as the head encodes them.
    """
    bias = float(getattr(model.config, BIAS_KEY, 0.0))
    ids, mask = pad_batch(encode(tokenizer, prompts), int(model.config.pad_token_id), side="right")
    logits = model(input_ids=ids, attention_mask=mask).logits[:, 0].double()
    return torch.sigmoid(logits + bias).cpu().numpy()
