"""The plugin's HTTP port: /livez, /readyz, /status, /metrics (docs/design.md §5), and the live
status page at / (ops/status_page.py). Thin: reads the runtime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_server import Server

from llm_health.core.addresses import split_address
from llm_health.ops.logging_setup import install_peer_input_filter
from llm_health.ops.status_page import status_page

HEADER_TIMEOUT_S = 10.0
"""A request head (request line + headers) must be complete this long after its first
byte, and a new connection must send one this long after it opened: slowloris
connections are closed."""
KEEPALIVE_TIMEOUT_S = 30.0
"""An idle keep-alive connection is closed after this long."""
MAX_CONNECTIONS = 256
"""Open HTTP connections at most; a connection beyond it is closed at once."""
_LOG = logging.getLogger("llm_health.http")

ReadyFn = Callable[[], list[str]]
StatusFn = Callable[[], dict[str, Any]]
MetricsFn = Callable[[], Awaitable[tuple[bytes, str]]]  # (body, content type)


def build_http_app(
    ready_problems: ReadyFn, status: StatusFn, metrics: MetricsFn | None = None
) -> web.Application:
    """``ready_problems`` returns why we are not ready (empty list: ready).
    ``metrics``: the Prometheus exposition for /metrics (absent: no /metrics route)."""

    async def livez(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        problems = ready_problems()
        if problems:
            return web.json_response({"ready": False, "waiting_for": problems}, status=503)
        return web.json_response({"ready": True})

    async def status_handler(_request: web.Request) -> web.Response:
        return web.json_response(status(), dumps=_dumps)

    app = web.Application()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    app.router.add_get("/", status_page)  # the live page: it polls /status
    if metrics is not None:
        render = metrics

        async def metrics_handler(_request: web.Request) -> web.Response:
            body, content_type = await render()
            return web.Response(body=body, headers={"Content-Type": content_type})

        app.router.add_get("/metrics", metrics_handler)
    return app


async def start_http(
    app: web.Application,
    bind: str,
    *,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> web.AppRunner:
    """Listen on ``host:port`` (port 0: any free port, see ``runner.addresses``) or
    ``unix:/path``; raises OSError if the address is taken.

    Hostile clients are bounded: a request head must arrive within ``header_timeout_s``,
    an idle keep-alive connection is closed after ``keepalive_timeout_s``, at most
    ``max_connections`` are open (more are closed at once), and a malformed request gets
    aiohttp's 400 without an error-level traceback (``logging_setup.PeerInputFilter``).
    """
    install_peer_input_filter()
    limits = _Limits(header_timeout_s, max_connections)
    runner = _GuardedRunner(
        app,
        limits,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=keepalive_timeout_s,
    )
    await runner.setup()
    site: web.BaseSite
    if bind.startswith("unix:"):
        site = web.UnixSite(runner, bind.removeprefix("unix:"))
    else:
        host, port = _split(bind)
        site = web.TCPSite(runner, host, port, reuse_port=False)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


def _split(bind: str) -> tuple[str, int]:
    """``split_address``, plus port 0 (any free port: tests)."""
    host, sep, port = bind.rpartition(":")
    if sep and port == "0":
        return split_address(f"{host}:1")[0], 0
    return split_address(bind)


class _Limits:
    """Per server: the header timeout and the connection cap (with its live count)."""

    def __init__(self, header_timeout_s: float, max_connections: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.open = 0
        self.refused = 0


class _GuardedRunner(web.AppRunner):
    """An ``AppRunner`` whose sites create connections through ``_Gate`` (the sites take
    their protocol factory from ``runner.server``)."""

    def __init__(self, app: web.Application, limits: _Limits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits
        self._gate: _Gate | None = None

    @property
    def server(self) -> Server | None:
        inner = super().server
        if inner is None:
            return None
        if self._gate is None or self._gate.inner is not inner:
            self._gate = _Gate(inner, self._limits)
        return self._gate  # type: ignore[return-value]  # a protocol factory, like Server


class _Gate:
    """Protocol factory: at most ``max_connections`` open, each behind ``_HeadDeadline``."""

    def __init__(self, inner: Server, limits: _Limits) -> None:
        self.inner, self._limits = inner, limits

    def __call__(self) -> asyncio.Protocol:
        limits = self._limits
        if limits.open >= limits.max_connections:
            limits.refused += 1
            if limits.refused == 1 or limits.refused % 1000 == 0:
                _LOG.warning(
                    "HTTP connection refused: %d open (the limit); %d refused so far",
                    limits.open,
                    limits.refused,
                )
            return _Refused()
        return _HeadDeadline(self.inner(), limits)


class _Refused(asyncio.Protocol):
    """Closes the connection as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _HeadDeadline(asyncio.Protocol):
    """Wraps aiohttp's ``RequestHandler`` (every call forwarded) and closes the connection
    when a request head stays incomplete for ``header_timeout_s``: armed when the
    connection opens and by the first byte after a complete head, disarmed when a head
    ends (``\r\n\r\n``). aiohttp itself closes idle keep-alive connections, but counts a
    half-sent request as idle only from its own keep-alive clock."""

    def __init__(self, inner: asyncio.Protocol, limits: _Limits) -> None:
        self._inner, self._limits = inner, limits
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True  # a new connection owes a request head
        self._tail = b""  # the last bytes of the head so far (a split "\r\n\r\n")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._limits.open += 1
        self._transport = transport
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._in_head:  # the first byte of a next request (or of a body)
            self._in_head, self._tail = True, b""
            self._arm()
        seen = self._tail + data
        if b"\r\n\r\n" in seen:
            self._in_head = False
            self._disarm()
        self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._limits.open -= 1
        self._disarm()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _arm(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._limits.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._transport is not None and self._in_head:
            _LOG.debug("HTTP connection closed: no complete request head in time")
            self._transport.close()


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2)
