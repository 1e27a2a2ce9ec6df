"""Commands on a deployment's own traffic: ``label`` (mark served answers) and ``adapt`` (recalibrate on them)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from candor.cli.shared import user_errors
from candor.util.errors import CandorError

EXPORTS = ("seq-cls",)
DEFAULT_LABEL_PORT = 8765


def served_source(records: Path | None, store: str | None) -> str | Path:
    """The one place served answers are read from: a store URL or a served log file (exactly one)."""
    if (records is None) == (store is None):
        raise CandorError("give either a served log file (RECORDS) or --store URL, not both or neither")
    if store is not None and "://" not in store:
        raise CandorError(f"--store must be a database URL (sqlite:///FILE.db, postgresql://…), got {store!r}")
    return store if store is not None else records  # type: ignore[return-value]


StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", help="The store candor serve writes to (sqlite:///served.db, postgresql://…) instead of a file."
    ),
]


@user_errors
def label(
    records: Annotated[
        Path | None, typer.Argument(help="A served log (candor serve --log-records) or any records file.")
    ] = None,
    store: StoreOpt = None,
    host: Annotated[str | None, typer.Option(help="The page's address (127.0.0.1: this machine only).")] = None,
    port: Annotated[
        int | None, typer.Option(help=f"The page's port ({DEFAULT_LABEL_PORT}; 0 picks a free one).")
    ] = None,
    judge_model: Annotated[
        str | None, typer.Option("--judge-model", help="Label with this LLM as judge (no reference) instead of a page.")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help="--judge-model on an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
    ] = None,
    audit: Annotated[
        int | None,
        typer.Option(
            "--audit",
            help="Label a uniformly random sample of N answered choices (seeded by --seed); labels are 'audit' ones.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the --audit sample.")] = 0,
) -> None:
    """Mark served answers correct or wrong on a local page (keys 1/2/0, arrows), or with an LLM judge."""
    from candor.annotation.labelling import LabelServer, judge_labels

    source = served_source(records, store)
    if audit is not None and audit < 1:
        raise CandorError(f"--audit draws at least 1 answer, got {audit}")
    if judge_model is None:
        if base_url is not None:
            raise CandorError("--base-url is the judge's server: give it with --judge-model")
        page_port = DEFAULT_LABEL_PORT if port is None else port
        server = LabelServer(source, host or "127.0.0.1", page_port, audit=audit, seed=seed).start()
        what = f"an audit of {server.queue.total()} answers from {source}" if audit is not None else str(source)
        typer.echo(f"labelling {what}: open {server.url} (Ctrl-C to stop; labels are saved as you make them)")
        server.wait()
        return
    if host is not None or port is not None:
        raise CandorError("--host and --port are the page's: a --judge-model run serves no page")
    if audit is not None:
        raise CandorError("--audit is a sample for a person to label: a --judge-model run labels every answer")
    from candor.backends import load_backend

    backend = load_backend(judge_model, "openai" if base_url else "hf", base_url=base_url)
    report = judge_labels(source, backend, judge_model)
    agreement = (
        "no human labels to compare with"
        if report.agreement is None
        else (f"agreement with the {report.compared} human labels: {report.agreement:.1%}")
    )
    typer.echo(f"judge:{judge_model} labelled {report.labelled} answers; {agreement}")


@user_errors
def adapt(
    records: Annotated[
        Path | None, typer.Argument(help="The served log (candor serve --log-records) with its labels.")
    ] = None,
    store: StoreOpt = None,
    honest: Annotated[
        Path | None, typer.Option("--honest", help="The served honest-model folder to start from (required).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="The new honest-model folder (may be --honest itself; required).")
    ] = None,
    alpha: Annotated[float, typer.Option(help="Certify an answered error rate of at most this.")] = 0.1,
    delta: Annotated[
        float,
        typer.Option(
            help="... with probability at least 1 - delta; also the level of the held-out comparison with the served "
            "model that marks the new folder promotable or kept."
        ),
    ] = 0.1,
    holdout: Annotated[float, typer.Option(help="Share of the labels held out from stage 2 for the threshold.")] = 0.5,
    k: Annotated[int, typer.Option(help="Samples regenerated per served question that was logged without any.")] = 5,
    seed: Annotated[int, typer.Option(help="Seeds the label split and training.")] = 0,
    label_sources: Annotated[
        str | None,
        typer.Option(
            "--label-sources",
            help="Learn and certify only from labels of these sources: a comma list, patterns allowed "
            "(human,judge:*). Default: human,audit (the labels a person made).",
        ),
    ] = None,
    system_prompt_file: Annotated[
        Path | None,
        typer.Option(
            "--system-prompt-file",
            help="The deployment's system prompt (UTF-8 text, trailing whitespace ignored): refuse (exit 2) unless "
            "stage-2 labels were asked with exactly it and no earlier turn. Without it too, the new model is "
            "calibrated for the request shapes its stage-2 labels came from, this system prompt's included.",
        ),
    ] = None,
    export: Annotated[
        str | None, typer.Option("--export", help="seq-cls: also export the new head for a classify server.")
    ] = None,
    export_dir: Annotated[
        Path | None, typer.Option("--export-dir", help="Where --export writes (default: OUT-cls beside OUT).")
    ] = None,
) -> None:
    """Recalibrate a served model on its own labelled traffic: stage 1 on every served question, stage 2 on the
    labels, the threshold by risk control on labels held out from stage 2 (refused, exit 2, when too few). The new
    folder is marked promotable only when the adapted head ranks the held-out labels better than the served model
    (paired by question, at level delta), else kept: reload refuses a kept folder unless forced, and a kept model is
    never written over --honest (exit 1)."""
    from candor.annotation.label_selection import DEFAULT_LABEL_SOURCES, parse_label_sources
    from candor.serve.adaptation import AdaptSettings
    from candor.serve.adaptation import adapt as run_adapt
    from candor.serve.shapes import read_system_prompt

    source = served_source(records, store)
    if honest is None or out is None:
        raise CandorError("candor adapt needs --honest DIR (the served model) and --out DIR (the new one)")
    if export is not None and export not in EXPORTS:
        raise CandorError(f"--export {export!r}: unknown format; known: {', '.join(EXPORTS)}")
    if export_dir is not None and export is None:
        raise CandorError("--export-dir needs --export seq-cls")
    settings = AdaptSettings(
        alpha=alpha,
        delta=delta,
        holdout=holdout,
        k=k,
        seed=seed,
        label_sources=DEFAULT_LABEL_SOURCES if label_sources is None else parse_label_sources(label_sources),
        system_prompt=None if system_prompt_file is None else read_system_prompt(system_prompt_file),
    )
    summary = run_adapt(source, honest, out, settings)
    typer.echo(_adapt_report(summary))
    if summary["folder"] is None:  # kept, and --out is the served folder: nothing was written
        raise typer.Exit(1)
    if export is not None:
        typer.echo(_export_seq_cls(out, export_dir or out.with_name(out.name + "-cls"), summary["threshold"]["value"]))
        if summary["promotion"]["status"] != "promotable":
            typer.echo(
                "the exported head is the kept one: start a classify server on it only if you mean to (no check)"
            )


def _adapt_report(summary: dict) -> str:
    return _counts_report(summary) + "\n" + _promotion_report(summary)


def _promotion_report(summary: dict) -> str:
    """The held-out comparison with the model served, and what was written: promotable, kept, or nothing."""
    from candor.serve.promotion import PROMOTABLE, Comparison

    comparison = Comparison(**summary["promotion"])
    line = f"against the model it was adapted from: {comparison.words()}"
    folder = summary["folder"]
    if folder is None:
        return (
            f"{line}\nnot written: --out is the served folder --honest, and a kept model never replaces it "
            "(write it elsewhere with --out to keep it)"
        )
    written = f"wrote {folder} (version {summary['version']}; what it did: {folder}/adapt.json)"
    if comparison.status == PROMOTABLE:
        serve = f"serve it: candor serve --honest {shlex.quote(folder)} (or reload a running server)"
        return f"{line}\n{written}, marked promotable\n{serve}"
    return f'{line}\n{written}, marked kept: POST /admin/reload refuses it unless the body says "force": true'


def _counts_report(summary: dict) -> str:
    counts, held, labels = summary["counts"], summary["held_out"], summary["labels"]
    return (
        f"adapted {counts['served_questions']} served questions ({counts['samples_regenerated_for']} resampled), "
        f"{counts['labels_used']} labels used: {counts['stage2_labels']} for stage 2, "
        f"{counts['held_out_labels']} held out ({counts['held_out_answered']} answered at the threshold)\n"
        f"labels by source (trusted: {','.join(labels['trusted_sources'])}): {_by_source(labels['by_source'])}\n"
        f"held-out AUROC {_fmt(held['auroc'])}, ECE {_fmt(held['ece'])}\n"
        f"calibrated for: {_shapes(summary['tuned_on'])}\n"
        f"guarantee: {summary['guarantee']}"
    )


def _shapes(tuned_on: list[str]) -> str:
    from candor.serve.shapes import shape_words

    return "; ".join(shape_words(s) for s in tuned_on)


def _by_source(by_source: dict[str, dict[str, int]]) -> str:
    """``human 40 used; feedback 14 ignored (14 untrusted_source)``."""
    parts = []
    for source, counts in by_source.items():
        ignored = {k: v for k, v in counts.items() if k != "used" and v}
        text = f"{source} {counts.get('used', 0)} used"
        if ignored:
            text += f", {sum(ignored.values())} ignored (" + ", ".join(f"{v} {k}" for k, v in ignored.items()) + ")"
        parts.append(text)
    return "; ".join(parts) or "none"


def _fmt(x: float | None) -> str:
    return "n/a (one class held out)" if x is None else f"{x:.3f}"


def _export_seq_cls(folder: Path, target: Path, threshold: float) -> str:
    from candor.serve.confidence_sources import HEAD_DIR
    from candor.serve.honest_folder import read_config
    from candor.train.elical.export import export_seq_cls

    result = export_seq_cls(folder / HEAD_DIR, target)
    model = read_config(folder)["generator"]["model"]
    cls = shlex.quote(str(target))
    return (
        f"exported the adapted head to {target} ({result.architecture}); restart the classify server on it:\n"
        f"  {result.vllm_command()} --port 8001\n"
        f"  # or, without vLLM: candor serve-head {cls} --port 8001\n"
        f"then serve with its threshold:\n"
        f"  candor serve --backend openai --model {shlex.quote(model)} --base-url http://127.0.0.1:8000/v1 "
        f"--confidence-url http://127.0.0.1:8001 --head {cls} --threshold {threshold:.6g}"
    )
