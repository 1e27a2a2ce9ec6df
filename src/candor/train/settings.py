"""A method's settings: ``KEY=VALUE`` text turned into its config dataclass, and the ranges every config shares.

- :func:`parse_settings` and :func:`build_config` / :func:`convert_settings`:
  ``candor train --set lr=1e-4`` to typed config fields, unknown keys named;
- :func:`check_settings`: the ranges of the hyperparameters every config
  shares (a batch size of 0 fails here, not deep inside transformers).

Below every method package, which imports :func:`check_settings` in its config.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from candor.util.errors import CandorError

# ------------------------------------------------------------------ ranges


def _positive(value: Any) -> bool:
    return value > 0


def _at_least_one(value: Any) -> bool:
    return value >= 1


def _not_negative(value: Any) -> bool:
    return value >= 0


def _fraction(value: Any) -> bool:
    return 0 <= value < 1


# What each shared hyperparameter name must be; a config field of that name is checked by it.
SETTING_RULES: dict[str, tuple[Any, str]] = {
    "learning_rate": (_positive, "a positive number"),
    "head_learning_rate": (_not_negative, "at least 0"),  # 0 freezes the head
    "epochs": (_positive, "a positive number"),
    "max_epochs": (_at_least_one, "at least 1"),
    "batch_size": (_at_least_one, "at least 1"),
    "eval_batch_size": (_at_least_one, "at least 1"),
    "gradient_accumulation": (_at_least_one, "at least 1"),
    "patience": (_at_least_one, "at least 1"),
    "max_examples": (_at_least_one, "at least 1"),
    "lora_r": (_at_least_one, "at least 1"),
    "lora_alpha": (_positive, "a positive number"),
    "lora_dropout": (_fraction, "in [0, 1)"),
    "warmup_ratio": (_fraction, "in [0, 1)"),
    "weight_decay": (_not_negative, "at least 0"),
    "extra_samples": (_not_negative, "at least 0"),
    "extra_rounds": (_not_negative, "at least 0"),
    "logging_steps": (_not_negative, "at least 0"),
}


def check_settings(config: Any) -> None:
    """Raise a :class:`CandorError` for the first field of the dataclass ``config`` outside its range.

    Fields set to ``None`` (take the default) pass. Without this, a batch size
    of 0 or a negative learning rate would train quietly, or fail deep inside
    transformers or peft with a traceback.
    """
    for item in dataclasses.fields(config):
        rule = SETTING_RULES.get(item.name)
        value = getattr(config, item.name)
        if rule is not None and value is not None and not rule[0](value):
            raise CandorError(f"{type(config).__name__}: {item.name}={value!r} must be {rule[1]}")


# ------------------------------------------------------------------ from text


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-4", "mode=lora"]`` → ``{"lr": "1e-4", "mode": "lora"}``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CandorError(f"--set {pair!r}: expected KEY=VALUE, e.g. mode=lora")
        out[key.strip()] = value.strip()
    return out


def build_config(cls: type, settings: Mapping[str, str], **fixed: Any) -> Any:
    """An instance of the dataclass ``cls`` from string settings; see :func:`convert_settings`."""
    return cls(**convert_settings(cls, settings, **fixed))


def convert_settings(cls: type, settings: Mapping[str, str], prefix: str = "", **fixed: Any) -> dict[str, Any]:
    """String settings converted to the types of the dataclass ``cls``'s fields, plus ``fixed``.

    An unknown key is an error that lists the known ones; ``fixed`` values
    (model, seed) come from the command's own options and cannot be set twice.
    ``prefix`` is how the user spelled the keys' group (``weights.``), for messages.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(fixed)
    for key, text in settings.items():
        if key not in fields:
            known = ", ".join(prefix + name for name in sorted(fields))
            raise CandorError(f"unknown setting {prefix + key!r} for {cls.__name__}; known: {known}")
        if key in fixed:
            raise CandorError(f"setting {key!r} has its own option; use --{key.replace('_', '-')}")
        values[key] = _convert(text, hints[key], prefix + key)
    return values


def _convert(text: str, hint: Any, key: str) -> Any:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    if union and text.lower() in ("none", "null") and type(None) in typing.get_args(hint):
        return None
    for kind in options:
        origin = typing.get_origin(kind)
        try:
            if kind is bool:
                return _boolean(text)
            if origin is tuple:
                return tuple(part.strip() for part in text.split(",") if part.strip())
            if kind in (int, float, str):
                return kind(text)
        except ValueError:
            continue
    names = " or ".join(getattr(kind, "__name__", str(kind)) for kind in options)
    raise CandorError(f"setting {key}={text!r}: expected {names}")


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)
