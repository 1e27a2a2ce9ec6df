"""The playground page ``candor serve`` answers at ``/``: one static HTML file, no CDN, no build step.

The page (``static/playground.html``) asks the service's own OpenAI-compatible
API: it streams the answer (``stream: true``, OpenAI's server-sent chunks) when
the server supports it and falls back to one plain request when the server
answers that streaming is unsupported. It shows the answer, the confidence as a
bar, an abstention and its reason, and, when the threshold was tuned on dev,
the threshold with its expected accuracy and coverage.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def playground_html() -> str:
    """The page's HTML (shipped as package data)."""
    return resources.files("candor.serve.http").joinpath("static/playground.html").read_text(encoding="utf-8")
