"""Regenerate the tables and quoted numbers of README.md and benchmarks/README.md from benchmarks/results/*.json.

    python -m benchmarks.readme_tables           # rewrite both READMEs in place
    python -m benchmarks.readme_tables --check   # exit 1 if either differs from what this writes

The generator is the package beside this file: readme/generator.py (markers, render, check),
readme/sections.py (the registry of renderers) and one module of renderers per topic.
"""

from __future__ import annotations

import sys

from benchmarks.readme.generator import main

if __name__ == "__main__":
    sys.exit(main())
