"""``GET /`` on a real ``candor serve`` answers the playground page, which names no outside address."""

from __future__ import annotations

import re
import urllib.request

import pytest

pytest.importorskip("fastapi")

from candor.serve import Decoding, HonestModel  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.playground import playground_html  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402


def test_the_page_names_no_outside_address():
    html = playground_html()
    assert not re.search(r"(src|href)\s*=", html)  # no script, style or link fetched from anywhere
    assert not re.search(r"https?://", html)
    assert "connect-src 'self'" in html  # the only requests go back to the server


def test_root_serves_the_playground_without_a_key(tiny_backend):
    model = HonestModel(tiny_backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    with (
        serve_in_thread(create_app(model, ServeSettings(api_key="k"))) as url,
        urllib.request.urlopen(f"{url}/", timeout=30) as resp,
    ):
        assert resp.status == 200 and resp.headers["content-type"].startswith("text/html")
        assert resp.read().decode() == playground_html()
