"""``candor annotate --engine ray``: the builder's records, made by a Ray Data pipeline.

The stages: read the items (the loaders' own, so an unjudgeable row is
skipped and counted as today) → render each prompt with the run's template →
generate the greedy answer and ``k`` samples → judge them (the llm judge on
its own server is one more HTTP stage) → records. The driver consumes the
stream a batch at a time and writes each batch as a shard file under
``<out>.parts/``, atomically (a temporary file, fsync, a rename), so a
killed driver loses at most the batches in flight. When the stream ends the
shards, and what ``out`` held before, are merged into ``out`` in input order
(atomically), and the shards are removed. A rerun skips the items whose
records exist in ``out`` or in a shard, after checking, as the builder does,
that they were made with the same settings for the same questions.

Two generation stages, chosen by ``--backend``:

- ``openai``: a pool of ``--ray-concurrency`` actors, each holding candor's own
  :class:`candor.backends.openai.OpenAIBackend` for every server of the fleet
  (``--ray-url``, repeatable; else ``--base-url``) and splitting its batch
  across them. Not ``ray.data.llm``'s ``HttpRequestProcessorConfig``: that
  stage sends one JSON body per row to one URL and hands back the raw reply,
  so a record's greedy answer plus ``k`` seeded samples would be ``k + 1``
  rows regrouped by a shuffle (an all-to-all barrier that ends streaming,
  and with it the shard-per-batch resume), one URL per processor would need
  a balancer in front of a fleet, and the reply parsing that makes the
  records equal to ``--backend openai``'s (the capability probe, servers
  that ignore ``n`` or ``top_k``, stop strings a server ignored, token
  counts, 31-bit request seeds) would be a second copy of the backend's.
  Calling the backend itself gives the same requests and the same parsing.
- ``vllm``: ``ray.data.llm``'s ``vLLMEngineProcessorConfig``, vLLM inside
  ``--ray-concurrency`` actors of ``--tensor-parallel-size`` GPUs each. Its
  rows carry one request each (the stage returns one output per request),
  so an item becomes ``k + 1`` rows, regrouped by id after the stage. The
  stage reports no finish reason, so those completions carry None. It needs
  vLLM in the Ray workers' environment and GPUs, and is not exercised on
  the CPU machines this project tests on.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from candor.annotation.builder import (
    AnnotateConfig,
    AnnotateResult,
    check_unique_ids,
    finished_ids,
    judge_records,
    make_judges,
    render_prompts,
    run_provenance,
    sampling_params,
)
from candor.annotation.prompts import QATemplate, resolve_template
from candor.annotation.records import Record, read_records, write_records
from candor.annotation.workers import BackendRecipe
from candor.backends import load_backend
from candor.backends.base import Completion, Generations, SamplingParams
from candor.backends.openai import sample_seeds
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.util.registry import Registry
from candor.util.version import install_hint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayOptions:
    """How the pipeline runs: the server fleet, the generation actors, the cluster and the batch size."""

    urls: tuple[str, ...] = ()
    concurrency: int = 1
    tensor_parallel_size: int = 1
    address: str | None = None
    batch_size: int = 16
    progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise CandorError(f"--ray-concurrency {self.concurrency}: need at least one generation actor")
        if self.tensor_parallel_size < 1:
            raise CandorError(f"--tensor-parallel-size {self.tensor_parallel_size}: need at least one GPU")
        if self.batch_size < 1:
            raise CandorError(f"--batch-size {self.batch_size}: must be >= 1")


@dataclass(frozen=True)
class Plan:
    """What every stage's actors receive: how to load the models, the config and the records' provenance."""

    recipe: BackendRecipe
    config: AnnotateConfig
    options: RayOptions
    template: str
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GenerationStage:
    """One kind of generation stage: its prompt renderer, and the stage that adds a ``gens`` column."""

    renderer: Callable[[BackendRecipe], Any]
    apply: Callable[[Any, Plan], Any]
    check: Callable[[BackendRecipe, AnnotateConfig, RayOptions], None]


GENERATION_STAGES: Registry[GenerationStage] = Registry("ray generation stage (--backend)")


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise CandorError(f"--engine ray needs Ray Data: {install_hint('ray')}") from None
    return ray


def parts_folder(out: Path) -> Path:
    """Where a Ray run keeps its shard files: ``<out>.parts/`` beside ``out``."""
    return out.with_name(out.name + ".parts")


def shard_files(out: Path) -> list[Path]:
    return sorted(parts_folder(out).glob("ray-*.jsonl"))


def annotate_with_ray(
    items: Sequence[QAItem],
    recipe: BackendRecipe,
    out: str | Path,
    config: AnnotateConfig,
    options: RayOptions,
) -> AnnotateResult:
    """Annotate ``items`` into ``out`` through a Ray Data pipeline, resuming what ``out`` and its shards hold."""
    out = Path(out)
    stage = GENERATION_STAGES.get(recipe.backend)
    stage.check(recipe, config, options)
    check_unique_ids(items)
    renderer = stage.renderer(recipe)
    template = resolve_template(recipe.template, recipe.model, renderer)
    judges = make_judges(config, _judge_backend(recipe, renderer))
    provenance = run_provenance(renderer, template, config, None, items, judges)
    done = finished_ids(out, provenance, items)
    for shard in shard_files(out):
        done |= finished_ids(shard, provenance, items)
    todo = [item for item in items if item.id not in done]
    logger.info("%s: %d items, %d already done, %d to annotate", out, len(items), len(items) - len(todo), len(todo))
    plan = Plan(recipe=recipe, config=config, options=options, template=template.name, provenance=provenance)
    written = _run(todo, plan, stage, out, already=len(items) - len(todo), total=len(items)) if todo else 0
    merged = merge_into(out, items)
    return AnnotateResult(out, written, merged - written, len(items))


def _judge_backend(recipe: BackendRecipe, renderer: Any) -> Any:
    """The backend the llm judges call: ``--judge-model``'s, else the answering one (the renderer's)."""
    if recipe.judge_model is not None:
        return load_backend(recipe.judge_model, recipe.judge_backend or recipe.backend, **recipe.judge_options)
    return renderer


def _run(todo: Sequence[QAItem], plan: Plan, stage: GenerationStage, out: Path, *, already: int, total: int) -> int:
    """Build the dataset, stream it, and write each batch of records as one shard; the records written."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=plan.options.address, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = plan.options.progress
    size = plan.options.batch_size
    rows = [{"id": item.id, "item": pickle.dumps(item)} for item in todo]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // size)))
    one = ray.data.ActorPoolStrategy(size=1)
    ds = ds.map_batches(RenderStage, fn_constructor_args=(plan,), batch_size=size, compute=one, num_cpus=0.5)
    ds = stage.apply(ds, plan)
    ds = ds.map_batches(JudgeStage, fn_constructor_args=(plan,), batch_size=size, compute=one, num_cpus=0.5)
    folder = parts_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=total, initial=already, desc="records", unit="q", disable=not plan.options.progress)
    written = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        records = [Record.from_dict(json.loads(line)) for line in batch["record"]]
        if records:
            write_records(folder / f"ray-{uuid.uuid4().hex}.jsonl", records)  # whole or not at all
        written += len(records)
        bar.update(len(records))
    bar.close()
    return written


def merge_into(out: Path, items: Sequence[QAItem]) -> int:
    """Put ``out``'s records and the shards' into ``out`` in input order (atomically), then drop the shards."""
    shards = shard_files(out)
    found: dict[str, Record] = {}
    for path in [out, *shards] if out.exists() else shards:
        for rec in read_records(path):
            found.setdefault(rec.id, rec)  # a shard merged before a kill may repeat an id of ``out``
    order = {item.id: i for i, item in enumerate(items)}
    merged = sorted(found.values(), key=lambda rec: order.get(rec.id, len(order)))
    write_records(out, merged)
    shutil.rmtree(parts_folder(out), ignore_errors=True)
    return len(merged)


# ---------------------------------------------------------------- stages (Ray actors)


def _items(batch: dict[str, Any]) -> list[QAItem]:
    return [pickle.loads(raw) for raw in batch["item"]]


class RenderStage:
    """Items → prompts with the run's template, and each item's seed (as the builder renders them)."""

    def __init__(self, plan: Plan) -> None:
        self.config = plan.config
        self.renderer = GENERATION_STAGES.get(plan.recipe.backend).renderer(plan.recipe)
        self.template: QATemplate = resolve_template(plan.template, plan.recipe.model, self.renderer)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        prompts, seeds = render_prompts(_items(batch), self.renderer, self.template, self.config)
        return {"id": batch["id"], "item": batch["item"], "prompt": prompts, "seed": seeds}


class JudgeStage:
    """Items and their generations → record lines, judged by the run's judges (an llm judge calls its server)."""

    def __init__(self, plan: Plan) -> None:
        self.config, self.provenance = plan.config, plan.provenance
        renderer = GENERATION_STAGES.get(plan.recipe.backend).renderer(plan.recipe)
        self.judges = make_judges(plan.config, _judge_backend(plan.recipe, renderer))

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        gens = [pickle.loads(raw) for raw in batch["gens"]]
        records = judge_records(_items(batch), gens, self.config, self.judges, self.provenance)
        return {"record": [json.dumps(rec.to_dict(), ensure_ascii=False) for rec in records]}


# ---------------------------------------------------------------- the openai fleet


class FleetStage:
    """Prompts → generations from candor's openai backend, the batch split across the fleet's servers."""

    def __init__(self, plan: Plan) -> None:
        self.config = plan.config
        self.params = sampling_params(plan.config, plan.provenance)
        urls = plan.options.urls or (plan.recipe.options.get("base_url"),)
        options = plan.recipe.options
        self.backends = [load_backend(plan.recipe.model, "openai", **{**options, "base_url": url}) for url in urls]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        prompts, seeds = list(batch["prompt"]), [int(s) for s in batch["seed"]]
        n = len(self.backends)
        parts = [(backend, prompts[i::n], seeds[i::n]) for i, backend in enumerate(self.backends)]
        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(lambda part: self._generate(*part), parts))
        gens: list[Generations] = [None] * len(prompts)  # type: ignore[list-item]
        for i, part in enumerate(answers):
            gens[i::n] = part
        return {"id": batch["id"], "item": batch["item"], "gens": [pickle.dumps(g) for g in gens]}

    def _generate(self, backend: Any, prompts: list[str], seeds: list[int]) -> list[Generations]:
        if not prompts:
            return []
        return backend.generate(prompts, self.config.k, self.params, greedy=True, seeds=seeds)


def _openai_renderer(recipe: BackendRecipe) -> Any:
    """The openai backend renders prompts (chat templates with ``--tokenizer``); building it sends nothing."""
    return load_backend(recipe.model, "openai", **recipe.options)


def _apply_fleet(ds: Any, plan: Plan) -> Any:
    return ds.map_batches(
        FleetStage,
        fn_constructor_args=(plan,),
        batch_size=plan.options.batch_size,
        compute=_ray().data.ActorPoolStrategy(size=plan.options.concurrency),
        num_cpus=0,  # the actors wait on HTTP; the servers do the work
    )


def _check_fleet(recipe: BackendRecipe, config: AnnotateConfig, options: RayOptions) -> None:
    if not options.urls and not recipe.options.get("base_url"):
        raise CandorError("--engine ray with --backend openai needs the servers: --ray-url (repeatable) or --base-url")


GENERATION_STAGES.register("openai")(GenerationStage(renderer=_openai_renderer, apply=_apply_fleet, check=_check_fleet))


# ---------------------------------------------------------------- vLLM inside Ray (GPU clusters)


def vllm_requests(row: dict[str, Any], k: int, params: SamplingParams) -> list[dict[str, Any]]:
    """One item's ``k + 1`` requests: the greedy answer (``request`` -1) and each seeded sample.

    The samples' seeds are the openai backend's (:func:`candor.backends.openai.sample_seeds`), so a
    sample is the one a vLLM server behind ``--backend openai`` would give for the same item.
    """
    common = {"max_tokens": params.max_new_tokens, "stop": list(params.stop) or None, "logprobs": 0}
    greedy = {**common, "temperature": 0.0}
    sampled = {**common, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
    seed = int(row["seed"])
    base = {"id": row["id"], "item": row["item"], "prompt": row["prompt"], "k": k}
    out = [{**base, "request": -1, "sampling_params": greedy}]
    out += [
        {**base, "request": j, "sampling_params": {**sampled, "seed": s}} for j, s in enumerate(sample_seeds(seed, k))
    ]
    return out


def vllm_completion(row: dict[str, Any]) -> dict[str, Any]:
    """A vLLM stage's output row → the request's completion (pickled), keyed by item and request."""
    tokens = [int(t) for t in row.get("generated_tokens") or []]
    chosen = row.get("logprobs") or []
    logprobs = [float(_logprob_of(entry, token)) for entry, token in zip(chosen, tokens, strict=False)]
    completion = Completion(
        text=row.get("generated_text") or "",
        token_ids=tokens,
        logprobs=logprobs if len(logprobs) == len(tokens) else [],
        completion_tokens=row.get("num_generated_tokens"),
    )
    return {
        "id": row["id"],
        "item": row["item"],
        "request": row["request"],
        "prompt_tokens": row.get("num_input_tokens"),
        "completion": pickle.dumps(completion),
    }


def _logprob_of(entry: Any, token: int) -> float:
    """The chosen token's log-prob in one position's ``{token_id: {logprob, rank, decoded_token}}``."""
    if isinstance(entry, dict):
        info = entry.get(token, entry.get(str(token)))
        if info is not None:
            return info["logprob"] if isinstance(info, dict) else float(info)
    raise CandorError(f"the vLLM stage gave no log-prob for the generated token {token}")


def vllm_generations(rows: Any) -> dict[str, Any]:
    """One item's ``k + 1`` completions (a group by id) → its generations, as the fleet stage gives them."""
    requests = [int(r) for r in rows["request"]]
    completions = {r: pickle.loads(raw) for r, raw in zip(requests, rows["completion"], strict=True)}
    samples = [completions[j] for j in sorted(r for r in requests if r >= 0)]
    gen = Generations(greedy=completions[-1], samples=samples, prompt_tokens=int(rows["prompt_tokens"][0]))
    return {"id": [rows["id"][0]], "item": [rows["item"][0]], "gens": [pickle.dumps(gen)]}


def _tokenizer_renderer(recipe: BackendRecipe) -> Any:
    """Prompts for the vLLM stage, rendered with the model's own tokenizer (no engine loaded for that)."""
    from transformers import AutoTokenizer

    from candor.backends.chat import TokenizerChat

    return TokenizerChat(AutoTokenizer.from_pretrained(recipe.options.get("tokenizer") or recipe.model), recipe.model)


def build_vllm_processor(plan: Plan) -> Any:
    """``ray.data.llm``'s vLLM processor for this run: TP GPUs per replica, ``--ray-concurrency`` replicas."""
    _ray()
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    engine = {"tensor_parallel_size": plan.options.tensor_parallel_size, "seed": plan.config.seed}
    if plan.recipe.options.get("dtype"):
        engine["dtype"] = plan.recipe.options["dtype"]
    config = vLLMEngineProcessorConfig(
        model_source=plan.recipe.model,
        engine_kwargs=engine,
        concurrency=plan.options.concurrency,
        batch_size=plan.options.batch_size,
        chat_template_stage=False,  # the prompts are rendered already, by candor's templates
        tokenize_stage=False,
        detokenize_stage=False,
    )
    return build_processor(
        config,
        preprocess=lambda row: {**row, "prompt": row["prompt"], "sampling_params": row["sampling_params"]},
        postprocess=vllm_completion,
    )


def _apply_vllm(ds: Any, plan: Plan) -> Any:
    params = sampling_params(plan.config, plan.provenance)
    k = plan.config.k
    ds = ds.flat_map(lambda row: vllm_requests(row, k, params))
    ds = build_vllm_processor(plan)(ds)
    return ds.groupby("id").map_groups(vllm_generations, batch_format="numpy")


def _check_vllm(recipe: BackendRecipe, config: AnnotateConfig, options: RayOptions) -> None:
    uses_llm = "llm" in (config.correctness_judge, config.consistency_judge)
    if uses_llm and (recipe.judge_model is None or (recipe.judge_backend or recipe.backend) != "openai"):
        raise CandorError(
            "--engine ray --backend vllm: the llm judge runs on its own server (--judge-model with "
            "--judge-backend openai --judge-base-url URL), not inside the answering engine"
        )
    if options.urls:
        raise CandorError("--ray-url names servers for --backend openai; the vllm stage runs vLLM inside Ray")


GENERATION_STAGES.register("vllm")(GenerationStage(renderer=_tokenizer_renderer, apply=_apply_vllm, check=_check_vllm))


__all__ = ["GENERATION_STAGES", "Plan", "RayOptions", "annotate_with_ray", "merge_into"]
