"""Tool calls with a confidence on BFCL v4 (issue 62): n-prob, consistency and an EliCal-style head, with and
without the calls' grammar.

Items: BFCL v4 simple (400), multiple (200), parallel (200) and irrelevance (240), judged by BFCL's AST
checker in short (:mod:`candor.tool_calls.bfcl`). Each item's prompt is :func:`candor.tool_calls.render_tool_prompt`
with ``tool_choice="auto"`` (the embedded SmolLM2's template has no tools: the documented prompt). Per item and
arm, a greedy reply and ``k`` samples (temperature 1, top-p 0.95, top-k 50: ``PROTOCOL_SAMPLES``), seeded by
the item's id; arms:

| arm | decoding |
|---|---|
| ``free`` | unconstrained |
| ``grammar`` | ``JsonConstraint.of(calls_schema(tools, parallel), allow_text=True)``: a valid call, or plain text |

On ``--backend openai`` (an OpenAI-compatible server such as ``llama-server --jinja``) every arm asks the server's
chat endpoint, which applies the server's own template: ``free`` and ``required`` send the documented prompt's
messages (:func:`candor.tool_calls.tool_prompt_messages`), ``required`` with the calls' schema as the server's
structured output (``response_format`` ``json_schema``), and ``grammar`` is the server's own tool calling (the
item's messages with ``tools`` and ``tool_choice="auto"``, via the openai backend's upstream-tools passthrough).

Scores of the greedy reply (the label: the judge's verdict on it): ``n-prob`` (geometric mean token probability
of the reply), ``consistency`` (share of the k samples whose calls agree with the greedy reply's,
:func:`candor.tool_calls.calls_agree`; a plain answer agrees with a plain answer), and ``head`` (EliCal-style:
a ridge head on the hidden state of the prompt's last token trained to predict consistency on the ``train``
split, then Platt-calibrated on the ``cal`` split's labels). Every score is Platt-calibrated on ``cal``; the head
is evaluated on ``test`` only, the training-free scores (nothing is fitted to them on ``train``) on ``train`` and
``test``. The split is by item id (a hash of it: 50 % train, 20 % cal, 30 % test).

Per-item results are cached in ``benchmarks/cache/tool_calls/<run>.jsonl`` under a key of everything that
determines them (backend, model, arm, prompt, schema, sampling settings, k, seed), so a run resumes where it
stopped. Run it in the background:

    nohup nice -n 10 python -m benchmarks.tool_calls --limit 150 > tool_calls.log 2>&1 &
    python -m benchmarks.tool_calls --backend openai --base-url http://127.0.0.1:8080/v1 --limit 40
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from candor.backends.base import SamplingParams
from candor.evaluation.calibration import get_calibrator
from candor.evaluation.claims import claim_metrics
from candor.serve.answering import PROTOCOL_SAMPLES
from candor.tool_calls import (
    calls_agree,
    calls_schema,
    may_become_call,
    parse_calls,
    render_tool_prompt,
    starts_like_call,
    tool_prompt_messages,
)
from candor.tool_calls.bfcl import CATEGORIES, Item, judge, load

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bfcl"
OUT = RESULTS / "tool_calls.json"
TOOL_CACHE = CACHE / "tool_calls"
MODEL = "smollm2-135m"
SCORES = ("n-prob", "consistency", "head")
# The splits a score is evaluated on: the head is fitted on train, so only test; the training-free scores fit
# nothing there, so every split but cal (Platt's) holds out-of-sample items for them.
EVALUATED_ON = {"n-prob": ("train", "test"), "consistency": ("train", "test"), "head": ("test",)}
SPLITS = {"train": range(0, 5), "cal": range(5, 7), "test": range(7, 10)}  # id hash mod 10
THRESHOLD = 0.5  # abstain below this calibrated confidence (the chance the call is right)
MAX_NEW_TOKENS = {"simple": 96, "multiple": 96, "parallel": 192, "irrelevance": 96}


def split_of(item_id: str) -> str:
    bucket = int(hashlib.sha256(item_id.encode()).hexdigest(), 16) % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def item_seed(item_id: str) -> int:
    return int(hashlib.sha256(("seed:" + item_id).encode()).hexdigest()[:8], 16)


def params_for(item: Item) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=MAX_NEW_TOKENS[item.category],
        temperature=PROTOCOL_SAMPLES.temperature,
        top_p=PROTOCOL_SAMPLES.top_p,
        top_k=PROTOCOL_SAMPLES.top_k,
    )


def schema_of(item: Item) -> dict[str, Any]:
    return calls_schema(item.tools, parallel=CATEGORIES[item.category].parallel)


def cache_key(identity: dict[str, Any], arm: str, item: Item, prompt: str, k: int) -> str:
    payload = {
        "backend": identity,
        "arm": arm,
        "id": item.id,
        "prompt": prompt,
        "schema": schema_of(item) if ARM_SPECS[arm].constrained else None,
        "tools": [tool.to_json() for tool in item.tools],
        "params": params_for(item).to_dict(),
        "k": k,
        "seed": item_seed(item.id),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# --- generation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """How an arm asks: the prompt's ``tool_choice`` and the decoding constraint (None: unconstrained)."""

    tool_choice: str
    constrained: bool
    allow_text: bool


ARM_SPECS: dict[str, Arm] = {
    "free": Arm(tool_choice="auto", constrained=False, allow_text=True),
    "grammar": Arm(tool_choice="auto", constrained=True, allow_text=True),
    "required": Arm(tool_choice="required", constrained=True, allow_text=False),
}
ARMS = tuple(ARM_SPECS)
SPEED_ARMS = ("free", "required")  # decoding without and with the schema, both run to their end (no cut)


@dataclass
class Runner:
    """A backend and how one arm's replies come from it."""

    backend: Any
    kind: str
    identity: dict[str, Any]
    tokenizer: Any

    def prompt(self, item: Item, arm: str = "free") -> str:
        choice = ARM_SPECS[arm].tool_choice
        if self.kind != "hf":  # the server applies its own template to the documented prompt's messages
            return self.backend.render_chat(tool_prompt_messages(item.messages, item.tools, choice))
        return render_tool_prompt(self.tokenizer, item.messages, item.tools, choice)

    def arms(self) -> dict[str, str | None]:
        """arm → None (it runs here) or why it cannot."""
        out: dict[str, str | None] = {"free": None}
        try:
            from candor.backends.constraints import JsonConstraint  # noqa: F401  (the grammar helper's)
        except ImportError:
            why = "candor.backends.constraints (constrained decoding) is not in this checkout"
            return {**out, "grammar": why, "required": why}
        if self.kind == "hf":
            return {**out, "grammar": None, "required": None}
        has = callable(getattr(self.backend, "generate_tool_calls", None))
        out["grammar"] = None if has else "the openai backend has no upstream tools passthrough here"
        out["required"] = None  # the server's structured output (response_format json_schema)
        return out

    def generate(self, arm: str, items: Sequence[Item], k: int) -> list[dict[str, Any]]:
        """Per item: the greedy reply (text, token log-probs) and the k samples' texts."""
        spec = ARM_SPECS[arm]
        params = params_for(items[0])
        seeds = [item_seed(item.id) for item in items]
        if arm == "grammar" and self.kind != "hf":
            return self._upstream_tools(items, k, params, seeds)
        prompts = [self.prompt(item, arm) for item in items]
        hooks = self.kind == "hf"  # the openai backend streams no tokens to a hook
        if not spec.constrained:
            cut = {"on_token": PlainCut(self.tokenizer)} if hooks else {}
            generated = self.backend.generate(prompts, k, params, seeds=seeds, **cut)
            return [reply_record(gen.greedy, gen.samples) for gen in generated]
        from candor.backends.constraints import JsonConstraint

        constraints = [JsonConstraint.of(schema_of(item), allow_text=spec.allow_text) for item in items]
        cut = {"on_token": PlainCut(self.tokenizer)} if hooks and spec.allow_text else {}
        if self.kind == "hf":  # each item its own tools' schema, the items decoded in one batch
            generated = self.backend.generate(prompts, k, params, seeds=seeds, constraint=constraints, **cut)
        else:  # a server's structured output is one schema a request
            generated = []
            for prompt, constraint, seed in zip(prompts, constraints, seeds, strict=True):
                generated += self.backend.generate([prompt], k, params, seeds=[seed], constraint=constraint)
        return [reply_record(gen.greedy, gen.samples) for gen in generated]

    def _upstream_tools(
        self, items: Sequence[Item], k: int, params: SamplingParams, seeds: Sequence[int]
    ) -> list[dict[str, Any]]:
        out = []
        for item, seed in zip(items, seeds, strict=True):
            (gen,) = self.backend.generate_tool_calls(
                [self.backend.render_chat(item.messages)],
                k,
                params,
                tools=[tool.to_openai() for tool in item.tools],
                tool_choice="auto",
                parallel_tool_calls=CATEGORIES[item.category].parallel,
                seeds=[seed],
            )
            out.append(reply_record(gen.greedy, gen.samples))
        return out


class PlainCut:
    """A token hook that ends a row once its text can no longer become a call (:func:`may_become_call`): a plain
    answer is judged as "no call" whatever follows, so its tail is not generated. Its n-prob is then that of
    the tokens up to the cut (the first few)."""

    CHECKED = 16  # characters: past them a reply that may still be a call is one in progress

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.rows: dict[tuple[int, int], list[int]] = {}
        self.settled: set[tuple[int, int]] = set()

    def __call__(self, prompt: int, sample: int, token: int) -> bool:
        row = (prompt, sample)
        if row in self.settled:
            return True
        ids = self.rows.setdefault(row, [])
        ids.append(token)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not may_become_call(text):
            return False
        if len(text.strip()) >= self.CHECKED:
            self.settled.add(row)
        return True


def reply_record(greedy: Any, samples: Sequence[Any]) -> dict[str, Any]:
    tokens = len(greedy.logprobs) + sum(len(sample.logprobs) for sample in samples)
    return {
        "greedy": {
            "text": greedy.text,
            "logprobs": [float(x) for x in greedy.logprobs],
            "stop_logprob": greedy.stop_logprob,
            "finish_reason": greedy.finish_reason,
        },
        "samples": [sample.text for sample in samples],
        "tokens": tokens,
    }


def load_runner(args: argparse.Namespace) -> Runner:
    from transformers import AutoTokenizer

    from candor.backends import load_backend
    from candor.backends.default_model import resolve_embedded

    tokenizer = AutoTokenizer.from_pretrained(resolve_embedded(MODEL))
    if args.backend == "hf":
        backend = load_backend(MODEL, "hf", batch_size=args.batch)  # rows are reserved per batch: keep it small
        identity = {"backend": "hf", "model": MODEL}
    else:
        # The chat endpoint for every arm: tools and structured output are chat fields on llama.cpp's server
        # (its completions endpoint ignores response_format), and its chat replies carry log-probs.
        backend = load_backend(args.served_model, "openai", base_url=args.base_url, endpoint="chat")
        identity = {"backend": "openai", "endpoint": "chat", "model": args.served_model, "server": args.server_name}
    return Runner(backend=backend, kind=args.backend, identity=identity, tokenizer=tokenizer)


def read_cache(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["key"]] = row
    return out


def round_robin(items: Sequence[Item], batch: int) -> list[list[Item]]:
    """Batches of one category each (items of a category share a token cap), the categories taking turns, so a
    run stopped early holds every category."""
    queues = []
    for category in CATEGORIES:
        group = [item for item in items if item.category == category]
        queues.append([group[start : start + batch] for start in range(0, len(group), batch)])
    out = []
    for turn in range(max((len(q) for q in queues), default=0)):
        out += [queue[turn] for queue in queues if turn < len(queue)]
    return out


def annotate(
    runner: Runner,
    items: Sequence[Item],
    arms: Sequence[str],
    k: int,
    path: Path,
    batch: int,
    stop_at: float | None = None,
) -> None:
    """Generate what the cache lacks, a batch of items at a time, the arms interleaved; no new batch starts
    after ``stop_at`` (a Unix time)."""
    cached = read_cache(path)
    run_id = f"{time.time():.0f}"
    path.parent.mkdir(parents=True, exist_ok=True)
    todo = [item for item in items if any(key_of(runner, arm, item, k) not in cached for arm in arms)]
    logger.info("%d of %d items to generate (%s)", len(todo), len(items), ", ".join(arms))
    started = time.time()
    done = 0
    for chunk in round_robin(todo, batch):
        if stop_at is not None and time.time() >= stop_at:
            logger.info("stopping at the deadline: %d of %d items generated", done, len(todo))
            return
        for arm in arms:
            missing = [item for item in chunk if key_of(runner, arm, item, k) not in cached]
            if not missing:
                continue
            began = time.perf_counter()
            records = runner.generate(arm, missing, k)
            seconds = time.perf_counter() - began
            total = sum(record["tokens"] for record in records) or 1
            with path.open("a") as handle:
                for item, record in zip(missing, records, strict=True):
                    key = key_of(runner, arm, item, k)
                    row = {
                        "key": key,
                        "id": item.id,
                        "arm": arm,
                        "batch": f"{run_id}:{chunk[0].id}",
                        "seconds": seconds * record["tokens"] / total,
                        **record,
                    }
                    handle.write(json.dumps(row) + "\n")
                    cached[key] = row
        done += len(chunk)
        elapsed = time.time() - started
        logger.info(
            "%d/%d items, %.0f s, about %.0f s left", done, len(todo), elapsed, elapsed / done * (len(todo) - done)
        )


_KEYS: dict[tuple[str, str, int], str] = {}


def key_of(runner: Runner, arm: str, item: Item, k: int) -> str:
    memo = (arm, item.id, k)
    if memo not in _KEYS:
        _KEYS[memo] = cache_key(runner.identity, arm, item, runner.prompt(item, arm), k)
    return _KEYS[memo]


def prompt_states(runner: Runner, items: Sequence[Item], path: Path) -> dict[str, np.ndarray] | None:
    """The hidden state of each prompt's last token (hf only), cached by prompt hash."""
    if runner.kind != "hf":
        return None
    stored: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as data:
            stored = {name: data[name] for name in data.files}
    hashes = {item.id: hashlib.sha256(runner.prompt(item).encode()).hexdigest() for item in items}
    missing = [item for item in items if hashes[item.id] not in stored]
    for start in range(0, len(missing), 16):
        chunk = missing[start : start + 16]
        states = runner.backend.hidden_states([runner.prompt(item) for item in chunk])
        for item, row in zip(chunk, states, strict=True):
            stored[hashes[item.id]] = row
        np.savez(path, **stored)
    return {item.id: stored[hashes[item.id]] for item in items}


# --- scoring -----------------------------------------------------------------------------------------------

INVALID = "<invalid call>"


def outcome(text: str) -> str:
    """What a reply does: the canonical calls, "" for a plain answer, INVALID for a call that does not parse."""
    calls = parse_calls(text)
    if calls is not None:
        return json.dumps(sorted(call.canonical() for call in calls))
    return INVALID if starts_like_call(text) else ""


def agrees(sample: str, greedy: str) -> bool:
    a, b = parse_calls(sample), parse_calls(greedy)
    if a is not None and b is not None:
        return calls_agree(a, b)
    return outcome(sample) == outcome(greedy) != INVALID


def n_prob(greedy: dict[str, Any]) -> float:
    logprobs = greedy["logprobs"]
    if logprobs:
        return float(math.exp(sum(logprobs) / len(logprobs)))
    stop = greedy.get("stop_logprob")
    return float(math.exp(stop)) if stop is not None else 0.0


def item_rows(items: Sequence[Item], records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for item in items:
        record = records.get(item.id)
        if record is None:
            continue
        text = record["greedy"]["text"]
        calls = parse_calls(text)
        samples = record["samples"]
        texts = [text, *samples]
        attempts = [starts_like_call(t) for t in texts]
        samples_correct = sum(judge(item, parse_calls(sample)).correct for sample in samples)
        parsed = [parse_calls(t) is not None for t in texts]
        rows.append(
            {
                "id": item.id,
                "category": item.category,
                "split": split_of(item.id),
                "correct": int(judge(item, calls).correct),
                "called": calls is not None,
                "samples": len(samples),
                "samples_correct": samples_correct,
                "attempts": sum(attempts),
                "parsed": sum(p for p, a in zip(parsed, attempts, strict=True) if a),
                "greedy_cut": record["greedy"]["finish_reason"] == "length",  # at the token cap: may end mid-call
                "greedy_attempt": attempts[0],
                "greedy_parsed": parsed[0],
                "n-prob": n_prob(record["greedy"]),
                "consistency": float(np.mean([agrees(s, text) for s in samples])) if samples else float("nan"),
                "tokens": record["tokens"],
                "seconds": record["seconds"],
                "batch": record["batch"],
            }
        )
    return rows


def fit_head(rows: list[dict[str, Any]], states: dict[str, np.ndarray]) -> np.ndarray:
    """Stage 1: ridge on the standardised prompt state → consistency, fitted on the train split only."""
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.stack([states[row["id"]] for row in rows])
    train = np.array([row["split"] == "train" for row in rows])
    target = np.array([row["consistency"] for row in rows])
    head = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-1, 4, 12)))
    head.fit(x[train], target[train])
    return np.clip(head.predict(x), 0.0, 1.0)


def clip_open(values: np.ndarray) -> np.ndarray:
    return np.clip(values, 1e-4, 1 - 1e-4)


def score_rows(rows: list[dict[str, Any]], bootstrap: int) -> dict[str, Any]:
    """Per score: Platt on the cal split, then AUROC and ECE (bootstrap intervals) on the splits the score is
    evaluated on (:data:`EVALUATED_ON`)."""
    cal = [row for row in rows if row["split"] == "cal"]
    out: dict[str, Any] = {}
    for score in SCORES:
        test = [row for row in rows if row["split"] in EVALUATED_ON[score]]
        if not test or any(score not in row for row in rows):
            continue
        y_cal = np.array([row["correct"] for row in cal])
        if len(cal) < 10 or y_cal.min() == y_cal.max():
            out[score] = {"missing": f"the cal split has {len(cal)} items, {int(y_cal.sum())} correct: no calibration"}
            continue
        calibrator = get_calibrator("platt").fit(clip_open(np.array([row[score] for row in cal])), y_cal)
        raw = np.array([row[score] for row in test])
        confidence = calibrator.predict(clip_open(raw))
        correct = [row["correct"] for row in test]
        ids = [row["id"] for row in test]
        metrics = claim_metrics(confidence, correct, ids, metrics=("auroc", "ece"), bootstrap=bootstrap)
        raw_ece = claim_metrics(raw, correct, ids, metrics=("ece",), bootstrap=bootstrap)["ece"]
        irrelevant = [i for i, row in enumerate(test) if row["category"] == "irrelevance"]
        relevant = [i for i, row in enumerate(test) if row["category"] != "irrelevance"]

        def abstains(i: int, threshold: float = THRESHOLD, conf: np.ndarray = confidence, rows: list = test) -> bool:
            return not rows[i]["called"] or conf[i] < threshold

        answered = [i for i in relevant if not abstains(i)]
        out[score] = {
            "evaluated_on": list(EVALUATED_ON[score]),
            "n": len(test),
            "correct": int(sum(correct)),
            "auroc": metrics["auroc"],
            "ece": metrics["ece"],
            "ece_uncalibrated": raw_ece,
            "platt": {"slope": calibrator.slope_, "intercept": calibrator.intercept_, "n_cal": len(cal)},
            "threshold": THRESHOLD,
            "irrelevance": {
                "n": len(irrelevant),
                "abstained": int(sum(abstains(i) for i in irrelevant)),
                "no_call": sum(not test[i]["called"] for i in irrelevant),
            },
            "relevant": {
                "n": len(relevant),
                "answered": len(answered),
                "answered_correct": int(sum(test[i]["correct"] for i in answered)),
            },
        }
    return out


def arm_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    attempts = sum(row["attempts"] for row in rows)
    parsed = sum(row["parsed"] for row in rows)
    per_category = {}
    for category in CATEGORIES:
        mine = [row for row in rows if row["category"] == category]
        if mine:
            per_category[category] = {
                "n": len(mine),
                "accuracy": float(np.mean([row["correct"] for row in mine])),
                "called": float(np.mean([row["called"] for row in mine])),
            }
    finished = [row for row in rows if not row["greedy_cut"] and row["greedy_attempt"]]
    return {
        "n": len(rows),
        "call_attempts": attempts,
        "parsed": parsed,
        "parse_rate": parsed / attempts if attempts else None,
        # Greedy replies (their finish reason is kept; the samples' is not): cut at the token cap, and how many
        # of those that ended on their own and try a call parse.
        "greedy_cut": sum(row["greedy_cut"] for row in rows),
        "greedy_finished_attempts": len(finished),
        "greedy_finished_parsed": sum(row["greedy_parsed"] for row in finished),
        "accuracy": float(np.mean([row["correct"] for row in rows])) if rows else None,
        "replies_judged": len(rows) + sum(row["samples"] for row in rows),
        "sample_accuracy": (
            sum(row["samples_correct"] for row in rows) / sum(row["samples"] for row in rows) if rows else None
        ),
        "categories": per_category,
        "tokens": int(sum(row["tokens"] for row in rows)),
        "seconds": float(sum(row["seconds"] for row in rows)),
    }


def speed_probe(runner: Runner, items: Sequence[Item], k: int, path: Path) -> None:
    """Generated tokens/s without and with the schema (``free`` uncut against ``required``), the arms alternating
    item by item in this run; appended to ``path`` under this run's id."""
    from candor.backends.constraints import JsonConstraint

    run_id = f"{time.time():.0f}"
    with path.open("a") as handle:
        for item in items:
            params, seed = params_for(item), [item_seed(item.id)]
            for arm in SPEED_ARMS:
                spec = ARM_SPECS[arm]
                kwargs = {"constraint": JsonConstraint.of(schema_of(item))} if spec.constrained else {}
                began = time.perf_counter()
                (gen,) = runner.backend.generate([runner.prompt(item, arm)], k, params, seeds=seed, **kwargs)
                seconds = time.perf_counter() - began
                tokens = len(gen.greedy.logprobs) + sum(len(sample.logprobs) for sample in gen.samples)
                row = {"run": run_id, "id": item.id, "arm": arm, "tokens": tokens, "seconds": seconds}
                handle.write(json.dumps(row) + "\n")
                logger.info("speed %s %s: %d tokens in %.1f s", item.id, arm, tokens, seconds)


def speed(path: Path) -> dict[str, Any] | None:
    """The latest speed probe's tokens/s per arm and the ratio with the schema over without."""
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    latest = max(row["run"] for row in rows)
    mine = [row for row in rows if row["run"] == latest]
    out: dict[str, Any] = {"items": len({row["id"] for row in mine})}
    for arm in SPEED_ARMS:
        tokens = sum(row["tokens"] for row in mine if row["arm"] == arm)
        seconds = sum(row["seconds"] for row in mine if row["arm"] == arm)
        out[arm] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else None}
    if out["free"]["tokens_per_s"] and out["required"]["tokens_per_s"]:
        out["ratio_schema_over_free"] = out["required"]["tokens_per_s"] / out["free"]["tokens_per_s"]
    return out


# --- main --------------------------------------------------------------------------------------------------


def read_commands(path: Path) -> list[dict[str, str]]:
    """The generating runs whose replies the cache holds (a scoring run's own command is ``command``)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stop_time(text: str | None) -> float | None:
    """Today's HH:MM (UTC) as a Unix time."""
    if text is None:
        return None
    hours, minutes = (int(part) for part in text.split(":"))
    now = time.gmtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hours, minutes, 0, 0, 0, 0)) - time.timezone


def select(items_by_category: dict[str, list[Item]], limit: int | None) -> list[Item]:
    chosen = []
    for items in items_by_category.values():
        chosen += items[:limit] if limit else items
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("hf", "openai"), default="hf")
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="openai: the server's /v1 URL")
    parser.add_argument("--served-model", default="smollm2", help="openai: the model name the server serves")
    parser.add_argument("--server-name", default="llama-server", help="openai: what the server is (recorded)")
    parser.add_argument("--data", type=Path, default=DATA, help="the BFCL v4 folder")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--limit", type=int, default=None, help="the first N items of each category")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--k", type=int, default=5, help="samples per item")
    parser.add_argument("--batch", type=int, default=4, help="items generated together")
    parser.add_argument("--stop-at", default=None, help="HH:MM (UTC): start no new batch after it, then score")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--run", default=None, help="the cache's name (default: the backend's)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--speed", type=int, default=0, help="time N simple items without and with the schema (uncut), alternating"
    )
    parser.add_argument("--score-only", action="store_true", help="score what the cache holds; generate nothing")
    args = parser.parse_args(argv)
    setup_logging()

    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    by_category = {category: load(args.data, category) for category in categories}
    items = select(by_category, args.limit)
    runner = load_runner(args)
    run = args.run or args.backend
    cache_path = TOOL_CACHE / f"{run}.jsonl"
    availability = runner.arms()
    wanted = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    arms = [arm for arm in wanted if availability.get(arm) is None]
    speed_path = TOOL_CACHE / f"{run}-speed.jsonl"
    command = "python -m benchmarks.tool_calls " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    commands_path = TOOL_CACHE / f"{run}-commands.jsonl"
    if not args.score_only:
        commands_path.parent.mkdir(parents=True, exist_ok=True)
        with commands_path.open("a") as handle:  # every generating run the cache holds, for the results' record
            handle.write(
                json.dumps({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}) + "\n"
            )
        if args.speed and availability.get("required") is None:
            speed_probe(runner, by_category.get("simple", items)[: args.speed], args.k, speed_path)
        annotate(runner, items, arms, args.k, cache_path, args.batch, stop_time(args.stop_at))
    cached = read_cache(cache_path)
    # Only items some arm generated are scored (a run stopped at its deadline holds fewer than asked).
    generated = [item for item in items if any(key_of(runner, arm, item, args.k) in cached for arm in arms)]
    states = prompt_states(runner, generated, TOOL_CACHE / f"{run}-states.npz")

    result_arms: dict[str, Any] = {}
    for arm in arms:
        records = {}
        for item in generated:
            row = cached.get(key_of(runner, arm, item, args.k))
            if row is not None:
                records[item.id] = row
        rows = item_rows(generated, records)
        if states is not None and rows:
            for row, value in zip(rows, fit_head(rows, states), strict=True):
                row["head"] = float(value)
        result_arms[arm] = {"summary": arm_summary(rows), "scores": score_rows(rows, args.bootstrap)}
    for arm in wanted:
        if arm not in arms:
            result_arms[arm] = {"missing": availability.get(arm) or "not asked for"}

    out = args.out or (OUT if args.backend == "hf" else RESULTS / f"tool_calls_{args.backend}.json")
    split_counts = {name: sum(split_of(item.id) == name for item in generated) for name in SPLITS}
    payload = {
        "command": command,
        "generated_by": read_commands(commands_path),
        "backend": runner.identity,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "items": {category: sum(item.category == category for item in generated) for category in by_category},
        "items_asked": {category: min(len(v), args.limit or len(v)) for category, v in by_category.items()},
        "k": args.k,
        "sampling": {
            "temperature": PROTOCOL_SAMPLES.temperature,
            "top_p": PROTOCOL_SAMPLES.top_p,
            "top_k": PROTOCOL_SAMPLES.top_k,
            "max_new_tokens": MAX_NEW_TOKENS,
        },
        "split": {"by": "sha256(item id) mod 10: 0-4 train, 5-6 cal, 7-9 test", "items": split_counts},
        "threshold": THRESHOLD,
        "arms": result_arms,
        "speed": speed(speed_path),
        "bootstrap": args.bootstrap,
    }
    if any(ARM_SPECS[arm].constrained for arm in arms):
        import candor.backends.constraints as constraints

        payload["constraints_from"] = constraints.__file__  # which checkout's constrained decoding ran
    from candor.util.cpu import describe

    payload["machine"]["cpu"] = describe()  # this machine's (an openai run's server may run elsewhere: its name says)
    write_json(out, payload)
    logger.info("wrote %s", out)


if __name__ == "__main__":
    main()
