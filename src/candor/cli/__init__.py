"""The ``candor`` command line: one module per command group, each a thin layer (parse, call, print).

- :mod:`.commands`: the typer app, logging, the console entry point and the table of commands;
- :mod:`.shared`: what every command shares (one-line errors with exit 2, provenance, printing);
- :mod:`.options`: the option types commands share, and the honest-model option group of ``ask``/``serve``;
- one module per group: :mod:`.getting_started` (datasets, demo), :mod:`.annotating`,
  :mod:`.scoring` (score, eval, calibrate), :mod:`.training` (train, sweep), :mod:`.diagnosing`,
  :mod:`.serving` (ask, serve, serve-head).

User mistakes surface as one line on stderr and exit code 2 (docs/architecture.md "Conventions").
"""

from __future__ import annotations

import os

# Before torch loads: OpenMP threads that spin while waiting made every forward
# pass 5-6x slower on a 2-core machine shared with other processes (measured in
# benchmarks/annotate_throughput.py); passive waiting costs nothing when idle.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from candor.cli.commands import app, run  # noqa: E402

__all__ = ["app", "run"]
