"""Regenerate README.md's estimator table from the estimator registry (``candor.estimators.catalog``).

The table sits between ``<!-- table:estimators -->`` and ``<!-- /table -->``;
tests/test_estimator_catalog.py fails when the committed README differs from it.

    python benchmarks/readme_estimators.py           # rewrite README.md in place
    python benchmarks/readme_estimators.py --check   # exit 1 if README.md differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from candor.estimators.catalog import markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- table:estimators -->\n).*?(<!-- /table -->)", re.S)


def render(text: str) -> str:
    if not BLOCK.search(text):
        raise SystemExit(f"{README}: no <!-- table:estimators --> block")
    return BLOCK.sub(lambda m: m.group(1) + markdown_table() + m.group(2), text, count=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    new = render(text)
    if args.check:
        sys.exit(0 if new == text else 1)
    README.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
