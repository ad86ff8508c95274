"""The plugin's HTTP port: /livez, /readyz, /status, /metrics (docs/design.md §5), and the live
status page at / (ops/status_page.py). Thin: reads the runtime.

``start_http`` is the one HTTP server (``serve``'s, and any other command's kubelet port):
it accepts connections itself, in front of aiohttp, so that the probe paths are answered
whatever other clients do (``_Connections``; the threat model, docs/design.md §10)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llm_health.core.addresses import split_address
from llm_health.core.problems import ProblemLog
from llm_health.ops.head_scan import HeadScan
from llm_health.ops.logging_setup import install_peer_input_filter
from llm_health.ops.status_page import status_page

HEADER_TIMEOUT_S = 5.0
"""A request head (request line + headers) must be complete this long after its first
byte, and a new connection must send one this long after it opened: slowloris
connections are closed. Empty lines before a request line (``HeadScan``) are not a head:
the timer keeps running through them."""
KEEPALIVE_TIMEOUT_S = 30.0
"""An idle keep-alive connection is closed after this long."""
MAX_CONNECTIONS = 256
"""Open HTTP connections at most (accepted sockets, counted before aiohttp sees them);
above three quarters of it, a new connection closes the one idle longest."""
PROBE_PATHS = frozenset({"/livez", "/readyz", "/startupz", "/healthz"})
"""The kubelet's paths (serve's and the agent's): requests for them may use the
connections that other requests may not (``_probe_reserve``)."""
BACKLOG = 128
"""Connections the kernel queues for us while we are at the cap."""
ACCEPT_RETRY_S = 1.0
"""After an accept error (out of file descriptors): wait, as asyncio does."""
BUSY_TEXT = "busy: the remaining connections are kept for the health probes\n"
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

    Hostile clients are bounded (docs/design.md §10), so that the kubelet's probes
    (``PROBE_PATHS``) are answered whatever other clients do: a request head must arrive
    within ``header_timeout_s``, an idle keep-alive connection is closed after
    ``keepalive_timeout_s``, at most ``max_connections`` are open (new ones close the
    connections idle longest), a few of them are kept for probe requests (see
    ``_Connections``), and a malformed request gets aiohttp's 400 without an
    error-level traceback (``logging_setup.PeerInputFilter``). Adds a middleware to
    ``app`` (it tells the guard when a request is answered).
    """
    install_peer_input_filter()
    connections = _Connections(header_timeout_s, max_connections)
    app.middlewares.append(_answer_tracking(connections))
    runner = _GuardedRunner(
        app,
        connections,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=keepalive_timeout_s,
    )
    await runner.setup()
    try:
        await runner.listen(bind)
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


def _probe_reserve(max_connections: int) -> int:
    """Connections that only probe requests may hold: 1 in 16 of the cap, at least 1."""
    return max(1, max_connections // 16)


class _Connections:
    """Per server: the open connections, and the rules that keep a way in for the
    kubelet's probes whatever other clients do.

    - Counted at accept (``admit``), before aiohttp sees the socket, and accepted only
      below the cap (``_GuardedRunner``): asyncio's own accept loop takes up to its
      backlog of sockets per wake-up and creates their protocols only later, so a check
      in the protocol factory let a burst through.
    - A connection is *idle* while no request of it is being handled: from when it opens
      or its last request is answered until its next request head is complete (empty
      lines alone are no head, ``HeadScan``). Above
      three quarters of the cap (``evict_above``), each new connection closes the one
      idle longest: a client that holds connections without using them loses them
      first, and the rest of the cap stays free, so that a burst of new connections (a
      flood's reconnects, the kubelet's among them) is accepted at once instead of
      waiting in the kernel's queue behind the closes.
    - Requests for other paths than ``PROBE_PATHS`` are handled on at most
      ``general_limit`` connections at once (beyond: 503, connection closed): slow
      handlers cannot hold every connection either.
    """

    def __init__(self, header_timeout_s: float, max_connections: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.evict_above = max_connections - max_connections // 4
        self.general_limit = max(1, max_connections - _probe_reserve(max_connections))
        self.evicted = 0  # idle connections closed for new ones
        self.busy = 0  # requests answered 503 to keep the reserve
        self._slots: set[_Guard] = set()  # accepted, not yet lost
        self._idle: dict[_Guard, None] = {}  # insertion order: idle longest first
        self._evicting: set[_Guard] = set()  # closed by us, not yet lost
        self._by_transport: dict[asyncio.BaseTransport, _Guard] = {}
        self._serving_general = 0
        self._changed = asyncio.Event()  # a connection was lost or became idle
        self._problems = ProblemLog(_LOG)

    @property
    def open(self) -> int:
        return len(self._slots)

    def has_room(self) -> bool:
        return self.open < self.max_connections

    async def make_room(self) -> None:
        """Return once a connection may be accepted: at the cap, close idle ones (down to
        ``evict_above``) and wait until one is lost; if none is idle, until one is."""
        while not self.has_room():
            self._changed.clear()
            self._evict_longest_idle()
            await self._changed.wait()

    def admit(self, guard: _Guard) -> None:
        self._slots.add(guard)
        self._evict_longest_idle()

    def made(self, guard: _Guard) -> None:
        assert guard.transport is not None
        self._by_transport[guard.transport] = guard
        self.idle(guard)

    def idle(self, guard: _Guard) -> None:
        if guard in self._slots and guard not in self._evicting:
            self._idle.pop(guard, None)
            self._idle[guard] = None  # to the end: idle the shortest
            self._changed.set()

    def in_use(self, guard: _Guard) -> None:
        self._idle.pop(guard, None)

    def free(self, guard: _Guard) -> None:
        """The connection is lost (or never became a transport). Idempotent."""
        self._slots.discard(guard)
        self._idle.pop(guard, None)
        self._evicting.discard(guard)
        if guard.transport is not None:
            self._by_transport.pop(guard.transport, None)
        self._changed.set()

    def serving(self, transport: asyncio.BaseTransport | None, probe: bool) -> bool:
        """A request starts: False if it may not (not a probe, and ``general_limit``
        others are being handled). Every True is followed by one ``answered``."""
        if not probe:
            if self._serving_general >= self.general_limit:
                self.busy += 1
                self._problems.report(
                    "busy",
                    f"HTTP request answered 503: {self.general_limit} requests other than "
                    f"health probes in progress; {self.busy} so far",
                )
                return False
            self._serving_general += 1
        guard = self._by_transport.get(transport) if transport is not None else None
        if guard is not None:
            self.in_use(guard)
        return True

    def answered(self, transport: asyncio.BaseTransport | None, probe: bool) -> None:
        if not probe:
            self._serving_general -= 1
        guard = self._by_transport.get(transport) if transport is not None else None
        if guard is not None:
            self.idle(guard)

    def close_silent(self) -> None:
        """At shutdown: aiohttp closes the connections it handles; these never sent a
        byte, so it never saw them."""
        for guard in list(self._slots):
            if guard.silent:
                self._evict(guard)

    def accept_failed(self, exc: OSError) -> None:
        self._problems.report(
            "accept", f"HTTP accept failed: {exc}; retrying in {ACCEPT_RETRY_S:g} s"
        )

    def _evict_longest_idle(self) -> None:
        closed = 0
        while self._idle and self.open - len(self._evicting) > self.evict_above:
            self._evict(next(iter(self._idle)))
            closed += 1
        if closed:
            self.evicted += closed
            self._problems.report(
                "evicted",
                f"HTTP connections idle longest closed for new ones: {self.open} open "
                f"(at most {self.max_connections}); {self.evicted} closed so far",
            )

    def _evict(self, guard: _Guard) -> None:
        self._idle.pop(guard, None)
        self._evicting.add(guard)
        guard.abort()


def _answer_tracking(connections: _Connections) -> Middleware:
    """Tells ``connections`` when a request is handled and answered, and answers a
    non-probe request beyond ``general_limit`` 503 (connection closed)."""

    @web.middleware
    async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
        probe = request.path in PROBE_PATHS
        transport = request.transport
        if not connections.serving(transport, probe):
            response = web.Response(status=503, text=BUSY_TEXT)
            response.force_close()
            return response
        try:
            return await handler(request)
        finally:  # the answer is written next: the connection is idle from here
            connections.answered(transport, probe)

    return track


class _GuardedRunner(web.AppRunner):
    """An ``AppRunner`` that listens itself (``listen``; no aiohttp site): its accept
    loop takes a connection only while ``_Connections`` has room for it, and puts a
    ``_Guard`` in front of aiohttp's ``RequestHandler``."""

    def __init__(self, app: web.Application, connections: _Connections, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._connections = connections
        self._bound: asyncio.Server | None = None
        self._sockets: list[socket.socket] = []
        self._accepting: set[asyncio.Task[None]] = set()
        self._connecting: set[asyncio.Task[None]] = set()

    @property
    def addresses(self) -> list[Any]:
        return [sock.getsockname() for sock in self._sockets]

    async def listen(self, bind: str) -> None:
        """Bind through asyncio (its address resolution, dual-stack rule, stale Unix
        socket removal and error texts), never let it serve, and accept on duplicates of
        its listening sockets."""
        loop = asyncio.get_running_loop()
        self._bound = await _bind(loop, bind)
        for bound in self._bound.sockets:
            sock = socket.socket(bound.family, bound.type, fileno=os.dup(bound.fileno()))
            sock.listen(BACKLOG)  # asyncio listens only when it starts serving
            sock.setblocking(False)
            self._sockets.append(sock)
            _keep(self._accepting, loop.create_task(self._accept_forever(sock)))

    async def cleanup(self) -> None:
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, *self._connecting, return_exceptions=True)
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
        if self._bound is not None:
            self._bound.close()
        self._connections.close_silent()
        await super().cleanup()

    async def _accept_forever(self, sock: socket.socket) -> None:
        while True:
            await _readable(sock)
            await self._connections.make_room()
            try:
                self._accept_while_room(sock)
            except OSError as exc:  # out of file descriptors: others may free some
                self._connections.accept_failed(exc)
                await asyncio.sleep(ACCEPT_RETRY_S)

    def _accept_while_room(self, sock: socket.socket) -> None:
        handler = self.server
        assert handler is not None  # set up before listen
        loop = asyncio.get_running_loop()
        while self._connections.has_room():
            try:
                conn, _peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            guard = _Guard(handler, self._connections)
            self._connections.admit(guard)
            _keep(self._connecting, loop.create_task(self._connect(conn, guard)))

    async def _connect(self, conn: socket.socket, guard: _Guard) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: guard, conn)
        except OSError:  # the peer left before its transport was made
            conn.close()
            self._connections.free(guard)


def _keep(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    """Hold a reference until the task is done (the loop keeps only a weak one)."""
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _bind(loop: asyncio.AbstractEventLoop, bind: str) -> asyncio.Server:
    def refuse() -> asyncio.Protocol:
        raise RuntimeError("never serving: connections are accepted by _GuardedRunner")

    if bind.startswith("unix:"):
        path = bind.removeprefix("unix:")
        return await loop.create_unix_server(refuse, path, backlog=BACKLOG, start_serving=False)
    host, port = _split(bind)
    return await loop.create_server(
        refuse, host, port, backlog=BACKLOG, reuse_port=False, start_serving=False
    )


async def _readable(sock: socket.socket) -> None:
    """Wait until a connection is pending on the listening socket, without taking it."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


class _Guard(asyncio.Protocol):
    """In front of aiohttp's ``RequestHandler``, made only at the connection's first
    byte (an idle connection costs no handler, task or timer of aiohttp's), every call
    forwarded to it from then on. Closes the connection when a request head stays
    incomplete for ``header_timeout_s``: armed when the connection opens and by the
    first byte after a complete head, disarmed when a head ends (``HeadScan``: empty
    lines alone never end one). aiohttp itself closes idle keep-alive connections, but
    counts a half-sent request as idle only from its own keep-alive clock. Tells
    ``_Connections`` when it opens, when a head is complete (in use) and when it is
    lost."""

    def __init__(self, handler: Callable[[], asyncio.Protocol], connections: _Connections) -> None:
        self._handler, self._connections = handler, connections
        self._inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._heads = HeadScan()

    @property
    def silent(self) -> bool:
        """Not a byte received: aiohttp does not know this connection."""
        return self._inner is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._connections.made(self)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            assert self.transport is not None  # data arrives on a made connection
            self._inner = self._handler()
            self._inner.connection_made(self.transport)
        completed, began = self._heads.feed(data)
        if completed:
            self._disarm()
            self._connections.in_use(self)  # until the middleware says it is answered
        if began:  # bytes after a complete head (empty lines too): the next one is owed
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.free(self)
        self._disarm()
        self.transport = None
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def abort(self) -> None:
        """Close at once (unsent answer bytes dropped): the slot is wanted."""
        if self.transport is not None:
            cast(asyncio.Transport, self.transport).abort()

    def _arm(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._connections.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport is not None and self._heads.owed:
            _LOG.debug("HTTP connection closed: no complete request head in time")
            self.transport.close()


def bound_port(runner: web.AppRunner) -> int | None:
    """The TCP port a started HTTP server listens on (None: a Unix socket)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return None


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2)
