"""Commands that train confidence: ``train`` (one method) and ``sweep`` (EliCal's label-budget curve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from candor.cli.options import DEFAULT_MODEL, ModelOpt
from candor.cli.shared import comma_list, integer, user_errors
from candor.util.errors import CandorError


@user_errors
def train(
    method: Annotated[
        str,
        typer.Argument(help="elical, eli-only, cal-only, elical-claims, advice, conftuner, advice+conftuner, probe."),
    ],
    records: Annotated[Path, typer.Option("--records", "-r", help="Training records JSONL (`candor annotate`).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the trained head or adapter.")],
    dev: Annotated[
        Path | None,
        typer.Option(
            help="Dev records: EliCal stops early on them (default: a slice carved from --records); "
            "ADVICE/ConfTuner log their loss each epoch."
        ),
    ] = None,
    model: ModelOpt = DEFAULT_MODEL,
    seed: Annotated[int, typer.Option(help="Seed for budgets, shuffling and initialization.")] = 0,
    setting: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Method setting KEY=VALUE, e.g. mode=lora, budget=1000, learning_rate=1e-4."),
    ] = None,
    test: Annotated[
        list[str] | None,
        typer.Option(
            "--test",
            "-t",
            help="Test file (records, QA file or dataset name; repeatable): "
            "training refuses a pool or dev file that shares a question with it.",
        ),
    ] = None,
) -> None:
    """Train a confidence method and save it (a head for EliCal, a LoRA adapter for ADVICE/ConfTuner)."""
    from candor.train.elical.held_out import held_out_summary
    from candor.train.elical.rules import stage_two_line
    from candor.train.settings import parse_settings
    from candor.train.trainers import TrainJob, run_training

    job = TrainJob(
        records=records,
        out=out,
        model=model,
        dev=dev,
        seed=seed,
        settings=parse_settings(setting or []),
        tests=list(test or []),
    )
    result = run_training(method, job)
    typer.echo(
        f"{method}: saved to {result.path} ({result.cost.get('wall_s', float('nan')):.0f} s, "
        f"peak {result.cost.get('peak_rss_mib', float('nan')):.0f} MiB)"
    )
    if method in ("elical", "elical-claims"):
        typer.echo(stage_two_line(result.config))
    if method == "elical-claims" and result.config is not None:
        choice = result.config["pooling_choice"]
        typer.echo(f"claim feature: {choice['pooling']} (chosen by {choice['by']}; dev AUROC {choice['dev_auroc']})")
    if result.held_out is not None:
        typer.echo(held_out_summary(result.held_out))


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
        typer.Option(
            "--select",
            help="Choose stage 2's rule instead: leave each dataset of the pool out in turn, "
            "train on the others, score on its dev questions (reads no test file).",
        ),
    ] = False,
    held_out_dev: Annotated[
        list[Path] | None,
        typer.Option(
            "--held-out-dev",
            help="With --select: extra dev records (greedy correctness is enough) "
            "scored when their dataset is held out; repeatable.",
        ),
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
    if test and not select:
        refuse_test_overlap_first(records, dev, test)  # before the imports below (torch, the trainers)
    from candor.train.elical import Budget, EliCalConfig
    from candor.train.elical.selection import run_selection, selection_table
    from candor.train.elical.sweep import SweepData, run_sweep, sweep_table

    budget_list = [Budget.parse(b) for b in comma_list(budgets, "--budgets")]
    seed_list = [integer(s, "--seeds") for s in comma_list(seeds, "--seeds")]
    config = EliCalConfig(mode=mode, model=model, feature_cache=str(out_dir / "features"))
    if select:
        if test or ood:
            raise CandorError("--select chooses a rule on training and dev data only; it takes no --test or --ood")
        names = comma_list(rules, "--rules") if rules is not None else None
        result = run_selection(
            records,
            dev,
            held_out_dev or [],
            out_dir=out_dir,
            config=config,
            rules=names,
            budgets=budget_list,
            seeds=seed_list,
        )
        for line in selection_table(result, out_dir):
            typer.echo(line)
        return
    if held_out_dev or rules is not None:
        raise CandorError("--held-out-dev and --rules belong to --select")
    if not test:
        raise CandorError("the sweep needs at least one --test file (or --select, which needs none)")
    ood_names = {n.strip() for n in ood.split(",") if n.strip()}
    summary = run_sweep(
        SweepData.read(records, test, dev=dev, ood=ood_names),
        out_dir=out_dir,
        config=config,
        budgets=budget_list,
        seeds=seed_list,
        bootstrap=bootstrap,
    )
    for line in sweep_table(summary, out_dir):
        typer.echo(line)


def refuse_test_overlap_first(records: Path, dev: Path | None, tests: list[Path]) -> None:
    """The sweep's test-overlap refusal, before its imports (torch, the trainers) and the model load."""
    from candor.annotation.contamination import HeldOutQuestions
    from candor.annotation.records import read_records
    from candor.train.common import refuse_test_overlap

    held_out = HeldOutQuestions.read([str(t) for t in tests])
    refuse_test_overlap(held_out, read_records(records), read_records(dev) if dev else None, records, dev)
