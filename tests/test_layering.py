"""The package reads as the pipeline: no module imports from a stage after its own, and no import circle
(docs/architecture.md, "The layering rule").

Every ``import`` and ``from … import`` in ``src/candor`` is read with ``ast``, including those inside
functions (a lazy import is still a dependency), and so are the module names written as strings:
``importlib.import_module("candor.…")`` and the tables given to ``candor.util.lazy.lazy_exports``.
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
    "tool_calls",
    "backends",
    "annotation",
    "verbal",
    "estimators",
    "evaluation",
    "train",
    "diagnose",
    "serve",
    "integrations",
    "front door",
)
FRONT_DOOR = {"__init__", "api", "cli", "demo"}  # modules at the root, and the cli package


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
    """``(line, module)`` for every candor module ``path`` imports, relative imports resolved.

    ``from candor.a import b`` names ``candor.a.b``; whether that is a module or a name in ``candor.a``
    is for :func:`import_graph` to decide. Module names in strings count too (see the module docstring).
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(node.module or "", node.level, package)
            found += [(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}") for alias in node.names]
    found += [
        (line, resolve_relative(text.lstrip("."), len(text) - len(text.lstrip(".")), package))
        for line, text in module_strings(tree)
    ]
    return [(line, name) for line, name in found if name == "candor" or name.startswith("candor.")]


def resolve_relative(module: str, level: int, package: str) -> str:
    """``from ..x import y`` inside ``package``: the absolute name of ``..x``."""
    if not level:
        return module
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module] if module else []))


def module_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Module names written as strings: ``import_module("…")`` and the values of ``lazy_exports``' table."""
    tables = {
        target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if callee == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
        elif callee == "lazy_exports" and len(node.args) > 1:
            table = node.args[1]
            table = tables.get(table.id, table) if isinstance(table, ast.Name) else table
            if isinstance(table, ast.Dict):
                found += [(v.lineno, v.value) for v in table.values if isinstance(v, ast.Constant)]
    return [(line, text) for line, text in found if isinstance(text, str)]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each candor module → the candor modules it imports (a name in a package counts as its ``__init__``)."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        targets = {
            imported if imported in paths else imported.rpartition(".")[0]
            for _, imported in imported_modules(path, root)
        }
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def import_circles(root: Path = PACKAGE) -> list[list[str]]:
    """Every import circle (a strongly connected set of two or more modules), each sorted."""
    graph = import_graph(root)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            members = []
            while not members or members[-1] != node:
                members.append(stack.pop())
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(circles)


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """One line per import that climbs to a later stage: ``file:line: stage imports later stage (module)``."""
    rank = {stage: i for i, stage in enumerate(ORDER)}
    bad = []
    for path in sorted(root.rglob("*.py")):
        own = stage_of(module_name(path, root))
        for line, name in imported_modules(path, root):
            other = stage_of(name)
            if other not in rank:  # ``from candor import x``: x is a name of the front door or a stage
                continue
            if rank[other] > rank[own]:
                bad.append(f"{path.relative_to(root)}:{line}: {own} imports {other} ({name})")
    return bad


def test_every_stage_is_in_the_order_and_the_root_holds_only_the_front_door():
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert stages == set(ORDER) - {"front door"} | {"cli"}
    assert {p.stem for p in PACKAGE.glob("*.py")} == FRONT_DOOR - {"cli"}


def test_no_module_imports_from_a_later_stage():
    assert upward_imports() == []


def test_an_upward_import_is_caught_with_its_file_and_line(tmp_path):
    root = tmp_path / "candor"
    for stage in ("estimators", "serve"):
        (root / stage).mkdir(parents=True)
        (root / stage / "__init__.py").write_text("")
    (root / "estimators" / "leak.py").write_text(
        "from candor.util.errors import CandorError\n\ndef f():\n    from candor.serve.http import app\n"
    )
    (root / "serve" / "fine.py").write_text("from ..estimators import leak\nimport candor.util.files\n")
    assert upward_imports(root) == ["estimators/leak.py:4: estimators imports serve (candor.serve.http.app)"]


def test_no_import_circle():
    assert import_circles() == []


def make_package(root: Path, files: dict[str, str]) -> Path:
    """A throwaway ``candor`` tree: ``{"estimators/a.py": source}``, with the ``__init__.py`` files."""
    for relative, source in files.items():
        path = root / "candor" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == root:
                break
            (folder / "__init__.py").touch()
        path.write_text(source)
    return root / "candor"


def test_an_import_circle_inside_a_stage_is_caught_even_through_a_lazy_import(tmp_path):
    files = {
        "train/registry.py": "def methods():\n    from candor.train.elical.pipeline import run\n",
        "train/elical/pipeline.py": "from candor.train.registry import methods\n",
        "train/elical/config.py": "from candor.train.elical import pipeline\n",
    }
    root = make_package(tmp_path, files)
    assert import_circles(root) == [["candor.train.elical.pipeline", "candor.train.registry"]]
    (root / "train" / "elical" / "pipeline.py").write_text("X = 1\n")
    assert import_circles(root) == []


def test_an_import_circle_through_a_package_init_is_caught(tmp_path):
    root = make_package(tmp_path, {"serve/model.py": "from candor.serve import app\n", "serve/app.py": "X = 1\n"})
    (root / "serve" / "__init__.py").write_text("from .model import HonestModel\n")
    assert import_circles(root) == []  # ``app`` is a module: model reads it, not the package's __init__
    (root / "serve" / "model.py").write_text("from candor.serve import HonestModel\n")
    assert import_circles(root) == [["candor.serve", "candor.serve.model"]]


def test_a_module_name_in_a_string_that_climbs_is_caught(tmp_path):
    files = {
        "estimators/plugins.py": "import importlib\n\ndef load():\n"
        "    return importlib.import_module('candor.serve.http.app')\n",
        "util/lazy.py": "def lazy_exports(package, exports):\n    pass\n",
        "data/__init__.py": "from candor.util.lazy import lazy_exports\n_EXPORTS = {'Thing': 'candor.train.thing'}\n"
        "__getattr__ = lazy_exports(__name__, _EXPORTS)\n",
        "serve/http/app.py": "X = 1\n",
        "train/thing.py": "Thing = 1\n",
    }
    root = make_package(tmp_path, files)
    assert upward_imports(root) == [
        "data/__init__.py:2: data imports train (candor.train.thing)",
        "estimators/plugins.py:4: estimators imports serve (candor.serve.http.app)",
    ]


def test_a_relative_lazy_export_resolves_inside_its_package(tmp_path):
    files = {
        "train/elical/__init__.py": "from candor.util.lazy import lazy_exports\n"
        "__getattr__ = lazy_exports(__name__, {'Config': '.config'})\n",
        "train/elical/config.py": "from candor.train.elical import targets\n",  # a name of the package
    }
    root = make_package(tmp_path, files)
    assert import_circles(root) == [["candor.train.elical", "candor.train.elical.config"]]


@pytest.mark.parametrize(
    ("module", "stage"),
    [
        ("candor", "front door"),
        ("candor.api", "front door"),
        ("candor.train.elical.model", "train"),
        ("candor.util", "util"),
        ("candor.cli.serving", "front door"),
    ],
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


# The engine (docs/engine.md) sits inside the backends stage but below its adapters: the hf backend
# and serve use it, never the other way round.
ENGINE_MAY_IMPORT = (
    "candor.util",
    "candor.backends.engine",
    "candor.backends.base",
    "candor.backends.tokens",
    "candor.backends.constraints",  # the grammar each constrained row decodes under
)


def engine_reaches(root: Path = PACKAGE) -> list[str]:
    """One line per import of an engine module that leaves what the engine may import."""
    bad = []
    for path in sorted((root / "backends" / "engine").rglob("*.py")):
        for line, name in imported_modules(path, root):
            if not any(name == allowed or name.startswith(allowed + ".") for allowed in ENGINE_MAY_IMPORT):
                bad.append(f"{path.relative_to(root)}:{line}: {name}")
    return bad


def test_the_engine_imports_only_util_and_the_backend_plumbing():
    assert engine_reaches() == []


def test_an_engine_import_of_an_adapter_is_caught(tmp_path):
    source = "from candor.backends.base import Backend\ndef f():\n    from candor.backends.hf import HFBackend\n"
    root = make_package(tmp_path, {"backends/engine/loop.py": source})
    assert engine_reaches(root) == ["backends/engine/loop.py:3: candor.backends.hf.HFBackend"]


# serve's core (the honest model, answering, batching, re-reading, thresholds, the folder…) never
# imports its web door, ``candor.serve.http`` (docs/architecture.md "The layering rule").
def core_reaches_http(root: Path = PACKAGE) -> list[str]:
    """One line per import of ``candor.serve.http`` from a module of serve outside it."""
    bad = []
    for path in sorted((root / "serve").rglob("*.py")):
        if module_name(path, root).startswith("candor.serve.http"):
            continue
        for line, name in imported_modules(path, root):
            if name == "candor.serve.http" or name.startswith("candor.serve.http."):
                bad.append(f"{path.relative_to(root)}:{line}: {name}")
    return bad


def test_serves_core_never_imports_its_web_door():
    assert core_reaches_http() == []


def test_a_core_import_of_the_web_door_is_caught(tmp_path):
    files = {
        "serve/model.py": "def f():\n    from candor.serve.http.responses import confidence_object\n",
        "serve/http/responses.py": "from candor.serve.model import f\n",  # the door may import the core
        "serve/http/app.py": "X = 1\n",
        "serve/thresholds.py": "from candor.serve import http\n",
    }
    root = make_package(tmp_path, files)
    assert core_reaches_http(root) == [
        "serve/model.py:2: candor.serve.http.responses.confidence_object",
        "serve/thresholds.py:1: candor.serve.http",
    ]


def engine_module_reaches(root: Path = PACKAGE) -> list[str]:
    """One line per import of a module inside the engine from outside it: callers use its ``__init__``'s names."""
    modules = {module_name(path, root) for path in root.rglob("*.py")}
    bad = []
    for path in sorted(root.rglob("*.py")):
        if module_name(path, root).startswith("candor.backends.engine"):
            continue
        for line, name in imported_modules(path, root):
            inside = name.startswith("candor.backends.engine.")
            module = name if name in modules else name.rpartition(".")[0]
            if inside and module != "candor.backends.engine":
                bad.append(f"{path.relative_to(root)}:{line}: {name}")
    return bad


def test_outside_the_engine_only_its_exported_names_are_imported():
    assert engine_module_reaches() == []


def test_a_reach_into_an_engine_module_is_caught(tmp_path):
    files = {
        "backends/engine/__init__.py": "X = 1\n",
        "backends/engine/chunked_prefill.py": "ChunkedPrefill = 1\n",
        "backends/engine/stops.py": "from candor.backends.engine.chunked_prefill import ChunkedPrefill\n",  # inside
        "serve/rescoring.py": "from candor.backends.engine import X\n"
        "from candor.backends.engine.chunked_prefill import ChunkedPrefill\n",
    }
    root = make_package(tmp_path, files)
    assert engine_module_reaches(root) == [
        "serve/rescoring.py:2: candor.backends.engine.chunked_prefill.ChunkedPrefill"
    ]
