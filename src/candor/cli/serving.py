"""Answering with a confidence: ``ask`` (one question), ``serve`` (the OpenAI-compatible service), ``serve-head``."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from candor.cli.options import HonestModelChoice, MaxNewTokensOpt, honest_model_options
from candor.cli.shared import user_errors
from candor.util.errors import CandorError
from candor.util.version import install_hint

DEFAULT_MAX_NEW_TOKENS = 32  # serve's answer length cap when neither --max-new-tokens nor a folder names one

if TYPE_CHECKING:
    from candor.serve.claim_answers import ClaimPolicy


@user_errors
@honest_model_options
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    choice: HonestModelChoice,
    max_new_tokens: MaxNewTokensOpt = 32,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """Answer one question with a confidence, abstaining below the threshold."""
    import json

    from candor.serve.answering import check_text

    if not question.strip():
        raise CandorError("the question is empty")  # refused as the server refuses it, before the model loads
    check_text(question, "the question")
    honest_model = choice.build(max_new_tokens=max_new_tokens)
    result = honest_model.answer(question)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        return
    typer.echo(f"{'(abstained)' if result.abstained else result.answer}")
    typer.echo(
        f"confidence {result.confidence:.3f} ({result.method}{', calibrated' if result.calibrated else ''})"
        f" - {result.reason}"
    )


@user_errors
@honest_model_options
def serve(
    choice: HonestModelChoice,
    log_records: Annotated[
        Path | None,
        typer.Option(
            "--log-records",
            help="Also export every served answer and label to this JSONL file (candor records, with "
            "the confidence), to re-score, re-judge or calibrate on later. Without --store, the store "
            "is a SQLite file beside it (FILE.db).",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Keep served answers and labels in this database: sqlite:///served.db (one file), or "
            "postgresql://USER@HOST/DB for several replicas sharing feedback (pip install 'candor-honesty[store]').",
        ),
    ] = None,
    store_max_rows: Annotated[
        int | None,
        typer.Option(help="Served questions (and labels) the store keeps (default 1,000,000); the oldest go first."),
    ] = None,
    store_max_age_days: Annotated[
        float | None, typer.Option(help="Delete served questions and labels older than this (default: no limit).")
    ] = None,
    store_index_bytes: Annotated[
        int | None,
        typer.Option(
            help="Bytes of the remembered-response index feedback checks labels against (default 64 MiB); "
            "the oldest responses are evicted."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model_id: Annotated[str, typer.Option(help="The model name clients send.")] = "candor",
    api_key_env: Annotated[
        str, typer.Option(help="Environment variable holding the API key; unset means no key is required.")
    ] = "CANDOR_API_KEY",
    admin_key_env: Annotated[
        str,
        typer.Option(
            help="Environment variable holding the operator key (POST /admin/reload, labels from a trusted "
            "source); unset means the operator routes are off."
        ),
    ] = "CANDOR_ADMIN_KEY",
    honest_root: Annotated[
        Path | None,
        typer.Option(
            "--honest-root",
            help="POST /admin/reload may load folders inside this one only (default: the folder holding --honest).",
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a connection may take to send a request's headers (408 and closed after); a slow "
            "body has its own limit."
        ),
    ] = 10.0,
    max_connections: Annotated[
        int,
        typer.Option(
            help="Connections held at once (lowered to fit ulimit -n); at the cap a new one evicts the "
            "oldest still sending its headers, else it gets 503."
        ),
    ] = 2048,
    refusal: Annotated[str, typer.Option(help="The text of an abstained answer.")] = "I don't know.",
    queue_size: Annotated[int, typer.Option(help="Questions in flight (answering or waiting) before 503.")] = 64,
    max_batch: Annotated[int, typer.Option(help="Questions decoded together (1 turns batching off).")] = 16,
    batch_wait_ms: Annotated[
        float, typer.Option(help="How long a micro-batch waits to fill (backends without a live engine).")
    ] = 5.0,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(help="Default answer length cap in tokens (default: the --honest folder's, else 32)."),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="A browser origin allowed by CORS (repeatable); none: no CORS."),
    ] = None,
    log_prompts: Annotated[
        bool, typer.Option("--log-prompts", help="Write each request's messages or prompt into the access log.")
    ] = False,
    conversations: Annotated[
        str,
        typer.Option(
            help="accept: a chat request may hold a system message and earlier turns; refuse: "
            "exactly one user message (400 otherwise)."
        ),
    ] = "accept",
    stream: Annotated[
        str,
        typer.Option(
            help="buffered: an answer-level method streams nothing before its decision; live: tokens "
            "as they are generated, withdrawn by a refusal if it abstains."
        ),
    ] = "buffered",
    max_tokens: Annotated[
        int | None, typer.Option(help="The largest max_tokens a request may ask for (default: the model's context).")
    ] = None,
    docs: Annotated[bool, typer.Option("--docs", help="Serve /docs and /openapi.json (behind the key).")] = False,
    claims: Annotated[
        str | None,
        typer.Option(
            help="A claim method (claim-prob, claim-perplexity, …, elical-claims with --claim-head): each "
            "answer of more than one claim gets a confidence per claim in its confidence object."
        ),
    ] = None,
    refine: Annotated[
        str | None,
        typer.Option(
            help="With --claims: remove the claims below --claim-threshold from the returned "
            "text, or mark them [?…] (remove|mark)."
        ),
    ] = None,
    claim_threshold: Annotated[
        float | None,
        typer.Option(help="With --refine: the claim confidence below which a claim is refined (default 0.5)."),
    ] = None,
    abstain_as: Annotated[
        str,
        typer.Option(
            help="text: an abstention's refusal text is the answer's content, shown by every client; refusal: "
            "OpenAI's refusal field and part (some frameworks raise on it; needed by --stream live). "
            'finish_reason is "stop" either way.'
        ),
    ] = "text",
    factuality_alpha: Annotated[
        float | None,
        typer.Option(
            help="With --refine remove: refine at the claim threshold tuned in --honest for this alpha "
            "(`candor claims-tune`), so a refined answer holds no false claim with probability ≥ 1 − alpha."
        ),
    ] = None,
    claim_head: Annotated[
        Path | None,
        typer.Option(
            "--claim-head",
            help="With --claims elical-claims (which needs it): the claim head folder (`candor train "
            "elical-claims`). Trained on the served model: it reads the served model's own pass over each answer.",
        ),
    ] = None,
) -> None:
    """An OpenAI-compatible service: answers carry a confidence and abstain when unsure.

    Chat requests may carry a conversation (system message, earlier turns); a request whose only earlier
    message is a system prompt the folder was tuned for (--system-prompt-file of candor demo or adapt) is
    reported calibrated. Also /health, /ready,
    /metrics (Prometheus), POST /v1/feedback (labels on served answers, with --store or --log-records), an
    x-request-id on every response and one JSON access-log line per request on stderr; SIGHUP or
    POST /admin/reload (operator key) loads --honest again, keeping --threshold, --claims (with its
    --claim-head) and --max-new-tokens; SIGTERM finishes in-flight requests and exits 0.
    """
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "prometheus_client")):
        raise CandorError(f"candor serve needs fastapi, uvicorn and prometheus-client: {install_hint('serve')}")
    from candor.serve.http.connections import ConnectionLimits
    from candor.serve.http.server import bind_listener, run

    limits = ConnectionLimits(header_timeout_s=header_timeout, max_connections=max_connections)
    listener = bind_listener(host, port)  # a busy port is refused first, before the model (and torch) load
    from candor.backends.base import backend_capabilities
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.operations import check_cors_origins, send_access_log_to

    origins = tuple(cors_origin or ())
    check_cors_origins(origins)  # before the model loads
    from candor.serve.deployment import Deployment

    # The options that shape answers: the deployment's, put on this model and on every one a reload loads.
    deployment = Deployment(
        threshold=choice.threshold,
        claims=claim_serving(claims, refine, claim_threshold, factuality_alpha, choice.honest, claim_head),
        max_new_tokens=max_new_tokens,
    )
    from candor.annotation.served_store import Retention

    given = {"max_rows": store_max_rows, "remembered_bytes": store_index_bytes}
    if store is None and log_records is None and (store_max_age_days is not None or any(given.values())):
        raise CandorError(
            "--store-max-rows, --store-max-age-days and --store-index-bytes need --store or --log-records"
        )
    retention = Retention(
        max_age_s=None if store_max_age_days is None else store_max_age_days * 86400.0,
        **{name: value for name, value in given.items() if value is not None},
    )
    key = os.environ.get(api_key_env) or None
    admin_key = os.environ.get(admin_key_env) or None
    root = reload_root(choice.honest, honest_root)
    settings = ServeSettings(
        model_id=model_id,
        api_key=key,
        admin_key=admin_key,
        honest_root=root,
        refusal=refusal,
        queue_size=queue_size,
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        cors_origins=origins,
        log_prompts=log_prompts,
        log_records=log_records,
        store=store,
        retention=retention,
        conversations=conversations,
        stream=stream,
        max_tokens=max_tokens,
        docs=docs,
        honest_folder=choice.honest,
        abstain_as=abstain_as,
    )

    serve_log = logging.getLogger("candor.serve")
    if key is None:
        serve_log.warning("no API key in $%s: the server accepts every request", api_key_env)
    if admin_key is None:
        serve_log.warning("no operator key in $%s: POST /admin/reload and trusted labels are off", admin_key_env)
    honest_model = replace(choice, threshold=None).build(
        max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS, batch_size=max_batch
    )
    # A remote generator is probed here, before uvicorn takes the signals: SIGTERM ends a slow startup at once.
    backend_capabilities(honest_model.backend)
    service = create_app(honest_model, settings, deployment)  # the deployment's options are put on the model here
    if honest_model.threshold is None:
        logging.getLogger("candor.serve").warning(
            "no threshold: every question is answered and none abstains; pass --threshold or --honest DIR "
            "(a tuned folder, such as the one `candor demo` leaves in OUT_DIR/honest)"
        )
    send_access_log_to(sys.stderr)
    run(
        service,
        host=host,
        port=port,
        on_signal=service.state.lifecycle.begin_draining,
        in_flight=lambda: service.state.admission.in_flight,
        sock=listener,
        limits=limits,
    )


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
    from candor.serve.http.classify_server import load_classify_app
    from candor.serve.http.server import bind_listener, run

    listener = bind_listener(host, port)  # a busy port is refused before the head loads
    run(load_classify_app(folder, name), host=host, port=port, sock=listener, access_log=True)  # a line per request


def reload_root(honest: Path | None, root: Path | None) -> Path | None:
    """Where ``POST /admin/reload`` may load folders: ``--honest-root``, else the folder holding ``--honest``."""
    if root is None:
        return None if honest is None else honest.resolve().parent
    if not root.is_dir():
        raise CandorError(f"--honest-root {root} is not a folder")
    return root.resolve()


def claim_serving(
    method: str | None,
    refine: str | None,
    threshold: float | None,
    factuality_alpha: float | None = None,
    honest: Path | None = None,
    head: Path | None = None,
) -> ClaimPolicy | None:
    """``--claims``/``--refine``/``--claim-threshold``/``--factuality-alpha``/``--claim-head`` checked before the
    model loads (none is ever ignored); a guarantee asked for is looked up in the ``--honest`` folder here too."""
    from candor.serve.claim_answers import ClaimPolicy

    if method is None and head is not None:
        raise CandorError("--claim-head needs --claims elical-claims (the claim method that reads it)")
    if head is not None and not head.is_dir():
        raise CandorError(f"--claim-head {head}: no such folder")

    if method is None and refine is not None:
        raise CandorError("--refine needs --claims METHOD (the claim confidences it refines by)")
    if refine is None and threshold is not None:
        raise CandorError("--claim-threshold is used only with --refine remove|mark")
    if factuality_alpha is not None:
        if threshold is not None:
            raise CandorError("--factuality-alpha and --claim-threshold both set the claim threshold: give one of them")
        if method is None or refine is None:
            raise CandorError("--factuality-alpha needs --claims METHOD --refine remove")
        if honest is None:
            raise CandorError(
                "--factuality-alpha reads the claim threshold tuned in the honest folder: pass --honest DIR "
                "(tuned with `candor claims-tune`)"
            )
    if method is None:
        return None
    policy = ClaimPolicy(
        method,
        refine=refine,
        threshold=0.5 if threshold is None else threshold,
        factuality_alpha=factuality_alpha,
        head=None if head is None else str(head.resolve()),
    )
    if factuality_alpha is not None:
        from candor.serve.factuality import tuned_at
        from candor.serve.honest_folder import read_folder

        tuned_at(read_folder(honest).factuality, method, factuality_alpha)  # type: ignore[arg-type]
    return policy
