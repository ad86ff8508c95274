"""``GET /`` on the HTTP port: a live, read-only status page for humans (a browser or a
phone). One self-contained HTML document, no CDN, no internet: its CSS and JS are inline
and allowed by their SHA-256 hashes in a strict Content-Security-Policy (nothing else may
run or load; ``connect-src 'self'`` lets the script poll ``/status`` every second).

The page's sources are package files beside this module, read once at import with
``importlib.resources`` (pyproject.toml ships them as package data): ``page/index.html``
(its ``__CSS__`` and ``__JS__`` become the other two, inline), ``page/page.css`` and
``page/page.js`` (its ``__POLL_MS__`` and ``__POINTS__`` become :data:`POLL_MS` and
:data:`SPARK_POINTS`).

Every text from the status document (cluster and endpoint names, reasons, probe details:
they may quote what a backend answered) goes into the page through ``textContent``, never
as markup. TTFT sparklines are SVG built from the last :data:`SPARK_POINTS` probes the
page itself has seen (kept client-side across polls; a reload starts them anew).

Like ``/status`` it has no authentication: the HTTP port is meant for loopback or a
trusted network (docs/design.md §5).
"""

from __future__ import annotations

import base64
import hashlib
from importlib.resources import files

from aiohttp import web

POLL_MS = 1000
SPARK_POINTS = 30

_PAGE_FILES = files("llm_health.ops") / "page"


def _page_file(name: str) -> str:
    return (_PAGE_FILES / name).read_text(encoding="utf-8")


def _script() -> str:
    values = {"__POLL_MS__": str(POLL_MS), "__POINTS__": str(SPARK_POINTS)}
    text = _page_file("page.js")
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


# Each inline block starts on a line of its own ("<style>\n..."): the hashes below are of
# exactly the text between the tags.
_CSS = "\n" + _page_file("page.css")
_JS = "\n" + _script()
_HTML = _page_file("index.html").replace("__CSS__", _CSS).replace("__JS__", _JS)


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_sha256(_JS)}",
        f"style-src {_sha256(_CSS)}",
        "connect-src 'self'",
        "img-src 'self'",  # the browser's own /favicon.ico request (a 404)
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Only the page's own inline script and style (by hash) run; it may fetch from its own
origin and nothing else (no frames, forms, plugins, fonts or other origins)."""

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

PAGE = _HTML.encode()


async def status_page(_request: web.Request) -> web.Response:
    """``GET /``: the page (static: it reads ``/status`` itself)."""
    return web.Response(body=PAGE, content_type="text/html", charset="utf-8", headers=dict(HEADERS))
