"""``annotate --engine ray``: a real local Ray cluster (2 CPUs) against a real ``transformers serve`` on 127.0.0.1.

The records of the pipeline are compared with those of the single-process
``--backend openai`` path on the same server and seeds. transformers serve
gives no token log-probs (it ignores ``logprobs``), so the log-prob
comparison there is of empty lists; it honours per-request seeds, so the
samples are compared by seed, text for text. The vLLM stage's runs need vLLM
in the Ray workers (tests/test_annotate_ray_vllm.py, the vllm tier); what it
checks before starting runs here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import transformers_serve
from test_annotate import QUESTIONS, write_jsonl
from typer.testing import CliRunner

from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.records import read_records
from candor.annotation.workers import BackendRecipe
from candor.backends.base import SamplingParams
from candor.cli import app
from candor.data.items import QAItem, QAItems
from candor.util.errors import CandorError

ray = pytest.importorskip("ray", reason="--engine ray needs Ray Data: pip install -e '.[ray]'")
HAVE_SERVING = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not HAVE_SERVING, reason="transformers serve needs fastapi and uvicorn"),
]

from candor.annotation.fleet import RetryPolicy  # noqa: E402
from candor.annotation.ray_pipeline import (  # noqa: E402  (after the skip when Ray is absent)
    GENERATION_STAGES,
    ItemsLeft,
    RayOptions,
    annotate_with_ray,
    check_cluster_fits,
    parts_folder,
)

MORE = [
    ("What is the largest ocean on Earth?", ["Pacific", "Pacific Ocean"]),
    ("What gas do plants absorb from the air?", ["carbon dioxide", "CO2"]),
    ("What is the tallest mountain in the world?", ["Mount Everest", "Everest"]),
]


def items_of(pairs) -> QAItems:
    return QAItems(
        [
            QAItem(id=f"r:{i}", dataset="toy", split="test", question=q, answers=tuple(a))
            for i, (q, a) in enumerate(pairs)
        ]
    )


def config(k: int = 2) -> AnnotateConfig:
    return AnnotateConfig(k=k, params=SamplingParams(max_new_tokens=6), batch_size=2, seed=1)


def recipe(model_dir, url: str | None) -> BackendRecipe:
    options = {"base_url": url, "batch_size": 2, "seed": 1, "max_concurrency": 2}
    return BackendRecipe(model=str(model_dir), backend="openai", options=options, template="fewshot")


@pytest.fixture(scope="module")
def served(smollm_dir, tmp_path_factory):
    with transformers_serve(smollm_dir, tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def cluster():
    """A real local Ray cluster of 2 CPUs (not local mode), for the module."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def by_id(path) -> dict[str, dict]:
    records = [r.to_dict() for r in read_records(path)]
    assert len(records) == len({r["item"]["id"] for r in records}), "an id written twice"
    return {r["item"]["id"]: r for r in records}


def assert_same_content(got: dict[str, dict], expected: dict[str, dict]) -> None:
    """Same ids, same records; greedy and sample log-probs to 1e-6, texts exactly (samples by seed)."""
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        have = got[key]
        for x, y in zip([have["greedy"], *have["samples"]], [want["greedy"], *want["samples"]], strict=True):
            assert x["logprobs"] == pytest.approx(y["logprobs"], abs=1e-6)
        strip = lambda d: {  # noqa: E731
            **d,
            "greedy": {**d["greedy"], "logprobs": None},
            "samples": [{**s, "logprobs": None} for s in d["samples"]],
        }
        assert strip(have) == strip(want)


def single_process(items, model_dir, url, out, k=2):
    answering, judging, template = recipe(model_dir, url).load()
    annotate(items, answering, out, template, config(k), judge_backend=judging, progress=False)
    return by_id(out)


def test_ray_records_equal_the_openai_backend_on_the_same_server(served, smollm_dir, cluster, tmp_path):
    items = items_of([*QUESTIONS[:4], *MORE[:1]])
    expected = single_process(items, smollm_dir, served, tmp_path / "single.jsonl")
    out = tmp_path / "ray.jsonl"
    options = RayOptions(urls=(served,), concurrency=2, batch_size=2, progress=False)
    result = annotate_with_ray(items, recipe(smollm_dir, served), out, config(), options)
    assert (result.written, result.skipped, result.total) == (5, 0, 5)
    got = by_id(out)
    assert_same_content(got, expected)
    assert sum(bool(r["greedy"]["text"].strip()) for r in got.values()) >= 3  # not a comparison of empty answers
    assert all(len(r["samples"]) == 2 for r in got.values())
    assert not parts_folder(out).exists()  # merged, and the shards removed
    # In input order, as a single run writes it.
    assert [r.id for r in read_records(out)] == [item.id for item in items]
    # A rerun finds everything done, generates nothing, and leaves the same file.
    before = out.read_text()
    again = annotate_with_ray(items, recipe(smollm_dir, served), out, config(), options)
    assert (again.written, again.skipped) == (0, 5) and out.read_text() == before


def test_a_bad_item_is_skipped_with_a_count(served, smollm_dir, cluster, tmp_path):
    rows = [{"question": q, "answer": a} for q, a in QUESTIONS[:3]]
    rows.insert(1, {"question": "A question without a gold answer?", "answer": ""})
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ["annotate", "--data", str(data), "--out", str(out), "--model", str(smollm_dir), "--k", "1"]
    args += ["--max-new-tokens", "4", "--template", "fewshot", "--backend", "openai", "--base-url", served]
    args += ["--engine", "ray", "--ray-concurrency", "1", "--batch-size", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert [r.item.question for r in records] == [q for q, _ in QUESTIONS[:3]]
    assert {r.provenance["skipped_items"] for r in records} == {1}
    assert "3 records" in result.output


def test_options_of_the_ray_engine_are_used_or_refused(served, smollm_dir, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:2]])
    base = ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--model", str(smollm_dir)]
    cases = [
        (["--ray-url", served], "apply to --engine ray"),
        (["--ray-concurrency", "2"], "apply to --engine ray"),
        (["--engine", "ray", "--backend", "openai", "--base-url", served, "--workers", "2"], "without --workers"),
        (["--engine", "ray", "--backend", "openai", "--base-url", served, "--shard", "0/2"], "without --workers"),
        (["--engine", "ray", "--backend", "hf"], "unknown ray generation stage"),
        (["--engine", "ray", "--backend", "openai"], "--ray-url (repeatable) or --base-url"),
        (["--engine", "spark"], "--engine 'spark'"),
        (["--engine", "ray", "--backend", "openai", "--base-url", served, "--ray-concurrency", "0"], "at least one"),
        (["--ray-inflight", "4"], "apply to --engine ray"),
        (["--engine", "ray", "--backend", "vllm", "--ray-inflight", "4"], "applies to --backend openai"),
        (["--engine", "ray", "--backend", "openai", "--base-url", served, "--ray-inflight", "0"], "at least one"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output, (extra, result.output)


def test_two_servers_give_the_records_of_one(served, smollm_dir, cluster, tmp_path):
    """A fleet of two URLs (the same server twice here) shares the questions and changes no record."""
    items = items_of(QUESTIONS[:3])
    expected = single_process(items, smollm_dir, served, tmp_path / "single.jsonl", k=1)
    out = tmp_path / "fleet.jsonl"
    options = RayOptions(urls=(served, served.replace("127.0.0.1", "localhost")), batch_size=3, progress=False)
    annotate_with_ray(items, recipe(smollm_dir, served), out, config(1), options)
    assert_same_content(by_id(out), expected)


def dead_url() -> str:
    """An address where nothing listens (a port free a moment ago)."""
    from helpers import free_port

    return f"http://127.0.0.1:{free_port()}/v1"


QUICK = RetryPolicy(attempts=3, backoff=0.1, max_backoff=0.5, probes=2)


def test_a_dead_server_in_the_fleet_loses_no_item(served, smollm_dir, cluster, tmp_path):
    """One of two servers never answers: it is taken out, the live one does every item, records unchanged.

    Only --ray-url names the servers (no --base-url), the dead one first: the live one describes the run.
    """
    items = items_of(QUESTIONS[:4])
    expected = single_process(items, smollm_dir, served, tmp_path / "single.jsonl", k=1)
    out = tmp_path / "fleet.jsonl"
    options = RayOptions(urls=(dead_url(), served), batch_size=2, inflight=2, retry=QUICK, progress=False)
    result = annotate_with_ray(items, recipe(smollm_dir, None), out, config(1), options)
    assert (result.written, result.total) == (4, 4)
    assert_same_content(by_id(out), expected)


def test_a_fleet_with_no_live_server_is_refused_naming_each(smollm_dir, cluster, tmp_path):
    """No server answers at the start: one clear error naming each (the CLI's exit 2), not a hang."""
    items = items_of(QUESTIONS[:3])
    urls = (dead_url(), dead_url())
    options = RayOptions(urls=urls, batch_size=2, retry=QUICK, progress=False)
    with pytest.raises(CandorError, match="no server of the fleet answers") as caught:
        annotate_with_ray(items, recipe(smollm_dir, urls[0]), tmp_path / "none.jsonl", config(1), options)
    assert all(url in str(caught.value) for url in urls)


@contextlib.contextmanager
def killable_server(model_dir, log):
    """``transformers serve`` as tests/helpers.py starts it, yielding its URL and its process (to kill)."""
    from helpers import free_port, wait_healthy

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir)]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--device", "cpu"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, log=log)
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_server_killed_mid_run_loses_no_item(served, smollm_dir, cluster, tmp_path):
    """Two servers; one is killed (SIGKILL) once records land: every item once, the records of a clean run."""
    pairs = [*QUESTIONS, *MORE]
    items = items_of(pairs)
    expected = single_process(items, smollm_dir, served, tmp_path / "clean.jsonl")
    out = tmp_path / "fleet.jsonl"
    with killable_server(smollm_dir, tmp_path / "victim.log") as (victim, proc):
        options = RayOptions(urls=(served, victim), batch_size=2, inflight=2, progress=False)
        outcome: dict = {}

        def drive() -> None:
            try:
                outcome["result"] = annotate_with_ray(items, recipe(smollm_dir, served), out, config(), options)
            except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
                outcome["error"] = exc

        driver = threading.Thread(target=drive)
        driver.start()
        deadline = time.monotonic() + 400
        while not list(parts_folder(out).glob("ray-*.jsonl")) and time.monotonic() < deadline:
            assert driver.is_alive(), f"the run ended before any record landed: {outcome}"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kept = sum(len(read_records(p)) for p in parts_folder(out).glob("ray-*.jsonl"))
        answered = (tmp_path / "victim.log").read_text().count("POST /v1/completions")
        driver.join(600)
    assert 0 < kept < len(pairs), f"killed after {kept} of {len(pairs)} records: not midway"
    assert answered > 0, "the killed server had taken no work: the test would prove nothing"
    assert "error" not in outcome, outcome.get("error")
    assert (outcome["result"].written, outcome["result"].total) == (len(pairs), len(pairs))
    assert_same_content(by_id(out), expected)  # every item exactly once (by_id checks), as the clean run


@pytest.mark.slow
def test_when_the_last_server_dies_the_items_left_are_named_and_a_rerun_finishes(served, smollm_dir, cluster, tmp_path):
    """The fleet's only server killed mid-run: the finished records are kept, the others named (exit 2 in the
    CLI); the same run on a live server then does only those, and the file equals a clean run's."""
    pairs = [*QUESTIONS, *MORE]
    items = items_of(pairs)
    out = tmp_path / "fleet.jsonl"
    with killable_server(smollm_dir, tmp_path / "victim.log") as (victim, proc):
        options = RayOptions(urls=(victim,), batch_size=2, inflight=2, retry=QUICK, progress=False)
        outcome: dict = {}

        def drive() -> None:
            try:
                outcome["result"] = annotate_with_ray(items, recipe(smollm_dir, victim), out, config(), options)
            except BaseException as exc:  # noqa: BLE001  (checked below)
                outcome["error"] = exc

        driver = threading.Thread(target=drive)
        driver.start()
        deadline = time.monotonic() + 400
        while not list(parts_folder(out).glob("ray-*.jsonl")) and time.monotonic() < deadline:
            assert driver.is_alive(), f"the run ended before any record landed: {outcome}"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        driver.join(600)
    error = outcome.get("error")
    assert isinstance(error, ItemsLeft), outcome
    kept = {r.id for r in read_records(out)}  # merged into --out before the error
    assert kept and set(error.failed) == {item.id for item in items} - kept
    assert f"{len(error.failed)} item(s) not annotated" in str(error) and "rerunning the same command" in str(error)
    again = annotate_with_ray(
        items, recipe(smollm_dir, served), out, config(), RayOptions(urls=(served,), progress=False)
    )
    assert (again.written, again.skipped) == (len(error.failed), len(kept))
    expected = single_process(items, smollm_dir, served, tmp_path / "clean.jsonl")
    assert_same_content(by_id(out), expected)


def test_a_resume_refuses_records_of_other_settings(served, smollm_dir, cluster, tmp_path):
    items = items_of(QUESTIONS[:2])
    out = tmp_path / "out.jsonl"
    single_process(items, smollm_dir, served, out, k=1)
    options = RayOptions(urls=(served,), batch_size=2, progress=False)
    with pytest.raises(CandorError, match="other settings"):
        annotate_with_ray(items, recipe(smollm_dir, served), out, config(2), options)


def test_a_killed_driver_resumes_without_duplicates(served, smollm_dir, cluster, tmp_path):
    """Kill -9 the driver midway (the cluster lives on), rerun: every record once, as a single run writes it."""
    pairs = [*QUESTIONS, *MORE]
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in pairs])
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "candor.cli", "annotate", "--data", str(data), "--out", str(out)]
    args += ["--model", str(smollm_dir), "--k", "2", "--max-new-tokens", "6", "--template", "fewshot", "--seed", "1"]
    args += ["--backend", "openai", "--base-url", served, "--max-concurrency", "2", "--batch-size", "2"]
    args += ["--engine", "ray", "--ray-address", cluster]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        driver = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not list(parts_folder(out).glob("ray-*.jsonl")) and time.monotonic() < deadline:
        assert driver.poll() is None, f"the driver ended before writing a shard: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    kept = sum(len(read_records(p)) for p in parts_folder(out).glob("ray-*.jsonl"))
    assert 0 < kept < len(pairs), f"killed after {kept} of {len(pairs)} records: not midway"
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    got = by_id(out)
    assert len(got) == len(pairs)
    from candor.data import load_items

    expected = single_process(load_items(str(data)), smollm_dir, served, tmp_path / "single.jsonl")
    assert_same_content(got, expected)


def test_the_vllm_stage_renders_for_the_default_model_name(smollm_dir):
    """The embedded default's name resolves to its folder, as --backend vllm resolves it (an OSError before)."""
    from candor.annotation.prompts import resolve_template
    from candor.backends.default_model import DEFAULT_MODEL

    renderer = GENERATION_STAGES.get("vllm").renderer(BackendRecipe(model=DEFAULT_MODEL, backend="vllm"))
    assert renderer.model_name == DEFAULT_MODEL
    prompt = resolve_template("chat", DEFAULT_MODEL, renderer)(items_of(QUESTIONS[:1])[0], renderer)
    assert "capital of France" in prompt and prompt.rstrip().endswith("assistant")


def test_a_cluster_without_the_gpus_of_a_vllm_replica_is_refused_not_waited_on():
    """Ray would wait for ever (more than 8 minutes seen) to place an actor the cluster cannot hold."""
    options = RayOptions(tensor_parallel_size=2)
    with pytest.raises(CandorError, match=r"needs 2 GPU\(s\).*has 1 GPU\(s\).*--num-gpus"):
        check_cluster_fits({"CPU": 2.0, "GPU": 1.0}, options)
    with pytest.raises(CandorError, match="has 0 GPU"):
        check_cluster_fits({"CPU": 2.0}, RayOptions())
    with pytest.raises(CandorError, match=r"1.5 CPU\(s\)"):
        check_cluster_fits({"CPU": 1.0, "GPU": 1.0}, RayOptions())
    check_cluster_fits({"CPU": 2.0, "GPU": 2.0}, options)  # fits: no error


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is importable here (the vllm tier)")
def test_the_vllm_stage_without_vllm_says_so(tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:2]])
    args = ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--k", "1"]
    result = CliRunner().invoke(app, [*args, "--engine", "ray", "--backend", "vllm"])
    assert result.exit_code == 2, result.output
    assert "runs vLLM in the Ray workers" in result.output


def test_shards_are_whole_json_lines(served, smollm_dir, cluster, tmp_path):
    """What a killed driver leaves: only shard files that are complete (each written by a rename)."""
    items = items_of(QUESTIONS[:2])
    folder = parts_folder(tmp_path / "x.jsonl")
    folder.mkdir()
    (folder / ".ray-cut.jsonl.4242.tmp").write_text('{"cut')  # a temporary file is never read as a shard
    out = tmp_path / "x.jsonl"
    annotate_with_ray(items, recipe(smollm_dir, served), out, config(1), RayOptions(urls=(served,), progress=False))
    assert [json.loads(line)["item"]["id"] for line in out.read_text().splitlines()] == ["r:0", "r:1"]
