"""A JSON reply from a stdlib ``BaseHTTPRequestHandler``: the local servers of the tests answer with it."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Answer ``body`` (JSON bytes as they are, or a value to encode) with ``status``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
