"""The package reads as the pipeline: no module imports from a stage after its own (DESIGN.md §2).

Every ``import`` and ``from … import`` in ``src/candor`` is read with ``ast``,
including those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "candor"

# The stages, in pipeline order: each may import only itself and those before it.
# The front door (the root's modules) comes last and may import everything.
ORDER = (
    "util",
    "data",
    "backends",
    "annotation",
    "verbal",
    "estimators",
    "evaluation",
    "train",
    "diagnose",
    "serve",
    "front door",
)
FRONT_DOOR = {"__init__", "api", "cli", "demo"}


def stage_of(module: str) -> str:
    """The stage of a dotted ``candor…`` module name (the root package and its modules: the front door)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in FRONT_DOOR:
        return "front door"
    return parts[1]


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """``(line, module)`` for every candor module ``path`` imports, relative imports resolved."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                found.append((node.lineno, node.module or ""))
    return [(line, name) for line, name in found if name == "candor" or name.startswith("candor.")]


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """One line per import that climbs to a later stage: ``file:line: stage imports later stage (module)``."""
    rank = {stage: i for i, stage in enumerate(ORDER)}
    bad = []
    for path in sorted(root.rglob("*.py")):
        own = stage_of(module_name(path, root))
        for line, name in imported_modules(path, root):
            other = stage_of(name)
            if rank[other] > rank[own]:
                bad.append(f"{path.relative_to(root)}:{line}: {own} imports {other} ({name})")
    return bad


def test_every_stage_is_in_the_order_and_the_root_holds_only_the_front_door():
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert stages == set(ORDER) - {"front door"}
    assert {p.stem for p in PACKAGE.glob("*.py")} == FRONT_DOOR


def test_no_module_imports_from_a_later_stage():
    assert upward_imports() == []


def test_an_upward_import_is_caught_with_its_file_and_line(tmp_path):
    root = tmp_path / "candor"
    for stage in ("estimators", "serve"):
        (root / stage).mkdir(parents=True)
        (root / stage / "__init__.py").write_text("")
    (root / "estimators" / "leak.py").write_text(
        "from candor.util.errors import CandorError\n\ndef f():\n    from candor.serve import app\n"
    )
    (root / "serve" / "fine.py").write_text("from ..estimators import leak\nimport candor.util.files\n")
    assert upward_imports(root) == ["estimators/leak.py:4: estimators imports serve (candor.serve)"]


@pytest.mark.parametrize(
    ("module", "stage"),
    [("candor", "front door"), ("candor.api", "front door"), ("candor.train.elical.model", "train"),
     ("candor.util", "util")],
)
def test_stage_of(module, stage):
    assert stage_of(module) == stage


def test_the_front_door_and_the_estimator_registry_load_without_torch():
    """Lazy names (candor.util.lazy) keep ``import candor`` and the registry's plugin lookup free of torch."""
    import subprocess
    import sys

    code = (
        "import sys, candor\n"
        "from candor.estimators import ESTIMATORS\n"
        "assert 'elical' in ESTIMATORS and 'probe' in ESTIMATORS\n"
        "assert candor.CandorError.__module__ == 'candor.util.errors'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "import candor.train.elical as elical\n"
        "assert callable(elical.targets) and 'train_elical' in dir(elical) and 'torch' not in sys.modules\n"
        "print(sorted(dir(candor))[:2])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['CandorError', 'EliCal']"
