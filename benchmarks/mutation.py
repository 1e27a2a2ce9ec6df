"""Mutation testing of candor's core modules with mutmut 3 (not part of CI).

Each core module is mutated alone, in a scratch copy of the project, against the
test files that cover it (MODULES below), so one module's run takes minutes
rather than the whole suite per mutant. Results, per module: killed, survived,
timeouts, the score, and every surviving mutant with its diff; survivors that
are deliberately left alone get a reason in benchmarks/mutation_reasons.json.

    python benchmarks/mutation.py                      # every module, resumable
    python benchmarks/mutation.py --modules metrics judges
    python benchmarks/mutation.py --fresh metrics      # forget a module's earlier run

Writes benchmarks/results/mutation.json after each module, so a killed run keeps
what it finished and picks up at the next module.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "mutation.json"
REASONS = ROOT / "benchmarks" / "mutation_reasons.json"
SCRATCH = Path(os.environ.get("CANDOR_MUTATION_DIR", "/tmp/candor-mutation"))

# module key -> (source file, the test files that cover it)
MODULES: dict[str, tuple[str, list[str]]] = {
    "metrics": ("src/candor/metrics.py", ["tests/test_metrics.py"]),
    "evaluation": ("src/candor/evaluation.py", ["tests/test_evaluation.py", "tests/test_report.py"]),
    "annotate": ("src/candor/annotation.py", ["tests/test_annotate.py"]),
    "judges": ("src/candor/judges.py", ["tests/test_judges.py"]),
    "records": ("src/candor/records.py", ["tests/test_records.py", "tests/test_annotate.py"]),
    "splits": ("src/candor/data/splits.py", ["tests/test_splits.py"]),
    "scoring": ("src/candor/scoring.py", ["tests/test_scoring_and_demo.py", "tests/test_scoring.py"]),
    "confidences": ("src/candor/confidences.py", ["tests/test_scoring_and_demo.py", "tests/test_scoring.py"]),
    "estimators-logprob": ("src/candor/estimators/logprob.py", ["tests/test_estimators_logprob.py"]),
    "estimators-consistency": ("src/candor/estimators/consistency.py", ["tests/test_estimators_consistency.py"]),
    "elical-targets": ("src/candor/elical/targets.py", ["tests/test_elical_train.py"]),
    "elical-trainer": ("src/candor/elical/trainer.py", ["tests/test_elical_train.py"]),
    "advice-losses": ("src/candor/advice/losses.py", ["tests/test_advice_losses.py"]),
    "advice-triplets": ("src/candor/advice/triplets.py", ["tests/test_advice_triplets.py"]),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", nargs="*", default=list(MODULES), help="module keys (default: all)")
    p.add_argument("--fresh", nargs="*", default=[], help="rerun these modules from scratch")
    p.add_argument("--max-children", type=int, default=2)
    return p.parse_args()


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def write_results(payload: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_name(RESULTS.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(RESULTS)


def prepare_scratch(key: str, source: str, tests: list[str]) -> Path:
    """A copy of src/, tests/ and pyproject.toml with a [tool.mutmut] section for this module alone."""
    work = SCRATCH / key
    if not work.exists():
        work.mkdir(parents=True)
        shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        # mutmut runs the tests from work/mutants, and they read ../shared/data beside that root
        shared = ROOT.parent / "shared"
        if shared.exists():
            (work / "shared").symlink_to(shared.resolve())
    existing = [t for t in tests if (ROOT / t).exists()]
    pyproject = (ROOT / "pyproject.toml").read_text()
    # The whole src/ is copied (a partial tree would let the installed package shadow the mutants);
    # only_mutate picks the one module.
    section = (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f'only_mutate = ["{source}"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(existing)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
    )
    (work / "pyproject.toml").write_text(pyproject + section)
    return work


def run_mutmut(work: Path, max_children: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)], cwd=work, env=env,
                   check=False)
    return time.perf_counter() - start


def collect(work: Path, key: str, reasons: dict[str, str]) -> dict:
    """Counts from mutmut's CI stats, and each survivor's diff from ``mutmut show``."""
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=work, check=True,
                   capture_output=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    listing = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=work, capture_output=True, text=True)
    survivors = []
    for line in listing.stdout.splitlines():
        match = re.match(r"\s*(\S+): survived", line)
        if not match:
            continue
        name = match.group(1)
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, capture_output=True,
                              text=True).stdout
        survivors.append({"name": name, "diff": diff.strip(), "reason": reasons.get(name)})
    killed = int(stats.get("killed", 0)) + int(stats.get("timeout", 0))
    tested = killed + int(stats.get("survived", 0))
    return {"source": MODULES[key][0], "tests": MODULES[key][1], "killed": stats.get("killed", 0),
            "timeout": stats.get("timeout", 0), "survived": stats.get("survived", 0),
            "no_tests": stats.get("no_tests", 0), "suspicious": stats.get("suspicious", 0),
            "score": round(100 * killed / tested, 1) if tested else None,
            "unexplained_survivors": sum(1 for s in survivors if not s["reason"]),
            "survivors": survivors}


def main() -> None:
    args = parse_args()
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        sys.exit(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    payload = load_json(RESULTS)
    payload.setdefault("tool", "mutmut 3")
    payload.setdefault("modules", {})
    reasons = load_json(REASONS)
    for key in args.fresh:
        shutil.rmtree(SCRATCH / key, ignore_errors=True)
        payload["modules"].pop(key, None)
    for key in args.modules:
        if key in payload["modules"]:
            print(f"{key}: done earlier (score {payload['modules'][key]['score']}); --fresh {key} to rerun")
            continue
        source, tests = MODULES[key]
        if not (ROOT / source).exists():
            print(f"{key}: {source} does not exist, skipped")
            continue
        work = prepare_scratch(key, source, tests)
        seconds = run_mutmut(work, args.max_children)
        result = collect(work, key, reasons)
        result["seconds"] = round(seconds, 1)
        if result["score"] is None:
            print(f"{key}: mutmut tested no mutant (see {work}/mutants/mutmut-debug.log); not recorded")
            continue
        payload["modules"][key] = result
        write_results(payload)
        print(f"{key}: score {result['score']}%  killed {result['killed']}  survived {result['survived']}  "
              f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
