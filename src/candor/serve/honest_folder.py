"""The honest-model folder on disk: what ``honest.json`` holds, written and read back.

``HonestModel.save_pretrained`` / ``from_pretrained`` (:mod:`candor.serve.model`) build on these::

    honest.json   generator (model, backend, template, decoding), confidence source, calibrator (its JSON
                  form and how many dev questions it was fitted on), threshold, the request shapes the
                  calibration was fitted on (``tuned_on``, :mod:`candor.serve.shapes`), the model's ``version``
                  and the claim thresholds tuned with a factuality guarantee (``factuality``,
                  :mod:`candor.serve.factuality`)
    system_prompts/<12 hex>.txt   the text of each system prompt ``tuned_on`` names (``system:<12 hex>``)
    head/         the EliCal head (head sources only)
    adapter/      the generator's PEFT adapter (when it has one; ADVICE)
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from candor.backends.base import Backend
from candor.evaluation.calibration import Calibrator, calibrator_from_dict
from candor.serve import thresholds as th
from candor.serve.answering import Decoding
from candor.serve.factuality import FactualityGuarantee, with_guarantee
from candor.serve.shapes import QUESTION, SYSTEM_PREFIX, check_shape, is_system_shape, system_shape
from candor.util.errors import CandorError, at_line
from candor.util.files import NotRegularFile, atomic_write_text, read_regular_bytes

CONFIG_FILE = "honest.json"
ADAPTER_DIR = "adapter"
SYSTEM_PROMPTS_DIR = "system_prompts"


def fresh_version() -> str:
    """A new model version: the UTC time and a random suffix."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def generator_config(
    backend: Backend, backend_name: str, template: str, decoding: Decoding, folder: Path
) -> dict[str, Any]:
    """The generator's part of ``honest.json``; its adapter (if any) is copied into ``folder``."""
    adapter = getattr(backend, "adapter", None)
    if adapter:
        shutil.copytree(adapter, folder / ADAPTER_DIR)
    return {
        "model": backend.model_name,
        "backend": backend_name,
        "adapter": ADAPTER_DIR if adapter else None,
        "template": template,
        "decoding": asdict(decoding),
    }


def calibrator_config(calibrator: Calibrator | None, fitted_on: int) -> dict[str, Any] | None:
    return None if calibrator is None else {**calibrator.to_dict(), "fitted_on": fitted_on}


def write_system_prompts(folder: Path, tuned_on: tuple[str, ...], texts: dict[str, str]) -> None:
    """The text of each system-prompt shape of ``tuned_on`` as ``system_prompts/<12 hex>.txt`` (UTF-8, as compared)."""
    for shape in tuned_on:
        if not is_system_shape(shape):
            continue
        text = texts.get(shape)
        if text is None or system_shape(text) != shape:
            raise CandorError(f"tuned on {shape} but its system prompt's text is not known: cannot save the folder")
        target = folder / SYSTEM_PROMPTS_DIR / f"{shape[len(SYSTEM_PREFIX) :]}.txt"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(text.encode("utf-8"))


def read_system_prompts(folder: Path, tuned_on: tuple[str, ...]) -> dict[str, str]:
    """Each system-prompt shape of ``tuned_on`` with its text from ``folder``; refused when missing or not its text."""
    out = {}
    for shape in tuned_on:
        if not is_system_shape(check_shape(shape)):
            continue
        path = folder / SYSTEM_PROMPTS_DIR / f"{shape[len(SYSTEM_PREFIX) :]}.txt"
        try:
            text = read_regular_bytes(path).decode("utf-8")
        except NotRegularFile:
            raise CandorError(f"{path}: not a regular file (a FIFO, device or socket is never read)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CandorError(
                f"{folder / CONFIG_FILE}: tuned_on names {shape} but {path} cannot be read ({exc})"
            ) from None
        if system_shape(text) != shape:
            raise CandorError(f"{path}: its text's sha256 is not the {shape} that tuned_on names (the file was edited)")
        out[shape] = text
    return out


@dataclass(frozen=True)
class SavedModel:
    """``honest.json`` read back: everything but the generator's weights and the confidence source."""

    folder: Path
    generator: dict[str, Any]
    confidence: dict[str, Any]
    calibrator: Calibrator | None
    fitted_on: int
    threshold: th.Threshold | None
    tuned_on: tuple[str, ...]
    system_prompts: dict[str, str]  # the text of each system-prompt shape of tuned_on
    version: str
    factuality: tuple[FactualityGuarantee, ...] = ()

    @property
    def decoding(self) -> Decoding:
        return Decoding(**self.generator.get("decoding", {}))

    def load_generator(self, **backend_kwargs: Any) -> Backend:
        """The generator by its saved name, with the folder's adapter when it has one."""
        from candor.backends import load_backend

        if self.generator.get("adapter"):
            backend_kwargs["adapter"] = str(self.folder / self.generator["adapter"])
        return load_backend(self.generator["model"], self.generator.get("backend", "hf"), **backend_kwargs)


REQUIRED_FIELDS = ("generator", "confidence")  # the objects every honest.json has; the generator names its "model"


def read_config(folder: str | Path) -> dict[str, Any]:
    """``folder``'s ``honest.json`` as saved, checked; the one place it is parsed.

    A missing file, one that is not a regular file (a FIFO is refused, never waited on), malformed JSON
    (its line and column) or a missing field gets one :class:`CandorError` naming the file.
    """
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.exists():
        raise CandorError(f"{path}: no such file ({folder} is not a saved honest model)")
    try:
        config = json.loads(read_regular_bytes(path).decode("utf-8"))
    except NotRegularFile:
        raise CandorError(f"{path}: not a regular file (a FIFO, device or socket is never read)") from None
    except json.JSONDecodeError as exc:
        raise at_line(path, exc.lineno, f"malformed JSON ({exc.msg} at column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CandorError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(config, dict):
        raise CandorError(f"{path}: not an honest-model config (a JSON {type(config).__name__}, not an object)")
    for field in REQUIRED_FIELDS:
        if field not in config:
            raise CandorError(f"{path}: missing the field {field!r}")
        if not isinstance(config[field], dict):
            raise CandorError(f"{path}: the field {field!r} is not an object")
    if "model" not in config["generator"]:
        raise CandorError(f"{path}: missing the field 'generator.model'")
    return config


def read_folder(folder: str | Path) -> SavedModel:
    """``folder``'s ``honest.json`` read back (:func:`read_config`)."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    config = read_config(folder)
    cal = config.get("calibrator")
    # Folders saved before versions existed: their config's digest names them.
    version = str(config.get("version") or "sha-" + hashlib.sha256(read_regular_bytes(path)).hexdigest()[:12])
    tuned_on = tuple(str(shape) for shape in config.get("tuned_on") or (QUESTION,))
    return SavedModel(
        folder=folder,
        generator=config["generator"],
        confidence=config["confidence"],
        calibrator=calibrator_from_dict(cal) if cal else None,
        fitted_on=int(cal.get("fitted_on", 0)) if cal else 0,
        threshold=th.Threshold.from_dict(config["threshold"]) if config.get("threshold") else None,
        tuned_on=tuned_on,
        system_prompts=read_system_prompts(folder, tuned_on),
        version=version,
        factuality=factuality_of(config, path),
    )


def factuality_config(guarantees: tuple[FactualityGuarantee, ...]) -> list[dict[str, Any]]:
    return [g.to_dict() for g in guarantees]


def factuality_of(config: dict[str, Any], path: Path) -> tuple[FactualityGuarantee, ...]:
    """The factuality guarantees of a parsed ``honest.json`` (none in folders saved before them)."""
    saved = config.get("factuality") or []
    if not isinstance(saved, list) or not all(isinstance(g, dict) for g in saved):
        raise CandorError(f"{path}: the field 'factuality' is not a list of objects")
    try:
        return tuple(FactualityGuarantee.from_dict(g) for g in saved)
    except CandorError as exc:
        raise CandorError(f"{path}: {exc}") from None


def add_factuality(folder: str | Path, guarantee: FactualityGuarantee) -> str:
    """Write ``guarantee`` into ``folder``'s ``honest.json`` (replacing one for the same method and alpha).

    The file is replaced atomically, under a new ``version``: the folder now serves differently.
    Returns the new version.
    """
    folder = Path(folder)
    config = read_config(folder)
    config["factuality"] = factuality_config(with_guarantee(factuality_of(config, folder / CONFIG_FILE), guarantee))
    config["version"] = fresh_version()
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return config["version"]
