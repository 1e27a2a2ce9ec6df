"""Before the first real request: is a generation server there, and does it serve the model by that name?

The ``openai`` backend's first request (its capability probe) would otherwise
meet a dead address or a wrong model name through the client's retries: a
closed port took tens of seconds of ``Retrying request`` lines, and a server
asked for a model it does not hold either answered 400 or, loading models on
demand, tried to fetch the name from a hub it cannot reach for minutes. One
``GET /models`` with a short timeout and no retries tells both apart, in
seconds, with one line saying what to do. A server without ``/models`` (some
answer 404) is let through: the probe request then finds out.
"""

from __future__ import annotations

import logging
from typing import Any

from candor.util.errors import UpstreamError

logger = logging.getLogger(__name__)

# Seconds the listing may take: a live server answers it at once, even while it generates.
LIST_TIMEOUT_S = 5.0

START_HINT = "start it first (e.g. `transformers serve MODEL_FOLDER --port 8000`) or pass its address as --base-url"
SAME_NAME_HINT = (
    "name the model the same way on both sides: start the server with it (`transformers serve MODEL_FOLDER`, "
    "`vllm serve MODEL`) and pass the name it lists as --model"
)


def check_served_model(client: Any, base_url: str, model: str, api_key_env: str) -> None:
    """Raise :class:`UpstreamError` (one line: which problem, how to fix it) unless ``base_url`` serves ``model``."""
    import openai

    quick = client.with_options(timeout=LIST_TIMEOUT_S, max_retries=0)
    try:
        listed = [entry.id for entry in quick.models.list().data]
    except openai.APITimeoutError:
        raise UpstreamError(
            f"the generation server at {base_url} did not list its models within {LIST_TIMEOUT_S:.0f} s: "
            "is that address a generation server, and is it still starting?"
        ) from None
    except openai.APIConnectionError:
        raise UpstreamError(f"no generation server answers at {base_url}: {START_HINT}") from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise UpstreamError(
            f"the generation server at {base_url} refused the API key ({exc.status_code}): set it in "
            f"${api_key_env} (or name another variable with --api-key-env)"
        ) from None
    except openai.APIStatusError as exc:
        logger.info("%s does not list its models (%s); the first request checks the name", base_url, exc.status_code)
        return
    if model not in listed:
        served = ", ".join(repr(name) for name in listed[:5]) + (", …" if len(listed) > 5 else "")
        raise UpstreamError(
            f"the generation server at {base_url} serves {served or 'no model'}, not {model!r}: {SAME_NAME_HINT}"
        )
