"""candor's benchmarks: scripts run from the repository root as ``python -m benchmarks.NAME``.

A *script* is a module with a ``__main__`` block; everything else here is a *shared module*,
imported by the scripts as ``from benchmarks.common import ...``. No script imports another:
what two scripts share lives in a shared module named for what it is. benchmarks/README.md
lists every script (and the shell scripts beside them), the command that runs it and the
results file it writes; tests/test_benchmarks_index.py keeps that list whole.

The children the scripts start (``python -m benchmarks.NAME`` again, see :mod:`benchmarks.children`)
import this package first, so the OpenMP wait policy below is set before any of them loads torch.
"""

from __future__ import annotations

import os

# Before torch loads (see candor/cli/__init__.py): spinning OpenMP threads made every path
# five to six times slower on a 2-core machine shared with other processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
