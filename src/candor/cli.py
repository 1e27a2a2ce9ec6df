"""The ``candor`` command line: parse, call the library, print.

User mistakes surface as one line on stderr and exit code 2 (DESIGN.md §6.5).
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys

# Before torch loads: OpenMP threads that spin while waiting made every forward
# pass 5-6x slower on a 2-core machine shared with other processes (measured in
# benchmarks/annotate_throughput.py); passive waiting costs nothing when idle.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from candor.util.errors import CandorError
from candor.util.version import install_hint

app = typer.Typer(
    help="candor: make language models honest about what they know.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_MODEL = "smollm2-135m"

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Embedded name, Hugging Face id or local path.")]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Folder of HonestyBench files for named datasets.")
]

# Engine options shared by commands that load a model (each backend takes the ones it knows).
BackendOpt = Annotated[str, typer.Option("--backend", help="Engine: hf, vllm or openai (a server at --base-url).")]
BaseUrlOpt = Annotated[
    str | None, typer.Option(help="openai backend: the server's address, e.g. http://127.0.0.1:8000/v1.")
]
EndpointOpt = Annotated[str | None, typer.Option(help="openai backend: completions (default) or chat.")]
TokenizerOpt = Annotated[
    str | None, typer.Option(help="openai backend: the served model's tokenizer (chat template, token ids).")
]
ConcurrencyOpt = Annotated[int | None, typer.Option(help="openai backend: requests in flight at once (8).")]
RetriesOpt = Annotated[int | None, typer.Option(help="openai backend: retries on 429/5xx/dropped connections (5).")]
ApiKeyEnvOpt = Annotated[
    str | None, typer.Option(help="openai backend: environment variable holding the API key (OPENAI_API_KEY).")
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(help="hf and vllm backends: the weights' dtype: auto, float32, bfloat16 or float16 "
                 "(default: float32 on CPU, bfloat16 on GPU). On a CPU, bfloat16 is fast only with "
                 "AVX512-BF16 or AMX; elsewhere it is slower than float32, and a warning says so."),
]
TensorParallelOpt = Annotated[int | None, typer.Option(help="vllm backend: tensor-parallel GPUs.")]
DataParallelOpt = Annotated[int | None, typer.Option(help="vllm backend: data-parallel replicas.")]


def user_errors(fn: F) -> F:
    """Print CandorError as one line and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CandorError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


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


@app.command()
@user_errors
def annotate(
    data: Annotated[str, typer.Option("--data", "-d", help="Dataset name (see `candor datasets`) or file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Records JSONL to write (resumed if present).")],
    model: ModelOpt = DEFAULT_MODEL,
    k: Annotated[int, typer.Option(help="Sampled answers per question.")] = 5,
    limit: Annotated[int | None, typer.Option(help="Only the first N questions.")] = None,
    shard: Annotated[str | None, typer.Option(help="i/n: annotate the i-th of n slices (0-based).")] = None,
    template: Annotated[str, typer.Option(help="Prompt template: auto, chat or fewshot.")] = "auto",
    judge: Annotated[str, typer.Option(help="Correctness judge: contains, exact, f1, llm.")] = "contains",
    consistency: Annotated[
        str, typer.Option(help="Consistency judge (see candor.annotation.judges).")
    ] = "lexical-echo",
    max_new_tokens: Annotated[int, typer.Option(help="Answer length cap in tokens.")] = 32,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling.")] = 0.95,
    top_k: Annotated[int, typer.Option(help="Top-k sampling.")] = 50,
    batch_size: Annotated[int, typer.Option(help="Questions per batch.")] = 16,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    data_dir: DataDirOpt = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse items with no non-empty answer alias instead of skipping them.")
    ] = False,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    endpoint: EndpointOpt = None,
    tokenizer: TokenizerOpt = None,
    max_concurrency: ConcurrencyOpt = None,
    max_retries: RetriesOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    tensor_parallel_size: TensorParallelOpt = None,
    data_parallel_size: DataParallelOpt = None,
    dtype: DtypeOpt = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Model for the llm judges (default: the answering model).")
    ] = None,
    judge_backend: Annotated[str | None, typer.Option(help="Backend for --judge-model (default: --backend).")] = None,
    judge_base_url: Annotated[
        str | None, typer.Option(help="Server for --judge-model on the openai backend (default: --base-url).")
    ] = None,
    workers: Annotated[int, typer.Option(
        help="hf on CPU: annotate in N processes, one shard and 1/N of the cores each, merged into --out "
             "(shards kept in OUT.parts/ to resume; memory: one model per worker).")] = 1,
) -> None:
    """Answer QA items greedily and k times, judge them, and write records JSONL."""
    from candor.annotation.builder import AnnotateConfig, Shard
    from candor.annotation.builder import annotate as run_annotate
    from candor.annotation.prompts import resolve_template
    from candor.annotation.workers import Engine, annotate_with_workers
    from candor.backends.base import SamplingParams
    from candor.data import load_items

    # Every option is checked before the model loads, so a typo fails fast.
    shard_spec = Shard.parse(shard) if shard else None
    if template != "auto":
        resolve_template(template, model)
    items = load_items(data, data_dir=data_dir, limit=limit, strict=strict)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)
    config = AnnotateConfig(k=k, params=params, correctness_judge=judge, consistency_judge=consistency,
                            seed=seed, batch_size=batch_size)
    _check_dtype(dtype, backend)
    options = dict(base_url=base_url, endpoint=endpoint, tokenizer=tokenizer, max_concurrency=max_concurrency,
                   max_retries=max_retries, api_key_env=api_key_env, tensor_parallel_size=tensor_parallel_size,
                   data_parallel_size=data_parallel_size, batch_size=batch_size, seed=seed, dtype=dtype)
    engine = Engine(model, backend, options, template, judge_model, judge_backend,
                    {**options, "base_url": judge_base_url or base_url})
    if workers != 1:
        if shard_spec is not None:
            raise CandorError("--workers splits the input into shards itself; use it without --shard")
        result = annotate_with_workers(items, engine, out, config, workers)
    else:
        answering, judging, qa_template = engine.load()
        result = run_annotate(items, answering, out, qa_template, config, shard=shard_spec, judge_backend=judging)
    _print_annotation_summary(result.path)


DTYPES = ("auto", "float32", "bfloat16", "float16")


def _check_dtype(dtype: str | None, backend: str) -> None:
    """--dtype is a name candor knows, for a backend that loads weights (a server chose its own)."""
    if dtype is None:
        return
    if dtype not in DTYPES:
        raise CandorError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if backend not in ("hf", "vllm"):
        raise CandorError(f"--dtype applies to the hf and vllm backends, which load the weights; "
                          f"the {backend} backend's server chose its own")


def _print_annotation_summary(path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from candor.annotation.records import read_records

    records = read_records(path)
    by_dataset: dict[str, list] = {}
    for rec in records:
        by_dataset.setdefault(rec.item.dataset, []).append(rec)
    table = Table(title=f"{path}: {len(records)} records")
    for col in ("dataset", "n", "greedy acc", "sample acc", "consistency"):
        table.add_column(col, justify="right" if col != "dataset" else "left")
    for name, recs in by_dataset.items():
        n = len(recs)
        acc = sum(r.greedy_correct or 0 for r in recs) / n
        sample_acc = sum(r.sample_accuracy for r in recs if r.sample_correct) / n
        cons = sum(r.consistency_rate for r in recs if r.consistency) / n
        table.add_row(name, str(n), f"{acc:.3f}", f"{sample_acc:.3f}", f"{cons:.3f}")
    Console(stderr=False).print(table)


@app.command()
@user_errors
def merge(
    shards: Annotated[list[Path], typer.Argument(help="Shard record files from `annotate --shard`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Merged records JSONL.")],
) -> None:
    """Merge shard record files into one file, in input order."""
    from candor.annotation.builder import merge_shards

    n = merge_shards(shards, out)
    typer.echo(f"merged {n} records from {len(shards)} shards into {out}")


@app.command()
@user_errors
def rejudge(
    records: Annotated[Path, typer.Option("--records", "-r", help="Records JSONL to judge again.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Records JSONL to write (may be --records itself).")],
    consistency: Annotated[
        str, typer.Option(help="Consistency judge (see candor.annotation.judges).")
    ] = "lexical-echo",
) -> None:
    """Recompute the samples' consistency verdicts with another judge, from the stored texts (no generation)."""
    from candor.annotation.records import read_records, write_records
    from candor.annotation.rejudge import rejudge_consistency

    recs = rejudge_consistency(read_records(records), consistency)
    write_records(out, recs)
    typer.echo(f"rejudged {len(recs)} records with {consistency} into {out}")


def _export_honestybench(source: Path, out: Path, dtype: str | None) -> str:
    from candor.annotation.records import read_records, to_honestybench
    from candor.util.jsonl import write_json_lines

    if dtype is not None:
        raise CandorError("--dtype applies to --to seq-cls only (records have no weights)")
    if (source / "elical_config.json").exists():
        raise CandorError(f"{source} is an EliCal head folder; export it with --to seq-cls")
    recs = read_records(source)
    write_json_lines(out, (to_honestybench(r) for r in recs))
    return f"exported {len(recs)} records to {out}"


def _export_seq_cls(source: Path, out: Path, dtype: str | None) -> str:
    from candor.train.elical.export import export_seq_cls

    result = export_seq_cls(source, out, dtype=dtype)
    return (f"exported the {result.mode} head {source} to {out} as {result.architecture} (num_labels=1)\n"
            f"its raw logit lacks the head's bias {result.logit_bias:+.6f}; serve it with the exact confidence:\n"
            f"  {result.vllm_command()}\n"
            f"inputs are prompts rendered with the {result.template!r} template")  # fmt: skip


# --to FORMAT -> (source, out, dtype) -> summary line(s): what `candor export` can write.
EXPORT_FORMATS: dict[str, Callable[[Path, Path, str | None], str]] = {
    "honestybench": _export_honestybench,
    "seq-cls": _export_seq_cls,
}


@app.command("export")
@user_errors
def export(
    source: Annotated[
        Path, typer.Argument(help="candor records JSONL (--to honestybench) or an EliCal head folder (--to seq-cls).")
    ],
    out_arg: Annotated[Path | None, typer.Argument(metavar="[OUT]", help="Where to write (or give --out).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where to write (or give OUT).")] = None,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="honestybench: records with the released HonestyBench field names (JSONL). "
            "seq-cls: an EliCal head as a transformers *ForSequenceClassification checkpoint (folder).",
        ),
    ] = "honestybench",
    dtype: Annotated[str | None, typer.Option(help="seq-cls: the weights' dtype (float32 by default).")] = None,
) -> None:
    """Export records (HonestyBench field names) or a trained EliCal head (a standard sequence classifier)."""
    if to not in EXPORT_FORMATS:
        raise CandorError(f"--to {to!r}: unknown export format; known: {', '.join(EXPORT_FORMATS)}")
    if (out_arg is None) == (out is None):
        raise CandorError("give where to write once: as OUT or as --out")
    typer.echo(EXPORT_FORMATS[to](source, out_arg or out, dtype))  # type: ignore[arg-type]


@app.command("import-head")
@user_errors
def import_head(
    lora_dir: Annotated[Path, typer.Argument(help="The authors' PEFT LoRA folder (e.g. lora_epoch_best/).")],
    vector_head: Annotated[
        Path, typer.Argument(help="The state dict of nn.Linear(hidden, 1) (e.g. vector_head_epoch_best.pt).")
    ],
    backbone: Annotated[str, typer.Option("--backbone", help="The model the head was trained on (id or path).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The candor head folder to write.")],
    template: Annotated[
        str, typer.Option(help="The prompt template the head reads (chat, fewshot; auto: the model's default).")
    ] = "auto",
    dtype: Annotated[str | None, typer.Option(help="The backbone's dtype while importing (float32 on CPU).")] = None,
) -> None:
    """Turn an EliCal head saved in the authors' layout (LoRA folder + linear head) into a candor head folder."""
    from candor.train.elical.model import HeadConfig
    from candor.train.elical.released import import_released_head

    import_released_head(lora_dir, vector_head, backbone, out, template=template, dtype=dtype)
    config = HeadConfig.read(out)
    typer.echo(f"imported a {config.mode} head on {config.backbone} (template {config.template!r}) into {out}\n"
               f"score with: candor score -r RECORDS -o OUT -e elical -O elical.head={out}")  # fmt: skip


@app.command("import")
@user_errors
def import_honestybench(
    source: Annotated[Path, typer.Argument(help="JSONL with HonestyBench field names.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="candor records JSONL.")],
    dataset: Annotated[str, typer.Option(help="Dataset name when the file has none (default: the file's stem).")] = "",
    strict: Annotated[
        bool, typer.Option(help="Refuse items with no non-empty answer alias instead of skipping them.")
    ] = False,
) -> None:
    """Import released HonestyBench annotations as candor records."""
    from candor.annotation.records import read_honestybench, write_records

    recs = read_honestybench(source, dataset, strict=strict)
    write_records(out, recs)
    typer.echo(f"imported {len(recs)} records into {out}")


@app.command()
@user_errors
def score(
    records: Annotated[
        Path | None, typer.Option("--records", "-r", help="Records JSONL from `candor annotate` (required).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Confidences JSONL (required; columns made exactly as this run would are "
                                         "reused)."),
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
    from candor.estimators import ESTIMATORS, get_estimator
    from candor.estimators.confidences import check_nothing_lost, score_into

    if estimators == "list":
        for name in ESTIMATORS.names():
            typer.echo(name)
        return
    missing = [flag for flag, value in (("--records", records), ("--out", out)) if value is None]
    if missing:
        raise CandorError(f"candor score needs {' and '.join(missing)} (only `-e list` runs without them)")
    assert records is not None and out is not None  # for the type checker: checked just above
    names = [n.strip() for n in estimators.split(",") if n.strip()]
    options = parse_estimator_options(option or [], names)
    needs_model = any(get_estimator(n, **options.get(n, {})).needs_backend for n in names)
    recs = read_records(records)
    check_nothing_lost(out, recs, force)  # before the model loads
    backend = None
    if needs_model:
        from candor.backends import load_backend

        backend = load_backend(model, adapter=str(adapter) if adapter else None)
    table = score_into(recs, names, out, backend, force=force, options=options)
    typer.echo(f"wrote {counted(len(table.methods), 'method')} × {counted(len(table.rows), 'record')} to {out}")


def counted(n: int, noun: str) -> str:
    """``1 method``, ``2 methods``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def parse_estimator_options(pairs: list[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """``["elical.head=dir", "verbal-10.examples=f.jsonl"]`` → ``{"elical": {"head": "dir"}, …}``.

    Values stay strings except integers and floats; an option for an
    estimator that is not being run is an error, not silently ignored.
    """
    options: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        name, dot, field = key.rpartition(".")
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


@app.command("eval")
@user_errors
def evaluate(
    confidences: Annotated[Path, typer.Option("--confidences", "-c", help="Confidences JSONL.")],
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Report folder.")],
    ood: Annotated[str, typer.Option(help="Comma-separated out-of-domain datasets (the rest are in-domain).")] = "",
    n_bins: Annotated[int, typer.Option(help="ECE bins.")] = 10,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for 95% intervals (0: none).")] = 0,
    metrics: Annotated[str, typer.Option(help="Comma-separated metrics (default: all the report's).")] = "",
    records: Annotated[
        Path | None,
        typer.Option("--records", "-r", help="The records behind the confidences: report.html then shows each "
                     "question, gold and answer, and the model, template and judges."),
    ] = None,
) -> None:
    """Evaluate confidences: tables (Markdown, CSV, JSON), plots, and report.html (all of it on one offline page)."""
    from candor.annotation.records import read_records
    from candor.estimators.confidences import read_confidences
    from candor.evaluation.report import REPORT_METRICS, format_table_rich, roles_from_ood, write_report

    table = read_confidences(confidences)
    roles = roles_from_ood(table, ood.split(","), str(confidences))
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] or list(REPORT_METRICS)
    recs = read_records(records) if records is not None else None
    if recs is not None and not {r.id for r in recs} & {row.id for row in table.rows}:
        raise CandorError(f"--records {records}: no record id matches a row of {confidences}")
    result = write_report(table, out_dir, roles=roles, n_bins=n_bins, bootstrap=bootstrap, metrics=chosen,
                          records=recs, command=invoked_command())
    _print_rich(format_table_rich(result))
    typer.echo(f"report: {result.files['index']}")
    typer.echo(f"page: {result.files['html']}")


def invoked_command() -> str:
    """The command line that is running, for a report's provenance."""
    return shlex.join(["candor", *sys.argv[1:]])


@app.command()
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


@app.command("train")
@user_errors
def train_command(
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
    from candor.train.elical.held_out import held_out_summary
    from candor.train.settings import parse_settings
    from candor.train.trainers import TrainJob, run_training

    job = TrainJob(records=records, out=out, model=model, dev=dev, seed=seed, settings=parse_settings(setting or []),
                   tests=list(test or []))  # fmt: skip
    result = run_training(method, job)
    typer.echo(
        f"{method}: saved to {result.path} ({result.cost.get('wall_s', float('nan')):.0f} s, "
        f"peak {result.cost.get('peak_rss_mib', float('nan')):.0f} MiB)"
    )
    if result.held_out is not None:
        typer.echo(held_out_summary(result.held_out))


@app.command()
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

    With --select, the stage-2 rule selection by held-out domains instead (DESIGN.md §4.4).
    """
    from candor.train.elical import Budget, EliCalConfig
    from candor.train.elical.selection import run_selection, selection_table
    from candor.train.elical.sweep import SweepData, run_sweep, sweep_table

    budget_list = [Budget.parse(b) for b in _comma_list(budgets, "--budgets")]
    seed_list = [_integer(s, "--seeds") for s in _comma_list(seeds, "--seeds")]
    config = EliCalConfig(mode=mode, model=model, feature_cache=str(out_dir / "features"))
    if select:
        if test or ood:
            raise CandorError("--select chooses a rule on training and dev data only; it takes no --test or --ood")
        names = _comma_list(rules, "--rules") if rules is not None else None
        result = run_selection(records, dev, held_out_dev or [], out_dir=out_dir, config=config, rules=names,
                               budgets=budget_list, seeds=seed_list)  # fmt: skip
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


def _comma_list(text: str, option: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise CandorError(f"{option} {text!r}: expected a comma-separated list, e.g. 0,1,2")
    return parts


def _integer(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CandorError(f"{option}: {text!r} is not an integer") from None


@app.command()
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
    report = run_diagnosis(recs, out_dir, model=model, adapter=str(adapter) if adapter else None,
                           config=config, cache_dir=out_dir / "cache")
    for name, summary in report.summary().items():
        headline = {k: summary[k] for k in ("share_jsd_le_0.1", "mean_jsd", "mask_shift") if k in summary}
        typer.echo(f"{name}: {json.dumps(headline)}")
    typer.echo(f"report: {report.files.get('md', out_dir)}")
    if "html" in report.files:
        typer.echo(f"page: {report.files['html']}")


@app.command()
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
) -> None:
    """The whole pipeline on the embedded default and the built-in starter set."""
    from candor.demo import DEMO_ESTIMATORS, run_demo
    from candor.evaluation.report import format_table_rich

    names = [n.strip() for n in estimators.split(",") if n.strip()] if estimators else DEMO_ESTIMATORS
    result = run_demo(out_dir, model=model, k=k, limit=limit, estimators=names, command=invoked_command())
    _print_rich(format_table_rich(result.report))
    typer.echo(f"report: {result.report.files['index']}")
    typer.echo(f"page: {result.report.files['html']}")
    typer.echo(f"honest model: {result.honest} (serve it: candor serve --honest {result.honest})")


def _print_rich(renderable: Any) -> None:
    from rich.console import Console

    Console().print(renderable)


@app.command()
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


HonestOpt = Annotated[Path | None, typer.Option("--honest", help="A saved honest-model folder (HonestModel).")]
HeadOpt = Annotated[Path | None, typer.Option("--head", help="A trained EliCal head folder (decides first).")]
AdapterOpt = Annotated[
    Path | None, typer.Option("--adapter", help="An ADVICE/ConfTuner adapter folder: answer-level confidence.")
]
MethodOpt = Annotated[str | None, typer.Option("--method", help="A confidence estimator name (default n-prob).")]
ThresholdOpt = Annotated[float | None, typer.Option("--threshold", help="Abstain below this confidence.")]
ConfidenceUrlOpt = Annotated[
    str | None,
    typer.Option("--confidence-url", help="A classify server (vLLM --runner pooling, or candor serve-head) serving "
                 "the exported head given with --head OUT: the confidence comes from there, no head weights load."),
]
SamplesOpt = Annotated[
    int | None,
    typer.Option("--samples", help="Sampled answers a sample-based --method reads (default: the method's own k)."),
]
BackendOpt = Annotated[str, typer.Option("--backend", help="The generator's engine (see candor.backends).")]


@app.command()
@user_errors
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    model: ModelOpt = DEFAULT_MODEL,
    honest: HonestOpt = None,
    head: HeadOpt = None,
    adapter: AdapterOpt = None,
    method: MethodOpt = None,
    threshold: ThresholdOpt = None,
    samples: SamplesOpt = None,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    confidence_url: ConfidenceUrlOpt = None,
    max_new_tokens: Annotated[int, typer.Option(help="Answer length cap in tokens.")] = 32,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """Answer one question with a confidence, abstaining below the threshold."""
    import json

    from candor.serve.factory import build_model
    from candor.serve.model import check_text

    if not question.strip():
        raise CandorError("the question is empty")  # refused as the server refuses it, before the model loads
    check_text(question, "the question")
    honest_model = build_model(model, backend=backend, honest=honest, head=head, adapter=adapter, method=method,
                               threshold=threshold, max_new_tokens=max_new_tokens, base_url=base_url,
                               samples=samples, confidence_url=confidence_url)  # fmt: skip
    result = honest_model.answer(question)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        return
    typer.echo(f"{'(abstained)' if result.abstained else result.answer}")
    typer.echo(f"confidence {result.confidence:.3f} ({result.method}{', calibrated' if result.calibrated else ''})"
               f" - {result.reason}")  # fmt: skip


@app.command()
@user_errors
def serve(
    model: ModelOpt = DEFAULT_MODEL,
    honest: HonestOpt = None,
    head: HeadOpt = None,
    adapter: AdapterOpt = None,
    method: MethodOpt = None,
    threshold: ThresholdOpt = None,
    samples: SamplesOpt = None,
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    confidence_url: ConfidenceUrlOpt = None,
    log_records: Annotated[
        Path | None,
        typer.Option("--log-records", help="Append every served answer to this JSONL file (candor records, with "
                     "the confidence), to re-score, re-judge or calibrate on later."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model_id: Annotated[str, typer.Option(help="The model name clients send.")] = "candor",
    api_key_env: Annotated[
        str, typer.Option(help="Environment variable holding the API key; unset means no key is required.")
    ] = "CANDOR_API_KEY",
    refusal: Annotated[str, typer.Option(help="The text of an abstained answer.")] = "I don't know.",
    queue_size: Annotated[int, typer.Option(help="Questions in flight (answering or waiting) before 503.")] = 64,
    max_batch: Annotated[int, typer.Option(help="Questions decoded together (1 turns batching off).")] = 16,
    batch_wait_ms: Annotated[
        float, typer.Option(help="How long a micro-batch waits to fill (backends without a live engine).")
    ] = 5.0,
    max_new_tokens: Annotated[int, typer.Option(help="Default answer length cap in tokens.")] = 32,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="A browser origin allowed by CORS (repeatable); none: no CORS."),
    ] = None,
    log_prompts: Annotated[
        bool, typer.Option("--log-prompts", help="Write each request's messages or prompt into the access log.")
    ] = False,
) -> None:
    """An OpenAI-compatible service: answers carry a confidence and abstain when unsure.

    Also /health, /ready, /metrics (Prometheus), an x-request-id on every response and one JSON
    access-log line per request on stderr; SIGTERM finishes in-flight requests and exits 0.
    """
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "prometheus_client")):
        raise CandorError(f"candor serve needs fastapi, uvicorn and prometheus-client: {install_hint('serve')}")
    from candor.serve.app import ServeSettings, create_app
    from candor.serve.factory import build_model
    from candor.serve.operations import check_cors_origins, send_access_log_to
    from candor.serve.server import run

    origins = tuple(cors_origin or ())
    check_cors_origins(origins)  # before the model loads

    key = os.environ.get(api_key_env) or None
    if key is None:
        logging.getLogger("candor.serve").warning("no API key in $%s: the server accepts every request", api_key_env)
    honest_model = build_model(model, backend=backend, honest=honest, head=head, adapter=adapter, method=method,
                               threshold=threshold, max_new_tokens=max_new_tokens, batch_size=max_batch,
                               base_url=base_url, samples=samples, confidence_url=confidence_url)  # fmt: skip
    if honest_model.threshold is None:
        logging.getLogger("candor.serve").warning(
            "no threshold: every question is answered and none abstains; pass --threshold or --honest DIR "
            "(a tuned folder, such as the one `candor demo` leaves in OUT_DIR/honest)"
        )
    settings = ServeSettings(model_id=model_id, api_key=key, refusal=refusal, queue_size=queue_size,
                             max_batch=max_batch, batch_wait_ms=batch_wait_ms, cors_origins=origins,
                             log_prompts=log_prompts, log_records=log_records)  # fmt: skip
    service = create_app(honest_model, settings)
    send_access_log_to(sys.stderr)
    run(service, host=host, port=port, on_signal=service.state.lifecycle.begin_draining)


@app.command("serve-head")
@user_errors
def serve_head(
    folder: Annotated[Path, typer.Argument(help="The folder `candor export HEAD --to seq-cls OUT` wrote.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    name: Annotated[
        str | None, typer.Option(help="The model name clients send (default: the folder, as vLLM names it).")
    ] = None,
) -> None:
    """Serve an exported EliCal head on vLLM's classify API (POST /classify), for engines without one.

    `candor serve --confidence-url http://HOST:PORT --head FOLDER` reads its confidence from here.
    """
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn")):
        raise CandorError(f"candor serve-head needs fastapi and uvicorn: {install_hint('serve')}")
    from candor.serve.classify_server import load_classify_app
    from candor.serve.server import run as run_server

    run_server(load_classify_app(folder, name), host=host, port=port)


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


if __name__ == "__main__":
    run()
