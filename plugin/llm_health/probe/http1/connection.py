"""One HTTP/1.1 connection read through llhttp (``httptools.HttpResponseParser``: status
line, headers and chunked framing decoded in C): the request's head, the answer's bounds,
and the failures an exchange turns into a ``ProbeResult`` (docs/design.md §16.10)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

import httptools

from llm_health.errors import ProtocolError

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; llhttp itself has no limit
# Bytes after the head that are not body (chunk sizes and extensions, CRLFs, trailers),
# beyond as many as the body's own: none of them is counted by the body's bound, and
# llhttp joins an unfinished trailer's value piece by piece (memory and CPU without end).
MAX_FRAMING_BYTES = 64 * 1024
USER_AGENT = "llm-health-probe"


class ConnectFailed(OSError):
    """No TCP (or TLS) connection: refused, unreachable, a TLS handshake failure."""


class ConnectionBroken(OSError):
    """The connection ended before the whole answer arrived."""


class ResponseError(ProtocolError):
    """The server's bytes are not an HTTP/1.1 response we accept."""


class UnsendableRequest(ValueError):
    """A URL or header that cannot make an HTTP/1.1 request: the target's configuration,
    an endpoint's fault (a probe's ERROR), never our own."""


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
    """The route of an ``http://`` or ``https://`` URL (``UnsendableRequest`` for anything
    else)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError: not a number, or out of range
    except ValueError as exc:  # also a bracketed host that is no IPv6 address
        raise UnsendableRequest(f"not a usable URL: {url!r} ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsendableRequest(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Route(parts.hostname, port, tls, path, parts.netloc.rpartition("@")[2])


def request_head(route: Route, headers: dict[str, str], length: int | None) -> bytes:
    """A request's head: a POST of ``length`` bytes of JSON, or a GET (``length`` None).
    Header names and values with CR, LF or NUL are refused (they would split the request:
    ``UnsendableRequest``), as are non-Latin-1 ones (``UnicodeEncodeError``)."""
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
            raise UnsendableRequest(f"header {name!r} has a character a header cannot hold")
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
        # ``arrived`` is the kernel's receipt time (``stamped.StampedSocket``), not our read's:
        # no stall of this process is in it (a first token timed so is not corrected for
        # one: ``verdict.result_of``).
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
        self._body: list[bytes] = []  # a list: an empty deque is ten times its size
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
        ``stamped.StampedSocket``, whose bytes are timed by the kernel, not by this process.
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
