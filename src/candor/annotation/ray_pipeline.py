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
  (``--ray-url``, repeatable; else ``--base-url``) behind one
  :class:`candor.annotation.fleet.Fleet`: each item (its greedy request and
  its samples') goes to whichever server has a free slot (``--ray-inflight``
  items per server, shared by the actors), a server that fails is taken out
  and its items go to the others, and it is probed back in. An actor runs
  several batches at once so its slots stay full. An item that fails every
  try comes out as an error row; the driver keeps the others' records and
  ends naming the items left (a rerun does only those). Not ``ray.data.llm``'s
  ``HttpRequestProcessorConfig``: that stage sends one JSON body per row to
  one URL and hands back the raw reply, so a record's greedy answer plus
  ``k`` seeded samples would be ``k + 1`` rows regrouped by a shuffle (an
  all-to-all barrier that ends streaming, and with it the shard-per-batch
  resume), one URL per processor would need a balancer in front of a fleet,
  and the reply parsing that makes the records equal to ``--backend
  openai``'s (the capability probe, servers that ignore ``n`` or ``top_k``,
  stop strings a server ignored, token counts, 31-bit request seeds) would be
  a second copy of the backend's. Calling the backend itself gives the same
  requests and the same parsing.
- ``vllm``: ``--ray-concurrency`` actors of ``--tensor-parallel-size`` GPUs
  each, every one holding candor's own :class:`candor.backends.vllm.VLLMBackend`
  (loaded as ``--backend vllm`` loads it) and generating each batch as the
  single-process run does. For the same reasons as above, not ``ray.data.llm``'s
  ``vLLMEngineProcessorConfig``: its rows are one request each, sampling
  parameters pass through Arrow (greedy rows get ``top_p``/``top_k`` None,
  seeds come back as floats, and vLLM refuses both), its outputs carry no
  finish reason (so the stop token cannot be dropped as ``--backend vllm``
  drops it), and the ``k + 1`` rows of an item had to be regrouped by a
  shuffle, which held every record back until all generation ended. Before
  starting, a cluster that cannot place one replica is refused (Ray would
  wait for ever).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pickle
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
from candor.annotation.fleet import Fleet, JobFailed, RetryPolicy
from candor.annotation.prompts import QATemplate, resolve_template
from candor.annotation.records import Record, read_records, write_records
from candor.annotation.workers import BackendRecipe
from candor.backends import load_backend
from candor.backends.base import Generations
from candor.backends.default_model import is_embedded, resolve_embedded
from candor.backends.server_check import check_served_model
from candor.data.items import QAItem
from candor.util.errors import CandorError, UpstreamError
from candor.util.registry import Registry
from candor.util.version import install_hint

logger = logging.getLogger(__name__)


DEFAULT_INFLIGHT = 8


@dataclass(frozen=True)
class RayOptions:
    """How the pipeline runs: the server fleet, the generation actors, the cluster and the batch size.

    ``inflight``: the questions each server of a fleet has in flight at once, over all generation
    actors (each question is the greedy request and the samples'). ``retry``: how a fleet retries a
    question and backs a failed server off. ``stage_actors``: the most render and judge actors.
    """

    urls: tuple[str, ...] = ()
    concurrency: int = 1
    tensor_parallel_size: int = 1
    address: str | None = None
    batch_size: int = 16
    progress: bool = True
    inflight: int = DEFAULT_INFLIGHT
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    stage_actors: int = 2

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise CandorError(f"--ray-concurrency {self.concurrency}: need at least one generation actor")
        if self.tensor_parallel_size < 1:
            raise CandorError(f"--tensor-parallel-size {self.tensor_parallel_size}: need at least one GPU")
        if self.batch_size < 1:
            raise CandorError(f"--batch-size {self.batch_size}: must be >= 1")
        if self.inflight < 1:
            raise CandorError(f"--ray-inflight {self.inflight}: need at least one question in flight per server")
        if self.stage_actors < 1:
            raise CandorError(f"stage_actors {self.stage_actors}: need at least one render and one judge actor")

    @property
    def slots_per_actor(self) -> int:
        """Each generation actor's share of a server's questions in flight (at least one)."""
        return max(1, -(-self.inflight // self.concurrency))


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
    fits: Callable[[dict[str, float], RayOptions], None]  # refuses a cluster the stage cannot be placed on
    # On the driver: the recipe the actors get and the backend that renders and describes the run (provenance).
    prepare: Callable[[BackendRecipe, RayOptions], tuple[BackendRecipe, Any]]


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
    recipe, renderer = stage.prepare(recipe, options)
    template = resolve_template(recipe.template, recipe.model, renderer)
    judges = make_judges(config, _judge_backend(recipe, renderer))
    provenance = run_provenance(renderer, template, config, None, items, judges)
    done = finished_ids(out, provenance, items)
    for shard in shard_files(out):
        done |= finished_ids(shard, provenance, items)
    todo = [item for item in items if item.id not in done]
    logger.info("%s: %d items, %d already done, %d to annotate", out, len(items), len(items) - len(todo), len(todo))
    plan = Plan(recipe=recipe, config=config, options=options, template=template.name, provenance=provenance)
    try:
        written = _run(todo, plan, stage, out, already=len(items) - len(todo), total=len(items)) if todo else 0
    except ItemsLeft:
        merge_into(out, items)  # the finished records into ``out``; a rerun annotates only the items named
        raise
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
    stage.fits(ray.cluster_resources(), plan.options)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = plan.options.progress
    size = plan.options.batch_size
    ds = read_items(todo, size)
    pool = ray.data.ActorPoolStrategy(min_size=1, max_size=plan.options.stage_actors)
    ds = ds.map_batches(RenderStage, fn_constructor_args=(plan,), batch_size=size, compute=pool, num_cpus=0.25)
    ds = stage.apply(ds, plan)
    ds = ds.map_batches(JudgeStage, fn_constructor_args=(plan,), batch_size=size, compute=pool, num_cpus=0.25)
    folder = parts_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=total, initial=already, desc="records", unit="q", disable=not plan.options.progress)
    written, failed = 0, {}
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        ok = [not error for error in batch["error"]]
        records = [Record.from_dict(json.loads(line)) for line, good in zip(batch["record"], ok, strict=True) if good]
        if records:
            write_records(folder / f"ray-{uuid.uuid4().hex}.jsonl", records)  # whole or not at all
        written += len(records)
        bar.update(len(records))
        failed.update({str(key): str(error) for key, error in zip(batch["id"], batch["error"], strict=True) if error})
        if any(batch["fatal"]):
            bar.close()
            first = next(str(e) for e, fatal in zip(batch["error"], batch["fatal"], strict=True) if fatal)
            raise CandorError(f"{first} (the finished records stay in {folder}/; a rerun resumes)")
    bar.close()
    if failed:
        raise ItemsLeft(failed)
    return written


class ItemsLeft(CandorError):
    """The items a run could not annotate (every try failed): named, with why; a rerun retries them."""

    def __init__(self, failed: dict[str, str]) -> None:
        self.failed = failed
        shown = "; ".join(failed[key] for key in list(failed)[:3]) + (" …" if len(failed) > 3 else "")
        super().__init__(
            f"{len(failed)} item(s) not annotated: {', '.join(list(failed)[:10])}"
            f"{' …' if len(failed) > 10 else ''} ({shown}); the other records are saved, and rerunning the "
            "same command annotates only these"
        )


def read_items(todo: Sequence[QAItem], size: int) -> Any:
    """The items as a dataset read lazily: one read task per batch, its block made when the stream asks for it.

    Not ``from_items``, which puts every row in Ray's object store before the first batch runs.
    """
    ray = _ray()
    import pyarrow as pa
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    chunks = [list(todo[i : i + size]) for i in range(0, len(todo), size)]

    def reader(chunk: list[QAItem]) -> Callable[[], list[Any]]:
        return lambda: [pa.table({"id": [it.id for it in chunk], "item": [pickle.dumps(it) for it in chunk]})]

    class Items(Datasource):
        def estimate_inmemory_data_size(self) -> None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, **_: Any) -> list[Any]:
            meta = lambda chunk: BlockMetadata(num_rows=len(chunk), size_bytes=None, exec_stats=None)  # noqa: E731
            return [ReadTask(reader(c), meta(c), per_task_row_limit=per_task_row_limit) for c in chunks]

    return ray.data.read_datasource(Items(), override_num_blocks=len(chunks), num_cpus=0.25)


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
        n = len(batch["id"])
        errors = [str(e) for e in batch["error"]] if "error" in batch else [""] * n
        fatal = [bool(f) for f in batch["fatal"]] if "fatal" in batch else [False] * n
        good = [i for i in range(n) if not errors[i]]
        items = _items(batch)
        gens = [pickle.loads(batch["gens"][i]) for i in good]
        records = judge_records([items[i] for i in good], gens, self.config, self.judges, self.provenance)
        lines = [""] * n
        for i, rec in zip(good, records, strict=True):
            lines[i] = json.dumps(rec.to_dict(), ensure_ascii=False)
        return {"id": batch["id"], "record": lines, "error": errors, "fatal": fatal}


# ---------------------------------------------------------------- the openai fleet


# The openai client's own retries per request in a fleet (unless --max-retries says otherwise): one, so
# a dead server is noticed in about a second and its work moves, instead of after the client's backoff.
FLEET_CLIENT_RETRIES = 1


class FleetStage:
    """Prompts → generations from candor's openai backend, each item sent to whichever server is free.

    One :class:`candor.annotation.fleet.Fleet` per actor, shared by the batches the actor runs at
    once; an item that fails on every try comes out as an error row (the driver names it at the end).
    """

    def __init__(self, plan: Plan) -> None:
        self.config = plan.config
        self.params = sampling_params(plan.config, plan.provenance)
        options = plan.recipe.options
        servers = [
            (url, load_backend(plan.recipe.model, "openai", **{**options, "base_url": url})) for url in fleet_urls(plan)
        ]
        self.fleet = Fleet(servers, slots=plan.options.slots_per_actor, probe=_answers, policy=plan.options.retry)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        prompts, seeds = list(batch["prompt"]), [int(s) for s in batch["seed"]]
        jobs = [(str(key), self._job(p, s)) for key, p, s in zip(batch["id"], prompts, seeds, strict=True)]
        results = self.fleet.run(jobs)
        gens = [b"" if isinstance(r, JobFailed) else pickle.dumps(r) for r in results]
        errors = [str(r) if isinstance(r, JobFailed) else "" for r in results]
        fatal = [isinstance(r, JobFailed) and not r.retryable for r in results]
        return {"id": batch["id"], "item": batch["item"], "gens": gens, "error": errors, "fatal": fatal}

    def _job(self, prompt: str, seed: int) -> Callable[[Any], Generations]:
        k, params = self.config.k, self.params
        return lambda backend: backend.generate([prompt], k, params, greedy=True, seeds=[seed])[0]

    def __del__(self) -> None:
        self.fleet.close()


def _answers(backend: Any) -> None:
    """A fleet's probe of a server taken out: does it list its models again (seconds, no retries)?"""
    check_served_model(backend.client, backend.base_url, backend.model_name, backend.api_key_env)


def fleet_urls(plan: Plan) -> tuple[str, ...]:
    """The fleet's servers: ``--ray-url``s, else ``--base-url``."""
    return plan.options.urls or (plan.recipe.options["base_url"],)


def _openai_renderer(recipe: BackendRecipe) -> Any:
    """The openai backend renders prompts (chat templates with ``--tokenizer``); building it sends nothing."""
    return load_backend(recipe.model, "openai", **recipe.options)


def _prepare_fleet(recipe: BackendRecipe, options: RayOptions) -> tuple[BackendRecipe, Any]:
    """The first server of the fleet that answers describes the run (what it applies: the probe finds out).

    Without ``--base-url`` that server is also the one the actors' renderers (and an llm judge on the
    answering model) name. None answering: one error naming each server's reason.
    """
    reasons = []
    for url in options.urls or (recipe.options["base_url"],):
        backend = load_backend(recipe.model, "openai", **{**recipe.options, "base_url": url})
        try:
            backend.capabilities  # noqa: B018  (the probe)
        except UpstreamError as exc:
            reasons.append(str(exc))
            continue
        if not recipe.options.get("base_url"):
            recipe = replace(recipe, options={**recipe.options, "base_url": url})
        return recipe, backend
    raise CandorError(f"no server of the fleet answers: {'; '.join(reasons)}")


def _apply_fleet(ds: Any, plan: Plan) -> Any:
    # Enough batches at once per actor that its servers' slots stay full while one batch drains.
    slots = plan.options.slots_per_actor * len(fleet_urls(plan))
    calls = 1 + -(-slots // plan.options.batch_size)
    compute = _ray().data.ActorPoolStrategy(
        size=plan.options.concurrency, max_concurrent_calls_per_actor=calls, enable_true_multi_threading=True
    )
    return ds.map_batches(
        FleetStage,
        fn_constructor_args=(plan,),
        batch_size=plan.options.batch_size,
        compute=compute,
        num_cpus=0,  # the actors wait on HTTP; the servers do the work
    )


def _check_fleet(recipe: BackendRecipe, config: AnnotateConfig, options: RayOptions) -> None:
    if not options.urls and not recipe.options.get("base_url"):
        raise CandorError("--engine ray with --backend openai needs the servers: --ray-url (repeatable) or --base-url")


GENERATION_STAGES.register("openai")(
    GenerationStage(
        renderer=_openai_renderer,
        apply=_apply_fleet,
        check=_check_fleet,
        fits=lambda available, o: None,
        prepare=_prepare_fleet,
    )
)


# ---------------------------------------------------------------- vLLM inside Ray (GPU clusters)


class VLLMStage:
    """Prompts → generations from candor's own vllm backend, one engine per actor (``--tensor-parallel-size`` GPUs).

    The same backend ``--backend vllm`` loads, with the same options, called on each batch as the
    single-process run calls it: the same requests (greedy, and the samples with the item's seed),
    the same reading of vLLM's outputs, so the records are the same. A batch goes in and comes out
    whole, so nothing is regrouped and the stream (and with it the shard-per-batch resume) holds.
    """

    def __init__(self, plan: Plan) -> None:
        self.config = plan.config
        self.params = sampling_params(plan.config, plan.provenance)
        self.backend = load_backend(plan.recipe.model, "vllm", **plan.recipe.options)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        prompts, seeds = list(batch["prompt"]), [int(s) for s in batch["seed"]]
        gens = self.backend.generate(prompts, self.config.k, self.params, greedy=True, seeds=seeds)
        return {"id": batch["id"], "item": batch["item"], "gens": [pickle.dumps(g) for g in gens]}


def _tokenizer_renderer(recipe: BackendRecipe) -> Any:
    """Prompts for the vLLM stage, rendered with the model's own tokenizer (no engine loaded for that).

    The embedded default's name is resolved to its model folder, as ``--backend vllm`` resolves it.
    """
    from transformers import AutoTokenizer

    from candor.backends.chat import TokenizerChat

    source = recipe.options.get("tokenizer") or recipe.model
    folder = str(resolve_embedded(source)) if is_embedded(source) else source
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CandorError(f"cannot load the tokenizer of {source!r} for the vLLM stage: {exc}") from None
    return TokenizerChat(tokenizer, recipe.model)


def _apply_vllm(ds: Any, plan: Plan) -> Any:
    return ds.map_batches(
        VLLMStage,
        fn_constructor_args=(plan,),
        batch_size=plan.options.batch_size,
        compute=_ray().data.ActorPoolStrategy(size=plan.options.concurrency),
        num_gpus=plan.options.tensor_parallel_size,
        num_cpus=VLLM_ACTOR_CPUS,
    )


# CPUs each vLLM actor asks Ray for (its engine's scheduler and detokenizer; the GPUs do the work).
VLLM_ACTOR_CPUS = 1


def vllm_resources(options: RayOptions) -> dict[str, float]:
    """What one vLLM replica asks the cluster for."""
    return {"GPU": float(options.tensor_parallel_size), "CPU": float(VLLM_ACTOR_CPUS)}


def check_cluster_fits(available: dict[str, float], options: RayOptions) -> None:
    """Refuse, naming the shortfall, a cluster on which not even one vLLM replica could be placed (Ray would wait)."""
    need = vllm_resources(options)
    # The render and judge actors take a quarter CPU each, at least one of each.
    need_cpu = need["CPU"] + 0.5
    have_gpu, have_cpu = float(available.get("GPU", 0)), float(available.get("CPU", 0))
    if have_gpu < need["GPU"] or have_cpu < need_cpu:
        raise CandorError(
            f"--engine ray --backend vllm: one replica needs {need['GPU']:g} GPU(s) (--tensor-parallel-size) and "
            f"{need_cpu:g} CPU(s) with the render and judge stages; the Ray cluster has {have_gpu:g} GPU(s) and "
            f"{have_cpu:g} CPU(s), so Ray would wait for ever. Start the nodes with their GPUs (`ray start "
            "--num-gpus N`), or lower --tensor-parallel-size"
        )


def _check_vllm(recipe: BackendRecipe, config: AnnotateConfig, options: RayOptions) -> None:
    uses_llm = "llm" in (config.correctness_judge, config.consistency_judge)
    if uses_llm and (recipe.judge_model is None or (recipe.judge_backend or recipe.backend) != "openai"):
        raise CandorError(
            "--engine ray --backend vllm: the llm judge runs on its own server (--judge-model with "
            "--judge-backend openai --judge-base-url URL), not inside the answering engine"
        )
    if options.urls:
        raise CandorError("--ray-url names servers for --backend openai; the vllm stage runs vLLM inside Ray")
    if importlib.util.find_spec("vllm") is None:
        raise CandorError(
            f"--engine ray --backend vllm runs vLLM in the Ray workers, and this environment has none: "
            f"{install_hint('vllm')} (on every node)"
        )


GENERATION_STAGES.register("vllm")(
    GenerationStage(
        renderer=_tokenizer_renderer,
        apply=_apply_vllm,
        check=_check_vllm,
        fits=check_cluster_fits,
        prepare=lambda recipe, options: (recipe, _tokenizer_renderer(recipe)),
    )
)


__all__ = ["GENERATION_STAGES", "Plan", "RayOptions", "annotate_with_ray", "merge_into"]
