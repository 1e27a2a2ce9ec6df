"""``candor serve --docs``: the API's OpenAPI schema and a plain page listing its endpoints.

Off by default. When on, both answer only with the API key (they describe the
service to whoever can call it) and the page is self-contained: FastAPI's own
``/docs`` loads Swagger UI from a CDN, which an offline or locked-down
deployment must not do.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse


def install_docs(app: FastAPI, authorize: Callable[[Request], None]) -> None:
    """Add ``GET /openapi.json`` and ``GET /docs``, each checked by ``authorize`` first."""

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        authorize(request)
        return HTMLResponse(docs_page(app.openapi()))


def docs_page(schema: dict[str, Any]) -> str:
    """One HTML page (no scripts, no external resources) with each path, its methods and summaries."""
    rows = []
    for path, operations in sorted(schema.get("paths", {}).items()):
        for method, op in operations.items():
            summary = op.get("summary") or op.get("operationId") or ""
            rows.append(
                f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}</code>"
                f"</td><td>{html.escape(summary)}</td></tr>"
            )
    title = html.escape(str(schema.get("info", {}).get("title", "API")))
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{title} API</title><style>body{{font-family:sans-serif;margin:2em}}td{{padding:.2em 1em}}</style>"
        f"</head><body><h1>{title} API</h1><p>OpenAI-compatible; the full schema is at "
        "<code>/openapi.json</code>.</p><table>" + "".join(rows) + "</table></body></html>"
    )
