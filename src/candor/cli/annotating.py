"""Commands on records: ``annotate``, ``merge``, ``rejudge``, ``import``, ``export``, ``import-head``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from candor.cli.options import (
    DEFAULT_MODEL,
    ApiKeyEnvOpt,
    BackendOpt,
    BaseUrlOpt,
    ConcurrencyOpt,
    DataDirOpt,
    DataParallelOpt,
    DtypeOpt,
    EndpointOpt,
    ModelOpt,
    RetriesOpt,
    TensorParallelOpt,
    TokenizerOpt,
)
from candor.cli.shared import invoked_command, user_errors
from candor.util.errors import CandorError


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
    workers: Annotated[
        int,
        typer.Option(
            help="hf on CPU: annotate in N processes, one shard and 1/N of the cores each, merged into --out "
            "(shards kept in OUT.parts/ to resume; memory: one model per worker)."
        ),
    ] = 1,
    engine: Annotated[
        str,
        typer.Option(
            help="local: this process (and --workers); ray: a Ray Data pipeline (--backend openai: a server fleet, "
            "--backend vllm: vLLM inside Ray), shards in OUT.parts/ merged into --out."
        ),
    ] = "local",
    ray_url: Annotated[
        list[str] | None,
        typer.Option(help="--engine ray: an OpenAI-compatible server of the fleet (repeat; default --base-url)."),
    ] = None,
    ray_concurrency: Annotated[
        int, typer.Option(help="--engine ray: generation actors (openai) or vLLM replicas (vllm).")
    ] = 1,
    ray_address: Annotated[
        str | None, typer.Option(help="--engine ray: the cluster (e.g. auto, or ray://HOST:10001); default: local.")
    ] = None,
    ray_inflight: Annotated[
        int | None,
        typer.Option(
            help="--engine ray --backend openai: questions each server has in flight at once (default 8; "
            "raise it for servers that batch, e.g. vLLM)."
        ),
    ] = None,
) -> None:
    """Answer QA items greedily and k times, judge them, and write records JSONL."""
    from candor.annotation.builder import AnnotateConfig, Shard
    from candor.annotation.builder import annotate as run_annotate
    from candor.annotation.prompts import resolve_template
    from candor.annotation.workers import BackendRecipe, annotate_with_workers
    from candor.backends.base import SamplingParams
    from candor.data import load_items

    # Every option is checked before the model loads, so a typo fails fast.
    shard_spec = Shard.parse(shard) if shard else None
    if template != "auto":
        resolve_template(template, model)
    if limit is not None and limit < 1:
        raise CandorError(f"--limit {limit} leaves no question to annotate; give a positive count (or no --limit)")
    if k < 0:
        raise CandorError(f"--k {k}: the number of sampled answers cannot be negative")
    items = load_items(data, data_dir=data_dir, limit=limit, strict=strict)
    if not items:
        raise CandorError(f"{data}: no questions to annotate")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)
    config = AnnotateConfig(
        k=k, params=params, correctness_judge=judge, consistency_judge=consistency, seed=seed, batch_size=batch_size
    )
    _check_dtype(dtype, backend)
    options = dict(
        base_url=base_url,
        endpoint=endpoint,
        tokenizer=tokenizer,
        max_concurrency=max_concurrency,
        max_retries=max_retries,
        api_key_env=api_key_env,
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        batch_size=batch_size,
        seed=seed,
        dtype=dtype,
    )
    recipe = BackendRecipe(
        model=model,
        backend=backend,
        options=options,
        template=template,
        judge_model=judge_model,
        judge_backend=judge_backend,
        judge_options={**options, "base_url": judge_base_url or base_url},
    )
    if workers != 1 and shard_spec is not None:
        raise CandorError("--workers splits the input into shards itself; use it without --shard")
    ray_options = _ray_options(
        engine, ray_url, ray_concurrency, ray_address, ray_inflight, workers, shard_spec, options, backend
    )
    try:
        if ray_options is not None:
            from candor.annotation.ray_pipeline import annotate_with_ray

            result = annotate_with_ray(items, recipe, out, config, ray_options)
        elif workers != 1:
            result = annotate_with_workers(items, recipe, out, config, workers)
        else:
            answering, judging, qa_template = recipe.load()
            result = run_annotate(items, answering, out, qa_template, config, shard=shard_spec, judge_backend=judging)
    except KeyboardInterrupt:
        _say_how_to_resume(out, workers, ray=ray_options is not None)
        raise typer.Exit(130) from None
    _print_annotation_summary(result.path)


ENGINES = ("local", "ray")


def _ray_options(
    engine: str,
    urls: list[str] | None,
    concurrency: int,
    address: str | None,
    inflight: int | None,
    workers: int,
    shard: object,
    options: dict,
    backend: str,
) -> object | None:
    """The Ray pipeline's options for ``--engine ray`` (None: local); its options without it are refused."""
    if engine not in ENGINES:
        raise CandorError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if engine == "local":
        given = [
            name
            for name, value in (("--ray-url", urls), ("--ray-address", address), ("--ray-inflight", inflight))
            if value is not None and value != []
        ]
        if concurrency != 1:
            given.append("--ray-concurrency")
        if given:
            raise CandorError(f"{', '.join(given)} apply to --engine ray")
        return None
    if workers != 1 or shard is not None:
        raise CandorError("--engine ray spreads the work itself; use it without --workers and --shard")
    if options.get("data_parallel_size"):
        raise CandorError("--engine ray: vLLM replicas are --ray-concurrency, not --data-parallel-size")
    if inflight is not None and backend != "openai":
        raise CandorError("--ray-inflight applies to --backend openai (a fleet of servers)")
    from candor.annotation.ray_pipeline import DEFAULT_INFLIGHT, RayOptions

    return RayOptions(
        inflight=DEFAULT_INFLIGHT if inflight is None else inflight,
        urls=tuple(urls or ()),
        concurrency=concurrency,
        tensor_parallel_size=options.get("tensor_parallel_size") or 1,
        address=address,
        batch_size=options["batch_size"],
    )


def _say_how_to_resume(out: Path, workers: int, *, ray: bool = False) -> None:
    """After Ctrl-C: what was saved, and the command that resumes (the same one)."""
    parts = sorted(Path(f"{out}.parts").glob("*.jsonl"))
    files = [out, *parts] if ray else parts if workers != 1 else [out]
    saved = sum(_count_lines(f) for f in files)
    where = f"{out} and {out}.parts/" if ray else f"{out}.parts/" if workers != 1 else str(out)
    typer.secho(
        f"interrupted: {saved} finished records are saved in {where}; resume with the same command:\n"
        f"  {invoked_command()}",
        fg=typer.colors.YELLOW,
        err=True,
    )


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


DTYPES = ("auto", "float32", "bfloat16", "float16")


def _check_dtype(dtype: str | None, backend: str) -> None:
    """--dtype is a name candor knows, for a backend that loads weights (a server chose its own)."""
    if dtype is None:
        return
    if dtype not in DTYPES:
        raise CandorError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if backend not in ("hf", "vllm"):
        raise CandorError(
            f"--dtype applies to the hf and vllm backends, which load the weights; "
            f"the {backend} backend's server chose its own"
        )


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
        sampled = any(r.sample_correct for r in recs)  # with --k 0 there is nothing to average: n/a, not 0
        sample_acc = f"{sum(r.sample_accuracy for r in recs if r.sample_correct) / n:.3f}" if sampled else "n/a"
        consistent = any(r.consistency for r in recs)
        cons = f"{sum(r.consistency_rate for r in recs if r.consistency) / n:.3f}" if consistent else "n/a"
        table.add_row(name, str(n), f"{acc:.3f}", sample_acc, cons)
    Console(stderr=False).print(table)


@user_errors
def merge(
    shards: Annotated[list[Path], typer.Argument(help="Shard record files from `annotate --shard`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Merged records JSONL.")],
) -> None:
    """Merge shard record files into one file, in input order."""
    from candor.annotation.builder import merge_shards

    n = merge_shards(shards, out)
    typer.echo(f"merged {n} records from {len(shards)} shards into {out}")


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
    return (
        f"exported the EliCal head {source} ({result.mode} mode) to {out} as {result.architecture} "
        "(num_labels=1)\n"
        f"its raw logit lacks the head's bias {result.logit_bias:+.6f}; serve it with the exact confidence:\n"
        f"  {result.vllm_command()}\n"
        f"inputs are prompts rendered with the {result.template!r} template"
    )


# --to FORMAT -> (source, out, dtype) -> summary line(s): what `candor export` can write.
EXPORT_FORMATS: dict[str, Callable[[Path, Path, str | None], str]] = {
    "honestybench": _export_honestybench,
    "seq-cls": _export_seq_cls,
}


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
    typer.echo(
        f"imported a {config.mode} head on {config.backbone} (template {config.template!r}) into {out}\n"
        f"score with: candor score -r RECORDS -o OUT -e elical -O elical.head={out}"
    )


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
