"""Headless Chromium for the page tests: Debian's chromium driven by the playwright package.

Each test gets a fresh page that records console errors, page errors and every
request; :func:`assert_offline` fails on a request outside the file itself,
``data:``/``about:`` URLs and 127.0.0.1. Without chromium or playwright the
tests skip with one line saying how to install them, except in CI (``CI`` set),
where they must run and a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

HOW_TO_INSTALL = "page tests need Chromium: apt-get install -y chromium && pip install 'playwright>=1.45,<2'"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "pages"
ALLOWED_SCHEMES = {"file", "data", "about", "blob"}
LOCAL_HOSTS = {"127.0.0.1"}


def chromium_or_skip() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the page tests; {HOW_TO_INSTALL}")
        pytest.skip(HOW_TO_INSTALL)
    return path


@dataclass
class Watched:
    """A page with what it logged and requested."""

    page: object
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def assert_offline(self, *, allow_local: bool = False) -> None:
        outside = []
        for url in self.requests:
            parsed = urlparse(url)
            local = allow_local and parsed.scheme == "http" and parsed.hostname in LOCAL_HOSTS
            if parsed.scheme not in ALLOWED_SCHEMES and not local:
                outside.append(url)
        assert not outside, f"requests outside the page: {outside}"

    def assert_no_errors(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory) -> Iterator[object]:
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def watched(browser_context) -> Iterator[Watched]:
    page = browser_context.new_page()
    w = Watched(page)
    page.on("console", lambda m: w.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: w.errors.append(str(e)))
    page.on("request", lambda r: w.requests.append(r.url))
    yield w
    page.close()


def screenshot(watched: Watched, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    watched.page.screenshot(path=str(path), full_page=True)
    return path
