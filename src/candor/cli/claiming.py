"""``candor claims``: split answers into claims, label them, score and evaluate claim confidences."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from candor.cli.options import DEFAULT_MODEL, ModelOpt
from candor.cli.shared import comma_list, counted, invoked_command, user_errors
from candor.util.errors import CandorError

DEFAULT_METHODS = "claim-prob,claim-perplexity,claim-max-entropy,claim-ptrue"


@user_errors
def claims(
    records: Annotated[Path, typer.Option("--records", "-r", help="Records JSONL from `candor annotate`.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output folder (claims, claim confidences, metrics, report).")
    ],
    methods: Annotated[
        str, typer.Option("--methods", "-e", help="Comma-separated claim estimators, or 'list'.")
    ] = DEFAULT_METHODS,
    model: ModelOpt = DEFAULT_MODEL,
    decomposer: Annotated[
        str,
        typer.Option(help="How answers split into claims: sentence (no model) or llm (atomic facts by --judge-model)."),
    ] = "sentence",
    judge_model: Annotated[
        str | None,
        typer.Option(help="Model that labels claims of free answers (and writes the llm decomposer's facts)."),
    ] = None,
    bootstrap: Annotated[int, typer.Option(help="Resamples of answers for the intervals (0: none).")] = 1000,
    resplit: Annotated[bool, typer.Option(help="Split again even when the records already carry claims.")] = False,
    head: Annotated[
        Path | None,
        typer.Option(
            "--claim-head",
            "--head",
            help="A claim head folder (`candor train elical-claims`), read by the elical-claims method "
            "(the same option as `candor serve --claim-head`; --head is its older name).",
        ),
    ] = None,
) -> None:
    """Claim-level confidence for long answers (docs/claims.md).

    Records without claims are split (--decomposer). Claims are labelled by the
    gold aliases of compound prompts, else by --judge-model; records whose
    claims are already labelled keep their labels.
    """
    from candor.estimators.claim_scoring import claim_estimator_names

    if methods == "list":
        for name in claim_estimator_names():
            typer.echo(name)
        return
    names = comma_list(methods, "--methods")
    unknown = [n for n in names if n not in claim_estimator_names()]
    if unknown:
        raise CandorError(f"--methods: unknown claim estimator(s) {unknown}; `candor claims -e list` lists them")
    if decomposer == "llm" and judge_model is None:
        raise CandorError("--decomposer llm needs --judge-model (the model that writes the atomic facts)")
    if bootstrap < 0:
        raise CandorError(f"--bootstrap must be 0 or more, got {bootstrap}")
    options = _head_options(names, head)
    recs, backend = _prepared(records, names, model, decomposer, judge_model, resplit)
    from candor.evaluation.claim_report import write_claim_report

    metrics = write_claim_report(
        recs, names, out, backend, bootstrap=bootstrap, options=options, command=invoked_command()
    )
    from candor.annotation.records import write_records

    write_records(out / "claims.jsonl", recs)
    typer.echo(
        f"{counted(metrics['scored'], 'scored claim')} of {metrics['claims']} in "
        f"{counted(metrics['answers'], 'answer')}; wrote {out}"
    )
    for name, m in metrics["methods"].items():
        typer.echo(f"  {name}: AUROC {m['auroc']['value']}  ECE {m['ece']['value']}  PRR {m['prr']['value']}")


def _prepared(records: Path, names: list[str], model: str, decomposer: str, judge_model: str | None, resplit: bool):
    """The records with claims split and labelled, and the backend the methods need (None when none does)."""
    from candor.annotation.claim_labels import label_compound, label_free_claims
    from candor.annotation.claim_split import split_claims
    from candor.annotation.records import read_records
    from candor.backends import load_backend
    from candor.estimators.claim_scoring import get_claim_estimator

    recs = read_records(records)
    needs = any(getattr(get_claim_estimator(n, **_judge_free(n)), "needs_backend", False) for n in names)
    needs = needs or "claim-ccp" in names  # its default judge is the model itself
    backend = load_backend(model) if needs else None
    judge = load_backend(judge_model) if judge_model else None
    for rec in recs:
        if rec.claims is None or resplit:
            decode = backend.decode if backend is not None else None
            rec.claims = split_claims(
                rec.greedy.text,
                rec.greedy,
                decomposer,
                decode=decode,
                **({"backend": judge} if decomposer == "llm" else {}),
            )
    compound = [r for r in recs if r.item.meta.get("parts")]
    free = [r for r in recs if not r.item.meta.get("parts") and any(c.label is None for c in r.claims or [])]
    if compound:
        label_compound(compound)
    if free:
        if judge is None:
            raise CandorError(
                f"{records}: {counted(len(free), 'record')} with unlabelled claims and no gold per "
                "claim; pass --judge-model to label them"
            )
        label_free_claims(free, judge)
    return recs, backend


def _head_options(names: list[str], head: Path | None) -> dict[str, dict[str, str]]:
    """``--claim-head`` for the methods that read it; refused without such a method, and such a method refused
    without it."""
    from candor.estimators.claim_scoring import reads_claim_head

    readers = [n for n in names if reads_claim_head(n)]
    if head is None:
        if readers:
            raise CandorError(
                f"--methods {readers[0]} needs --claim-head DIR (a head from `candor train {readers[0]}`)"
            )
        return {}
    if not readers:
        raise CandorError("--claim-head is read only by a claim-head method (elical-claims); add it to --methods")
    if not head.is_dir():
        raise CandorError(f"--claim-head {head}: no such folder")
    return {name: {"head": str(head)} for name in readers}


def _judge_free(name: str) -> dict[str, str]:
    """Options that let an estimator be built without a model, to ask whether it needs one."""
    return {"judge": "lexical"} if name in ("claim-ccp", "claim-consistency") else {}


@user_errors
def claims_tune(
    confidences: Annotated[
        Path,
        typer.Option(
            "--confidences", "-c", help="claim_confidences.jsonl from `candor claims` on labelled dev answers."
        ),
    ],
    method: Annotated[str, typer.Option("--method", "-e", help="The claim estimator served with --claims.")],
    alpha: Annotated[
        float, typer.Option(help="The tolerated share of refined answers still holding a false claim, in (0, 1).")
    ],
    honest: Annotated[Path, typer.Option("--honest", help="The honest-model folder the guarantee is saved in.")],
    delta: Annotated[
        float | None,
        typer.Option(
            help="Risk control at level delta (the guarantee holds with probability ≥ 1 − delta over the dev "
            "draw); without it, split conformal (a marginal guarantee)."
        ),
    ] = None,
) -> None:
    """Tune the claim threshold of `candor serve --refine remove --factuality-alpha` (docs/claims.md).

    The threshold is chosen on the dev answers' labelled claims so that, if dev and served answers are
    exchangeable, a refined answer holds no false claim with probability at least 1 − alpha. It is
    saved, with its guarantee, in the honest folder (one per method and alpha; a new one replaces it).
    """
    from candor.estimators.claim_scoring import claim_estimator_names
    from candor.serve.factuality import labelled_claims, tune
    from candor.serve.honest_folder import add_factuality, read_config
    from candor.util.jsonl import iter_json_lines

    if method not in claim_estimator_names():
        raise CandorError(f"--method: unknown claim estimator {method!r}; `candor claims -e list` lists them")
    read_config(honest)  # a folder that is not an honest model is refused before any work
    rows = [row for _, row in iter_json_lines(confidences)]
    guarantee = tune(labelled_claims(rows, method), method, alpha, delta)
    version = add_factuality(honest, guarantee)
    typer.echo(
        f"{method} claim threshold {guarantee.threshold:.6g}: {guarantee.statement}; on dev, "
        f"{guarantee.dev_without_false:.1%} of refined answers without a false claim, "
        f"{guarantee.dev_claims_kept:.1%} of claims kept"
    )
    typer.echo(
        f"saved in {honest} (version {version}); serve it with --claims {method} --refine remove "
        f"--factuality-alpha {alpha:g}"
    )
