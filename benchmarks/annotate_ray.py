"""`candor annotate --engine ray` against the single-process `--backend openai` path, on the same servers.

Two ``transformers serve`` replicas of the embedded model on 127.0.0.1 (one
thread each), one local Ray cluster, the first NQ test questions, the
``fewshot`` template, 1 greedy + k samples. The served model is a copy of the
embedded one whose ``generation_config.json`` says ``do_sample: true``: without
it ``transformers serve`` never samples (the embedded model's config has no
``do_sample``), every "sample" is a greedy copy, and a comparison of samples
by seed proves nothing. Each round runs, in an order rotated from round to
round so that the machine's drift falls on every arm alike:

- ``openai_S``, ``openai_L``: :func:`candor.annotation.builder.annotate` in this process, on replica 1,
  on the first S (small) and L (large) questions;
- ``ray1_S``, ``ray1_L``: the Ray Data pipeline, the fleet being replica 1, on the same questions;
- ``ray2_L``: the pipeline with both replicas, on the L questions.

What Ray adds on n questions is ``ray1_n − openai_n``; from the two sizes, the
cost of each further question is ``(added_L − added_S) / (L − S)`` and the
fixed cost (actor start-up, pipeline drain) ``added_S − S × per_question``.
The 2-replica ratio is ``ray1_L / ray2_L`` per round. Each figure is given as
its median over the rounds with its range. Ray's own start-up (``ray.init``)
is timed apart, once. Every Ray arm's records are compared with the
same round's single-process ones (greedy texts; samples by seed), and the
share of samples that differ from their question's greedy answer shows that
the servers really sample.

    nohup nice python -m benchmarks.annotate_ray [--small 4] [--large 12] [--rounds 3] [--k 2] &

Writes ``benchmarks/results/annotate_ray.json`` after every round. A rerun with the
same settings goes on from the rounds that file holds (``rounds_done``; the
rotation continues where it stopped, and ``resumed`` records after which round and
at what load); ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, SETTINGS, load_items
from benchmarks.common import write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "annotate_ray.json"
BATCH = 8


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampling_copy(model_dir: Path, folder: Path) -> Path:
    """The model's files (linked), with ``do_sample: true`` in its generation config: a server that samples."""
    folder.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name != "generation_config.json":
            (folder / path.name).symlink_to(path.resolve())
    config_file = model_dir / "generation_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}, indent=2))
    return folder


@contextlib.contextmanager
def replica(model_dir: Path, log: Path) -> Iterator[str]:
    """One ``transformers serve`` on one thread, on a free port: yields its /v1 URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir), "--port", str(port)]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*cmd, "--device", "cpu"], env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"transformers serve did not start: {log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r,
            ):
                if r.status == 200:
                    break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def config(k: int, max_new_tokens: int) -> Any:
    from candor.annotation.builder import AnnotateConfig
    from candor.backends.base import SamplingParams

    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=SETTINGS["temperature"],
        top_p=SETTINGS["top_p"],
        top_k=SETTINGS["top_k"],
    )
    return AnnotateConfig(k=k, params=params, batch_size=BATCH, seed=0)


def recipe(model_dir: Path, url: str) -> Any:
    from candor.annotation.workers import BackendRecipe

    options = {"base_url": url, "batch_size": BATCH, "seed": 0}
    return BackendRecipe(model=str(model_dir), backend="openai", options=options, template="fewshot")


def agreement(got: Path, expected: Path) -> dict[str, int]:
    """How many greedy answers, and samples (by seed), equal the single-process run's; and samples unlike greedy."""
    from candor.annotation.records import read_records

    mine = {r.id: r for r in read_records(got)}
    theirs = {r.id: r for r in read_records(expected)}
    samples = [(a.text, b.text) for i in theirs for a, b in zip(mine[i].samples, theirs[i].samples, strict=True)]
    return {
        "records": len(mine),
        "greedy_identical": sum(mine[i].greedy.text == theirs[i].greedy.text for i in theirs),
        "samples": len(samples),
        "samples_identical": sum(a == b for a, b in samples),
    }


def unlike_greedy(path: Path) -> dict[str, int]:
    """Samples whose text differs from their question's greedy answer (0 would mean the server never sampled)."""
    from candor.annotation.records import read_records

    pairs = [(s.text, r.greedy.text) for r in read_records(path) for s in r.samples]
    return {"samples": len(pairs), "unlike_greedy": sum(a != b for a, b in pairs)}


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "rounds": [round(v, digits) for v in values],
    }


def previous_rounds(path: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The results of an earlier run with the same settings that stopped before ``--rounds`` (None: start over)."""
    if args.fresh or not path.exists():
        return None
    old = json.loads(path.read_text())
    settings = old.get("settings", {})
    same = (
        settings.get("questions") == {"S": args.small, "L": args.large}
        and settings.get("samples") == args.k
        and settings.get("max_new_tokens") == args.max_new_tokens
        and settings.get("batch_size") == BATCH
    )
    if not same or not 0 < old.get("rounds_done", 0) < args.rounds:
        return None
    return old


def summarise(args: argparse.Namespace, sizes: dict, seconds: dict, agree: dict, sampled: dict, extra: dict) -> dict:
    """The results of the rounds run so far."""
    added = {
        size: [ray - one for ray, one in zip(seconds[f"ray1_{size}"], seconds[f"openai_{size}"], strict=True)]
        for size in sizes
    }
    per_question = [
        (big - small) / (args.large - args.small) for small, big in zip(added["S"], added["L"], strict=True)
    ]
    fixed = [small - args.small * each for small, each in zip(added["S"], per_question, strict=True)]
    ratio = [one / two for one, two in zip(seconds["ray1_L"], seconds["ray2_L"], strict=True)]
    result = {
        "command": (
            f"nice python -m benchmarks.annotate_ray --small {args.small} --large {args.large} "
            f"--rounds {args.rounds} --k {args.k} --max-new-tokens {args.max_new_tokens}"
        ),
        "rounds_done": len(ratio),
        "settings": {
            "model": MODEL,
            "served_model": "a copy of the model whose generation_config.json sets do_sample: true",
            "questions": sizes,
            "rounds": args.rounds,
            "samples": args.k,
            "batch_size": BATCH,
            "max_new_tokens": args.max_new_tokens,
            "server": "transformers serve, one thread per replica, 127.0.0.1",
            "ray": {
                "version": extra["ray_version"],
                "num_cpus": 2,
                "generation_actors": 1,
                "inflight": extra["inflight"],
            },
            **{k: v for k, v in SETTINGS.items() if k not in ("stop", "max_new_tokens")},
            "machine": extra["machine"],
        },
        "seconds": {name: spread(values, 2) for name, values in seconds.items()},
        "ray_startup_seconds": round(extra["ray_startup"], 2),
        "overhead": {
            "fixed_seconds": spread(fixed, 2),
            "per_question_seconds": spread(per_question, 3),
            "added_seconds": {size: spread(values, 2) for size, values in added.items()},
        },
        "two_replicas_vs_one": spread(ratio, 3),
        "agreement": agree,
        "sampling": sampled,
        "load_average": {
            "before": [round(x, 2) for x in extra["load_before"]],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "resumed": extra["resumed"],
        "note": "arms in a rotated order each round on a machine shared with other jobs (see load_average): "
        "read the medians with their ranges",
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=4, help="questions of the small size")
    parser.add_argument("--large", type=int, default=12, help="questions of the large size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--data", type=Path, default=DATA, help="NQ test JSONL (default: the shared data)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="start over instead of going on from --out's rounds")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"skipped: NQ test data not found at {args.data} (benchmarks need ../shared/data)")
        return
    if not 0 < args.small < args.large or args.rounds < 3:
        raise SystemExit("need 0 < --small < --large and --rounds >= 3")
    import ray

    from candor.annotation.builder import annotate
    from candor.annotation.ray_pipeline import DEFAULT_INFLIGHT, RayOptions, annotate_with_ray
    from candor.backends.default_model import resolve_embedded
    from candor.util.cpu import describe

    sizes = {"S": args.small, "L": args.large}
    items = {name: load_items(n, args.data) for name, n in sizes.items()}
    run_config = config(args.k, args.max_new_tokens)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {}
    agree: dict[str, dict[str, int]] = {}
    sampled: dict[str, int] = {"samples": 0, "unlike_greedy": 0}
    resumed: list[dict[str, Any]] = []
    first_round, ray_startup = 0, None
    old = previous_rounds(args.out, args)
    if old is not None:  # go on from the rounds it finished (their seconds as written, to 0.01 s)
        first_round = old["rounds_done"]
        seconds = {name: list(values["rounds"]) for name, values in old["seconds"].items()}
        agree, sampled, ray_startup = old["agreement"], old["sampling"], old["ray_startup_seconds"]
        resumed = [
            *old.get("resumed", []),
            {"after_round": first_round, "load_average": [round(x, 2) for x in load_before]},
        ]
        load_before = tuple(old["load_average"]["before"])
        print(f"going on from {first_round} round(s) in {args.out}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        model_dir = sampling_copy(resolve_embedded(MODEL), folder / "model")
        urls = [stack.enter_context(replica(model_dir, folder / f"serve{i}.log")) for i in range(2)]
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        if ray_startup is None:  # timed once, by the run that did the first round
            ray_startup = time.perf_counter() - start

        def single(size: str, out: Path) -> None:
            answering, judging, template = recipe(model_dir, urls[0]).load()
            annotate(items[size], answering, out, template, run_config, judge_backend=judging, progress=False)

        def fleet(size: str, replicas: int, out: Path) -> None:
            options = RayOptions(urls=tuple(urls[:replicas]), batch_size=BATCH, progress=False)
            annotate_with_ray(items[size], recipe(model_dir, urls[0]), out, run_config, options)

        arms = {
            "openai_S": lambda out: single("S", out),
            "openai_L": lambda out: single("L", out),
            "ray1_S": lambda out: fleet("S", 1, out),
            "ray1_L": lambda out: fleet("L", 1, out),
            "ray2_L": lambda out: fleet("L", 2, out),
        }
        names = list(arms)
        for r in range(first_round, args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            outs = {name: folder / f"r{r}-{name}.jsonl" for name in names}
            for name in order:
                start = time.perf_counter()
                arms[name](outs[name])
                seconds.setdefault(name, []).append(time.perf_counter() - start)
                print(f"round {r}: {name} {seconds[name][-1]:.1f} s", flush=True)
            for name in ("ray1_S", "ray1_L", "ray2_L"):
                base = outs["openai_S" if name.endswith("_S") else "openai_L"]
                got = agreement(outs[name], base)
                total = agree.setdefault(name, dict.fromkeys(got, 0))
                for key, value in got.items():
                    total[key] += value
            for name in ("openai_L", "ray2_L"):
                for key, value in unlike_greedy(outs[name]).items():
                    sampled[key] += value
            extra = {
                "ray_version": ray.__version__,
                "inflight": DEFAULT_INFLIGHT,
                "machine": describe(),
                "ray_startup": ray_startup,
                "load_before": load_before,
                "resumed": resumed,
            }
            result = summarise(args, sizes, seconds, agree, sampled, extra)
            write_json(args.out, result)  # after every round: a run cut short keeps the rounds it finished
        ray.shutdown()
    print(json.dumps({k: result[k] for k in ("overhead", "two_replicas_vs_one", "sampling")}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
