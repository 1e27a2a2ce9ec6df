"""Commands from records to numbers: ``score`` (confidences), ``eval`` (the report), ``calibrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from candor.cli.options import DEFAULT_MODEL, ModelOpt
from candor.cli.shared import counted, invoked_command, print_rich, user_errors
from candor.util.errors import CandorError


@user_errors
def score(
    records: Annotated[
        Path | None, typer.Option("--records", "-r", help="Records JSONL from `candor annotate` (required).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Confidences JSONL (required; columns made exactly as this run would are reused)."
        ),
    ] = None,
    estimators: Annotated[
        str, typer.Option("--estimators", "-e", help="Comma-separated estimator names, or 'list'.")
    ] = "prob,n-prob,min-prob,consis-lex,consis-sem",
    model: ModelOpt = DEFAULT_MODEL,
    adapter: Annotated[
        Path | None, typer.Option(help="PEFT adapter folder (e.g. from `candor train advice`) to load on --model.")
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option("--option", "-O", help="Estimator setting NAME.KEY=VALUE, e.g. elical.head=runs/elical."),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Recompute methods already in --out; replace an --out about other records.")
    ] = False,
) -> None:
    """Turn records into confidences with any registered estimators.

    With --adapter the model-based estimators score with the fine-tuned model;
    write its confidences to their own --out file so they stay apart from the
    base model's.
    """
    from candor.annotation.records import read_records
    from candor.estimators import get_estimator
    from candor.estimators.confidences import check_nothing_lost, score_into

    if estimators == "list":
        print_estimator_table()
        return
    missing = [flag for flag, value in (("--records", records), ("--out", out)) if value is None]
    if missing:
        raise CandorError(f"candor score needs {' and '.join(missing)} (only `-e list` runs without them)")
    assert records is not None and out is not None  # for the type checker: checked just above
    names = [n.strip() for n in estimators.split(",") if n.strip()]
    options = parse_estimator_options(option or [], names)
    needs_model = any(get_estimator(n, **options.get(n, {})).needs_backend for n in names)
    recs = read_records(records)
    if not recs:
        raise CandorError(f"{records}: no records to score (an empty file; was `candor annotate` run with --limit 0?)")
    check_nothing_lost(out, recs, force)  # before the model loads
    refuse_dev_files_overlap(options, recs, records)
    backend = None
    if needs_model:
        from candor.backends import load_backend

        backend = load_backend(model, adapter=str(adapter) if adapter else None)
    table = score_into(recs, names, out, backend, force=force, options=options)
    typer.echo(f"wrote {counted(len(table.methods), 'method')} × {counted(len(table.rows), 'record')} to {out}")
    for name in names:  # a fitted combination says what it learned (the weights are in the .columns.json too)
        weights = (table.provenance(name) or {}).get("estimator", {}).get("weights")
        if weights:
            typer.echo(f"{name} weights: " + ", ".join(f"{k} {v:+.4f}" for k, v in weights.items()))


# Options naming a labelled dev file that an estimator is fitted on when scoring (``ensemble.dev``,
# ``X.debias_dev``, a member's ``ensemble.length.dev``): the last dotted part of the option's key.
DEV_OPTIONS = frozenset({"dev", "debias_dev"})


def refuse_dev_files_overlap(options: dict[str, dict[str, Any]], recs: list[Any], records: Path) -> None:
    """Refuse, before the model loads, a dev file that shares a question with the ``--records`` scored."""
    from candor.annotation.contamination import refuse_dev_overlap
    from candor.annotation.records import read_records

    scored = [r.item.question for r in recs]
    for name, given in options.items():
        for key, value in given.items():
            if key.rpartition(".")[2] in DEV_OPTIONS and isinstance(value, str):
                dev = [r.item.question for r in read_records(value)]
                refuse_dev_overlap(dev, f"-O {name}.{key}={value}", scored, f"--records {records}")


def print_estimator_table() -> None:
    """Every registered estimator: family, level, what it needs, its reference (``-e list``)."""
    from rich.table import Table

    from candor.estimators.catalog import HEADER, estimator_rows

    table = Table(*HEADER, title="Estimators (-e NAME,NAME,...)")
    for row in estimator_rows():
        table.add_row(row.name, row.family, row.level, row.needs, row.reference)
    print_rich(table)


def parse_estimator_options(pairs: list[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """``["elical.head=dir", "verbal-10.examples=f.jsonl"]`` → ``{"elical": {"head": "dir"}, …}``.

    Values stay strings except integers and floats; an option for an
    estimator that is not being run is an error, not silently ignored. The
    name ends at the first dot, so ``ensemble.n-prob.debias=length`` is the
    ensemble's option ``n-prob.debias`` (a member's setting).
    """
    options: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        name, dot, field = key.partition(".")  # the first dot: ensemble.length.dev sets the member's dev
        if not sep or not dot or not name or not field:
            raise CandorError(f"--option {pair!r}: expected NAME.KEY=VALUE, e.g. elical.head=runs/elical")
        if name not in names:
            raise CandorError(f"--option {pair!r}: estimator {name!r} is not among --estimators ({', '.join(names)})")
        options.setdefault(name, {})[field] = _option_value(value)
    return options


def _option_value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


# eval's options for a thresholded method and a hand-checked judge (docs/methods.md "Abstention-aware scores").
ThresholdOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--threshold",
        help="Abstain below it: VALUE for every method or METHOD=VALUE (repeatable); adds the abstention-aware scores.",
    ),
]
HonestOpt = Annotated[
    Path | None,
    typer.Option(
        "--honest",
        help="A tuned honest-model folder: its method and threshold (and calibrator) add the abstention-aware scores.",
    ),
]
HandLabelsOpt = Annotated[
    Path | None,
    typer.Option(
        "--hand-labels",
        help="Hand labels of the judge's verdicts (JSONL of {id, human}): adds the "
        "judge-noise-corrected accuracy and each AUROC's spread under judge noise.",
    ),
]


@user_errors
def eval_command(
    confidences: Annotated[Path, typer.Option("--confidences", "-c", help="Confidences JSONL.")],
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Report folder.")],
    ood: Annotated[str, typer.Option(help="Comma-separated out-of-domain datasets (the rest are in-domain).")] = "",
    n_bins: Annotated[int, typer.Option(help="ECE bins.")] = 10,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for 95% intervals (0: none).")] = 0,
    metrics: Annotated[str, typer.Option(help="Comma-separated metrics (default: all the report's).")] = "",
    records: Annotated[
        Path | None,
        typer.Option(
            "--records",
            "-r",
            help="The records behind the confidences: report.html then shows each "
            "question, gold and answer, and the model, template and judges.",
        ),
    ] = None,
    threshold: ThresholdOpt = None,
    honest: HonestOpt = None,
    hand_labels: HandLabelsOpt = None,
) -> None:
    """Evaluate confidences: tables (Markdown, CSV, JSON), plots, and report.html (all of it on one offline page)."""
    from candor.annotation.records import read_records
    from candor.estimators.confidences import read_confidences
    from candor.evaluation.judge_noise import read_hand_labels
    from candor.evaluation.report import format_table_rich, write_report
    from candor.evaluation.summary import REPORT_METRICS, roles_from_ood
    from candor.evaluation.trust import trust_lines

    table = read_confidences(confidences)
    thresholds = parse_thresholds(threshold or [], table.methods)
    if honest is not None:
        thresholds.update(honest_threshold(honest, table))
    roles = roles_from_ood(table, ood.split(","), str(confidences))
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] or list(REPORT_METRICS)
    recs = read_records(records) if records is not None else None
    if recs is not None and not {r.id for r in recs} & {row.id for row in table.rows}:
        raise CandorError(f"--records {records}: no record id matches a row of {confidences}")
    labels = read_hand_labels(hand_labels, table) if hand_labels is not None else None
    result = write_report(
        table,
        out_dir,
        roles=roles,
        n_bins=n_bins,
        bootstrap=bootstrap,
        metrics=chosen,
        records=recs,
        command=invoked_command(),
        thresholds=thresholds,
        hand_labels=labels,
    )
    print_rich(format_table_rich(result))
    for line in trust_lines(result.trust):
        typer.echo(line)
    typer.echo(f"report: {result.files['index']}")
    typer.echo(f"page: {result.files['html']}")


def parse_thresholds(values: list[str], methods: list[str]) -> dict[str, float]:
    """``["0.4"]`` → every method at 0.4; ``["n-prob=0.3"]`` → that method only (later values win)."""
    out: dict[str, float] = {}
    for text in values:
        method, sep, value = text.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise CandorError(f"--threshold {text!r}: expected VALUE or METHOD=VALUE, e.g. 0.4 or n-prob=0.4") from None
        if not 0.0 <= number <= 1.0:
            raise CandorError(f"--threshold {text!r}: a threshold is a confidence, in [0, 1]")
        if sep and method not in methods:
            raise CandorError(f"--threshold {text!r}: no method {method!r} in the confidences ({', '.join(methods)})")
        out.update({m: number for m in ([method] if sep else methods)})
    return out


def honest_threshold(folder: Path, table: Any) -> dict[str, float]:
    """The tuned threshold of an honest-model folder, on its method's column (calibrated as it serves it)."""
    from candor.evaluation.calibration import calibrated_column, calibrator_from_dict
    from candor.serve.honest_folder import read_config

    config = read_config(folder)
    source, threshold = config["confidence"], config.get("threshold")
    if not threshold:
        raise CandorError(f"--honest {folder}: the model has no threshold; tune one first (HonestModel.tune)")
    method = source.get("name")
    if source.get("kind") != "estimator" or method not in table.methods:
        raise CandorError(
            f"--honest {folder}: its confidence ({source.get('kind')} {method or ''}) is not a "
            f"column of the confidences ({', '.join(table.methods)}); score it first"
        )
    if config.get("calibrator"):  # the threshold applies to the calibrated confidence, as the model serves it
        calibrator = calibrator_from_dict(config["calibrator"])
        column = calibrated_column(method, calibrator.name)
        conf, _ = table.arrays(method)
        table.add(column, [r.id for r in table.rows], calibrator.predict(conf))
        method = column
    return {method: float(threshold["value"])}


@user_errors
def calibrate(
    dev: Annotated[Path, typer.Option("--dev", help="Dev confidences JSONL with labels (fits the calibrator).")],
    confidences: Annotated[Path, typer.Option("--confidences", "-c", help="Confidences JSONL to calibrate.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output confidences JSONL (input columns kept).")],
    methods: Annotated[str, typer.Option("--methods", "-m", help="Comma-separated method columns.")],
    calibrator: Annotated[str, typer.Option(help="platt, isotonic, temperature or histogram.")] = "isotonic",
    save_dir: Annotated[Path | None, typer.Option(help="Also save each fitted calibrator as JSON here.")] = None,
) -> None:
    """Fit a calibrator per method on dev confidences and add calibrated columns (METHOD+CALIBRATOR)."""
    from candor.estimators.confidences import read_confidences, write_confidences
    from candor.evaluation.calibration import calibrate_tables, save_calibrators

    names = [m.strip() for m in methods.split(",") if m.strip()]
    result = calibrate_tables(read_confidences(dev), read_confidences(confidences), names, calibrator)
    write_confidences(out, result.table)
    if save_dir is not None:
        save_calibrators(save_dir, result, dev)
    typer.echo(f"wrote {', '.join(result.columns.values())} to {out}")
