"""What a model-loading command spends before its work: imports and the model load, before and after lazy imports.

Each measurement runs in a fresh process on one source tree (``--src``; the
default is this checkout's ``src``), ``--repeats`` times, and keeps the
median wall time and the median CPU seconds (user + system of the child: on a
machine shared with other jobs the steadier measure). The steps:

- ``import candor.cli``: what every command pays before it parses its options;
- ``candor --help``: the whole command, interpreter start included;
- ``import candor.backends.hf``: the in-process engine (torch and transformers);
- ``load``: inside one process, the hf backend's import and then the embedded
  default's load (``load_backend("smollm2-135m")``), timed apart;
- ``candor ask``: one question end to end on the embedded default.

``python -X importtime`` of ``import candor.cli`` gives the modules that cost most
(cumulative microseconds, the top of the list). Results go under the label
(``--label before`` / ``after``) in ``benchmarks/results/startup.json``; a
label already there is measured again only with ``--force``.

    python -m benchmarks.startup --label before --src /path/to/old/checkout/src
    python -m benchmarks.startup --label after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "startup.json"
LOAD = """
import time, json
t0 = time.perf_counter()
from candor.backends import load_backend
import candor.backends.hf
t1 = time.perf_counter()
load_backend("smollm2-135m")
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, the child's CPU seconds and its stdout."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, done.stdout


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}


def import_top(env: dict[str, str], limit: int = 12) -> list[dict[str, object]]:
    """The modules ``import candor.cli`` spends most in (cumulative, from ``-X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import candor.cli"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append({"module": parts[2].strip(), "cumulative_ms": round(int(parts[1]) / 1000, 1)})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:limit]  # type: ignore[operator]


def measure(src: Path, repeats: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    py = [sys.executable]
    steps = {
        "import candor.cli": py + ["-c", "import candor.cli"],
        "candor --help": py + ["-m", "candor.cli", "--help"],
        "import candor.backends.hf": py + ["-c", "import candor.backends.hf"],
        "candor ask": py + ["-m", "candor.cli", "ask", "Who wrote Hamlet?", "--max-new-tokens", "8"],
    }
    result: dict[str, object] = {}
    timed(py + ["-c", LOAD], env)  # warm the file cache and the de-quantized model once
    for name, cmd in steps.items():
        runs = [dict(zip(("wall_s", "cpu_s"), timed(cmd, env)[:2], strict=True)) for _ in range(repeats)]
        result[name] = median_of(runs)
    loads = [json.loads(timed(py + ["-c", LOAD], env)[2].strip().splitlines()[-1]) for _ in range(repeats)]
    result["load (in one process)"] = median_of(loads)
    result["importtime: import candor.cli"] = import_top(env)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--src", type=Path, default=ROOT.parent / "src")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.label in results and not args.force:
        print(f"{args.label} already measured (--force measures it again)")
        return
    measured = measure(args.src.resolve(), args.repeats)
    commit = subprocess.run(
        ["git", "-C", str(args.src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results[args.label] = {
        "commit": commit,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_average_after": round(os.getloadavg()[0], 1),
        **measured,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results[args.label], indent=2))


if __name__ == "__main__":
    main()
