"""Heads in the EliCal authors' layout, turned into candor head folders (``candor import-head``).

The authors' trainer (and the released Honest-Qwen2.5 models) saves two things:

- ``lora_epoch_best/``: a PEFT LoRA folder (``adapter_config.json`` and the
  adapter weights) for the causal LM;
- ``vector_head_epoch_best.pt``: the state dict of ``nn.Linear(hidden, 1)``
  (``weight`` ``[1, hidden]``, ``bias`` ``[1]``), applied with a sigmoid to the
  final hidden state of the last prompt token.

That is candor's ``lora`` mode with an identity standardization, so
:func:`import_released_head` writes a head folder that ``candor score -e
elical``, ``candor serve --head`` and ``candor export --to seq-cls`` read like
one candor trained. The LoRA weights are keyed again for the decoder (candor
wraps the transformer under the LM head; the authors wrap the whole causal
LM), and every one of them must land on a module of the backbone.

The ``.pt`` file is read with ``weights_only=True``: it holds tensors only, and
no pickled code runs. The prompt the head reads is candor's template
(``--template``); a head only means what it was trained to mean on the prompt
format it was trained with, so pick the template that matches it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from candor.annotation.prompts import resolve_template
from candor.backends.chat import TokenizerChat
from candor.train.elical.model import CONFIG_FILE, HeadConfig, LinearHead, decoder_of, save_head
from candor.util.errors import CandorError
from candor.util.files import check_replaceable

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # what PEFT puts before a wrapped model's module names


def import_released_head(
    lora_dir: str | Path,
    vector_head: str | Path,
    backbone: str,
    out: str | Path,
    *,
    template: str = "auto",
    dtype: str | None = None,
) -> Path:
    """Write ``out``, a candor ``lora``-mode head folder, from the authors' LoRA folder and linear head."""
    from candor.train.common import load_causal_lm

    lora_dir, vector_head = Path(lora_dir), Path(vector_head)
    check_replaceable(out, CONFIG_FILE, inputs=(lora_dir, vector_head))
    lora = read_lora_config(lora_dir)
    model, tokenizer = load_causal_lm(backbone, dtype=dtype, device="cpu")
    hidden = int(model.config.hidden_size)
    head = LinearHead(hidden)
    head.linear.load_state_dict(read_vector_head(vector_head, hidden))
    adapted = adapted_decoder(model, lora_dir, lora)
    chat = TokenizerChat(tokenizer, backbone)
    config = HeadConfig(
        backbone=backbone,
        template=resolve_template(template, backbone, chat).name,  # type: ignore[arg-type]
        layer=-1,
        mode="lora",
        hidden_size=hidden,
        lora={"r": lora.r, "alpha": lora.lora_alpha, "dropout": lora.lora_dropout, "targets": _targets(lora)},
        meta={"imported": {"lora_dir": str(lora_dir), "vector_head": str(vector_head), "layout": "EliCal authors"}},
    )
    save_head(out, config, head, adapted)
    logger.info("imported %s and %s on %s into %s", lora_dir, vector_head.name, backbone, out)
    return Path(out)


def read_lora_config(lora_dir: Path) -> Any:
    """The folder's ``LoraConfig``; a clear error for a folder that is not a PEFT LoRA adapter."""
    from peft import LoraConfig, PeftConfig

    if not (lora_dir / ADAPTER_CONFIG).is_file():
        raise CandorError(f"{lora_dir}: not a PEFT LoRA folder (no {ADAPTER_CONFIG})")
    try:
        config = PeftConfig.from_pretrained(str(lora_dir))
    except (ValueError, TypeError, OSError) as exc:
        raise CandorError(f"{lora_dir / ADAPTER_CONFIG}: not a valid PEFT config ({exc})") from None
    if not isinstance(config, LoraConfig):
        raise CandorError(f"{lora_dir / ADAPTER_CONFIG}: a {config.peft_type} adapter, not LoRA")
    if config.modules_to_save:
        raise CandorError(
            f"{lora_dir / ADAPTER_CONFIG}: modules_to_save {list(config.modules_to_save)} would "
            "retrain whole layers of the backbone; only plain LoRA adapters import"
        )
    return config


def read_vector_head(path: Path, hidden_size: int) -> dict[str, torch.Tensor]:
    """``{"weight": [1, hidden], "bias": [1]}`` from the ``.pt`` state dict, checked against the backbone."""
    if not path.is_file():
        raise CandorError(f"{path}: no such file")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for what it refuses
        raise CandorError(f"{path}: not a tensor state dict torch can load with weights_only=True ({exc})") from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CandorError(f"{path}: expected the state dict of nn.Linear(hidden, 1) (keys weight, bias), got {found}")
    weight, bias = state["weight"], state["bias"]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (1, hidden_size):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise CandorError(f"{path}: weight has shape {shape}, but the backbone's hidden size needs (1, {hidden_size})")
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (1,):
        raise CandorError(f"{path}: bias must have shape (1,), got {getattr(bias, 'shape', type(bias).__name__)}")
    return {"weight": weight.float(), "bias": bias.float()}


def adapted_decoder(causal_lm: torch.nn.Module, lora_dir: Path, lora: Any) -> torch.nn.Module:
    """The causal LM's decoder with the folder's LoRA weights, keyed for the decoder; every weight must land."""
    import copy

    from peft import get_peft_model
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    decoder = decoder_of(causal_lm)
    spec = copy.deepcopy(lora)
    spec.task_type = None  # candor's head wraps the decoder, not the causal LM
    spec.inference_mode = False
    weights = load_peft_weights(str(lora_dir), device="cpu")
    if not weights:
        raise CandorError(f"{lora_dir}: the adapter holds no weights")
    rekeyed = rekey_for_decoder(weights, causal_lm, decoder, lora_dir)
    adapted = get_peft_model(decoder, spec)
    loaded = set_peft_model_state_dict(adapted, rekeyed)
    lora_params = {n for n, _ in adapted.named_parameters() if "lora_" in n}
    missing = sorted(k for k in loaded.missing_keys if "lora_" in k)
    if loaded.unexpected_keys or missing:
        raise CandorError(
            f"{lora_dir}: the adapter's weights do not fit the backbone "
            f"(unexpected {loaded.unexpected_keys[:3]}, missing {missing[:3]})"
        )
    if not lora_params:
        raise CandorError(f"{lora_dir}: the adapter's target modules match no layer of the backbone")
    adapted.requires_grad_(False)
    return adapted


def rekey_for_decoder(
    weights: dict[str, torch.Tensor], causal_lm: torch.nn.Module, decoder: torch.nn.Module, lora_dir: Path
) -> dict[str, torch.Tensor]:
    """Adapter weights keyed ``base_model.model.<decoder module>...``, from a causal-LM or a decoder wrap."""
    modules = {name for name, _ in decoder.named_modules()}
    inner = f"{PEFT_PREFIX}{getattr(causal_lm, 'base_model_prefix', 'model')}."
    for prefix in (inner, PEFT_PREFIX):  # the authors wrap the causal LM; a decoder wrap is accepted too
        if all(k.startswith(prefix) and _module_of(k[len(prefix) :]) in modules for k in weights):
            return {PEFT_PREFIX + k[len(prefix) :]: v for k, v in weights.items()}
    example = next(iter(weights))
    raise CandorError(
        f"{lora_dir}: adapter weight {example!r} names no module of the backbone's decoder; "
        "was it trained on another model?"
    )


def _module_of(key: str) -> str:
    """``layers.0.self_attn.q_proj`` from ``layers.0.self_attn.q_proj.lora_A.weight``."""
    head, _, _ = key.partition(".lora_")
    return head


def _targets(lora: Any) -> list[str] | str:
    targets = lora.target_modules
    return sorted(targets) if isinstance(targets, (set, list, tuple)) else str(targets)
