"""The probe's own HTTP/1.1 exchange (docs/design.md §2, §16.10): an ``asyncio.Protocol``
whose bytes go through llhttp (``httptools.HttpResponseParser``: status line, headers and
chunked framing decoded in C), and a small pool of kept connections.

Why not aiohttp here: a micro-probe is one POST and a few hundred bytes of answer, and
aiohttp's per-request machinery cost about 0.5 ms of CPU each (``bench/probe_client_cost.py``),
twice this exchange. The engines' side reads (GET /metrics and the like) use it too, on
connections of their own; aiohttp stays for the HTTP server and webhooks. What this
module does not do: redirects (a probe follows none: a 3xx is the endpoint's answer),
content encodings (none is asked for), proxies, cookies.

Every size is bounded (the head by ``MAX_HEAD_BYTES``, every other byte after it by
``MAX_FRAMING_BYTES``, the body by the caller), every failure is an exception the prober
turns into a ``ProbeResult``: ``ConnectFailed``, ``ConnectionBroken`` (lost before the whole
answer), ``ResponseError`` (bytes llhttp refuses, an upgrade, a head too large, too much
framing, bytes while idle or before the request went out). Interim 1xx responses before
the answer are read past and counted (``Connection.interim``). Nothing here logs.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import platform
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from urllib.parse import urlsplit

import httptools

from llm_health.errors import ProtocolError

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; llhttp itself has no limit
# Bytes after the head that are not body (chunk sizes and extensions, CRLFs, trailers),
# beyond as many as the body's own: none of them is counted by the body's bound, and
# llhttp joins an unfinished trailer's value piece by piece (memory and CPU without end).
MAX_FRAMING_BYTES = 64 * 1024
MAX_IDLE_PER_ENDPOINT = 2  # kept connections per endpoint (one probe in flight, plus one)
IDLE_TIMEOUT_S = 15.0  # a kept connection unused this long is closed (aiohttp's default)
SWEEP_EVERY_S = 5.0  # a walk over every endpoint: not at every probe, nor every second
USER_AGENT = "llm-health-probe"


class ConnectFailed(OSError):
    """No TCP (or TLS) connection: refused, unreachable, a TLS handshake failure."""


class ConnectionBroken(OSError):
    """The connection ended before the whole answer arrived."""


class ResponseError(ProtocolError):
    """The server's bytes are not an HTTP/1.1 response we accept."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where a probe URL's request goes: ``authority`` is the Host header. ``key``: the
    connection pool's, made once (it is read twice a probe)."""

    host: str
    port: int
    tls: bool
    path: str
    authority: str
    key: tuple[str, int, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.host, self.port, self.tls))


@lru_cache(maxsize=8192)
def route_of(url: str) -> Route:
    """The route of an ``http://`` or ``https://`` URL (ValueError for anything else)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Route(parts.hostname, port, tls, path, parts.netloc.rpartition("@")[2])


def request_head(route: Route, headers: dict[str, str], length: int | None) -> bytes:
    """A request's head: a POST of ``length`` bytes of JSON, or a GET (``length`` None).
    Header names and values with CR, LF or NUL are refused (they would split the request:
    ValueError), as are non-Latin-1 ones."""
    method = "GET" if length is None else "POST"
    lines = [
        f"{method} {route.path} HTTP/1.1",
        f"Host: {route.authority}",
        f"User-Agent: {USER_AGENT}",
    ]
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    for name, value in headers.items():
        if _splits(name) or _splits(value) or not name or ":" in name:
            raise ValueError(f"header {name!r} has a character a header cannot hold")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _splits(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one exchange at a time: ``send`` a request, then read its
    answer as ``listener`` hears of news (``head_ready``, ``take_body``, ``drain``).
    ``reusable`` once an answer was read whole on a connection both sides keep open."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        # When the bytes ``take_body`` returns had all arrived (perf_counter): the moment of
        # the last read of the socket, not of a later callback's.
        self.arrived = 0.0
        # ``arrived`` is the kernel's receipt time (``_StampedSocket``), not our read's:
        # no stall of this process is in it (a first token timed so is not corrected for
        # one: ``client.MicroProbe._result``).
        self.stamped = False
        self._sent_at = 0.0  # when the request went out (perf_counter)
        self.head_at: float | None = None  # when the bytes that completed the head came
        # Called on news: the exchange reading this answer, driven by the connection's own
        # callbacks (``probe.client``, ``engines.side_reads``; docs/design.md §16.10). It
        # may be called again after the exchange is over: it must ignore that.
        self.listener: Callable[[], None] | None = None
        # Only during an exchange: the parser refers back to this protocol, and a cycle
        # would keep a closed connection (its transport, buffers) until the collector
        # runs, or for ever if it was alive at start-up's gc.freeze (app/heap.py).
        self._parser: httptools.HttpResponseParser | None = None
        self._reset()

    def _reset(self) -> None:
        self._active = False
        self.status: int | None = None
        self.complete = False
        self._keep_alive = False
        self._framed = False  # Content-Length or chunked: an early end is a break
        self._head_bytes = 0  # of the status lines and headers, as llhttp reports them
        self._raw = 0  # bytes received for this answer: its heads, framing, body
        self._interim = False  # llhttp is in an interim (1xx) response
        self.interim = 0  # interim responses read past (RFC 9110 §15.2)
        self._body: list[bytes] = []  # 56 bytes empty (a deque: 600)
        self._body_size = 0  # of the whole answer's body so far
        self._to_end: int | None = None  # while draining: the most body bytes awaited
        if not self.lost:  # a new connection's unasked bytes stay its first answer's fault
            self._error: str | None = None  # what broke the exchange (``ResponseError``)
        self.head_at = None

    # --- the exchange -----------------------------------------------------------------

    def send(self, request: bytes) -> None:
        self._reset()
        self._parser = httptools.HttpResponseParser(self)  # fresh for each answer
        self._active = True
        assert self.transport is not None
        self._sent_at = time.perf_counter()
        self.transport.write(request)

    # The steps of reading an answer, for an exchange driven by ``listener`` (each returns
    # at once: None or False means "not yet", to be asked again at the next news).

    def head_ready(self) -> bool:
        """Whether the status and the first of the body (or its end) are here: an engine
        sends the head at once and the first token later, and waking for each costs a
        loop turn (docs/design.md §16.10). When the head came: ``head_at``. Raises what
        broke the exchange."""
        if self.status is not None and self._news():
            return True
        self._raise_if_failed(before_head=self.status is None)
        return False

    def take_body(self) -> bytes | None:
        """The body bytes received since the last take, ``b""`` at the end of the
        answer, None while neither (raises what broke the exchange)."""
        body = self._body
        if body:
            chunks = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
            return chunks
        if self.complete:
            return b""
        self._raise_if_failed(before_head=False)
        if self.lost:
            return b""  # an answer delimited by the connection's end (HTTP/1.0 style)
        return None

    def drain(self, limit: int) -> bool | None:
        """``begin_drain``, then ``drained``."""
        self.begin_drain(limit)
        return self.drained()

    def begin_drain(self, limit: int) -> None:
        """From now on the answer's body is only counted, not kept (``drained``)."""
        unread = 0
        for chunk in self._body:
            unread += len(chunk)
        self._to_end = self._body_size - unread + limit
        self._body.clear()

    def drained(self) -> bool | None:
        """After ``begin_drain``: True once the answer ended within the limit, False once
        more than the limit came first, None until either (raises what broke it)."""
        assert self._to_end is not None
        if self.complete:
            return self._body_size <= self._to_end
        if self._body_size > self._to_end:
            return False
        self._raise_if_failed(before_head=self.status is None)
        if self.lost:
            return True  # an answer delimited by the connection's end
        return None

    @property
    def reusable(self) -> bool:
        return self.complete and self._keep_alive and not self.lost and self._error is None

    def rest(self) -> None:
        """Between exchanges (kept idle): no parser held, no bytes of the last answer."""
        self._parser = None
        self._body.clear()

    def close(self) -> None:
        """Close at once (mid-answer: the engine sees the client go and aborts)."""
        self.lost = True
        self._parser = None
        if self.transport is not None:
            self.transport.abort()

    def _raise_if_failed(self, *, before_head: bool) -> None:
        if self._error is not None:
            # A new exception each time, none kept: one kept here would hold, through its
            # traceback, the frames that read the bytes (their buffers, the parser) in a
            # cycle with this connection, for the collector to find (about 0.6 MiB a
            # failed exchange in ``serve``, whose collections are rare: app/heap.py).
            raise ResponseError(self._error)
        if self.lost and before_head:
            raise ConnectionBroken("server closed the connection")
        if self.lost and self._framed:
            raise ConnectionBroken("connection broke mid-stream")

    def _news(self) -> bool:
        """Whether the exchange has something new: body bytes (past the drain's limit,
        while it drains), the answer's end, a failure."""
        if self.complete or self.lost or self._error is not None:
            return True
        if self._to_end is not None:
            return self._body_size > self._to_end
        return bool(self._body)

    def _wake(self) -> None:
        listener = self.listener
        if listener is not None:
            listener()

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.arrived = time.perf_counter()
        self.stamped = False
        self._take(data)

    def data_stamped(self, data: bytes, arrived: float) -> None:
        """``data`` as the kernel received it at ``arrived`` (perf_counter): from a
        ``_StampedSocket``, whose bytes are timed by the kernel, not by this process.
        Bytes that arrived before the request went out answer no request of ours (a
        server that writes on accept, or unasked on a kept connection): never this
        exchange's answer, however soon they were read (docs/design.md §7.4)."""
        if arrived < self._sent_at and self._active:
            self.data_unasked()
            return
        self.arrived, self.stamped = arrived, True
        self._take(data)

    def data_unasked(self) -> None:
        """Bytes came before the request went out (the request is not sent then)."""
        self._fail("answer began before the request was sent")

    def _take(self, data: bytes) -> None:
        parser = self._parser
        if not self._active or parser is None:
            self._fail(self._unasked())
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the server switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP response: {_reason(exc)}")
        # One sum a read, the bounds only past MAX_HEAD_BYTES: no work a byte.
        self._raw += len(data)
        if self._raw > MAX_HEAD_BYTES and self._error is None:
            self._check_bounds()
        if self._news():
            self._wake()

    def _unasked(self) -> str:
        """What bytes outside an exchange are: before the first request (a server that
        writes on accept), or after an answer (on a kept connection)."""
        if self._sent_at == 0.0:
            return "answer began before the request was sent"
        return "bytes from the server outside an exchange"

    def _check_bounds(self) -> None:
        """The head's bound (llhttp buffers an unfinished header, and counts none), then
        the framing's: what came besides the body, past the head, at most as much as the
        body plus MAX_FRAMING_BYTES (an unfinished trailer or chunk extension grows
        nothing but this). Past either, nothing of the answer is read, not even its body
        or its end that came in the same read."""
        if self.status is None or self._head_bytes > MAX_HEAD_BYTES:
            error = f"response head longer than {MAX_HEAD_BYTES} bytes"
        elif self._raw - 2 * self._body_size > MAX_HEAD_BYTES + MAX_FRAMING_BYTES:
            error = f"more than {MAX_FRAMING_BYTES} bytes of chunk framing and trailers"
        else:
            return
        self._body.clear()
        self.complete = False
        self._fail(error)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._parser = None
        self._wake()

    def _fail(self, error: str) -> None:
        self._error = error
        self.close()
        self._wake()

    # --- llhttp callbacks (kept trivial: an exception here is llhttp's error) ---------

    def on_status(self, status: bytes) -> None:
        self._head_bytes += len(status) + 15

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status is not None:
            return  # a trailer (bounded as framing), or a second answer's (never read)
        size = len(name)
        self._head_bytes += size + len(value) + 4
        # Lowered only when its length could be one of the two (most headers: never).
        if (size == 14 or size == 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        if self.complete:
            self._error = "bytes from the server after the answer"
            return
        parser = self._parser
        assert parser is not None  # llhttp calls this from inside its feed_data
        status = parser.get_status_code()
        if status < 200 and status != 101:
            # An interim response (100 Continue, 103 Early Hints): a client reads past
            # those it did not ask for (RFC 9110 §15.2). llhttp takes it for a message of
            # its own and reads the final one next; its head counts toward the bound.
            self._interim, self._framed = True, False
            self.interim += 1
            return
        self.status = status
        self.head_at = self.arrived
        self._keep_alive = parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._body_size += len(body)
            if self._to_end is None:
                self._body.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            parser = self._parser
            if parser is not None and not parser.should_keep_alive():
                # llhttp reads nothing after it: no final answer can come.
                self._error = "an interim (1xx) response closed the connection"
            return
        self.complete = True
        self._active = False


def _reason(exc: Exception) -> str:
    return str(exc).strip()[:120] or type(exc).__name__


class Connections:
    """The prober's connections: opened per exchange, or taken from those kept after an
    answer read whole (``release(reuse=True)``), at most ``MAX_IDLE_PER_ENDPOINT`` per
    endpoint, each for at most ``IDLE_TIMEOUT_S`` unused. ``async with``: closes all."""

    def __init__(self, *, stamped: bool = False) -> None:
        # ``stamped``: plain-TCP connections to an IP address read through
        # ``_StampedSocket`` (where the system can: ``STAMPS``), their bytes timed by the
        # kernel when they arrived; the probe's first token is timed so (docs/design.md
        # §16.10). Otherwise, and for TLS or a host name, the event loop's transport.
        self._stamped = stamped and STAMPS
        self._idle: dict[tuple[str, int, bool], list[Connection]] = {}
        # Taken and not released yet: an exchange's, closed with the rest by ``close`` (an
        # exchange reads its answer's tail after its result is out: docs/design.md §16.10).
        self._lent: set[Connection] = set()
        self._tls: ssl.SSLContext | None = None
        self._swept = 0.0
        self.opened = 0
        self.reused = 0

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    async def take(self, route: Route, *, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection to ``route`` and whether it was kept from an earlier exchange
        (``take_kept``, else ``open``)."""
        kept = self.take_kept(route, fresh=fresh)
        if kept is not None:
            return kept, True
        return await self.open(route), False

    def take_kept(self, route: Route, *, fresh: bool = False) -> Connection | None:
        """A connection to ``route`` kept from an earlier exchange, or None. ``fresh``:
        none, and the route's kept ones closed (one of them was just found dead: the
        others, kept as long, are as likely dead too)."""
        now = time.monotonic()
        if now - self._swept >= SWEEP_EVERY_S:
            self._sweep(now)
        if fresh:
            for connection in self._idle.pop(route.key, []):
                connection.close()
            return None
        idle = self._idle.get(route.key)
        while idle:
            connection = idle.pop()
            if not connection.lost:
                self.reused += 1
                self._lent.add(connection)
                return connection
        return None

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """After the exchange: kept when ``reuse`` and the connection is reusable."""
        connection.listener = None  # the exchange's: no cycle through it, no stale call
        self._lent.discard(connection)
        if not (reuse and connection.reusable):
            connection.close()
            return
        idle = self._idle.setdefault(connection.route.key, [])
        if len(idle) >= MAX_IDLE_PER_ENDPOINT:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        connection.rest()
        idle.append(connection)

    def close(self) -> None:
        """Close every connection: those kept and those an exchange still holds."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        lent, self._lent = self._lent, set()
        for connection in lent:
            connection.close()

    async def open(self, route: Route) -> Connection:
        """A new connection to ``route`` (``ConnectFailed`` if none can be had)."""
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[Connection] = loop.create_future()
        connecting = self.open_soon(route, partial(self._settle, opened))
        if connecting is not None:
            try:
                return await opened
            except asyncio.CancelledError:
                connecting.cancel()  # the socket being connected goes too
                if opened.done() and not opened.cancelled() and opened.exception() is None:
                    self.release(opened.result(), reuse=False)  # connected as it came
                raise
        connection = Connection(route)
        await self._connect_transport(loop, connection, route)
        self._opened(connection)
        return connection

    def open_soon(self, route: Route, done: Connected) -> StampedConnect | None:
        """``open`` without a task, where the connection is read by us (``STAMPS``, an IP
        address, no TLS): ``done(connection, None)`` once connected, ``done(None,
        ConnectFailed)`` if not, never after ``cancel``. Raises ``ConnectFailed`` if it
        fails at once. None: not here, ``open`` it. A probe that opens a connection (every
        probe of an engine that closes after each answer, as llama.cpp's server does) no
        longer makes a task and three coroutine frames for it."""
        family = _address_family(route.host) if self._stamped and not route.tls else None
        if family is None:
            return None
        return StampedConnect(self, asyncio.get_running_loop(), family, route, done)

    def _settle(
        self,
        opened: asyncio.Future[Connection],
        connection: Connection | None,
        failed: OSError | None,
    ) -> None:
        """``open``'s future, from ``open_soon``'s answer."""
        if opened.done():  # ``open`` was cancelled meanwhile
            if connection is not None:
                self.release(connection, reuse=False)
        elif connection is not None:
            opened.set_result(connection)
        else:
            assert failed is not None
            opened.set_exception(failed)

    def _opened(self, connection: Connection) -> None:
        self.opened += 1
        self._lent.add(connection)

    async def _connect_transport(
        self, loop: asyncio.AbstractEventLoop, connection: Connection, route: Route
    ) -> None:
        """``connection`` on the loop's own transport (TLS, a host name, no stamps)."""
        tls = self._tls_context() if route.tls else None
        try:
            transport, _ = await loop.create_connection(
                lambda: connection, route.host, route.port, ssl=tls
            )
        except OSError as exc:
            raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
        connection.transport = transport  # uvloop may call connection_made after this returns

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # verified, as aiohttp's default
        return self._tls

    def _sweep(self, now: float) -> None:
        """Close kept connections unused for IDLE_TIMEOUT_S (or closed by the server)."""
        self._swept = now
        for key, idle in list(self._idle.items()):
            if not _any_stale(idle, now):
                continue  # the common case: nothing to close, nothing made
            kept = []
            for connection in idle:
                if connection.lost or now - connection.idle_since >= IDLE_TIMEOUT_S:
                    connection.close()
                else:
                    kept.append(connection)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]


def _any_stale(idle: list[Connection], now: float) -> bool:
    """Whether a kept connection is to be closed: lost, or unused for IDLE_TIMEOUT_S."""
    for connection in idle:  # a loop, not all(...): no generator made per endpoint
        if connection.lost or now - connection.idle_since >= IDLE_TIMEOUT_S:
            return True
    return False


# --- bytes timed by the kernel ---------------------------------------------------------
#
# A first token's bytes reach the host long before this process may read them: behind a
# busy loop, a collector pause, other processes on the cores. Timed when read, the TTFT
# holds all of that (the prober's own lateness, docs/design.md §7.4). With SO_TIMESTAMPNS
# the kernel stamps every packet it receives, and ``recvmsg`` hands over the stamp of the
# latest packet a read took in (so a TCP socket does too): the time the bytes arrived,
# whatever this process did meanwhile. uvloop's transports read with ``read`` and drop
# it, so these connections read their socket themselves (``_StampedSocket``).


def _so_timestampns() -> int | None:
    """The option's number where it is known: Python's socket module does not name it;
    Linux's is 35 on x86-64 and arm64 (the generic number; with a 64-bit time_t the
    struct timespec of two int64). Elsewhere (another system or architecture, where the
    number or the struct may differ) nothing is stamped and the loop's transport reads."""
    if hasattr(socket, "SO_TIMESTAMPNS"):
        return int(socket.SO_TIMESTAMPNS)
    known = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "arm64")
    return 35 if known and struct.calcsize("@q") == 8 else None


_SO_TIMESTAMPNS = _so_timestampns()
STAMPS = _SO_TIMESTAMPNS is not None
READ_SIZE = 256 * 1024  # at most this much a read (uvloop's own read size)
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec
_TIMESPEC = struct.Struct("@qq")


def _address_family(host: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 for an IP literal; None for a host name (resolved by the
    loop's transport, not here)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


Connected = Callable[["Connection | None", "OSError | None"], None]


def _stamped_socket(family: socket.AddressFamily) -> socket.socket:
    """A non-blocking TCP socket whose reads bear the kernel's receipt time."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loop's transports
        assert _SO_TIMESTAMPNS is not None  # STAMPS
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError as exc:
        sock.close()
        raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
    return sock


class StampedConnect:
    """A non-blocking TCP connect driven by the loop's writer callback (what
    ``loop.sock_connect`` does, without its future and the task awaiting it): once the
    socket is writable, its error (``SO_ERROR``) says whether it connected. ``cancel``
    closes the socket; ``done`` is then never called."""

    __slots__ = ("_connections", "_done", "_fd", "_loop", "_route", "_sock")

    def __init__(
        self,
        connections: Connections,
        loop: asyncio.AbstractEventLoop,
        family: socket.AddressFamily,
        route: Route,
        done: Connected,
    ) -> None:
        self._connections = connections
        self._loop = loop
        self._route = route
        self._done = done
        sock = _stamped_socket(family)
        error = sock.connect_ex((route.host, route.port))
        if error not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EINTR):
            sock.close()
            raise ConnectFailed(error, os.strerror(error))
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._loop.remove_writer(self._fd)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            sock.close()
            self._done(None, ConnectFailed(error, os.strerror(error)))
            return
        connection = Connection(self._route)
        _StampedSocket(self._loop, sock, connection)
        self._connections._opened(connection)
        self._done(connection, None)

    def cancel(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_writer(self._fd)
            sock.close()


class _StampedSocket:
    """A plain TCP connection read with ``recvmsg``, each read's bytes handed to its
    ``Connection`` with the kernel's receipt time (``Connection.data_stamped``), and
    written with ``send``: the part of ``asyncio.Transport`` the ``Connection`` uses
    (``write``, ``abort``, ``close``, ``is_closing``), with its callbacks' order:
    ``connection_made``, then bytes, then ``eof_received`` and ``connection_lost`` once."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Connection
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol: Connection | None = protocol  # None once closed: no cycle left
        self._pending = b""  # written and not sent yet (the socket's buffer was full)
        self._unread = select.poll()  # whether bytes wait unread (``write``)
        self._unread.register(self._fd, select.POLLIN)
        loop.add_reader(self._fd, self._readable)
        protocol.connection_made(self)  # type: ignore[arg-type]

    def _readable(self) -> None:
        sock, protocol = self._sock, self._protocol
        if sock is None or protocol is None:
            return
        try:
            data, ancillary, _flags, _address = sock.recvmsg(READ_SIZE, _STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        if not data:
            protocol.eof_received()
            self._lose(None)
            return
        protocol.data_stamped(data, _arrived(ancillary))

    def write(self, data: bytes) -> None:
        """Send a request, unless bytes came before it and wait unread (this loop turn
        did not read them): they answer no request of ours, and a read that took them in
        with the answer would bear the answer's stamp (docs/design.md §7.4)."""
        sock = self._sock
        if sock is None:
            return  # closed: the connection has heard (connection_lost)
        if self._pending:
            self._pending += data
            return
        if self._unread.poll(0) and self._came_unasked(sock):
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lose(exc)
            return
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _came_unasked(self, sock: socket.socket) -> bool:
        """Whether bytes wait unread (then the connection fails: ``data_unasked``), or
        the connection is lost meanwhile (the server had closed a kept one: its request
        is sent again on a new one, as ever)."""
        protocol = self._protocol
        try:
            data = sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._lose(exc)
            return True
        if protocol is not None and data:
            protocol.data_unasked()
        elif protocol is not None:
            protocol.eof_received()
        self._lose(None)
        return True

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        self._pending = self._pending[sent:]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def is_closing(self) -> bool:
        return self._sock is None

    def abort(self) -> None:
        self._lose(None)

    def close(self) -> None:
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        """Close the socket once; ``connection_lost`` on the loop's next turn (as a
        transport calls it)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._loop.remove_reader(self._fd)
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending = b""
        sock.close()
        protocol, self._protocol = self._protocol, None  # the connection keeps its transport
        if protocol is not None:
            self._loop.call_soon(protocol.connection_lost, exc)


def _arrived(ancillary: list[tuple[int, int, bytes]]) -> float:
    """When the latest packet read arrived, on ``time.perf_counter``'s clock: the
    kernel's stamp (CLOCK_REALTIME) moved by the two clocks' offset now. Never later than
    now; our own read's time when there is no stamp, or one from the future (the wall
    clock stepped back meanwhile)."""
    now = time.perf_counter()
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
            seconds, nanoseconds = _TIMESPEC.unpack_from(raw)
            ago = time.time() - (seconds + nanoseconds * 1e-9)
            return now - ago if ago >= 0 else now
    return now
