"""Option types commands share, and the honest-model option group of ``ask`` and ``serve``.

A typer command's options are its function's parameters. :func:`honest_model_options` adds the
options that choose an honest model (generator, confidence, threshold) to a command in one place,
and hands the command one :class:`HonestModelChoice` instead of ten parameters.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from candor.serve.model import HonestModel

DEFAULT_MODEL = "smollm2-135m"

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Embedded name, Hugging Face id or local path.")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Folder of HonestyBench files for named datasets.")]

# Backend options of commands that load a model (each backend takes the ones it knows).
BackendOpt = Annotated[
    str, typer.Option("--backend", help="Backend: hf, vllm, openai or sglang (a server at --base-url).")
]
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
    typer.Option(
        help="hf and vllm backends: the weights' dtype: auto, float32, bfloat16 or float16 "
        "(default: float32 on CPU, bfloat16 on GPU). On a CPU, bfloat16 is fast only with "
        "AVX512-BF16 or AMX; elsewhere it is slower than float32, and a warning says so."
    ),
]
TensorParallelOpt = Annotated[int | None, typer.Option(help="vllm backend: tensor-parallel GPUs.")]
DataParallelOpt = Annotated[int | None, typer.Option(help="vllm backend: data-parallel replicas.")]
MaxNewTokensOpt = Annotated[int, typer.Option(help="Answer length cap in tokens.")]
SystemPromptFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--system-prompt-file",
        help="The deployment's system prompt (UTF-8 text): the threshold and calibration are tuned for requests "
        "with exactly this system message and no earlier turn (trailing whitespace ignored), which the server "
        "then reports calibrated.",
    ),
]


@dataclass(frozen=True)
class HonestModelChoice:
    """The options of ``ask`` and ``serve`` that choose the honest model; see :func:`build`."""

    model: ModelOpt = DEFAULT_MODEL
    honest: Annotated[Path | None, typer.Option("--honest", help="A saved honest-model folder (HonestModel).")] = None
    head: Annotated[Path | None, typer.Option("--head", help="A trained EliCal head folder (decides first).")] = None
    adapter: Annotated[
        Path | None, typer.Option("--adapter", help="An ADVICE/ConfTuner adapter folder: answer-level confidence.")
    ] = None
    method: Annotated[str | None, typer.Option("--method", help="A confidence estimator name (default n-prob).")] = None
    threshold: Annotated[float | None, typer.Option("--threshold", help="Abstain below this confidence.")] = None
    samples: Annotated[
        int | None,
        typer.Option("--samples", help="Sampled answers a sample-based --method reads (default: the method's own k)."),
    ] = None
    backend: Annotated[str, typer.Option("--backend", help="The generator's backend (see candor.backends).")] = "hf"
    base_url: BaseUrlOpt = None
    confidence_url: Annotated[
        str | None,
        typer.Option(
            "--confidence-url",
            help="A classify server (vLLM --runner pooling, or candor serve-head) "
            "serving the exported head given with --head OUT: the confidence comes from there, no head "
            "weights load.",
        ),
    ] = None

    def build(self, *, max_new_tokens: int, batch_size: int | None = None) -> HonestModel:
        """The honest model these options name (:func:`candor.serve.factory.build_model`)."""
        from candor.serve.factory import build_model

        generation: dict[str, Any] = {"max_new_tokens": max_new_tokens}
        if batch_size is not None:
            generation["batch_size"] = batch_size
        choice = asdict(self)
        return build_model(choice.pop("model"), **choice, **generation)


def honest_model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` the :class:`HonestModelChoice` options in place of its ``choice`` parameter.

    Typer reads a command's options from its signature; the wrapper's signature is the command's
    with ``choice`` replaced by the choice's fields, and the wrapper gathers them back into one value.
    """
    own = inspect.signature(command, eval_str=True).parameters
    shared_hints = inspect.get_annotations(HonestModelChoice, eval_str=True)
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=shared_hints[f.name])
        for f in fields(HonestModelChoice)
    ]
    params: list[inspect.Parameter] = []
    for param in own.values():
        if param.name == "choice":
            params += shared
        else:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    names = {f.name for f in fields(HonestModelChoice)}

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        choice = HonestModelChoice(**{name: kwargs.pop(name) for name in names})
        return command(choice=choice, **kwargs)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
