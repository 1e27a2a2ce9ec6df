"""The typer app: logging, the table of commands in the order ``--help`` lists them, the console script."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from candor.cli import adapting, annotating, claiming, diagnosing, getting_started, scoring, serving, training

app = typer.Typer(
    help="candor: make language models honest about what they know.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command name -> function, in the order `candor --help` lists them (the pipeline's order).
COMMANDS: dict[str, Callable[..., Any]] = {
    "annotate": annotating.annotate,
    "merge": annotating.merge,
    "rejudge": annotating.rejudge,
    "export": annotating.export,
    "import-head": annotating.import_head,
    "import": annotating.import_honestybench,
    "score": scoring.score,
    "eval": scoring.eval_command,
    "calibrate": scoring.calibrate,
    "claims": claiming.claims,
    "claims-tune": claiming.claims_tune,
    "train": training.train,
    "sweep": training.sweep,
    "diagnose": diagnosing.diagnose,
    "demo": getting_started.demo,
    "datasets": getting_started.datasets,
    "model-path": getting_started.model_path,
    "ask": serving.ask,
    "serve": serving.serve,
    "serve-head": serving.serve_head,
    "label": adapting.label,
    "adapt": adapting.adapt,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(_command)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # transformers is chatty at INFO; keep our own messages readable.
    for noisy in ("transformers", "httpx", "urllib3", "datasets", "filelock", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(argv: list[str] | None = None) -> None:
    """The console script: like ``app()``, but a usage error (unknown option, a value of the wrong
    type, a missing argument) is one line on stderr and exit 2, as every other user mistake is."""
    try:
        code = app(args=argv, standalone_mode=False)
    except Exception as exc:  # click's usage errors carry their own message and exit code
        if not hasattr(exc, "format_message"):
            raise
        typer.secho(f"error: {exc.format_message()}", fg=typer.colors.RED, err=True)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)
