"""``annotate --engine ray --backend vllm`` for real: vLLM inside Ray actors, against ``--backend vllm``.

Runs where vLLM is importable (the vllm tier, ``make test-vllm``: vLLM's CPU
build). Ray places an actor only where the resources it asks for exist, and a
vLLM replica asks for ``--tensor-parallel-size`` GPUs: the cluster here
declares one GPU (``num_gpus=1``) so that Ray places the replica, which vLLM's
CPU build then runs on the CPU. A real GPU cluster declares its own.
"""

from __future__ import annotations

import importlib.util

import pytest
from test_annotate import QUESTIONS, write_jsonl
from typer.testing import CliRunner

from candor.annotation.records import read_records
from candor.cli import app

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not importable: the vllm tier (make test-vllm) runs the Ray vLLM stage",
    ),
]
ray = pytest.importorskip("ray", reason="--engine ray needs Ray Data: pip install -e '.[ray]'")


@pytest.fixture(scope="module")
def gpu_cluster():
    """A local Ray cluster of 2 CPUs that declares one GPU, so that Ray places a vLLM replica."""
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def records(path) -> dict[str, dict]:
    found = [r.to_dict() for r in read_records(path)]
    assert len(found) == len({r["item"]["id"] for r in found}), "an id written twice"
    return {r["item"]["id"]: r for r in found}


def test_ray_vllm_records_equal_the_vllm_backend_on_the_default_model(gpu_cluster, tmp_path):
    """The default model by its name (an OSError before), greedy and seeded samples, the same records."""
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:4]])
    common = ["annotate", "--data", str(data), "--k", "2", "--max-new-tokens", "8", "--template", "fewshot"]
    common += ["--batch-size", "4", "--seed", "1", "--backend", "vllm"]
    single = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "single.jsonl")])
    assert single.exit_code == 0, single.output
    run = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "ray.jsonl"), "--engine", "ray"])
    assert run.exit_code == 0, run.output
    got, want = records(tmp_path / "ray.jsonl"), records(tmp_path / "single.jsonl")
    assert sorted(got) == sorted(want)
    for key, expected in want.items():
        have = got[key]
        for x, y in zip([have["greedy"], *have["samples"]], [expected["greedy"], *expected["samples"]], strict=True):
            assert x["text"] == y["text"] and x["token_ids"] == y["token_ids"] and x["tokens"] == y["tokens"]
            assert x["logprobs"] == pytest.approx(y["logprobs"], abs=1e-5)
            assert (x.get("stop_logprob") is None) == (y.get("stop_logprob") is None)
        assert have["greedy_correct"] == expected["greedy_correct"]
        assert have["provenance"] == expected["provenance"]
    texts = [r["greedy"]["text"] for r in got.values()]
    assert any(texts) and all(t == t.strip() for t in texts)  # no leading space kept
