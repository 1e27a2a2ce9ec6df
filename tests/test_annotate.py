"""The annotator end to end on a tiny random model: records, resume, kill -9, shards, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import candor
from candor.annotation.builder import AnnotateConfig, Shard, annotate, merge_shards
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE, get_consistency_judge, get_correctness_judge
from candor.annotation.prompts import TEMPLATES, QATemplate
from candor.annotation.records import (
    HONESTYBENCH_FIELDS,
    from_honestybench,
    read_records,
    to_honestybench,
    write_records,
)
from candor.annotation.text_matching import normalize, rouge_tokens
from candor.backends.base import SamplingParams
from candor.cli import app
from candor.data.items import QAItem
from candor.util.errors import CandorError

FEWSHOT = TEMPLATES.get("fewshot")
QUESTIONS = [
    ("What is the capital of France?", ["Paris"]),
    ("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]),
    ("What is the chemical symbol for gold?", ["Au"]),
    ("How many legs does a spider have?", ["8", "eight"]),
    ("Which planet is known as the Red Planet?", ["Mars"]),
    ("What is the boiling point of water in Celsius?", ["100"]),
    ("Who painted The Starry Night?", ["Vincent van Gogh", "van Gogh"]),
]


def make_items() -> list[QAItem]:
    return [
        QAItem(id=f"t:{i}", dataset="toy", split="test", question=q, answers=tuple(a))
        for i, (q, a) in enumerate(QUESTIONS)
    ]


def config(k: int = 2) -> AnnotateConfig:
    return AnnotateConfig(k=k, params=SamplingParams(max_new_tokens=6), batch_size=3, seed=1)


def assert_same_records(got, expected) -> None:
    """Equal record for record; log-probs to 1e-4, because batch padding moves them by ~1e-6 (tokens stay identical)."""
    got, expected = [[r.to_dict() for r in recs] for recs in (got, expected)]
    assert [logprobs_removed(d) for d in got] == [logprobs_removed(d) for d in expected]
    for a, b in zip(got, expected, strict=True):
        for x, y in zip([a["greedy"], *a["samples"]], [b["greedy"], *b["samples"]], strict=True):
            assert x["logprobs"] == pytest.approx(y["logprobs"], abs=1e-4)


def logprobs_removed(d: dict) -> dict:
    d = {**d, "provenance": {k: v for k, v in d["provenance"].items() if k != "shard"}}
    # Top-k alternatives: the same tokens (their log-probs move by ~1e-6 like the others).
    d["greedy"] = {**d["greedy"], "logprobs": None, "top_logprobs": top_tokens(d["greedy"])}
    d["samples"] = [{**s, "logprobs": None, "top_logprobs": top_tokens(s)} for s in d["samples"]]
    return d


def top_tokens(completion: dict) -> list[list[str]]:
    return [sorted(pos) for pos in completion.get("top_logprobs", [])]


def comparable(records) -> list[dict]:
    """Records as dicts; log-probs rounded because batch padding moves them by ~1e-6 (tokens stay identical)."""
    out = []
    for rec in records:
        d = rec.to_dict()
        d["provenance"] = {k: v for k, v in d["provenance"].items() if k != "shard"}
        for comp in [d["greedy"], *d["samples"]]:
            comp["logprobs"] = [round(x, 4) for x in comp["logprobs"]]
            # Top-k alternatives: the same tokens (their log-probs move by ~1e-6 like the others).
            comp["top_logprobs"] = [sorted(pos) for pos in comp.get("top_logprobs", [])]
        out.append(d)
    return out


def test_annotate_writes_complete_records(tiny_backend, tmp_path):
    out = tmp_path / "records.jsonl"
    result = annotate(make_items(), tiny_backend, out, FEWSHOT, config(k=3), progress=False)
    assert (result.written, result.skipped, result.total) == (7, 0, 7)
    records = read_records(out)
    assert [r.id for r in records] == [f"t:{i}" for i in range(7)]
    judge = get_correctness_judge("contains")
    for rec in records:
        assert rec.k == 3 and len(rec.sample_correct) == 3 and len(rec.consistency) == 3
        assert len(rec.greedy.logprobs) == len(rec.greedy.token_ids) > 0
        assert all(lp <= 0 for lp in rec.greedy.logprobs)
        assert rec.greedy_correct == judge.judge([rec.greedy.text], [rec.item.answers])[0]
        assert rec.sample_correct == judge.judge([s.text for s in rec.samples], [rec.item.answers] * 3)
        assert rec.provenance["template"] == "fewshot" and rec.provenance["k"] == 3
        assert "\n" in rec.provenance["decoding"]["samples"]["stop"]
    # What made the records, in full: settings that a resume compares, and how the samples were drawn.
    assert records[0].provenance == {
        "model": tiny_backend.model_name,
        "dtype": "float32",
        "template": "fewshot",
        "k": 3,
        "seed": 1,
        "decoding": {
            "greedy": {"temperature": 0.0},
            "samples": {**SamplingParams(max_new_tokens=6).to_dict(), "stop": ["\n"]},
        },
        "correctness_judge": "contains",
        "consistency_judge": DEFAULT_CONSISTENCY_JUDGE,
        "candor_version": candor.__version__,
        "shard": None,
        "input_items": None,
        "skipped_items": 0,
    }


def test_records_hold_what_the_backend_answers_each_items_prompt_with_its_seed(tiny_backend, tmp_path):
    """Against the backend called by hand: the chat template renders through the annotated model's own chat
    template, and each item's samples are drawn with the seed of (config seed, item id)."""
    from candor.util.seeds import item_seed

    items, chat = make_items()[:3], TEMPLATES.get("chat")
    cfg = AnnotateConfig(k=2, params=SamplingParams(max_new_tokens=5), batch_size=3, seed=7)
    out = tmp_path / "r.jsonl"
    annotate(items, tiny_backend, out, chat, cfg, progress=False)
    records = read_records(out)
    assert {r.provenance["template"] for r in records} == {"chat"}
    prompts = [
        tiny_backend.render_chat([{"role": "user", "content": f"Answer the following question.\nQuestion: {q}"}])
        for q, _ in QUESTIONS[:3]
    ]
    stop = tuple(records[0].provenance["decoding"]["samples"]["stop"])
    params = SamplingParams(**{**cfg.params.to_dict(), "stop": stop})
    by_hand = tiny_backend.generate(prompts, 2, params, greedy=True, seeds=[item_seed(7, item.id) for item in items])
    assert [[r.greedy.text, *(s.text for s in r.samples)] for r in records] == [
        [g.greedy.text, *(s.text for s in g.samples)] for g in by_hand
    ]
    # Another seed draws other samples (so the seed above is the one that was used).
    other = tiny_backend.generate(prompts, 2, params, greedy=True, seeds=[item_seed(8, item.id) for item in items])
    assert [[s.text for s in g.samples] for g in other] != [[s.text for s in r.samples] for r in records]


def test_a_run_of_several_backend_calls_counts_and_writes_every_record(tiny_backend, tmp_path):
    """batch_size 1 hands the backend 4 questions a call (CALL_BATCHES): 7 items take two calls, and the file and
    the count are those of a one-call run."""
    one_call, two_calls = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    annotate(make_items(), tiny_backend, one_call, FEWSHOT, config(k=1), progress=False)
    result = annotate(
        make_items(), tiny_backend, two_calls, FEWSHOT, replace(config(k=1), batch_size=1), progress=False
    )
    assert (result.written, result.skipped, result.total) == (7, 0, 7)
    assert_same_records(read_records(two_calls), read_records(one_call))


def test_k_0_annotates_the_greedy_answer_alone(tiny_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    result = annotate(make_items()[:2], tiny_backend, out, FEWSHOT, config(k=0), progress=False)
    assert result.written == 2
    contains = get_correctness_judge("contains")
    for rec in read_records(out):
        assert (rec.k, rec.samples, rec.sample_correct, rec.consistency) == (0, [], [], [])
        assert rec.greedy.token_ids and rec.greedy_correct == contains.judge([rec.greedy.text], [rec.item.answers])[0]


def test_greedy_answer_marked_correct_when_it_matches_gold(tiny_backend, tmp_path):
    first = read_records_after(tiny_backend, tmp_path / "a.jsonl", make_items()[:2])
    # Reuse the model's own greedy answer as gold: contains must then say correct.
    items = [
        QAItem(id=r.id, dataset="toy", split="test", question=r.item.question, answers=(r.greedy.text or "x",))
        for r in first
    ]
    second = read_records_after(tiny_backend, tmp_path / "b.jsonl", items)
    assert [r.greedy_correct for r in second] == [1 if normalize(r.greedy.text) else 0 for r in first]


def read_records_after(backend, out, items):
    annotate(items, backend, out, FEWSHOT, config(), progress=False)
    return read_records(out)


def test_resume_skips_done_items_and_equals_single_run(tiny_backend, tmp_path):
    items = make_items()
    single = tmp_path / "single.jsonl"
    annotate(items, tiny_backend, single, FEWSHOT, config(), progress=False)

    resumed = tmp_path / "resumed.jsonl"
    annotate(items[:4], tiny_backend, resumed, FEWSHOT, config(), progress=False)
    # Simulate a write cut mid-line by kill -9: a partial trailing line.
    with resumed.open("a") as fh:
        fh.write('{"item": {"id": "t:4", "quest')
    result = annotate(items, tiny_backend, resumed, FEWSHOT, config(), progress=False)
    assert (result.written, result.skipped) == (3, 4)
    assert_same_records(read_records(resumed), read_records(single))


def test_a_resume_says_what_is_done_and_shows_its_progress_by_default(tiny_backend, tmp_path, caplog, capsys):
    items = make_items()
    out = tmp_path / "r.jsonl"
    annotate(items[:4], tiny_backend, out, FEWSHOT, config(), progress=False)
    assert "annotate:" not in capsys.readouterr().err  # progress=False: no bar
    with caplog.at_level("INFO", logger="candor.annotation.builder"):
        annotate(items, tiny_backend, out, FEWSHOT, config())  # the default: a progress bar on stderr
    assert f"{out}: 7 items, 4 already done, 3 to annotate" in caplog.messages
    # The bar counts questions of the whole input: it starts at the 4 done and ends at 7 of 7.
    states = [s.strip() for s in capsys.readouterr().err.replace("\r", "\n").splitlines() if "annotate:" in s]
    assert states[0].startswith("annotate:  57%|") and "| 4/7 [" in states[0]
    assert states[-1].startswith("annotate: 100%|") and "| 7/7 [" in states[-1]
    assert states[-1].endswith(("q/s]", "s/q]"))  # the unit: questions


def test_rerun_with_other_settings_is_refused(tiny_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    annotate(make_items()[:2], tiny_backend, out, FEWSHOT, config(k=2), progress=False)
    with pytest.raises(CandorError) as err:
        annotate(make_items(), tiny_backend, out, FEWSHOT, config(k=3), progress=False)
    assert str(err.value) == (
        f"{out} holds records made with other settings {{'k': (2, 3)}} (found, requested); "
        "use another --out or delete the file"
    )
    assert len(read_records(out)) == 2  # nothing already written is lost


def test_dtype_is_in_the_provenance_and_a_resume_in_another_dtype_is_refused(tiny_model_dir, tmp_path):
    """bf16 records never join a float32 file (nor the reverse); files from before the key count as float32."""
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:3]])

    def args(out: Path, limit: int, *extra: str) -> list[str]:
        return [
            "annotate",
            "--data",
            str(data),
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--k",
            "1",
            "--max-new-tokens",
            "3",
            "--template",
            "fewshot",
            "--limit",
            str(limit),
            *extra,
        ]

    runner = CliRunner()
    out = tmp_path / "out.jsonl"
    assert runner.invoke(app, args(out, 2, "--dtype", "bfloat16")).exit_code == 0
    assert [r.provenance["dtype"] for r in read_records(out)] == ["bfloat16", "bfloat16"]
    before = out.read_text()
    refused = runner.invoke(app, args(out, 3))  # the default dtype, float32 on CPU
    assert refused.exit_code == 2
    assert "other settings {'dtype': ('bfloat16', 'float32')}" in one_error_line(refused.output)
    assert out.read_text() == before  # nothing already written is lost
    # A file written before records named their dtype: float32, so a float32 resume continues it.
    legacy = tmp_path / "legacy.jsonl"
    assert runner.invoke(app, args(legacy, 2)).exit_code == 0
    rows = [json.loads(line) for line in legacy.read_text().splitlines()]
    for row in rows:
        del row["provenance"]["dtype"]
    write_jsonl(legacy, rows)
    resumed = runner.invoke(app, args(legacy, 3))
    assert resumed.exit_code == 0, resumed.output
    assert len(read_records(legacy)) == 3
    assert runner.invoke(app, args(legacy, 3, "--dtype", "bfloat16")).exit_code == 2


def test_annotate_through_an_engine_that_does_not_name_its_dtype_reaches_the_engine(tmp_path):
    """The openai backend has no dtype (the server decides it): the provenance records None, and annotate goes on
    to ask the server, here a closed port, which is one clear error."""
    import socket

    from candor.backends.base import GENERATE
    from candor.backends.openai import OpenAIBackend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens there once the socket is closed
    backend = OpenAIBackend("m", base_url=url, max_retries=0, capabilities=[GENERATE])
    assert not hasattr(backend, "dtype")
    out = tmp_path / "r.jsonl"
    with pytest.raises(CandorError, match=rf"^cannot reach the server at {url} "):
        annotate(make_items()[:1], backend, out, FEWSHOT, config(), progress=False)
    assert not out.exists() or out.read_text() == ""  # nothing half-written


def test_shards_then_merge_equal_single_run(tiny_backend, tmp_path):
    items = make_items()
    single = tmp_path / "single.jsonl"
    annotate(items, tiny_backend, single, FEWSHOT, config(), progress=False)
    parts = []
    for i in (2, 0, 1):  # any order
        part = tmp_path / f"shard{i}.jsonl"
        annotate(items, tiny_backend, part, FEWSHOT, config(), shard=Shard(i, 3), progress=False)
        parts.append(part)
    merged = tmp_path / "merged.jsonl"
    assert merge_shards(parts, merged) == len(items)
    assert_same_records(read_records(merged), read_records(single))


def make_shards(backend, tmp_path, items, n: int = 3, k: int = 2) -> list[Path]:
    parts = []
    for i in range(n):
        part = tmp_path / f"shard{i}.jsonl"
        annotate(items, backend, part, FEWSHOT, config(k=k), shard=Shard(i, n), progress=False)
        parts.append(part)
    return parts


def test_merge_names_a_missing_shard_and_writes_nothing(tiny_backend, tmp_path):
    parts = make_shards(tiny_backend, tmp_path, make_items())
    merged = tmp_path / "m.jsonl"
    with pytest.raises(CandorError, match=r"shard 1/3 is missing \(given: 0/3, 2/3\)"):
        merge_shards([parts[0], parts[2]], merged)
    assert not merged.exists()


def test_merge_refuses_duplicates_unfinished_shards_and_mixed_settings(tiny_backend, tmp_path):
    items = make_items()
    parts = make_shards(tiny_backend, tmp_path, items)
    with pytest.raises(CandorError, match=r"shard 1/3 given twice"):
        merge_shards([*parts, parts[1]], tmp_path / "m.jsonl")
    # A shard cut short (a killed run not resumed) is an incomplete merge, not a smaller file.
    complete = parts[2].read_text()
    parts[2].write_text("".join(complete.splitlines(keepends=True)[:-1]))
    with pytest.raises(CandorError, match=r"shard2\.jsonl \(shard 2/3\) holds 2 of its 3 items"):
        merge_shards(parts, tmp_path / "m.jsonl")
    parts[2].write_text(complete)
    # Shards of another run (other k) do not mix.
    other = tmp_path / "other"
    other.mkdir()
    k1 = make_shards(tiny_backend, other, items, k=1)
    with pytest.raises(CandorError, match="other settings"):
        merge_shards([parts[0], parts[1], k1[2]], tmp_path / "m.jsonl")
    # Shards of a different input (other size) do not mix either.
    smaller = tmp_path / "smaller"
    smaller.mkdir()
    s = make_shards(tiny_backend, smaller, items[:5])
    with pytest.raises(CandorError, match="not parts of one run"):
        merge_shards([parts[0], parts[1], s[2]], tmp_path / "m.jsonl")
    # An id in two shards: shard 1 with one of its records swapped for one of shard 0's.
    dup = tmp_path / "dup.jsonl"
    write_records(dup, [replace_shard(read_records(parts[0])[0], "1/3"), read_records(parts[1])[1]])
    with pytest.raises(CandorError, match=rf"id 't:0' is in both {parts[0]} and {dup}"):
        merge_shards([parts[0], dup, *parts[2:]], tmp_path / "m.jsonl")
    plain = tmp_path / "plain.jsonl"
    annotate(items[:2], tiny_backend, plain, FEWSHOT, config(), progress=False)
    with pytest.raises(CandorError, match="not one shard"):
        merge_shards([plain], tmp_path / "m.jsonl")


def replace_shard(rec, shard: str):
    rec.provenance = {**rec.provenance, "shard": shard}
    return rec


def test_merge_accepts_empty_shards_of_a_small_input(tiny_backend, tmp_path):
    items = make_items()[:2]
    parts = make_shards(tiny_backend, tmp_path, items, n=4)  # shards 0/4 and 2/4 hold nothing
    assert [len(read_records(p)) for p in parts] == [0, 1, 0, 1]
    assert merge_shards(parts, tmp_path / "m.jsonl") == 2


def test_merge_refuses_files_mixing_shards_or_input_sizes_and_names_what_it_found(tiny_backend, tmp_path):
    items = make_items()
    parts = make_shards(tiny_backend, tmp_path, items)
    with pytest.raises(CandorError, match=r"^merge: no input files$"):
        merge_shards([], tmp_path / "m.jsonl")
    empty = [write_jsonl(tmp_path / f"empty{i}.jsonl", []) for i in range(2)]
    with pytest.raises(CandorError, match=rf"^merge: no records in {empty[0]}, {empty[1]}$"):
        merge_shards(empty, tmp_path / "m.jsonl")
    mixed = tmp_path / "mixed.jsonl"
    write_records(mixed, read_records(parts[0]) + read_records(parts[1]))
    with pytest.raises(CandorError, match=r"mixed\.jsonl: not one shard of .*\(shard in provenance: 0/3, 1/3\)"):
        merge_shards([mixed, parts[2]], tmp_path / "m.jsonl")
    smaller = tmp_path / "smaller"
    smaller.mkdir()
    sizes = tmp_path / "sizes.jsonl"  # shard 2/3 of the 7 items and of 5 of them: one shard name, two inputs
    write_records(sizes, read_records(parts[2]) + read_records(make_shards(tiny_backend, smaller, items[:5])[2]))
    with pytest.raises(CandorError, match=r"sizes\.jsonl: records made from inputs of different sizes \['5', '7'\]"):
        merge_shards([parts[0], parts[1], sizes], tmp_path / "m.jsonl")


def test_merge_of_one_shard_and_of_shards_written_before_input_items_was_kept(tiny_backend, tmp_path):
    items = make_items()
    whole = tmp_path / "whole.jsonl"
    annotate(items, tiny_backend, whole, FEWSHOT, config(), shard=Shard.parse("0/1"), progress=False)
    assert merge_shards([whole], tmp_path / "m1.jsonl") == len(items)
    parts = make_shards(tiny_backend, tmp_path, items)
    for part in parts:  # as older candor wrote them: no input_items in the provenance
        records = read_records(part)
        for rec in records:
            rec.provenance = {**rec.provenance, "input_items": None}
        write_records(part, records)
    assert merge_shards(parts, tmp_path / "m3.jsonl") == len(items)
    with pytest.raises(CandorError, match=r"shard 1/3 is missing \(given: 0/3, 2/3\)"):
        merge_shards([parts[0], parts[2]], tmp_path / "m.jsonl")


def test_good_shard_specs_parse():
    assert [Shard.parse(t) for t in ("0/1", "2/3")] == [Shard(0, 1), Shard(2, 3)]
    assert str(Shard.parse("2/3")) == "2/3"


@pytest.mark.parametrize("text", ["1/1", "3/2", "x", "-1/2", "0/0"])
def test_bad_shard_spec(text):
    with pytest.raises(CandorError):
        Shard.parse(text)


def test_duplicate_input_ids_are_refused(tiny_backend, tmp_path):
    items = make_items()[:2]
    with pytest.raises(CandorError, match="twice"):
        annotate([*items, items[0]], tiny_backend, tmp_path / "r.jsonl", FEWSHOT, config(), progress=False)


def test_honestybench_round_trip(tiny_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    annotate(make_items()[:3], tiny_backend, out, FEWSHOT, config(k=2), progress=False)
    for rec in read_records(out):
        exported = to_honestybench(rec)
        assert list(exported) == list(HONESTYBENCH_FIELDS)
        assert exported["greedy_response"] == [rec.greedy.text]
        assert exported["greedy_tokens"] == [rec.greedy.tokens] and exported["greedy_logprobs"] == [rec.greedy.logprobs]
        # The total of the whole sequence, not a running sum.
        assert exported["greedy_cumulative_logprobs"] == [pytest.approx(sum(rec.greedy.logprobs))]
        back = from_honestybench(json.loads(json.dumps(exported)), dataset="toy", index=1)
        assert back.item.question == rec.item.question and back.item.answers == rec.item.answers
        assert back.greedy.text == rec.greedy.text and back.greedy.tokens == rec.greedy.tokens
        assert back.greedy.logprobs == rec.greedy.logprobs
        assert [s.text for s in back.samples] == [s.text for s in rec.samples]
        assert (back.greedy_correct, back.sample_correct, back.consistency) == (
            rec.greedy_correct,
            rec.sample_correct,
            rec.consistency,
        )


# ------------------------------------------------------------------- CLI


def one_error_line(output: str) -> str:
    """The CLI's error: one line, the last, with no traceback (model loading may print progress bars before it)."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], output
    return lines[-1]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_cli_annotate_and_rerun(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:4]])
    out = tmp_path / "out.jsonl"
    args = [
        "annotate",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--k",
        "2",
        "--max-new-tokens",
        "5",
        "--template",
        "fewshot",
        "--batch-size",
        "2",
    ]
    runner = CliRunner()
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    before = out.read_text()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert out.read_text() == before and len(before.splitlines()) == 4


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (['{"question": "a", "answer": ["b"]}', '{"question": "c", "answer": '], ":2:"),
        (['{"question": "a", "answer": ["b"]}', '{"answer": ["b"]}'], ":2:"),
        (['{"question": "a"}'], ":1:"),
        (['{"question": "a", "answer": []}'], ":1:"),
    ],
)
def test_cli_bad_input_exits_2_naming_file_and_line(tiny_model_dir, tmp_path, rows, needle):
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    result = CliRunner().invoke(
        app, ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--model", str(tiny_model_dir)]
    )
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output and needle in result.output
    assert "Traceback" not in result.output


def test_cli_unknown_model_and_dataset_exit_2(tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": ["a"]}])
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "annotate",
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--model",
            str(tmp_path / "no-such-model"),
        ],
    )
    assert result.exit_code == 2 and "no-such-model" in result.output
    result = runner.invoke(app, ["annotate", "--data", "no-such-dataset", "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "no-such-dataset" in result.output


def test_kill_9_mid_run_then_resume(tiny_model_dir, tmp_path):
    rows = [{"question": f"Question number {i}: what is {i} plus {i}?", "answer": [str(2 * i)]} for i in range(40)]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    out = tmp_path / "out.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "candor.cli",
        "annotate",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--k",
        "2",
        "--max-new-tokens",
        "8",
        "--template",
        "fewshot",
        "--batch-size",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_bytes().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(read_records(out))
    assert 0 < partial < 40, "the run should have been killed part-way"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = read_records(out)
    assert [r.item.question for r in records] == [r["question"] for r in rows]


def test_cli_export_then_import_round_trip(tiny_backend, tmp_path):
    recs = tmp_path / "r.jsonl"
    annotate(make_items()[:3], tiny_backend, recs, FEWSHOT, config(k=2), progress=False)
    hb = tmp_path / "hb" / "toy.jsonl"
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(recs), "--out", str(hb)]).exit_code == 0
    exported = [json.loads(line) for line in hb.read_text().splitlines()]
    assert [e["greedy_response"] for e in exported] == [[r.greedy.text] for r in read_records(recs)]
    back = tmp_path / "back.jsonl"
    assert runner.invoke(app, ["import", str(hb), "--out", str(back)]).exit_code == 0
    for a, b in zip(read_records(recs), read_records(back), strict=True):
        # The released format has no id field: an import numbers the lines of the file.
        assert b.id == f"toy:{int(a.id.split(':')[1]) + 1}"
        assert (a.item.question, a.greedy.text, a.greedy.logprobs, a.greedy_correct, a.consistency) == (
            b.item.question,
            b.greedy.text,
            b.greedy.logprobs,
            b.greedy_correct,
            b.consistency,
        )
    hb.write_text(hb.read_text() + '{"question": "q"}\n')
    bad = runner.invoke(app, ["import", str(hb), "--out", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "toy.jsonl:4:" in bad.output


# ------------------------------------------------ consistency verdict values


# The tiny random model (tied embeddings) tends to repeat a prompt's last token. A prompt that ends in
# the gold answer gives greedy answers like "Mars Mars Mars"; with top_k=2 the samples then agree
# with it on some draws and not on others, so verdicts of both kinds occur.
ECHO_GOLD = QATemplate("echo-gold", lambda item, _: f"Question: {item.question}\nAnswer: {item.answers[0]}", ("\n",))


def test_consistency_verdicts_judge_each_sample_against_its_greedy_answer(tiny_backend, tmp_path):
    cfg = AnnotateConfig(
        k=4, params=SamplingParams(max_new_tokens=3, top_k=2), batch_size=3, seed=1, consistency_judge="lexical"
    )
    out = tmp_path / "r.jsonl"
    annotate(make_items(), tiny_backend, out, ECHO_GOLD, cfg, progress=False)
    lexical, contains = get_consistency_judge("lexical"), get_correctness_judge("contains")
    verdicts = []
    for rec in read_records(out):
        greedy = rec.greedy.text
        # Correctness too, one answer at a time: the greedy answer's verdict and each sample's, not a neighbour's.
        assert rec.greedy_correct == contains.judge([greedy], [rec.item.answers])[0]
        assert rec.sample_correct == contains.judge([s.text for s in rec.samples], [rec.item.answers] * 4)
        # Recomputed pair by pair, outside annotate's batching.
        assert rec.consistency == [int(lexical.equivalent(s.text, greedy)) for s in rec.samples]
        for sample, verdict in zip(rec.samples, rec.consistency, strict=True):
            # By hand: the same non-empty normalized text is consistent; no shared word is not.
            if normalize(sample.text) and normalize(sample.text) == normalize(greedy):
                assert verdict == 1
            if not set(rouge_tokens(sample.text)) & set(rouge_tokens(greedy)):
                assert verdict == 0
        verdicts += rec.consistency
    # Both values occur, so judging greedy against greedy (all 1) or misaligned slices fail.
    assert 0 < sum(verdicts) < len(verdicts)


# ------------------------------------------------------------------ resume


def test_resume_refuses_records_made_for_another_question(tiny_backend, tmp_path):
    items = make_items()[:3]
    out = tmp_path / "r.jsonl"
    annotate(items, tiny_backend, out, FEWSHOT, config(), progress=False)
    before = out.read_text()
    edited = [items[0], replace(items[1], question="Who wrote Macbeth?"), items[2]]
    with pytest.raises(CandorError) as err:
        annotate(edited, tiny_backend, out, FEWSHOT, config(), progress=False)
    message = str(err.value)
    assert message.startswith(f"{out}: the record for id 't:1' was made for question 'Who wrote Hamlet?'")
    assert "'Who wrote Macbeth?'" in message
    regolded = [items[0], items[1], replace(items[2], answers=("Gold",))]
    with pytest.raises(CandorError, match=r"'t:2'.*changed \(answers\)"):
        annotate(regolded, tiny_backend, out, FEWSHOT, config(), progress=False)
    both = [items[0], replace(items[1], question="Who wrote Macbeth?", answers=("Shakespeare",)), items[2]]
    with pytest.raises(CandorError) as err:
        annotate(both, tiny_backend, out, FEWSHOT, config(), progress=False)
    assert str(err.value) == (
        f"{out}: the record for id 't:1' was made for question 'Who wrote Hamlet?' "
        "(answers ['William Shakespeare', 'Shakespeare']), but the input now has question 'Who wrote Macbeth?' "
        "(answers ['Shakespeare']) under that id; the input changed (question, answers): "
        "use another --out or delete the file"
    )
    assert out.read_text() == before  # nothing already written is lost
    result = annotate(items, tiny_backend, out, FEWSHOT, config(), progress=False)
    assert (result.written, result.skipped) == (0, 3)


def test_cli_resume_after_the_input_changed_exits_2(tiny_model_dir, tmp_path):
    rows = [{"question": q, "answer": a} for q, a in QUESTIONS[:3]]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    args = [
        "annotate",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "out.jsonl"),
        "--model",
        str(tiny_model_dir),
        "--k",
        "1",
        "--max-new-tokens",
        "3",
        "--template",
        "fewshot",
    ]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    write_jsonl(data, [rows[0], {**rows[1], "question": "Who wrote Macbeth?"}, rows[2]])
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "'qa:2'" in one_error_line(result.output) and "'Who wrote Hamlet?'" in result.output
    assert "'Who wrote Macbeth?'" in result.output
    write_jsonl(data, rows)  # unchanged input resumes
    assert runner.invoke(app, args).exit_code == 0


# ------------------------------------------------------- skipped items


def test_cli_skips_an_item_without_alias_and_records_the_count(tiny_model_dir, tmp_path):
    rows = [{"question": q, "answer": a} for q, a in QUESTIONS[:4]]
    rows.insert(2, {"question": "Who painted it?", "answer": [""]})
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = [
        "annotate",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--k",
        "1",
        "--max-new-tokens",
        "3",
        "--template",
        "fewshot",
    ]
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert [r.id for r in records] == ["qa:1", "qa:2", "qa:4", "qa:5"]
    assert {r.provenance["skipped_items"] for r in records} == {1}
    strict = runner.invoke(app, [*args, "--out", str(tmp_path / "strict.jsonl"), "--strict"])
    assert strict.exit_code == 2 and "qa.jsonl:3: no non-empty answer alias" in one_error_line(strict.output)


# ---------------------------------------------------------- sharded CLI


def test_cli_three_shards_merge_to_the_single_run(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS])
    base = [
        "annotate",
        "--data",
        str(data),
        "--model",
        str(tiny_model_dir),
        "--k",
        "2",
        "--max-new-tokens",
        "5",
        "--template",
        "fewshot",
        "--batch-size",
        "2",
    ]
    runner = CliRunner()
    single = tmp_path / "single.jsonl"
    assert runner.invoke(app, [*base, "--out", str(single)]).exit_code == 0
    shards = []
    for i in range(3):
        shards.append(tmp_path / f"part{i}.jsonl")
        result = runner.invoke(app, [*base, "--out", str(shards[-1]), "--shard", f"{i}/3"])
        assert result.exit_code == 0, result.output
    merged = tmp_path / "merged.jsonl"
    result = runner.invoke(app, ["merge", *map(str, reversed(shards)), "--out", str(merged)])
    assert result.exit_code == 0, result.output
    assert f"merged 7 records from 3 shards into {merged}" in result.output
    assert_same_records(read_records(merged), read_records(single))
    assert {r.provenance["shard"] for r in read_records(merged)} == {None}

    missing = runner.invoke(app, ["merge", str(shards[0]), str(shards[2]), "--out", str(tmp_path / "m.jsonl")])
    assert missing.exit_code == 2
    assert one_error_line(missing.output) == (
        "error: merge: shard 1/3 is missing (given: 0/3, 2/3); run `candor annotate --shard 1/3` and merge again"
    )
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: [str(d / "nope.jsonl")], "nope.jsonl: no such file"),
        (lambda d: [str(write_jsonl(d / "junk.jsonl", ['{"x": 1}']))], "junk.jsonl:1: not a record"),
        (lambda d: [str(write_jsonl(d / "empty.jsonl", []))], "merge: no records in"),
    ],
)
def test_cli_merge_bad_input_exits_2_with_one_line(tmp_path, make, needle):
    result = CliRunner().invoke(app, ["merge", *make(tmp_path), "--out", str(tmp_path / "m.jsonl")])
    assert result.exit_code == 2
    assert one_error_line(result.output).count(needle) == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--shard", "3/2"], "--shard '3/2'"),
        (["--shard", "x"], "expected i/n"),
        (["--k", "-1"], "the number of sampled answers cannot be negative"),
        (["--batch-size", "0"], "batch size must be >= 1"),
        (["--limit", "-1"], "leaves no question to annotate"),
        (["--judge", "nosuch"], "unknown correctness judge 'nosuch'"),
        (["--consistency", "nosuch"], "unknown consistency judge 'nosuch'"),
        (["--template", "nosuch"], "nosuch"),
        (["--dtype", "float8"], "--dtype 'float8': expected one of auto, float32, bfloat16, float16"),
        (
            ["--dtype", "bfloat16", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"],
            "--dtype applies to the hf and vllm backends",
        ),
    ],
)
def test_cli_annotate_bad_options_exit_2_with_one_line(tiny_model_dir, tmp_path, extra, needle):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": ["a"]}])
    result = CliRunner().invoke(
        app,
        ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--model", str(tiny_model_dir), *extra],
    )
    assert result.exit_code == 2
    assert one_error_line(result.output).count(needle) == 1
