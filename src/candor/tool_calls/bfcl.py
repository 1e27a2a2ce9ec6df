"""The Berkeley Function Calling Leaderboard (BFCL v4, Patil et al., ICML 2025): its data and its AST judge.

A category's items are ``BFCL_v4_<file>.json`` (one JSON object a line: ``id``, ``question`` (the turns),
``function`` (the tools, with BFCL's own type names)) and ``possible_answer/BFCL_v4_<file>.json``
(``ground_truth``: a list of ``{function name: {argument: [accepted values]}}``, one per expected call).

The judge is BFCL's AST checker in short: a call is right when its function is the expected one, it passes
no argument the function lacks, every required argument is there, an argument left out has ``""`` among its
accepted values, and every argument's value has the declared type (an integer is a float) and is one of
the accepted values (strings compared without case, spaces and ``, . / - _ * ^``, as BFCL's
``standardize_string``; lists element by element; nested dicts key by key). Parallel calls are matched as a
set (any order, each expected call to its own call). Irrelevance: right means no call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from candor.tool_calls.calls import Call
from candor.tool_calls.tools import Tool
from candor.util.errors import CandorError, at_line


@dataclass(frozen=True)
class Category:
    """One BFCL category: its file name, whether several calls are expected, whether any call is right."""

    file: str
    parallel: bool
    relevant: bool  # False: no offered tool fits, the right answer is no call


CATEGORIES: dict[str, Category] = {
    "simple": Category(file="simple_python", parallel=False, relevant=True),
    "multiple": Category(file="multiple", parallel=False, relevant=True),
    "parallel": Category(file="parallel", parallel=True, relevant=True),
    "irrelevance": Category(file="irrelevance", parallel=False, relevant=False),
}

# BFCL type name → JSON Schema type (None: any value).
TYPE_NAMES: dict[str, str | None] = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "tuple": "array",
    "any": None,
}
# Keys of BFCL's parameter specs that JSON Schema reads; the others ("optional", "format") are dropped.
KEPT_KEYS = ("description", "enum", "default", "minItems", "maxItems", "minimum", "maximum")


def to_json_schema(spec: dict[str, Any], where: str = "parameters") -> dict[str, Any]:
    """A BFCL parameter spec as JSON Schema: ``dict`` → object, ``float`` → number, ``tuple`` → array,
    ``any`` → no type; nested ``properties`` and ``items`` converted too."""
    if not isinstance(spec, dict):
        raise CandorError(f"{where}: must be an object, got {type(spec).__name__}")
    out: dict[str, Any] = {key: spec[key] for key in KEPT_KEYS if key in spec}
    name = spec.get("type")
    if name is not None:
        if name not in TYPE_NAMES:
            raise CandorError(f"{where}.type: unknown BFCL type {name!r}")
        if TYPE_NAMES[name] is not None:
            out["type"] = TYPE_NAMES[name]
    if isinstance(spec.get("properties"), dict):
        out["properties"] = {
            key: to_json_schema(value, f"{where}.properties.{key}") for key, value in spec["properties"].items()
        }
        if out.get("type") is None:
            out["type"] = "object"
    if isinstance(spec.get("required"), list):
        out["required"] = [key for key in spec["required"] if key in out.get("properties", {})]
    if isinstance(spec.get("items"), dict):
        out["items"] = to_json_schema(spec["items"], f"{where}.items")
    return out


@dataclass(frozen=True)
class Item:
    """One BFCL question: the turns, the offered tools (JSON Schema) and, unless irrelevance, the answers."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    tools: list[Tool]
    functions: list[dict[str, Any]]  # BFCL's own specs (the judge reads their types and required arguments)
    answers: list[dict[str, dict[str, list[Any]]]] | None  # one {function: {argument: accepted}} per call


def _read_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise CandorError(f"{path}: no such file (BFCL data: BFCL_v4_<category>.json and possible_answer/)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise at_line(path, number, f"not JSON ({error.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise at_line(path, number, "each line must be an object with a string 'id'")
        rows.append((number, row))
    return rows


def load(data_dir: str | Path, category: str) -> list[Item]:
    """A category's items (file order), with their possible answers unless it is irrelevance."""
    if category not in CATEGORIES:
        raise CandorError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    spec = CATEGORIES[category]
    folder = Path(data_dir)
    path = folder / f"BFCL_v4_{spec.file}.json"
    answers: dict[str, Any] = {}
    if spec.relevant:
        answer_path = folder / "possible_answer" / f"BFCL_v4_{spec.file}.json"
        for number, row in _read_lines(answer_path):
            if not isinstance(row.get("ground_truth"), list):
                raise at_line(answer_path, number, "'ground_truth' must be a list")
            answers[row["id"]] = row["ground_truth"]
    items = []
    for number, row in _read_lines(path):
        question, functions = row.get("question"), row.get("function")
        if not (isinstance(question, list) and question and isinstance(question[0], list)):
            raise at_line(path, number, "'question' must be a list of turns (lists of messages)")
        if not isinstance(functions, list) or not functions:
            raise at_line(path, number, "'function' must be a non-empty list")
        if spec.relevant and row["id"] not in answers:
            raise at_line(path, number, f"{row['id']} has no possible answer")
        tools = []
        for index, function in enumerate(functions):
            where = f"{path.name}:{number}: function.{index}"
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise CandorError(f"{where}: must be an object with a string 'name'")
            parameters = to_json_schema(function.get("parameters") or {"type": "dict"}, f"{where}.parameters")
            tools.append(
                Tool(name=function["name"], description=function.get("description", ""), parameters=parameters)
            )
        items.append(
            Item(
                id=row["id"],
                category=category,
                messages=[message for turn in question for message in turn],
                tools=tools,
                functions=functions,
                answers=answers.get(row["id"]) if spec.relevant else None,
            )
        )
    return items


# --- the judge -----------------------------------------------------------------------------------------

_STANDARDIZE = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    """BFCL's ``standardize_string``: no spaces or ``, . / - _ * ^``, lower case, ``'`` as ``"``."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def _has_type(value: Any, name: str | None) -> bool:
    if name in (None, "any"):
        return True
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name in ("float", "number"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name in ("array", "tuple"):
        return isinstance(value, list)
    if name in ("dict", "object"):
        return isinstance(value, dict)
    return True


def _typed(value: Any, spec: dict[str, Any]) -> bool:
    """The value has the spec's type, and so do an array's items when the spec names theirs."""
    if not _has_type(value, spec.get("type")):
        return False
    items = spec.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        return all(_typed(item, items) for item in value)
    return True


def _matches(value: Any, accepted: Any) -> bool:
    """One value against one accepted value (nested dicts: each key against its own accepted list)."""
    if isinstance(accepted, dict):
        if not isinstance(value, dict) or any(key not in accepted for key in value):
            return False
        return all(_among(value[key], options) if key in value else "" in options for key, options in accepted.items())
    if isinstance(accepted, list):
        return (
            isinstance(value, list)
            and len(value) == len(accepted)
            and all(_matches(item, want) for item, want in zip(value, accepted, strict=True))
        )
    if isinstance(accepted, str):
        return isinstance(value, str) and standardize(value) == standardize(accepted)
    if isinstance(accepted, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
    if isinstance(accepted, int | float):
        return isinstance(value, int | float) and value == accepted
    return value == accepted


def _among(value: Any, options: Any) -> bool:
    options = options if isinstance(options, list) else [options]
    return any(_matches(value, option) for option in options)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    reason: str  # why not, or "ok"


def _check_call(call: Call, expected: dict[str, dict[str, list[Any]]], functions: Sequence[dict[str, Any]]) -> str:
    """ "ok", or why ``call`` is not the expected call."""
    (name, accepted), *_ = expected.items()
    if call.name != name:
        return f"function {call.name!r}, expected {name!r}"
    spec = next((function for function in functions if function.get("name") == name), {})
    parameters = (spec.get("parameters") or {}).get("properties") or {}
    required = (spec.get("parameters") or {}).get("required") or []
    for key in required:
        if key not in call.arguments:
            return f"required argument {key!r} missing"
    for key, value in call.arguments.items():
        if key not in parameters or key not in accepted:
            return f"unexpected argument {key!r}"
        if not _typed(value, parameters[key]):
            return f"argument {key!r}: {value!r} is not of type {parameters[key].get('type')!r}"
        if not _among(value, accepted[key]):
            return f"argument {key!r}: {value!r} not among {accepted[key]!r}"
    for key, options in accepted.items():
        if key not in call.arguments and "" not in options:
            return f"argument {key!r} missing"
    return "ok"


def _matching(ok: list[list[bool]]) -> bool:
    """A perfect matching between expected calls (rows) and made calls (columns) where ``ok``."""
    owner: dict[int, int] = {}

    def place(row: int, seen: set[int]) -> bool:
        for column, fits in enumerate(ok[row]):
            if fits and column not in seen:
                seen.add(column)
                if column not in owner or place(owner[column], seen):
                    owner[column] = row
                    return True
        return False

    return all(place(row, set()) for row in range(len(ok)))


def judge(item: Item, calls: Sequence[Call] | None) -> Verdict:
    """Whether the reply's calls (None or empty: no call) answer the item, as BFCL's AST checker."""
    made = list(calls or [])
    if item.answers is None:
        return Verdict(correct=not made, reason="ok" if not made else f"{len(made)} call(s) where none fits")
    if not made:
        return Verdict(correct=False, reason="no call")
    if len(made) != len(item.answers):
        return Verdict(correct=False, reason=f"{len(made)} call(s), expected {len(item.answers)}")
    if len(made) == 1:
        reason = _check_call(made[0], item.answers[0], item.functions)
        return Verdict(correct=reason == "ok", reason=reason)
    ok = [[_check_call(call, expected, item.functions) == "ok" for call in made] for expected in item.answers]
    if _matching(ok):
        return Verdict(correct=True, reason="ok")
    return Verdict(correct=False, reason="the calls do not match the expected ones as a set")
