"""README parts on the estimators: the registry's table, and what two of them cost."""

from __future__ import annotations

from pathlib import Path

from candor.estimators.catalog import markdown_table

from .formatting import load, md_table


def estimator_table(r: Path) -> dict[str, str]:
    """The top-level README's estimator table, from the registry (not a results file: ``r`` is not read)."""
    return {"table:estimators": markdown_table().removesuffix("\n")}


def eigenscore_cost(r: Path) -> dict[str, str]:
    d = load("eigenscore_cost", r)
    old, new = d["paths"]["one_by_one"], d["paths"]["shared"]
    return {
        "value:eigenscore-cost": (
            f"{new['cpu_seconds_per_record']:.2f} CPU s per record against {old['cpu_seconds_per_record']:.2f} "
            f"with one pass per sample ({d['speedup_cpu']:.1f}x CPU, {d['speedup_wall']:.1f}x wall; k = {d['k']}, "
            f"{d['n']} NQ records, confidences equal within {d['max_abs_confidence_difference']:.0e})"
        ),
    }


def verbal_pruned(r: Path) -> dict[str, str]:
    d = load("verbal_pruned", r)
    rows = [
        [
            f"{float(m):g}",
            f"{run['cpu_ratio_to_number']:.2f}x",
            f"{run['mean_abs_mu_difference']:.4f}",
            f"{run['max_abs_mu_difference']:.4f}",
            f"{run['mean_bound']:.3f}",
            str(run["records_over_bound"]),
        ]
        for m, run in d["percent_pruned"].items()
    ]
    rows.insert(0, ["exact", f"{d['percent_exact']['cpu_ratio_to_number']:.2f}x", "0", "0", "0", "0"])
    header = ["min_mass", "CPU vs verbal-number", r"mean \|Δμ\|", r"max \|Δμ\|", "mean bound", "over bound"]
    return {"table:verbal-pruned": md_table(header, "l" + "r" * 5, rows), "value:verbal-pruned-n": str(d["n"])}
