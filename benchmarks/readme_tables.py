"""Regenerate the tables and quoted numbers of README.md and benchmarks/README.md from benchmarks/results/*.json.

    python benchmarks/readme_tables.py           # rewrite both READMEs in place
    python benchmarks/readme_tables.py --check   # exit 1 if either differs from what this writes

The generator is the package beside this file: readme/generator.py (markers, render, check),
readme/sections.py (the registry of renderers) and one module of renderers per topic.
"""

from __future__ import annotations

import sys

from readme.generator import main  # benchmarks/ is first on sys.path when this file runs as a script

if __name__ == "__main__":
    sys.exit(main())
