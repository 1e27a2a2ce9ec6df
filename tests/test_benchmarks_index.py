"""benchmarks/README.md's index names every benchmark script, and no script imports another.

A *script* is a module of the ``benchmarks`` package whose top level has an
``if __name__ == "__main__":`` block (it runs as ``python -m benchmarks.NAME``); every other module
is shared code. Shell scripts (``benchmarks/*.sh``) are scripts too. Which is which is read from
the source by that rule, never from a list kept here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
INDEX = BENCHMARKS / "README.md"
HEADING = "## Scripts"
ROW = re.compile(r"^\| `(?P<name>[\w.]+)` \|")


def has_main_block(source: str) -> bool:
    """Whether the module's top level holds ``if __name__ == "__main__":`` (either quote, either order)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            sides = [node.test.left, node.test.comparators[0]]
            names = {s.id for s in sides if isinstance(s, ast.Name)}
            values = {s.value for s in sides if isinstance(s, ast.Constant)}
            if isinstance(node.test.ops[0], ast.Eq) and names == {"__name__"} and values == {"__main__"}:
                return True
    return False


def package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``benchmarks.common``, ``benchmarks.readme.generator``)."""
    out = {}
    for path in BENCHMARKS.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if {"cache", "results"} & set(parts):
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def scripts_on_disk() -> set[str]:
    """The file names of the scripts in benchmarks/: modules with a ``__main__`` block, and shell scripts."""
    python = {path.name for path in BENCHMARKS.glob("*.py") if has_main_block(path.read_text(encoding="utf-8"))}
    return python | {path.name for path in BENCHMARKS.glob("*.sh")}


def index_rows(text: str) -> dict[str, list[str]]:
    """The index table's rows under the "Scripts" heading, by the script named in the first cell."""
    assert f"\n{HEADING}\n" in text, f"benchmarks/README.md has no {HEADING!r} section"
    section = text.split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            assert match["name"] not in rows, f"the index lists {match['name']} twice"
            rows[match["name"]] = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
    return rows


def imported_modules(source: str, package: str) -> set[str]:
    """The modules ``source`` (a module of ``package``) imports anywhere, relative imports resolved."""
    parts = package.split(".")
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*parts[: len(parts) + 1 - node.level], *filter(None, [base])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # ``from benchmarks import common``
    return out


@pytest.fixture(scope="module")
def rows() -> dict[str, list[str]]:
    return index_rows(INDEX.read_text(encoding="utf-8"))


def test_the_rule_tells_a_script_from_a_shared_module():
    assert has_main_block('def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n')
    assert has_main_block("if '__main__' == __name__:\n    main()\n")
    assert not has_main_block('"""Shared."""\n\ndef helper():\n    return 1\n')
    assert not has_main_block('def f():\n    if __name__ == "__main__":\n        pass\n')  # not at the top level
    assert not has_main_block('if __name__ != "__main__":\n    pass\n')
    on_disk = scripts_on_disk()
    assert {"annotate_throughput.py", "readme_tables.py", "gpu_check.sh"} <= on_disk
    assert not {"common.py", "annotation_job.py", "servers.py", "__init__.py"} & on_disk


def test_every_script_is_in_the_index_and_the_index_names_only_scripts(rows):
    on_disk = scripts_on_disk()
    missing = sorted(on_disk - rows.keys())
    assert not missing, f"benchmarks/README.md ({HEADING}) has no row for: {', '.join(missing)}"
    gone = sorted(rows.keys() - on_disk)
    assert not gone, f"benchmarks/README.md ({HEADING}) lists what is not a script in benchmarks/: {', '.join(gone)}"


def test_each_row_says_how_to_run_the_script_what_it_measures_and_what_it_writes(rows):
    for name, cells in rows.items():
        assert len(cells) == 4, f"{name}: a row has four cells (script, run it, what it measures, writes): {cells}"
        _, run, what, writes = cells
        stem, kind = name.rsplit(".", 1)
        wanted = rf"`bash benchmarks/{re.escape(name)}\b" if kind == "sh" else rf"-m benchmarks\.{stem}\b"
        assert re.search(wanted, run), f"{name}: the command should run it as {wanted!r}: {run}"
        assert not re.search(r"python\S* benchmarks/", run), f"{name}: run by its path, not as a module: {run}"
        assert what, f"{name}: says nothing about what it measures"
        assert writes.startswith(("`benchmarks/results/", "none (")), f"{name}: writes a results file or none: {writes}"
        if "not yet run" not in writes:
            for path in re.findall(r"`(benchmarks/results/[^`]+)`", writes):
                assert list(ROOT.glob(path)), f"{name}: {path} is not in the repository"


def test_no_script_imports_another_script():
    modules = package_modules()
    scripts = {name for name, path in modules.items() if has_main_block(path.read_text(encoding="utf-8"))}
    # What only worked because a script's folder was first on sys.path (``from common import ...``).
    siblings = {path.stem for path in BENCHMARKS.glob("*.py")} | {"readme"}
    offenders = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        imported = imported_modules(path.read_text(encoding="utf-8"), package)
        offenders += [f"{name} imports the script {other}" for other in sorted(imported & scripts) if other != name]
        offenders += [
            f"{name} imports {bare} by the folder, not as benchmarks.{bare}" for bare in sorted(imported & siblings)
        ]
    assert offenders == []


def test_imports_are_resolved_as_the_package_sees_them():
    found = imported_modules("from .formatting import load\nfrom . import adapt\n", "benchmarks.readme")
    assert {"benchmarks.readme.formatting", "benchmarks.readme.adapt"} <= found
    assert "benchmarks.common" in imported_modules("from ..common import CACHE\n", "benchmarks.readme")
    assert "benchmarks.common" in imported_modules("def f():\n    from benchmarks.common import CACHE\n", "benchmarks")
    assert "common" in imported_modules("from common import CACHE\n", "benchmarks")
