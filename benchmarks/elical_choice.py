"""What EliCal's held-out selection chose, by target, as the results file records it (issue 46).

``elical.py`` writes these fields when it runs the selection; ``elical_targets.py`` writes them
again after deciding a saved selection anew.
"""

from __future__ import annotations

from typing import Any

from candor.train.elical import EliCalConfig
from candor.train.elical.rules import DEFAULT_TARGET, rule_of


def claim_fields(selection: dict) -> dict[str, Any]:
    """What each target chose and why (issue 46): the default target's criterion, each target's rule, the
    per-domain tolerances, each rule's 100→all change per held-out domain, and the library's default now."""
    default = EliCalConfig()
    return {
        "criterion": selection["criteria"][DEFAULT_TARGET]["criterion"],
        "selected_by_target": selection["selected_by_target"],
        "universal_choice": {k: v for k, v in selection["criteria"][DEFAULT_TARGET].items() if k != "criterion"},
        "tolerance": selection["tolerance"],
        "domain_change": {
            name: {
                d: {k: _num(v) for k, v in cell.items() if k != "per_seed"} for d, cell in c["domain_change"].items()
            }
            for name, c in selection["candidates"].items()
        },
        "library_default": {
            "name": rule_of(default),
            "target": default.target,
            "cal_stop": default.cal_stop,
            "cal_anchor": default.cal_anchor,
            "cal_scope": default.cal_scope,
        },
    }


def _num(x: float | None) -> float | None:
    return None if x is None or x != x else round(float(x), 4)
