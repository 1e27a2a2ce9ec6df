"""Commands that train confidence: ``train`` (one method) and ``sweep`` (EliCal's label-budget curve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from candor.cli.common import comma_list, integer, user_errors
from candor.cli.options import (
    DEFAULT_MODEL,
    ModelOpt,
)
from candor.util.errors import CandorError


@user_errors
def train(
    method: Annotated[str, typer.Argument(help="elical, eli-only, cal-only, advice, conftuner, advice+conftuner.")],
    records: Annotated[Path, typer.Option("--records", "-r", help="Training records JSONL (`candor annotate`).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the trained head or adapter.")],
    dev: Annotated[
        Path | None,
        typer.Option(help="Dev records: EliCal stops early on them (default: a slice carved from --records); "
                     "ADVICE/ConfTuner log their loss each epoch."),
    ] = None,
    model: ModelOpt = DEFAULT_MODEL,
    seed: Annotated[int, typer.Option(help="Seed for budgets, shuffling and initialization.")] = 0,
    setting: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Method setting KEY=VALUE, e.g. mode=lora, budget=1000, learning_rate=1e-4."),
    ] = None,
    test: Annotated[
        list[str] | None,
        typer.Option("--test", "-t", help="Test file (records, QA file or dataset name; repeatable): "
                     "training refuses a pool or dev file that shares a question with it."),
    ] = None,
) -> None:
    """Train a confidence method and save it (a head for EliCal, a LoRA adapter for ADVICE/ConfTuner)."""
    from candor.train.trainers import TrainJob, parse_settings, run_training

    job = TrainJob(records=records, out=out, model=model, dev=dev, seed=seed, settings=parse_settings(setting or []),
                   tests=list(test or []))  # fmt: skip
    result = run_training(method, job)
    typer.echo(
        f"{method}: saved to {result.path} ({result.cost.get('wall_s', float('nan')):.0f} s, "
        f"peak {result.cost.get('peak_rss_mib', float('nan')):.0f} MiB)"
    )
    if result.held_out is not None:
        _echo_held_out(result.held_out)


def _echo_held_out(report: dict[str, Any]) -> None:
    """The held-out-domain AUROC of an EliCal run (trained without each dataset of the pool, scored on it)."""
    if "skipped" in report:
        typer.echo(f"held-out-domain AUROC: skipped ({report['skipped']})")
        return
    cells = []
    for name, d in report["domains"].items():
        if "skipped" in d:
            cells.append(f"{name} skipped ({d['skipped']})")
        elif d["auroc"] is None:
            cells.append(f"{name} n/a ({d['n_correct']}/{d['n']} correct: one class)")
        else:
            cells.append(f"{name} {100 * d['auroc']:.1f} ({d['n_correct']}/{d['n']} correct)")
    mean = report["mean_auroc"]
    typer.echo("held-out-domain AUROC ×100 (retrained without each dataset, scored on it): " + ", ".join(cells)
               + ("" if mean is None else f"; mean {100 * mean:.1f}"))


@user_errors
def sweep(
    records: Annotated[Path, typer.Option("--records", "-r", help="Training pool records JSONL.")],
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Folder for heads, curve.json and the plot.")],
    test: Annotated[
        list[Path] | None,
        typer.Option("--test", "-t", help="Test records JSONL (one or more datasets; repeatable; not with --select)."),
    ] = None,
    dev: Annotated[Path | None, typer.Option(help="Dev records (default: carved from --records).")] = None,
    select: Annotated[
        bool,
        typer.Option("--select", help="Choose stage 2's rule instead: leave each dataset of the pool out in turn, "
                     "train on the others, score on its dev questions (reads no test file)."),
    ] = False,
    held_out_dev: Annotated[
        list[Path] | None,
        typer.Option("--held-out-dev", help="With --select: extra dev records (greedy correctness is enough) "
                     "scored when their dataset is held out; repeatable."),
    ] = None,
    rules: Annotated[
        str | None, typer.Option(help="With --select: comma-separated stage-2 rules (default: all candidates).")
    ] = None,
    budgets: Annotated[str, typer.Option(help="Comma-separated label budgets; 'all' = the whole pool.")] = (
        "100,250,500,1000,all"
    ),
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    ood: Annotated[str, typer.Option(help="Comma-separated out-of-domain datasets in --test.")] = "",
    mode: Annotated[str, typer.Option(help="head (frozen backbone, cached features) or lora.")] = "head",
    model: ModelOpt = DEFAULT_MODEL,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the intervals.")] = 200,
) -> None:
    """EliCal's label-budget curve: Cal-Only and EliCal at each budget and seed (AUROC, ECE, Alignment).

    With --select, the stage-2 rule selection by held-out domains instead (docs/methods.md "EliCal").
    """
    from candor.annotation.contamination import HeldOutQuestions
    from candor.annotation.records import read_records
    from candor.train.elical import EliCalConfig, carve_dev, parse_budget
    from candor.train.elical.sweep import SweepData, run_sweep

    budget_list = [parse_budget(b) for b in comma_list(budgets, "--budgets")]
    seed_list = [integer(s, "--seeds") for s in comma_list(seeds, "--seeds")]
    config = EliCalConfig(mode=mode, model=model, feature_cache=str(out_dir / "features"))
    if select:
        if test or ood:
            raise CandorError("--select chooses a rule on training and dev data only; it takes no --test or --ood")
        _select_rule(records, dev, held_out_dev or [], rules, out_dir, config, budget_list, seed_list)
        return
    if held_out_dev or rules is not None:
        raise CandorError("--held-out-dev and --rules belong to --select")
    if not test:
        raise CandorError("the sweep needs at least one --test file (or --select, which needs none)")
    tests: dict[str, list] = {}
    for path in test:
        for rec in read_records(path):
            tests.setdefault(rec.item.dataset, []).append(rec)
    guard = HeldOutQuestions.of((r.item.question for recs in tests.values() for r in recs), [str(p) for p in test])
    pool = read_records(records)
    guard.refuse_overlap((r.item.question for r in pool), str(records))
    dev_records = read_records(dev) if dev is not None else None
    if dev_records is None:
        pool, dev_records = carve_dev(pool)
    else:
        guard.refuse_overlap((r.item.question for r in dev_records), str(dev))
    ood_names = {n.strip() for n in ood.split(",") if n.strip()}
    unknown = ood_names - set(tests)
    if unknown:
        files = ", ".join(str(p) for p in test)
        raise CandorError(f"--ood {', '.join(sorted(unknown))}: not a dataset in {files} ({', '.join(tests)})")
    roles = {d: ("ood" if d in ood_names else "id") for d in tests}
    summary = run_sweep(
        SweepData(pool, dev_records, tests, roles),
        out_dir=out_dir,
        config=config,
        budgets=budget_list,
        seeds=seed_list,
        bootstrap=bootstrap,
    )
    for name, entry in summary["methods"].items():
        cells = [f"{g.upper()} AUROC {100 * entry[g]['auroc']:5.1f}" for g in ("id", "ood") if g in entry]
        typer.echo(f"{name:>20}  " + "  ".join(cells))
    typer.echo(f"curve: {out_dir / 'curve.json'}, plot: {out_dir / 'budget_curve.png'}")


def _select_rule(
    records: Path, dev: Path | None, held_out_dev: list[Path], rules: str | None, out_dir: Path,
    config: Any, budgets: list, seeds: list[int],
) -> None:
    """``candor sweep --select``: the held-out-domain table, the pick, and ``out_dir/selection.json``."""
    from candor.annotation.records import read_records
    from candor.train.elical import carve_dev
    from candor.train.elical.selection import select_rule
    from candor.train.elical.sweep import write_json

    pool = read_records(records)
    dev_records = read_records(dev) if dev is not None else None
    if dev_records is None:
        pool, dev_records = carve_dev(pool)
    extra = [r for path in held_out_dev for r in read_records(path)]
    names = comma_list(rules, "--rules") if rules is not None else None
    result = select_rule(pool, dev_records, extra, out_dir=out_dir, config=config, rules=names, budgets=budgets,
                         seeds=seeds)  # fmt: skip
    write_json(out_dir / "selection.json", result)
    for domain, sizes in result["folds"].items():
        typer.echo(f"held out {domain}: {sizes['n_scored']} dev questions, {sizes['n_correct']} correct")
    head = "  ".join(f"AUROC@{b:>4}" for b in result["budgets"])
    typer.echo(f"{'rule':>12}  {head}   mean  ECE mean  AUROC @{result['budgets'][-1]} - @{result['budgets'][0]} [95%]")
    for name, c in result["candidates"].items():
        cells = "  ".join(f"{100 * c['by_budget'][b]['auroc']:9.1f}" for b in result["budgets"])
        gap = c["last_vs_first"]
        mark = " *" if name == result["selected"] else ""
        typer.echo(f"{name:>12}  {cells}  {100 * c['mean_auroc']:5.1f}  {100 * c['mean_ece']:8.1f}  "
                   f"{100 * gap['auroc_diff']:+.1f} [{100 * gap['ci95'][0]:+.1f}, {100 * gap['ci95'][1]:+.1f}]{mark}")
    eli = result["eli_only"]
    typer.echo(f"{'Eli-Only':>12}  held-out AUROC {100 * eli['auroc']:.1f}, ECE {100 * eli['ece']:.1f}")
    typer.echo(f"selected: {result['selected']} (best mean held-out AUROC, ties broken by ECE); "
               f"table: {out_dir / 'selection.json'}")
