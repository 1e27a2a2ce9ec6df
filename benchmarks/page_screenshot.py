"""A full-page screenshot of a candor page (report.html, diagnose.html) in headless Chromium.

    candor demo --limit 120 -o candor-out/demo120
    python -m benchmarks.page_screenshot candor-out/demo120/report/report.html \\
        benchmarks/results/pages/demo_report.png

Uses Debian's ``chromium`` through the ``playwright`` package (no browser download) with the flags
the page tests use; exits 1 when the page logs an error or requests anything outside the file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("page", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--width", type=int, default=1280)
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    outside: list[str] = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=args.chromium,
            headless=True,
            args=FLAGS,
            viewport={"width": args.width, "height": 900},
        )
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "about:")) else outside.append(r.url))
        page.goto(args.page.resolve().as_uri())
        page.wait_for_selector("body[data-ready]", timeout=120_000)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out), full_page=True)
        context.close()
    if errors or outside:
        print(f"errors: {errors}; requests outside the file: {outside}", file=sys.stderr)
        raise SystemExit(1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
