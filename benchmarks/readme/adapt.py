"""The top-level README's "Calibrate on your own traffic" numbers, from results/adapt.json."""

from __future__ import annotations

from pathlib import Path

from .formatting import DASH, Json, load, with_ci

ARMS = (("adapted", "adapted"), ("unadapted", "unadapted"), ("cal_only", "Cal-Only"))


def cell(entry: Json) -> str:
    """``75.6 [68, 82]``: the mean ×100 and its interval in whole points; a dash when missing."""
    return with_ci(entry.get("mean"), entry.get("ci95"))


def error_cell(entry: Json) -> str:
    """The answered error (×100); a dash where no run answered anything."""
    if entry["answered_error"]["mean"] is None:
        return f"{DASH} (answers none)"
    return cell(entry["answered_error"])


def coverage_cell(entry: Json) -> str:
    """The share of test questions answered (×100, one decimal: a run answering 1 of 200 shows)."""
    mean = entry["coverage"]["mean"]
    return DASH if mean is None else f"{100 * mean:.1f}"


def table(result: Json) -> str:
    rows = [
        "| domain | labels | arm | AUROC | ECE | coverage (%) | answered error (α = {:g}) | within α (runs) |".format(
            result["alpha"]
        ),
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    domains = [("mean of the four", result)] + [(d, result["by_domain"][d]) for d in result["sizes"]["folds"]]
    for name, block in domains:
        for n, arms in block["by_labels"].items():
            for key, label in ARMS:
                entry = arms[key]
                rows.append(
                    f"| {name} | {n} | {label} | {cell(entry['auroc'])} | {cell(entry['ece'])} | "
                    f"{coverage_cell(entry)} | {error_cell(entry)} | {entry['guarantee']} |"
                )
    return "\n".join(rows)


def goal(result: Json) -> str:
    g = result.get("goal_at_100_labels") or {}
    if not g.get("auroc_gain_by_domain"):
        return "The 100-label goal was not measured."
    gains = ", ".join(f"{d} {100 * v:+.1f}" for d, v in g["auroc_gain_by_domain"].items())
    verdict = (
        "met"
        if all(
            g[k]
            for k in (
                "mean_gain_at_least_0.05",
                "no_domain_below_unadapted",
                "adapted_ece_at_most_0.05",
                "answered_error_within_alpha_every_run",
            )
        )
        else "not met"
    )
    seconds = result["adapt_seconds"].get("100", {}).get("mean")
    return (
        f"With 100 labels the goal (mean AUROC gain ≥ +5 points, no domain below the unadapted head, "
        f"ECE ≤ 0.05, answered error within α in every run) is **{verdict}**: AUROC gain per domain "
        f"{gains} (mean {100 * g['mean_auroc_gain']:+.1f}); adapted ECE ≤ 0.05: "
        f"{'yes' if g['adapted_ece_at_most_0.05'] else 'no'}; answered error within α in every run: "
        f"{g['answered_error_within_alpha']} (adapted coverage {100 * g['adapted_coverage']:.1f}%)"
        f"{_promoted(g)}. "
        f"Adapting took {seconds:.0f} s per run (mean, features cached) on 2 shared CPU cores" + _cli(result) + "."
    )


def _promoted(g: Json) -> str:
    """Issue 64's goal: no worse head promoted (absent from results measured before the check)."""
    if g.get("worse_promoted_runs") is None:
        return ""
    return f"; worse heads marked promotable, over every domain, seed and label count: {g['worse_promoted_runs']}"


def _cli(result: Json) -> str:
    cli = result.get("cli_adapt")
    if not cli:
        return ""
    return (
        f"; the command itself, from a cold start (loading the model, computing every feature), "
        f"{cli['seconds']:.0f} s with {cli['labels']} labels in {cli['mode']} mode "
        f"(load average {cli['load_average'][0]:g})"
    )


def promotion_table(result: Json) -> str:
    """Issue 64: adapt's held-out check against the test questions, per domain and label count, and in all."""
    promotion = result.get("promotion")
    if not promotion:
        return "The promotion check was not measured."
    rows = [
        "| domain | labels | runs | promoted | kept | worse on test | worse and promoted |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for d in result["sizes"]["folds"]:
        for n, c in result["by_domain"][d]["promotion"].items():
            rows.append(
                f"| {d} | {n} | {c['runs']} | {c['promoted']} | {c['kept']} | {c['worse_on_test']} | "
                f"{c['worse_promoted']} |"
            )
    for n, c in promotion["by_labels"].items():
        rows.append(
            f"| all four | {n} | {c['runs']} | {c['promoted']} | {c['kept']} | {c['worse_on_test']} | "
            f"{c['worse_promoted']} |"
        )
    c = promotion["all"]
    rows.append(
        f"| **every run** | all | {c['runs']} | {c['promoted']} | {c['kept']} | {c['worse_on_test']} | "
        f"**{c['worse_promoted']}** |"
    )
    return "\n".join(rows)


def alpha_table(result: Json) -> str:
    """Issue 64: the smallest α 100 labels certify per domain, beside the adapted head's guarantee row at it."""
    levels = result.get("certified_alpha_at_100_labels")
    if not levels:
        return "The certified levels were not measured."
    rows = [
        "| domain | smallest α per seed | α (every seed) | held-out answers right, per seed | "
        "most confident held-out answer right (runs) | coverage (%) | answered error | within α (runs) |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for d, e in levels.items():
        seeds = ", ".join("none" if a is None else f"{a:g}" for a in e["smallest_alpha_by_seed"].values())
        right = e.get("held_out_right_by_seed")
        right = DASH if right is None else ", ".join(str(k) for k in right.values()) + f" of {e['held_out']}"
        top = f"{right} | {e['most_confident_held_out_correct_runs']} of {e['runs']}"
        if e["alpha"] is None:
            rows.append(f"| {d} | {seeds} | none of the grid | {top} | {DASH} | {DASH} | not exercised (0 answered) |")
            continue
        error = f"{DASH} (answers none)" if e["answered_error"]["mean"] is None else cell(e["answered_error"])
        coverage = DASH if e["coverage"]["mean"] is None else f"{100 * e['coverage']['mean']:.1f}"
        rows.append(f"| {d} | {seeds} | {e['alpha']:g} | {top} | {coverage} | {error} | {e['guarantee']} |")
    return "\n".join(rows)


def adapt(r: Path) -> dict[str, str]:
    """``candor adapt`` on a held-out domain: the 100-label goal's verdict, the table of every arm, the promotion
    check and the smallest certifiable α per domain."""
    result = load("adapt", r)
    return {
        "table:adapt-goal": goal(result),
        "table:adapt": table(result),
        "table:adapt-promotion": promotion_table(result),
        "table:adapt-alpha": alpha_table(result),
    }
