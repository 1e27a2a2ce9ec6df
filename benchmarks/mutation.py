"""Mutation testing of candor's core modules with mutmut 3 (not part of CI).

Each core module is mutated alone, in a scratch copy of the project, against the
test files that cover it (MODULES below), so one module's run takes minutes
rather than the whole suite per mutant. Results, per module: killed, survived,
timeouts, the score, and every surviving mutant with its diff; survivors that
are deliberately left alone get a reason in benchmarks/mutation_reasons.json.

    python -m benchmarks.mutation                      # every module, resumable
    python -m benchmarks.mutation --modules metrics judges
    python -m benchmarks.mutation --fresh metrics      # forget a module's earlier run
    python -m benchmarks.mutation --recheck metrics    # new tests: retest only the recorded survivors
    python -m benchmarks.mutation --collect annotate   # record a scratch run as it stands (e.g. stopped part-way)
    python -m benchmarks.mutation --refresh annotate   # continue a stopped run with the current tests

A run stopped part-way (killed, or the machine needed) resumes where it stopped:
mutmut keeps each mutant's verdict as it comes, and rerunning the same command
tests only the mutants without one. One worker by default (--max-children): the
cores are usually shared, and mutmut's CPU-time limits do not depend on it.

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
    "metrics": (
        "src/candor/evaluation/metrics.py",
        ["tests/test_metrics.py", "tests/test_selective_metrics.py", "tests/test_aggregate.py"],
    ),
    "evaluation": ("src/candor/evaluation/aggregate.py", ["tests/test_aggregate.py", "tests/test_report.py"]),
    "annotate": ("src/candor/annotation/builder.py", ["tests/test_annotate.py", "tests/test_annotate_judge.py"]),
    "judges": ("src/candor/annotation/judges.py", ["tests/test_judges.py"]),
    # Split out of judges.py after results/mutation.json was written: its survivors there name this module.
    "text-matching": ("src/candor/annotation/text_matching.py", ["tests/test_judges.py"]),
    "records": ("src/candor/annotation/records.py", ["tests/test_records.py", "tests/test_annotate.py"]),
    "splits": ("src/candor/data/splits.py", ["tests/test_splits.py"]),
    # "scoring" and "confidences" were two modules when results/mutation.json was written; the
    # layout of issue 22 made them one, tested here once under the older results' second key.
    "confidences": (
        "src/candor/estimators/confidences.py",
        [
            "tests/test_estimators_confidences.py",
            "tests/test_calibration_cli.py",
            "tests/test_elical_model.py::test_score_with_another_head_in_the_same_folder_recomputes_and_warns_of_overlap",
        ],
    ),
    "calibrators": (
        "src/candor/evaluation/calibration.py",
        ["tests/test_calibration.py", "tests/test_calibration_cli.py"],
    ),
    "estimators-logprob": ("src/candor/estimators/logprob.py", ["tests/test_estimators_logprob.py"]),
    "estimators-consistency": (
        "src/candor/estimators/annotated_consistency.py",
        ["tests/test_estimators_annotated_consistency.py"],
    ),
    "elical-targets": ("src/candor/train/elical/targets.py", ["tests/test_elical_train.py"]),
    "elical-trainer": ("src/candor/train/elical/trainer.py", ["tests/test_elical_train.py"]),
    "advice-losses": ("src/candor/train/advice/losses.py", ["tests/test_advice_losses.py"]),
    "advice-triplets": ("src/candor/train/advice/triplets.py", ["tests/test_advice_triplets.py"]),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", nargs="*", default=None, help="module keys (default: all, or none with --recheck)")
    p.add_argument("--fresh", nargs="*", default=[], help="rerun these modules from scratch")
    p.add_argument(
        "--recheck",
        nargs="*",
        default=[],
        help="copy the current src/ and tests/ into these modules' scratch runs and retest their recorded "
        "survivors (and any mutant of a changed function); killed mutants stay killed",
    )
    p.add_argument(
        "--refresh",
        nargs="*",
        default=[],
        help="copy the current src/ and tests/ into these modules' unfinished scratch runs and continue "
        "them: verdicts so far are kept (mutants of a changed function are retested), the mutants "
        "not yet tested meet the new tests",
    )
    p.add_argument(
        "--collect",
        nargs="*",
        default=[],
        help="record these modules' scratch runs as they stand (after an interrupted or hand-run mutmut), "
        "running nothing",
    )
    p.add_argument("--max-children", type=int, default=1)
    return p.parse_args()


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def write_results(payload: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_name(RESULTS.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(RESULTS)


# Appended to the scratch copy of tests/conftest.py. mutmut forks every mutant's test run from one
# process, which has made tqdm's lock, a multiprocessing semaphore, so every run shares that one
# semaphore; a run that ends while holding it (tqdm's monitor thread takes it every 10 s, and every
# bar takes it when made) leaves it held, and every later run blocks in its first tqdm until mutmut's
# CPU limit kills it: a timeout that is no verdict on the mutant. Each run gets a lock of its own.
OWN_TQDM_LOCK = """

def pytest_configure(config):  # added by benchmarks/mutation.py (see OWN_TQDM_LOCK there)
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
"""


def copy_tree(work: Path) -> None:
    """The current src/ and tests/ into a scratch run (replacing older copies)."""
    for part, ignore in (("src", ("__pycache__", "*.egg-info")), ("tests", ("__pycache__",))):
        shutil.rmtree(work / part, ignore_errors=True)
        shutil.copytree(ROOT / part, work / part, ignore=shutil.ignore_patterns(*ignore))
    conftest = work / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + OWN_TQDM_LOCK)


def prepare_scratch(key: str, source: str, tests: list[str]) -> Path:
    """A copy of src/, tests/ and pyproject.toml with a [tool.mutmut] section for this module alone."""
    work = SCRATCH / key
    if not work.exists():
        work.mkdir(parents=True)
        copy_tree(work)
        # mutmut runs the tests from work/mutants, and they read ../shared/data beside that root
        shared = ROOT.parent / "shared"
        if shared.exists():
            (work / "shared").symlink_to(shared.resolve())
    existing = [t for t in tests if (ROOT / t.split("::")[0]).exists()]  # a test id may name one test
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


def run_mutmut(work: Path, max_children: int, names: list[str] | None = None) -> float:
    """``mutmut run``: every mutant not yet tested (mutmut retests those of changed functions), then ``names``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    start = time.perf_counter()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    subprocess.run(command, cwd=work, env=env, check=False)
    if names:  # mutmut reruns a mutant only when it is named
        subprocess.run([*command, *names], cwd=work, env=env, check=False)
    return time.perf_counter() - start


def collect(work: Path, key: str, reasons: dict[str, str]) -> dict:
    """Counts from mutmut's CI stats, and each survivor's diff from ``mutmut show``."""
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=work, check=True, capture_output=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    listing = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=work, capture_output=True, text=True)
    survivors, timeouts = [], []
    for line in listing.stdout.splitlines():
        if match := re.match(r"\s*(\S+): timeout", line):
            timeouts.append(match.group(1))
        match = re.match(r"\s*(\S+): survived", line)
        if not match:
            continue
        name = match.group(1)
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name], cwd=work, capture_output=True, text=True
        ).stdout
        survivors.append({"name": name, "diff": diff.strip(), "reason": reasons.get(name)})
    killed = int(stats.get("killed", 0)) + int(stats.get("timeout", 0))
    tested = killed + int(stats.get("survived", 0))
    # mutants with no verdict yet (a run stopped part-way); the score is over the tested ones only
    decided = (
        "killed",
        "timeout",
        "survived",
        "no_tests",
        "skipped",
        "suspicious",
        "segfault",
        "check_was_interrupted_by_user",
    )
    not_checked = int(stats.get("total", 0)) - sum(int(stats.get(k, 0)) for k in decided)
    return {
        "source": MODULES[key][0],
        "tests": MODULES[key][1],
        "killed": stats.get("killed", 0),
        "timeout": stats.get("timeout", 0),
        "survived": stats.get("survived", 0),
        "no_tests": stats.get("no_tests", 0),
        "suspicious": stats.get("suspicious", 0),
        "total": stats.get("total"),
        "not_checked": not_checked,
        "score": round(100 * killed / tested, 1) if tested else None,
        "explained_survivors": sum(1 for s in survivors if s["reason"]),
        "unexplained_survivors": sum(1 for s in survivors if not s["reason"]),
        "timeouts": timeouts,
        "survivors": survivors,
    }


def refresh_reasons(payload: dict, reasons: dict[str, str]) -> None:
    """Survivors recorded earlier get the reasons listed since (no rerun needed to explain a survivor)."""
    for result in payload["modules"].values():
        for survivor in result["survivors"]:
            survivor["reason"] = reasons.get(survivor["name"])
        result["unexplained_survivors"] = sum(1 for s in result["survivors"] if not s["reason"])
        result["explained_survivors"] = len(result["survivors"]) - result["unexplained_survivors"]


def main() -> None:
    args = parse_args()
    if args.modules is None:
        args.modules = [] if args.recheck or args.collect or args.refresh else list(MODULES)
    unknown = sorted(
        (set(args.modules) | set(args.recheck) | set(args.fresh) | set(args.collect) | set(args.refresh)) - set(MODULES)
    )
    if unknown:
        sys.exit(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    payload = load_json(RESULTS)
    payload.setdefault("tool", "mutmut 3")
    payload.setdefault("modules", {})
    reasons = load_json(REASONS)
    refresh_reasons(payload, reasons)
    for key in args.fresh:
        shutil.rmtree(SCRATCH / key, ignore_errors=True)
        payload["modules"].pop(key, None)
    rechecks: dict[str, list[str]] = {}
    for key in args.recheck:
        earlier = payload["modules"].get(key)
        if earlier is None or not (SCRATCH / key).exists():
            sys.exit(f"{key}: no earlier run to recheck; run it first")
        copy_tree(SCRATCH / key)
        # mutmut maps each function to the tests that call it once, and later only adds new test names:
        # an edited test that now calls a function would never be run on its mutants. Recollect the map.
        (SCRATCH / key / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        # timeouts too: a run can time out for the harness's sake (see OWN_TQDM_LOCK)
        rechecks[key] = [s["name"] for s in earlier["survivors"]] + earlier.get("timeouts", [])
    for key in args.refresh:
        if not (SCRATCH / key / "mutants").exists():
            sys.exit(f"{key}: no scratch run to refresh")
        if key in payload["modules"]:
            sys.exit(f"{key}: its run finished (score {payload['modules'][key]['score']}); use --recheck {key}")
        copy_tree(SCRATCH / key)  # new test names are mapped to the functions they call when mutmut starts
    for key in args.collect:
        if not (SCRATCH / key / "mutants").exists():
            sys.exit(f"{key}: no scratch run to collect")
        earlier = payload["modules"].get(key, {})
        payload["modules"][key] = {
            **collect(SCRATCH / key, key, reasons),
            **{k: earlier[k] for k in ("seconds", "rechecked_survivors") if k in earlier},
        }
    write_results(payload)
    for key in dict.fromkeys([*args.recheck, *args.refresh, *args.modules]):
        if key in payload["modules"] and key not in rechecks:
            print(f"{key}: done earlier (score {payload['modules'][key]['score']}); --fresh {key} to rerun")
            continue
        source, tests = MODULES[key]
        if not (ROOT / source).exists():
            print(f"{key}: {source} does not exist, skipped")
            continue
        work = prepare_scratch(key, source, tests)
        seconds = run_mutmut(work, args.max_children, rechecks.get(key))
        result = collect(work, key, reasons)
        result["seconds"] = round(seconds, 1)
        if key in rechecks:
            result["rechecked_survivors"] = len(rechecks[key])
        if result["score"] is None:
            print(f"{key}: mutmut tested no mutant (see {work}/mutants/mutmut-debug.log); not recorded")
            continue
        payload["modules"][key] = result
        write_results(payload)
        print(
            f"{key}: score {result['score']}%  killed {result['killed']}  survived {result['survived']}  "
            f"({seconds:.0f} s)"
        )


if __name__ == "__main__":
    main()
