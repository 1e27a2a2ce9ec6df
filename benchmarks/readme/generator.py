"""Rewrite or check the generated parts of the READMEs and docs pages from benchmarks/results/*.json.

README.md, benchmarks/README.md and the docs pages in ``READMES`` mark every generated part, so prose
and tables cannot drift from the results files:

    <!-- table:NAME -->            a whole block (a table or a paragraph), regenerated between the markers
    ...
    <!-- /table -->
    <!-- value:NAME -->12.3<!-- /value -->    one number or phrase quoted in the prose

    python -m benchmarks.readme_tables           # rewrite every file in READMES in place
    python -m benchmarks.readme_tables --check   # exit 1 if one differs from what this writes

Every marker in these files needs a renderer in ``sections.SECTIONS`` (an unknown one is an error
naming the file, line and marker; exit 2), and every part a renderer writes must be placed in at least
one of them (a part may be placed in several). Only the JSON files and the estimator registry are read
(no model, no cache), so this runs anywhere in a second; tests/test_readme_tables.py fails when a
committed file differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from .formatting import RESULTS
from .sections import SECTIONS

ROOT = Path(__file__).resolve().parents[2]
# Every file that holds markers: the two READMEs and the docs pages the README's sections moved to.
READMES = (
    ROOT / "benchmarks" / "README.md",
    ROOT / "README.md",
    ROOT / "docs" / "benchmarks.md",
    ROOT / "docs" / "estimators.md",
    ROOT / "docs" / "serving.md",
)
BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- /table -->)", re.S)
INLINE = re.compile(r"(<!-- value:(?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- /value -->)", re.S)
MARKERS = {"table": BLOCK, "value": INLINE}


class MarkerError(ValueError):
    """A marker (in a README or a docs page) that no renderer writes."""


def generated(results: Path = RESULTS) -> dict[str, str]:
    """Every generated block and value, by marker name; two renderers may not write the same part."""
    out: dict[str, str] = {}
    for section in SECTIONS:
        parts = section(results)
        twice = sorted(out.keys() & parts.keys())
        if twice:
            raise ValueError(f"{section.__module__}.{section.__name__} writes parts already written: {twice}")
        out.update(parts)
    return out


def markers(text: str) -> list[tuple[int, str]]:
    """``(line, "table:NAME")`` for every marker in ``text``, in the order of the file."""
    found = [(m.start(), f"{kind}:{m['name']}") for kind, pattern in MARKERS.items() for m in pattern.finditer(text)]
    return [(text.count("\n", 0, start) + 1, key) for start, key in sorted(found)]


def render(text: str, parts: Mapping[str, str], where: str = "README") -> str:
    """``text`` with every marked block and value replaced; a marker without a renderer is a MarkerError."""
    for line, key in markers(text):
        if key not in parts:
            raise MarkerError(f"{where}:{line}: marker {key!r} has no generator; known: {', '.join(sorted(parts))}")

    def block(match: re.Match[str]) -> str:
        return match.group(1) + parts[f"table:{match['name']}"] + match.group(4)

    def inline(match: re.Match[str]) -> str:
        return match.group(1) + parts[f"value:{match['name']}"] + match.group(4)

    return INLINE.sub(inline, BLOCK.sub(block, text))


def unplaced(texts: Iterable[str], parts: Mapping[str, str]) -> list[str]:
    """Generated parts no README or page places (so a rename cannot silently drop one)."""
    placed = {key for text in texts for _, key in markers(text)}
    return sorted(set(parts) - placed)


def shown(path: Path) -> str:
    """``README.md``: a file's path from the repository root, as the messages name it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def rewritten(texts: Mapping[Path, str], parts: Mapping[str, str]) -> dict[Path, str]:
    """The new text of each file that differs from what ``parts`` make of it."""
    out = {}
    for path, old in texts.items():
        new = render(old, parts, shown(path))
        if new != old:
            out[path] = new
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if a README or page is not what this script writes")
    args = p.parse_args(argv)
    parts = generated()
    texts = {path: path.read_text(encoding="utf-8") for path in READMES}
    missing = unplaced(texts.values(), parts)
    if missing:
        print(f"no README or page places: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        changed = rewritten(texts, parts)
    except MarkerError as error:
        print(error, file=sys.stderr)
        return 2
    for path, new in changed.items():
        if args.check:
            print(
                f"{shown(path)} differs from the results files; run python -m benchmarks.readme_tables", file=sys.stderr
            )
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return 1 if changed and args.check else 0
