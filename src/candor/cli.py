"""The ``candor`` command line: parse, call the library, print.

User mistakes surface as one line on stderr and exit code 2 (DESIGN.md §6.5).
"""

from __future__ import annotations

import functools
import logging
import os
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
                 "(default: float32 on CPU, bfloat16 on GPU)."),
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
) -> None:
    """Answer QA items greedily and k times, judge them, and write records JSONL."""
    from candor.annotation.builder import AnnotateConfig, Shard
    from candor.annotation.builder import annotate as run_annotate
    from candor.annotation.prompts import resolve_template
    from candor.backends import load_backend
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
    engine = dict(base_url=base_url, endpoint=endpoint, tokenizer=tokenizer, max_concurrency=max_concurrency,
                  max_retries=max_retries, api_key_env=api_key_env, tensor_parallel_size=tensor_parallel_size,
                  data_parallel_size=data_parallel_size, batch_size=batch_size, seed=seed, dtype=dtype)
    answering = load_backend(model, backend, **engine)
    judging = None
    if judge_model is not None:
        judge_engine = {**engine, "base_url": judge_base_url or base_url}
        judging = load_backend(judge_model, judge_backend or backend, **judge_engine)
    qa_template = resolve_template(template, model, answering)
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


@app.command("export")
@user_errors
def export_honestybench(
    records: Annotated[Path, typer.Argument(help="candor records JSONL.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL with HonestyBench field names.")],
) -> None:
    """Export records with the released HonestyBench field names."""
    from candor.annotation.records import read_records, to_honestybench
    from candor.util.jsonl import write_json_lines

    recs = read_records(records)
    write_json_lines(out, (to_honestybench(r) for r in recs))
    typer.echo(f"exported {len(recs)} records to {out}")


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
    records: Annotated[Path, typer.Option("--records", "-r", help="Records JSONL from `candor annotate`.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Confidences JSONL (columns made exactly as this run would are reused).")
    ],
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
    force: Annotated[bool, typer.Option(help="Recompute methods already in --out.")] = False,
) -> None:
    """Turn records into confidences with any registered estimators.

    With --adapter the model-based estimators score with the fine-tuned model;
    write its confidences to their own --out file so they stay apart from the
    base model's.
    """
    from candor.annotation.records import read_records
    from candor.estimators import ESTIMATORS, get_estimator
    from candor.estimators.confidences import score_into

    if estimators == "list":
        for name in ESTIMATORS.names():
            typer.echo(name)
        return
    names = [n.strip() for n in estimators.split(",") if n.strip()]
    options = parse_estimator_options(option or [], names)
    needs_model = any(get_estimator(n, **options.get(n, {})).needs_backend for n in names)
    backend = None
    if needs_model:
        from candor.backends import load_backend

        backend = load_backend(model, adapter=str(adapter) if adapter else None)
    recs = read_records(records)
    table = score_into(recs, names, out, backend, force=force, options=options)
    typer.echo(f"wrote {len(table.methods)} methods × {len(table.rows)} records to {out}")


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
) -> None:
    """Evaluate confidences: tables (Markdown, CSV, JSON), reliability and risk-coverage plots, histograms."""
    from candor.estimators.confidences import read_confidences
    from candor.evaluation.report import REPORT_METRICS, format_table_rich, roles_from_ood, write_report

    table = read_confidences(confidences)
    roles = roles_from_ood(table, ood.split(","), str(confidences))
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] or list(REPORT_METRICS)
    result = write_report(table, out_dir, roles=roles, n_bins=n_bins, bootstrap=bootstrap, metrics=chosen)
    _print_rich(format_table_rich(result))
    typer.echo(f"report: {result.files['index']}")


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
    from candor.train.trainers import TrainJob, parse_settings, run_training

    job = TrainJob(records=records, out=out, model=model, dev=dev, seed=seed, settings=parse_settings(setting or []),
                   tests=list(test or []))  # fmt: skip
    result = run_training(method, job)
    typer.echo(
        f"{method}: saved to {result.path} ({result.cost.get('wall_s', float('nan')):.0f} s, "
        f"peak {result.cost.get('peak_rss_mib', float('nan')):.0f} MiB)"
    )


@app.command()
@user_errors
def sweep(
    records: Annotated[Path, typer.Option("--records", "-r", help="Training pool records JSONL.")],
    test: Annotated[
        list[Path], typer.Option("--test", "-t", help="Test records JSONL (one or more datasets; repeatable).")
    ],
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Folder for heads, curve.json and the plot.")],
    dev: Annotated[Path | None, typer.Option(help="Dev records (default: carved from --records).")] = None,
    budgets: Annotated[str, typer.Option(help="Comma-separated label budgets; 'all' = the whole pool.")] = (
        "100,250,500,1000,all"
    ),
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    ood: Annotated[str, typer.Option(help="Comma-separated out-of-domain datasets in --test.")] = "",
    mode: Annotated[str, typer.Option(help="head (frozen backbone, cached features) or lora.")] = "head",
    model: ModelOpt = DEFAULT_MODEL,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the intervals.")] = 200,
) -> None:
    """EliCal's label-budget curve: Cal-Only and EliCal at each budget and seed (AUROC, ECE, Alignment)."""
    from candor.annotation.contamination import HeldOutQuestions
    from candor.annotation.records import read_records
    from candor.train.elical import EliCalConfig, carve_dev, parse_budget
    from candor.train.elical.sweep import SweepData, run_sweep

    budget_list = [parse_budget(b) for b in _comma_list(budgets, "--budgets")]
    seed_list = [_integer(s, "--seeds") for s in _comma_list(seeds, "--seeds")]
    config = EliCalConfig(mode=mode, model=model, feature_cache=str(out_dir / "features"))
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
    result = run_demo(out_dir, model=model, k=k, limit=limit, estimators=names)
    _print_rich(format_table_rich(result.report))
    typer.echo(f"report: {result.report.files['index']}")


def _print_rich(renderable: Any) -> None:
    from rich.console import Console

    Console().print(renderable)


@app.command()
@user_errors
def datasets(data_dir: DataDirOpt = None) -> None:
    """List the named datasets and where they resolve."""
    from candor.data import describe_datasets

    for line in describe_datasets(data_dir):
        typer.echo(line)


HonestOpt = Annotated[Path | None, typer.Option("--honest", help="A saved honest-model folder (HonestModel).")]
HeadOpt = Annotated[Path | None, typer.Option("--head", help="A trained EliCal head folder (decides first).")]
AdapterOpt = Annotated[
    Path | None, typer.Option("--adapter", help="An ADVICE/ConfTuner adapter folder: answer-level confidence.")
]
MethodOpt = Annotated[str | None, typer.Option("--method", help="A confidence estimator name (default n-prob).")]
ThresholdOpt = Annotated[float | None, typer.Option("--threshold", help="Abstain below this confidence.")]
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
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    max_new_tokens: Annotated[int, typer.Option(help="Answer length cap in tokens.")] = 32,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """Answer one question with a confidence, abstaining below the threshold."""
    import json

    from candor.serve.factory import build_model

    honest_model = build_model(model, backend=backend, honest=honest, head=head, adapter=adapter, method=method,
                               threshold=threshold, max_new_tokens=max_new_tokens, base_url=base_url)  # fmt: skip
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
    backend: BackendOpt = "hf",
    base_url: BaseUrlOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model_id: Annotated[str, typer.Option(help="The model name clients send.")] = "candor",
    api_key_env: Annotated[
        str, typer.Option(help="Environment variable holding the API key; unset means no key is required.")
    ] = "CANDOR_API_KEY",
    refusal: Annotated[str, typer.Option(help="The text of an abstained answer.")] = "I don't know.",
    queue_size: Annotated[int, typer.Option(help="Requests waiting before 503.")] = 64,
    max_batch: Annotated[int, typer.Option(help="Requests per batched forward pass (1 turns batching off).")] = 16,
    batch_wait_ms: Annotated[float, typer.Option(help="How long a batch waits to fill.")] = 5.0,
    max_new_tokens: Annotated[int, typer.Option(help="Default answer length cap in tokens.")] = 32,
) -> None:
    """An OpenAI-compatible service: answers carry a confidence and abstain when unsure."""
    import importlib.util

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise CandorError("candor serve needs fastapi and uvicorn: pip install 'candor[serve]'")
    from candor.serve.app import ServeSettings, create_app
    from candor.serve.factory import build_model
    from candor.serve.server import run

    key = os.environ.get(api_key_env) or None
    if key is None:
        logging.getLogger("candor.serve").warning("no API key in $%s: the server accepts every request", api_key_env)
    honest_model = build_model(model, backend=backend, honest=honest, head=head, adapter=adapter, method=method,
                               threshold=threshold, max_new_tokens=max_new_tokens, batch_size=max_batch,
                               base_url=base_url)  # fmt: skip
    settings = ServeSettings(model_id=model_id, api_key=key, refusal=refusal, queue_size=queue_size,
                             max_batch=max_batch, batch_wait_ms=batch_wait_ms)  # fmt: skip
    run(create_app(honest_model, settings), host=host, port=port)


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
