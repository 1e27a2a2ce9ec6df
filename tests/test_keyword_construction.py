"""A value object with more than four fields is built with keywords, so adding a field never shifts the others.

The rule: **a call that constructs a value object with more than four fields passes at most one positional
argument**, the class's first field: ``Threshold(0.5, rule="fixed")``, ``Completion("Paris", logprobs=[-0.5])``,
never ``Threshold(0.5, "fixed")``. The first value is what the object is (a threshold's value, a completion's
text) and reads at a glance; every later one is named. A class of four fields or fewer may still be built
positionally (``Shard(0, 1)``).

Every ``.py`` file in ``src/candor``, ``tests`` and ``benchmarks`` is read with ``ast``.

A *value object* is a class decorated with ``@dataclass`` / ``@dataclasses.dataclass`` (with or without
arguments) or subclassing ``NamedTuple``. Its *fields* are its constructor's parameters: annotated
class-level names, a base dataclass's first. An ``InitVar`` is a parameter and counts; a ``ClassVar``, the
``KW_ONLY`` sentinel and a ``field(init=False)`` do not. A dataclass with ``init=False`` takes none, and one
that writes its own ``__init__`` takes that method's parameters. Keyword-only fields (after ``KW_ONLY``,
``field(kw_only=True)``, ``kw_only=True``) still count: they cannot be passed positionally anyway.

A *construction* is a call whose callee names such a class: ``Name(...)``, ``module.Name(...)``, ``cls(...)``
in one of its classmethods, ``type(self)(...)`` / ``self.__class__(...)`` in one of its methods, and
``partial(Name, ...)`` (the arguments after the class). ``dataclasses.replace(...)`` takes keywords only. A
``*args`` argument may carry any number, so a call with one never passes.

Names resolve conservatively, so a name two classes share never lets a call pass. A name the file binds by a
class definition, or by an import from ``src/candor``, ``tests`` or ``benchmarks``, follows that binding
(through re-exports); an import from elsewhere (``typing``, ``torch``) is none of ours. Anything else (an
attribute of an object, a lazy export, a name the file does not bind) is checked against every value object
of that name, and the one with the most fields decides.

Each offending call is printed as ``path:line: ClassName(...) with K positional arguments (F fields)``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("src/candor", "tests", "benchmarks")
MOST_FIELDS_FOR_POSITIONAL = 4  # a class with more fields than this is built with keywords ...
POSITIONAL_ALLOWED = 1  # ... after at most this many positional arguments


@dataclass
class ValueClass:
    """A class definition as written, and (once worked out) its constructor's fields."""

    node: ast.ClassDef
    path: Path
    kind: str  # "dataclass", "namedtuple" or "" (not a value object)
    fields: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class Construction:
    path: Path
    call: ast.Call
    name: str  # the class's name
    positional: int  # positional arguments
    unpacked: bool  # one of them is ``*args``
    fields: int  # the class's fields (the largest, for an ambiguous name)


def module_names(path: Path, base: Path) -> list[str]:
    """The names ``path`` is imported by: ``src/candor/a/b.py`` is ``candor.a.b``; a file under ``tests`` or
    ``benchmarks`` is ``tests.x`` and also ``x`` (a script's own folder is on its import path)."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts and parts[0] == "src":
        return [".".join(parts[1:])]
    return [".".join(parts), ".".join(parts[1:])] if len(parts) > 1 else [".".join(parts)]


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_dataclass_decorator(node: ast.expr) -> bool:
    return _dotted(node.func if isinstance(node, ast.Call) else node) in {"dataclass", "dataclasses.dataclass"}


def _is_false_keyword(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords)


def _annotation_head(node: ast.expr) -> str:
    """``ClassVar`` for ``ClassVar[int]``, ``typing.ClassVar[int]`` or the string ``"ClassVar[int]"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split("[")[0].strip().rpartition(".")[2]
    if isinstance(node, ast.Subscript):
        node = node.value
    return _last_name(node) or ""


def _own_fields(cls: ast.ClassDef, kind: str) -> list[str] | None:
    """The constructor parameters the class body declares; None when a dataclass has ``init=False``."""
    if any(
        isinstance(d, ast.Call) and _is_dataclass_decorator(d) and _is_false_keyword(d, "init")
        for d in cls.decorator_list
    ):
        return None
    names = []
    for statement in cls.body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        if _annotation_head(statement.annotation) in {"ClassVar", "KW_ONLY"}:
            continue
        value = statement.value
        if (
            kind == "dataclass"
            and isinstance(value, ast.Call)
            and _dotted(value.func) in {"field", "dataclasses.field"}
            and _is_false_keyword(value, "init")
        ):
            continue
        names.append(statement.target.id)
    return names


def _written_init(cls: ast.ClassDef) -> tuple[str, ...] | None:
    """The parameters (``self`` left out) of an ``__init__`` the class writes itself, else None."""
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            args = statement.args
            return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))[1:]
    return None


def _absolute(module: str, level: int, here: str, is_package: bool) -> str:
    """``from ..x import y`` in module ``here``: the absolute name of ``..x``."""
    if not level:
        return module
    parts = here.split(".") if is_package else here.split(".")[:-1]
    parts = parts[: len(parts) - level + 1]
    return ".".join([*parts, *([module] if module else [])])


def _bindings(tree: ast.Module, here: str, is_package: bool) -> dict[str, list[tuple[str, ...]]]:
    """How a file binds each name, anywhere in it: ``("class",)``, ``("module", name)`` for an imported
    module, ``("from", module, name)`` for a name imported from a module, or ``("other",)``."""
    bound: dict[str, list[tuple[str, ...]]] = {}

    def add(name: str, how: tuple[str, ...]) -> None:
        if how not in bound.setdefault(name, []):
            bound[name].append(how)

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            add(node.name, ("class",))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node.name, ("other",))
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    add(arg.arg, ("other",))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    add(alias.asname, ("module", alias.name))
                else:
                    add(alias.name.split(".")[0], ("module", alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module or "", node.level, here, is_package)
            for alias in node.names:
                if alias.name != "*":
                    add(alias.asname or alias.name, ("from", module, alias.name))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            add(node.id, ("other",))
    return bound


class Checker:
    """The value objects of a tree of files, and the calls that construct them."""

    def __init__(self, files: Iterable[Path], base: Path) -> None:
        self.base = base
        self.trees = {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(files)}
        self.modules: dict[str, list[Path]] = {}
        for path in self.trees:
            for name in module_names(path, base):
                self.modules.setdefault(name, []).append(path)
        self.classes: dict[Path, dict[str, list[ValueClass]]] = {}  # every class each file defines, by name
        self.by_name: dict[str, list[ValueClass]] = {}  # every value object, by name
        self.bindings: dict[Path, dict[str, list[tuple[str, ...]]]] = {}
        for path, tree in self.trees.items():
            found = self.classes.setdefault(path, {})
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    kind = ""
                    if any(_is_dataclass_decorator(d) for d in node.decorator_list):
                        kind = "dataclass"
                    elif any(_last_name(b) == "NamedTuple" for b in node.bases):
                        kind = "namedtuple"
                    cls = ValueClass(node, path, kind)
                    found.setdefault(node.name, []).append(cls)
                    if kind:
                        self.by_name.setdefault(node.name, []).append(cls)
            self.bindings[path] = _bindings(tree, module_names(path, base)[0], path.name == "__init__.py")

    def value_objects(self) -> list[ValueClass]:
        return [cls for found in self.by_name.values() for cls in found]

    def fields(self, cls: ValueClass, seen: frozenset[int] = frozenset()) -> tuple[str, ...] | None:
        """The constructor's parameters of a value object, in order; None for another class."""
        if not cls.kind:
            return None
        if cls.fields is None:
            written = _written_init(cls.node)
            own = _own_fields(cls.node, cls.kind)
            if written is not None:
                cls.fields = written
            elif own is None:
                cls.fields = ()
            else:
                names: list[str] = []
                if cls.kind == "dataclass" and id(cls.node) not in seen:
                    for base in reversed(cls.node.bases):  # the first base's fields come first
                        parent = self._largest(self.resolve(base, cls.path), seen | {id(cls.node)})
                        names += [n for n in parent or () if n not in names]
                cls.fields = (*names, *(n for n in own if n not in names))  # an override keeps its place
        return cls.fields

    def _largest(self, candidates: list[ValueClass], seen: frozenset[int] = frozenset()) -> tuple[str, ...] | None:
        """The fields of the candidate value object with the most of them (None when none is one)."""
        best: tuple[str, ...] | None = None
        for cls in candidates:
            fields = self.fields(cls, seen)
            if fields is not None and (best is None or len(fields) > len(best)):
                best = fields
        return best

    # -- what a callee names ---------------------------------------------------------------------------------

    def resolve(self, callee: ast.expr, path: Path) -> list[ValueClass]:
        """The classes a callee in ``path`` may name (empty: none of ours)."""
        if isinstance(callee, ast.Name):
            return self._resolve_name(callee.id, path, frozenset())
        if isinstance(callee, ast.Attribute):
            owner = _dotted(callee.value)
            module = self._module_of(owner, path) if owner is not None else None
            if module is None:
                return self.by_name.get(callee.attr, [])
            return self._in_module(module, callee.attr, frozenset()) if module in self.modules else []
        return []

    def _resolve_name(self, name: str, path: Path, visiting: frozenset[tuple[Path, str]]) -> list[ValueClass]:
        bound = self.bindings[path].get(name)
        if not bound or (path, name) in visiting:
            return self.by_name.get(name, [])
        visiting |= {(path, name)}
        found: list[ValueClass] = []
        for how in bound:
            if how[0] == "class":
                found += self.classes[path].get(name, [])
            elif how[0] == "from":
                module, imported = how[1], how[2]
                if module in self.modules and f"{module}.{imported}" not in self.modules:
                    found += self._in_module(module, imported, visiting)
                # else: a module, or a name from outside our code
            elif how[0] == "other":  # an assignment, a parameter, a function: it could be anything
                found += self.by_name.get(name, [])
        return found

    def _in_module(self, module: str, name: str, visiting: frozenset[tuple[Path, str]]) -> list[ValueClass]:
        found: list[ValueClass] = []
        for path in self.modules[module]:
            found += self._resolve_name(name, path, visiting)  # a name it does not bind: any of that name
        return found

    def _module_of(self, owner: str, path: Path) -> str | None:
        """The module a dotted owner names in ``path`` (``th`` after ``… import thresholds as th``), else None."""
        head, _, rest = owner.partition(".")
        for how in self.bindings[path].get(head, []):
            if how[0] == "module":
                module = how[1]
            elif how[0] == "from" and f"{how[1]}.{how[2]}" in self.modules:
                module = f"{how[1]}.{how[2]}"
            else:
                continue
            return f"{module}.{rest}" if rest else module
        return None

    # -- the calls -------------------------------------------------------------------------------------------

    def constructions(self) -> Iterator[Construction]:
        """Every call that may construct a value object."""
        for path, tree in self.trees.items():
            yield from self._visit(tree, path, None, None)

    def _visit(
        self, node: ast.AST, path: Path, cls: ast.ClassDef | None, method: ast.FunctionDef | None
    ) -> Iterator[Construction]:
        if isinstance(node, ast.ClassDef):
            cls, method = node, None
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and cls is not None and method is None:
            method = node
        if isinstance(node, ast.Call):
            args = node.args
            own = _enclosing_class(node.func, cls, method)
            if own is not None:
                candidates, name = self.classes[path].get(own.name, []), own.name
            elif _dotted(node.func) in {"partial", "functools.partial"} and args:
                candidates, name, args = self._candidates(args[0], path), _last_name(args[0]) or "", args[1:]
            else:
                candidates, name = self._candidates(node.func, path), _last_name(node.func) or ""
            fields = self._largest(candidates)
            if fields is not None:
                unpacked = any(isinstance(a, ast.Starred) for a in args)
                yield Construction(
                    path=path,
                    call=node,
                    name=name,
                    positional=len(args),
                    unpacked=unpacked,
                    fields=len(fields),
                )
        for child in ast.iter_child_nodes(node):
            yield from self._visit(child, path, cls, method)

    def _candidates(self, callee: ast.expr, path: Path) -> list[ValueClass]:
        name = _last_name(callee)
        return self.resolve(callee, path) if name in self.by_name else []

    def offences(self) -> list[str]:
        found = []
        for c in self.constructions():
            if c.fields > MOST_FIELDS_FOR_POSITIONAL and (c.positional > POSITIONAL_ALLOWED or c.unpacked):
                count = f"{c.positional}+" if c.unpacked else str(c.positional)
                where = c.path.relative_to(self.base).as_posix()
                found.append(
                    f"{where}:{c.call.lineno}: {c.name}(...) with {count} positional arguments ({c.fields} fields)"
                )
        return found


def _enclosing_class(callee: ast.expr, cls: ast.ClassDef | None, method: ast.FunctionDef | None) -> ast.ClassDef | None:
    """The enclosing class, where the callee is ``cls`` in a classmethod or ``type(self)`` / ``self.__class__``."""
    if cls is None or method is None or not method.args.args:
        return None
    first = method.args.args[0].arg
    is_classmethod = any(_dotted(d) == "classmethod" for d in method.decorator_list)
    if isinstance(callee, ast.Name) and callee.id == first and is_classmethod:
        return cls
    if _dotted(callee) == f"{first}.__class__":
        return cls
    is_type_of_first = (
        isinstance(callee, ast.Call)
        and _dotted(callee.func) == "type"
        and len(callee.args) == 1
        and isinstance(callee.args[0], ast.Name)
        and callee.args[0].id == first
    )
    return cls if is_type_of_first else None


def python_files(base: Path = ROOT) -> list[Path]:
    return sorted(path for folder in CHECKED if (base / folder).is_dir() for path in (base / folder).rglob("*.py"))


@pytest.fixture(scope="module")
def repository() -> Checker:
    return Checker(python_files(), ROOT)


def test_value_objects_with_more_than_four_fields_are_built_with_keywords(repository):
    offences = repository.offences()
    assert not offences, f"{len(offences)} constructions with positional arguments:\n" + "\n".join(offences)


def test_the_checker_reads_the_real_classes_and_their_call_sites(repository):
    checker = repository
    fields = {(cls.name, cls.path.name): checker.fields(cls) for cls in checker.value_objects()}
    assert fields[("Threshold", "thresholds.py")][:2] == ("value", "rule")
    assert len(fields[("HonestAnswer", "answering.py")]) > MOST_FIELDS_FOR_POSITIONAL
    assert len(fields[("Reply", "openai.py")]) < len(fields[("Reply", "answering.py")])  # one name, two classes
    built = {c.name for c in checker.constructions() if c.fields > MOST_FIELDS_FOR_POSITIONAL}
    assert {"Threshold", "QAItem", "Record", "DecodeRequest", "Completion"} <= built


SYNTHETIC = {
    "src/candor/__init__.py": "",
    "src/candor/shapes.py": """
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import ClassVar, NamedTuple


@dataclass(frozen=True)
class Box:
    a: int
    b: int
    c: int
    d: int
    e: int
    unit: ClassVar[str] = "cm"
    cache: dict = field(default_factory=dict, init=False)

    @classmethod
    def cube(cls, side):
        return cls(side, side, side, side, side)


@dataclass
class Small:
    a: int
    b: int
    c: int
    d: int
    cache: dict = field(default_factory=dict, init=False)


@dataclass
class Bigger(Small):
    e: InitVar[int] = 0


@dataclass
class Sentinel:
    a: int
    _: KW_ONLY
    b: int = 0
    c: int = 0
    d: int = 0
    e: int = 0


class Row(NamedTuple):
    a: int
    b: int
    c: int
    d: int
    e: int


class Reply(NamedTuple):  # shares its name with a larger class in another module
    text: str
""",
    "src/candor/other.py": """
from dataclasses import dataclass


@dataclass
class Reply:
    a: int
    b: int
    c: int
    d: int
    e: int
""",
    "tests/test_use.py": """
import functools

import candor.shapes as sh
from candor import shapes
from candor.shapes import Bigger, Box, Row, Sentinel, Small
from typing import NamedTuple as Box2


def build(item, Thing):
    Box(1, 2, 3, 4, 5)
    Box(a=1, b=2, c=3, d=4, e=5)
    Box(1, b=2, c=3, d=4, e=5)
    sh.Box(1, 2, c=3, d=4, e=5)
    shapes.Row(1, 2, 3, 4, 5)
    Small(1, 2, 3, 4)
    Bigger(1, 2, 3, 4, 5)
    Sentinel(1, b=2)
    Row(*item)
    item.Reply(1, 2)
    functools.partial(Box, 1, 2)
    Box2("X", [])
""",
    "tests/test_reply.py": """
from candor.shapes import Reply


def answer():
    return Reply("fine", "twice")
""",
}


def test_the_checker_catches_a_positional_construction_and_passes_a_keyword_one(tmp_path):
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    checker = Checker(python_files(tmp_path), tmp_path)
    fields = {(cls.name, cls.path.name): checker.fields(cls) for cls in checker.value_objects()}
    assert fields == {
        ("Box", "shapes.py"): ("a", "b", "c", "d", "e"),
        ("Small", "shapes.py"): ("a", "b", "c", "d"),
        ("Bigger", "shapes.py"): ("a", "b", "c", "d", "e"),
        ("Sentinel", "shapes.py"): ("a", "b", "c", "d", "e"),
        ("Row", "shapes.py"): ("a", "b", "c", "d", "e"),
        ("Reply", "shapes.py"): ("text",),
        ("Reply", "other.py"): ("a", "b", "c", "d", "e"),
    }
    # Box(a=...), Box(1, b=...), Small(...) (four fields), Sentinel(1, b=2), Box2 (typing's) and
    # tests/test_reply.py's Reply (the import names the one-field class) all pass.
    assert checker.offences() == [
        "src/candor/shapes.py:18: Box(...) with 5 positional arguments (5 fields)",
        "tests/test_use.py:11: Box(...) with 5 positional arguments (5 fields)",
        "tests/test_use.py:14: Box(...) with 2 positional arguments (5 fields)",
        "tests/test_use.py:15: Row(...) with 5 positional arguments (5 fields)",
        "tests/test_use.py:17: Bigger(...) with 5 positional arguments (5 fields)",
        "tests/test_use.py:19: Row(...) with 1+ positional arguments (5 fields)",
        "tests/test_use.py:20: Reply(...) with 2 positional arguments (5 fields)",  # an object's: either Reply
        "tests/test_use.py:21: Box(...) with 2 positional arguments (5 fields)",
    ]
