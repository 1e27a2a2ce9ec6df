"""``diagnose``: is a verbalized confidence grounded in the answer?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from candor.cli.options import DEFAULT_MODEL, ModelOpt
from candor.cli.shared import user_errors


@user_errors
def diagnose(
    records: Annotated[Path, typer.Option("--records", "-r", help="Records JSONL whose questions to diagnose.")],
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Report folder (Markdown, JSON, PNGs).")],
    model: ModelOpt = DEFAULT_MODEL,
    adapter: Annotated[Path | None, typer.Option(help="PEFT adapter to diagnose beside the base model.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="Verbalized format: letter or number.")] = "number",
    limit: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    candidates: Annotated[int, typer.Option(help="Candidate answers per question (at most).")] = 30,
    stages: Annotated[str, typer.Option(help="Comma-separated: sensitivity, masking, rollout, attribution.")] = (
        "sensitivity,masking,rollout,attribution"
    ),
    ig_steps: Annotated[int, typer.Option(help="Integrated-gradients steps.")] = 32,
    ig_examples: Annotated[int, typer.Option(help="Questions to attribute with integrated gradients.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed for borrowed candidate answers.")] = 0,
) -> None:
    """Is the verbalized confidence grounded in the answer? Sensitivity, masking, rollout, attributions."""
    import json

    from candor.annotation.records import read_records
    from candor.diagnose import DiagnoseConfig, run_diagnosis

    recs = read_records(records)[:limit]
    config = DiagnoseConfig(
        fmt=fmt,
        max_candidates=candidates,
        seed=seed,
        stages=tuple(s.strip() for s in stages.split(",") if s.strip()),
        ig_steps=ig_steps,
        ig_examples=ig_examples,
    )
    report = run_diagnosis(
        recs,
        out_dir,
        model=model,
        adapter=str(adapter) if adapter else None,
        config=config,
        cache_dir=out_dir / "cache",
    )
    for name, summary in report.summary().items():
        headline = {k: summary[k] for k in ("share_jsd_le_0.1", "mean_jsd", "mask_shift") if k in summary}
        typer.echo(f"{name}: {json.dumps(headline)}")
    typer.echo(f"report: {report.files.get('md', out_dir)}")
    if "html" in report.files:
        typer.echo(f"page: {report.files['html']}")
