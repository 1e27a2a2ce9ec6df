"""The EliCal confidence model: backbone (+ LoRA) → last prompt token → ``Linear(hidden, 1)`` → sigmoid.

It reads the QA prompt alone and predicts, before any answer is generated,
how likely the model is to answer correctly (docs/methods.md "EliCal").

- The last prompt token is gathered as the last position whose attention mask
  is 1, with position ids counted over real tokens only, so left and right
  padding give the same confidence for the same prompt (the shared helpers of
  :mod:`candor.backends.tokens`, as the ``hf`` backend encodes and pads).
- ``mode="lora"`` (the paper): LoRA on the backbone, trained jointly with the
  head. ``mode="head"``: the backbone is frozen and only the head trains, on
  cached features (:mod:`candor.train.elical.features`).
- The head standardizes its input with a fixed mean and scale (identity unless
  set from training features). This is an affine re-parametrization of the
  same linear head, so the model family is the paper's; it only lets a small
  head train in seconds with one learning rate whatever the feature scale.

A trained model is a folder that :meth:`ConfidenceHead.from_pretrained` reloads
in one line::

    elical_config.json   backbone name, prompt template, layer, mode, LoRA settings
    head.safetensors     the linear head and its standardization
    adapter/             the LoRA adapter (lora mode only; PEFT's save_pretrained)
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from candor.annotation.prompts import render_prompts
from candor.annotation.records import Record
from candor.backends.chat import TokenizerChat
from candor.backends.engine import packed_linears_of
from candor.backends.tokens import encode, last_token_index, positions_from_mask, shared_prefix_batches
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.util.files import atomic_folder

logger = logging.getLogger(__name__)

CONFIG_FILE = "elical_config.json"
HEAD_FILE = "head.safetensors"
ADAPTER_DIR = "adapter"
MODES = ("head", "lora")


@dataclass
class HeadConfig:
    """What a saved head needs besides its weights: which backbone, which prompt, which layer."""

    backbone: str
    template: str
    layer: int = -1
    mode: str = "head"
    hidden_size: int = 0
    lora: dict[str, Any] | None = None  # r, alpha, dropout, targets (lora mode)
    meta: dict[str, Any] = field(default_factory=dict)  # provenance: stage, target, sizes, versions

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CandorError(f"unknown EliCal mode {self.mode!r}; known: {', '.join(MODES)}")

    @classmethod
    def read(cls, folder: Path) -> HeadConfig:
        path = folder / CONFIG_FILE
        if not path.exists():
            raise CandorError(f"{folder}: not a saved EliCal head (no {CONFIG_FILE})")
        try:
            return cls(**json.loads(path.read_text()))
        except (TypeError, json.JSONDecodeError) as exc:
            raise CandorError(f"{path}: not a valid EliCal config ({exc})") from None


class LinearHead(nn.Module):
    """``sigmoid(Linear((x - mean) / scale))``: one confidence per feature row."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        self.register_buffer("mean", torch.zeros(hidden_size))
        self.register_buffer("scale", torch.ones(hidden_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = (features.float() - self.mean) / self.scale
        return torch.sigmoid(self.linear(x)).squeeze(-1)

    @torch.no_grad()
    def standardize_on(self, features: torch.Tensor) -> None:
        """Fix the input standardization to ``features``' per-dimension mean and spread."""
        features = features.float()
        self.mean.copy_(features.mean(0))
        self.scale.copy_(features.std(0, unbiased=False).clamp_min(1e-4))

    @torch.no_grad()
    def start_at(self, mean_target: float) -> None:
        """Set the bias so an average input starts at the mean target (a head that starts calibrated)."""
        p = min(max(float(mean_target), 1e-3), 1 - 1e-3)
        self.linear.bias.fill_(math.log(p / (1 - p)))


class BiasScale(nn.Module):
    """``sigmoid(scale * logit + bias)`` around a :class:`LinearHead` whose own weights stay frozen.

    Stage 2's ``cal_scope="bias-scale"``: a monotone recalibration (Platt scaling of the head's
    logit) that cannot reorder questions, so the stage-1 ranking survives any number of labels.
    :meth:`fold_into_head` writes the result back into the linear layer (``w <- scale * w``,
    ``b <- scale * b + bias``): the saved head is the same family and format as any other.
    """

    def __init__(self, head: LinearHead) -> None:
        super().__init__()
        self.head = head
        head.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))  # named "bias" so an L2-SP anchor leaves it free

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = (features.float() - self.head.mean) / self.head.scale
        return torch.sigmoid(self.scale * self.head.linear(x) + self.bias).squeeze(-1)

    @torch.no_grad()
    def fold_into_head(self) -> LinearHead:
        """The wrapped head with the scale and bias folded into its weights, trainable again."""
        linear = self.head.linear
        linear.weight.mul_(self.scale)
        linear.bias.mul_(self.scale).add_(self.bias)
        self.head.requires_grad_(True)
        return self.head


class ConfidenceHead(nn.Module):
    """A backbone (LoRA-adapted in ``lora`` mode, frozen in ``head`` mode) and a :class:`LinearHead`.

    Build a fresh one with :meth:`create`, reload a trained one with
    :meth:`from_pretrained`, score with :meth:`predict`.
    """

    def __init__(self, backbone: nn.Module, head: LinearHead, config: HeadConfig, tokenizer: Any) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.config = config
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    # ------------------------------------------------------------ building

    @classmethod
    def create(cls, causal_lm: nn.Module, tokenizer: Any, config: HeadConfig, seed: int = 0) -> ConfidenceHead:
        """A fresh head (seeded) on ``causal_lm``'s decoder: LoRA added in ``lora`` mode, frozen in ``head`` mode."""
        backbone = decoder_of(causal_lm)
        config.hidden_size = int(causal_lm.config.hidden_size)  # type: ignore[union-attr]
        if config.mode == "lora":
            from peft import get_peft_model

            from candor.train.common import lora_config

            lora = config.lora or {}
            spec = lora_config(lora["r"], lora["alpha"], tuple(lora["targets"]), lora.get("dropout", 0.0), None)
            backbone = get_peft_model(backbone, spec)
        else:
            backbone.requires_grad_(False)
        torch.manual_seed(seed)
        head = LinearHead(config.hidden_size).to(_device(backbone))
        return cls(backbone, head, config, tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        model: nn.Module | None = None,
        tokenizer: Any = None,
        device: str | None = None,
        dtype: str | None = None,
        trainable: bool = False,
    ) -> ConfidenceHead:
        """Reload a saved head; the backbone is loaded by name unless ``model`` and ``tokenizer`` are given.

        ``trainable=True`` keeps the LoRA weights trainable (stage 2 resuming stage 1).
        """
        folder = Path(folder)
        config = HeadConfig.read(folder)
        if model is None or tokenizer is None:
            from candor.train.common import load_causal_lm

            model, tokenizer = load_causal_lm(config.backbone, dtype=dtype, device=device)
        backbone = decoder_of(model)
        hidden = int(model.config.hidden_size)  # type: ignore[union-attr]
        if config.hidden_size and hidden != config.hidden_size:
            raise CandorError(
                f"{folder}: the head was trained on a backbone with hidden size {config.hidden_size}, "
                f"but {config.backbone!r} has {hidden}"
            )
        if config.mode == "lora":
            from peft import PeftModel

            backbone = PeftModel.from_pretrained(backbone, str(folder / ADAPTER_DIR), is_trainable=trainable)
        else:
            backbone.requires_grad_(False)
        head = load_linear_head(folder)
        if head.linear.in_features != hidden:
            raise CandorError(
                f"{folder}: the head reads {head.linear.in_features} features, {config.backbone!r} has {hidden}"
            )
        return cls(backbone, head.to(_device(backbone)), config, tokenizer)

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write the config, the head and (lora mode) the adapter; the folder is swapped in whole."""
        return save_head(folder, self.config, self.head, self.backbone if self.config.mode == "lora" else None)

    # ------------------------------------------------------------ computing

    @property
    def device(self) -> torch.device:
        return _device(self.backbone)

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The configured layer's hidden state at every position, ``[rows, width, hidden]`` (model dtype).

        Position ids count real tokens only, so a row's states do not depend on its padding.
        """
        layer = self.config.layer
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
            output_hidden_states=layer != -1,
        )
        return out.last_hidden_state if layer == -1 else _layer(out.hidden_states, layer)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The hidden state of each row's last real token at the configured layer, as float32."""
        states = self.token_states(input_ids, attention_mask)
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, last_token_index(attention_mask)].float()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(input_ids, attention_mask))

    def prompts(self, inputs: Sequence[Record | QAItem | str]) -> list[str]:
        """The QA prompts this head reads for records, items or raw questions."""
        return render_prompts(inputs, self.config.template, TokenizerChat(self.tokenizer, self.config.backbone))

    @torch.no_grad()
    def prompt_features(self, prompts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """Last-token features of ``prompts``, ``[n, hidden]`` float32 (no gradients)."""
        if not prompts:
            return np.zeros((0, self.config.hidden_size), dtype=np.float32)
        return self._batched(prompts, batch_size, lambda features: features)

    @torch.no_grad()
    def predict(self, inputs: Sequence[Record | QAItem | str], batch_size: int = 16) -> np.ndarray:
        """One confidence in [0, 1] per record, QA item or question string."""
        if not inputs:
            return np.zeros(0, dtype=float)
        return self._batched(self.prompts(inputs), batch_size, self.head).astype(float)

    def _batched(self, prompts: Sequence[str], batch_size: int, fn: Any) -> np.ndarray:
        """``fn`` of the last-token features of ``prompts``, in eval mode, in input order.

        Prompts run in length-sorted batches, and a token prefix they all share
        (the few-shot block) is computed once (:func:`shared_prefix_batches`):
        the same features as :meth:`features` on padded batches, at a fraction
        of the cost when the prefix is most of each prompt.
        """
        was_training = self.training
        self.eval()
        try:
            encoded = encode(self.tokenizer, prompts)
            out: list[np.ndarray] = [np.empty(0)] * len(prompts)
            pad_id = int(self.tokenizer.pad_token_id)
            # On a CPU the backbone's linear layers run on prepacked weights (gradients are off here).
            with packed_linears_of(self.backbone):
                for indices, kwargs in shared_prefix_batches(self.backbone, encoded, pad_id, batch_size):
                    values = fn(self._last_token_states(kwargs)).float().cpu().numpy()
                    for row, index in enumerate(indices):
                        out[index] = values[row]
        finally:
            self.train(was_training)
        return np.stack(out)

    def _last_token_states(self, kwargs: dict[str, Any]) -> torch.Tensor:
        """The configured layer's state at the last column of a left-padded batch, as float32."""
        layer = self.config.layer
        out = self.backbone(**kwargs, output_hidden_states=layer != -1)
        states = out.last_hidden_state if layer == -1 else _layer(out.hidden_states, layer)
        return states[:, -1].float()


def load_linear_head(folder: str | Path) -> LinearHead:
    """A saved head's linear layer alone, no backbone: for a reader of states another pass computed
    (the generator's prefill, the served model's pass over an answer)."""
    state = load_file(str(Path(folder) / HEAD_FILE))
    head = LinearHead(int(state["linear.weight"].shape[1]))
    head.load_state_dict(state)
    return head.eval()


def save_head(folder: str | Path, config: HeadConfig, head: LinearHead, adapter_model: nn.Module | None) -> Path:
    """Write a head folder (see the module docstring) into a temporary sibling, then swap it in."""
    folder = Path(folder)
    with atomic_folder(folder) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n")
        state = {k: v.detach().float().cpu().contiguous() for k, v in head.state_dict().items()}
        save_file(state, str(tmp / HEAD_FILE))
        if adapter_model is not None:
            adapter_model.save_pretrained(str(tmp / ADAPTER_DIR))  # type: ignore[operator]
    return folder


def decoder_of(causal_lm: nn.Module) -> nn.Module:
    """The transformer under the LM head (``model.model`` for Llama/Qwen/Gemma): no logits to compute."""
    base = getattr(causal_lm, "base_model", causal_lm)
    if base is causal_lm and hasattr(causal_lm, "lm_head"):
        raise CandorError(f"cannot find the decoder inside {type(causal_lm).__name__}")
    return base


def _layer(hidden_states: Sequence[torch.Tensor], layer: int) -> torch.Tensor:
    if not -len(hidden_states) <= layer < len(hidden_states):
        raise CandorError(f"layer {layer} is out of range: the backbone has {len(hidden_states)} hidden states")
    return hidden_states[layer]


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
