"""``candor annotate --engine ray --backend vllm`` for real: vLLM inside Ray actors, against ``--backend vllm``.

Runs where vLLM is importable (the vllm tier, ``make test-vllm``: vLLM's CPU
build). Ray places an actor only where the resources it asks for exist, and a
vLLM replica asks for ``--tensor-parallel-size`` GPUs: the cluster here
declares one GPU (``num_gpus=1``) so that Ray places the replica, which vLLM's
CPU build then runs on the CPU. A real GPU cluster declares its own.

Both runs are the ``candor`` command in a process of its own, as a user runs
it: the ray one joins the test's cluster by ``--ray-address``. In one process
with the test, the in-process engine of the first run stayed alive beside the
Ray replica's (two engines' memory on a small machine), and vLLM's engine
closed the test runner's captured output.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_annotate import QUESTIONS, write_jsonl

from candor.annotation.records import read_records

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not importable: the vllm tier (make test-vllm) runs the Ray vLLM stage",
    ),
]
ray = pytest.importorskip("ray", reason="--engine ray needs Ray Data: pip install -e '.[ray]'")

ROOT = Path(__file__).resolve().parents[1]
# The longest either run may take: a hang (a replica Ray cannot place) fails here instead of holding CI.
RUN_LIMIT_S = 900
# Log-probs of the same tokens from two engines: float32 sums over rows scheduled together differently
# (which requests share an engine step depends on timing); measured up to 1.6e-5 apart (relative 7e-6).
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gpu_cluster() -> str:
    """A local Ray cluster of 2 CPUs that declares one GPU, so that Ray places a vLLM replica; its address."""
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def candor_annotate(args: list[str], log: Path) -> None:
    """``candor annotate ARGS`` from this checkout in its own process; fails naming its log's end."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "HF_HUB_OFFLINE": "1"}
    env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    with log.open("w") as sink:
        proc = subprocess.run(
            [sys.executable, "-m", "candor.cli", "annotate", *args],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=RUN_LIMIT_S,
            check=False,
        )
    assert proc.returncode == 0, log.read_text()[-4000:]


def records(path) -> dict[str, dict]:
    found = [r.to_dict() for r in read_records(path)]
    assert len(found) == len({r["item"]["id"] for r in found}), "an id written twice"
    return {r["item"]["id"]: r for r in found}


def test_ray_vllm_records_equal_the_vllm_backend_on_the_default_model(gpu_cluster, tmp_path):
    """The default model by its name (an OSError before), greedy and seeded samples, the same records."""
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:4]])
    common = ["--data", str(data), "--k", "2", "--max-new-tokens", "8", "--template", "fewshot"]
    common += ["--batch-size", "4", "--seed", "1", "--backend", "vllm"]
    candor_annotate([*common, "--out", str(tmp_path / "single.jsonl")], tmp_path / "single.log")
    ray_args = ["--engine", "ray", "--ray-address", gpu_cluster]
    candor_annotate([*common, "--out", str(tmp_path / "ray.jsonl"), *ray_args], tmp_path / "ray.log")
    got, want = records(tmp_path / "ray.jsonl"), records(tmp_path / "single.jsonl")
    assert sorted(got) == sorted(want)
    for key, expected in want.items():
        have = got[key]
        for x, y in zip([have["greedy"], *have["samples"]], [expected["greedy"], *expected["samples"]], strict=True):
            assert x["text"] == y["text"] and x["token_ids"] == y["token_ids"] and x["tokens"] == y["tokens"]
            assert x["logprobs"] == pytest.approx(y["logprobs"], abs=LOGPROB_TOLERANCE)
            assert x.get("stop_logprob") == pytest.approx(y.get("stop_logprob"), abs=LOGPROB_TOLERANCE)
            assert len(x["top_logprobs"]) == len(y["top_logprobs"])
        assert have["greedy_correct"] == expected["greedy_correct"]
        assert have["provenance"] == expected["provenance"]
    texts = [r["greedy"]["text"] for r in got.values()]
    assert any(texts) and all(t == t.strip() for t in texts)  # no leading space kept
    assert any(r["greedy"].get("stop_logprob") is not None for r in got.values())  # a stop token dropped, kept aside
