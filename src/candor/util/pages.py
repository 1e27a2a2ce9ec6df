"""Self-contained HTML pages: one file that opens offline and makes no network request.

A page is a title, a body of HTML, a JSON payload and Vega-Lite chart specs.
:func:`render_page` inlines everything (the shared style, the Vega/Vega-Lite/
vega-embed bundle, the page's own script), so the file can be mailed, archived
or opened from a laptop without network.

Why Vega-Lite (through Altair, with the bundle from ``vl-convert-python``):
its runtime is about 0.9 MB where Plotly's bundled plotly.js is about 4.6 MB,
which alone would nearly fill the 5 MB a report for 5,000 records × 10 methods
may take; its specs are plain JSON that Altair validates against the schema;
tooltips and signals (a method picker, a threshold rule) need no extra code.

The shared script (``page_assets/page.js``) reads the payload from
``<script id="page-data">``, embeds each chart into ``#chart-<name>``, keeps
the Vega views in ``window.candorPage.views``, calls the page's
``window.pageMain(page)`` and sets ``data-ready="1"`` on ``<body>`` when done
(the browser tests wait for it).
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from candor.util.errors import CandorError

ASSET_PACKAGE = "candor.util.page_assets"


@functools.cache
def vega_bundle() -> str:
    """The vega-embed bundle (Vega and the Vega-Lite version Altair writes) as one script."""
    try:
        import altair
        import vl_convert
    except ImportError as e:  # pragma: no cover - both are dependencies
        raise CandorError(f"HTML pages need altair and vl-convert-python ({e}); pip install candor again") from e
    version = "_".join(altair.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return vl_convert.javascript_bundle(vl_version=version)


def asset(name: str, package: str = ASSET_PACKAGE) -> str:
    """A text file shipped beside a module (a page's script or style)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can close it early)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def esc(text: Any) -> str:
    """Text for HTML content or an attribute value."""
    return html.escape(str(text), quote=True)


def render_page(
    title: str,
    body: str,
    *,
    data: Mapping[str, Any],
    charts: Mapping[str, Mapping[str, Any]] | None = None,
    script: str = "",
    style: str = "",
) -> str:
    """The whole page as one HTML string (see the module docstring)."""
    charts = dict(charts or {})
    vega = f"<script>{_inline_script(vega_bundle())}</script>\n" if charts else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # Nothing may leave the file: the policy blocks any request a library might try.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; "
        "connect-src 'none'\">\n"
        f"<title>{esc(title)}</title>\n<style>{asset('page.css')}\n{style}</style>\n{vega}</head>\n"
        f"<body>\n{body}\n"
        f'<script id="page-data" type="application/json">{script_json(data)}</script>\n'
        f'<script id="page-charts" type="application/json">{script_json(charts)}</script>\n'
        f"<script>{_inline_script(script)}</script>\n"
        f"<script>{_inline_script(asset('page.js'))}</script>\n"
        "</body>\n</html>\n"
    )


def _inline_script(code: str) -> str:
    # A literal "</script" inside a script would end the element; the escaped form means the same in JS strings.
    return code.replace("</script", "<\\/script")
