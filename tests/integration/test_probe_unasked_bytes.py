"""The probe's own HTTP/1.1 exchange (``probe.http1``) against hostile servers on loopback,
the bytes it did not ask for (docs/design.md §2.5, §7.4): framing and trailers past their
bound, interim (1xx) responses before the answer, and an answer that began before the
request was sent, on a new connection and on a kept one."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import socket
import struct
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator

import pytest

from llm_health.model.outcome import Outcome
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.http1 import (
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    STAMPS,
    Connection,
    ResponseError,
    request_head,
    route_of,
)
from tests.integration.test_probe_http1 import ONE_TOKEN, SSE_HEAD, TOKEN, probing, target
from tests.raw_http import RawServer, Script
from tests.started import probe_once

pytestmark = pytest.mark.timeout(30)

CHUNKED_HEAD = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
ENDLESS_AT_MOST = 64 * 1024 * 1024  # what the endless server writes at most (bounded)


# --- bytes after the head that are not body --------------------------------------------


class Endless:
    """A loopback server that answers the request with ``start``, then ``filler`` without
    end: until the client goes, ENDLESS_AT_MOST bytes, or 10 s. ``written``: how much."""

    def __init__(self, start: bytes, filler: bytes) -> None:
        self.start, self.filler = start, filler
        self.written = 0
        self.gone = asyncio.Event()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            with contextlib.suppress(AttributeError):
                server.close_clients()  # type: ignore[attr-defined]  # Python 3.13

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(self.start)
            ends = time.monotonic() + 10
            while self.written < ENDLESS_AT_MOST and time.monotonic() < ends:
                writer.write(self.filler)
                self.written += len(self.filler)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.gone.set()
            writer.close()


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("a trailer's value", CHUNKED_HEAD + b"0\r\nX-Trailer: "),
        ("a trailer's name", CHUNKED_HEAD + b"0\r\nX-"),
        ("a chunk extension", CHUNKED_HEAD + b"5;ext="),
    ],
)
async def test_endless_framing_after_the_head_is_an_error_at_its_bound(
    name: str, start: bytes
) -> None:
    """A 200 whose chunked body never gets a byte of body: after the head, a trailer (or a
    chunk extension) that never ends. llhttp joins the unfinished piece by piece and no
    body bound counts it: the framing's bound ends it, long before the timeout."""
    endless = Endless(start, b"a" * 16384)
    async with endless.serving() as port, new_connections() as connections:
        result = await probe_once(MicroProbe(connections), target(port, timeout="5s"))
        await asyncio.wait_for(endless.gone.wait(), 5)  # the connection was closed
    assert result.outcome is Outcome.ERROR, (name, result)
    assert result.detail == f"more than {MAX_FRAMING_BYTES} bytes of chunk framing and trailers"
    assert result.total_ms < 4000, result  # not the timeout: the bound
    assert endless.written < ENDLESS_AT_MOST  # the client went: it did not read on


async def test_a_chunked_body_in_tiny_chunks_is_read_within_the_bound() -> None:
    """Framing beside the body is allowed as much as the body's own size, plus the bound:
    a token sent a byte a chunk (five bytes of framing each) is still read."""
    token = ONE_TOKEN[len(CHUNKED_HEAD) :]
    body = b"".join(b"1\r\n%s\r\n" % token[i : i + 1] for i in range(len(token)))
    async with probing(Script([(CHUNKED_HEAD + body + b"0\r\n\r\n", "keep")])) as (
        server,
        prober,
        connections,
    ):
        results = [await probe_once(prober, target(server.port)) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 2, results
    assert connections.reused == 1


async def test_trailers_within_the_bound_end_the_answer_and_keep_the_connection() -> None:
    with_trailers = ONE_TOKEN[: -len(b"0\r\n\r\n")] + b"0\r\nX-Checksum: abc\r\nX-Took: 3\r\n\r\n"
    async with probing(Script([(with_trailers, "keep")])) as (server, prober, connections):
        results = [await probe_once(prober, target(server.port)) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 2, results
    assert connections.reused == 1


# --- interim (1xx) responses ------------------------------------------------------------

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"


@pytest.mark.parametrize(
    ("name", "interim"),
    [
        ("100 Continue", [CONTINUE]),
        ("103 Early Hints", [EARLY_HINTS]),
        ("both, and a 102", [CONTINUE, b"HTTP/1.1 102 Processing\r\n\r\n", EARLY_HINTS]),
    ],
)
@pytest.mark.parametrize("apart", [False, True], ids=["one write", "apart"])
async def test_interim_responses_before_the_answer_are_read_past_and_counted(
    name: str, interim: list[bytes], apart: bool
) -> None:
    """RFC 9110 §15.2: a client reads past 1xx responses it did not expect. The answer
    after them is the probe's (FAST, as without them), the connection is kept as usual,
    and the count is in the result (the metric's)."""
    reply: bytes | list[bytes] = [*interim, ONE_TOKEN] if apart else b"".join(interim) + ONE_TOKEN
    async with probing(Script([(reply, "keep")])) as (server, prober, connections):
        results = [await probe_once(prober, target(server.port)) for _ in range(3)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 3, (name, results)
    assert [r.interim for r in results] == [len(interim)] * 3
    assert [r.status for r in results] == [200] * 3
    assert connections.opened == 1 and connections.reused == 2


async def test_the_answer_after_an_interim_response_is_timed_from_the_request() -> None:
    """The head timed is the answer's, not the interim one's; the TTFT runs from the
    request as ever."""
    script = Script([([EARLY_HINTS, ONE_TOKEN], "keep")], pause_s=0.15)
    async with probing(script) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port))
    assert result.outcome is Outcome.FAST, result
    assert result.headers_ms is not None and result.headers_ms >= 150, result
    assert result.ttft_ms is not None and result.ttft_ms >= result.headers_ms


@pytest.mark.parametrize(
    ("name", "reply", "detail"),
    [
        (
            "101 without an upgrade",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + ONE_TOKEN,
            "HTTP 101",
        ),
        (
            "101 with an upgrade",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
            + ONE_TOKEN,
            "HTTP 101",
        ),
        (
            "an interim response that closes",
            b"HTTP/1.1 103 Early Hints\r\nConnection: close\r\n\r\n" + ONE_TOKEN,
            "",
        ),
        ("interim responses without end", EARLY_HINTS * 2000 + ONE_TOKEN, "response head longer"),
        ("only an interim response", CONTINUE, "server closed the connection"),
    ],
)
async def test_interim_responses_never_make_a_verdict_or_a_success(
    name: str, reply: bytes, detail: str
) -> None:
    """101 stays an error; the interim heads count toward the head's bound together; an
    interim response alone is no answer."""
    async with probing(Script([(reply, "close")])) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port))
    assert result.outcome is Outcome.ERROR, (name, result)
    assert detail in result.detail, (name, result.detail)
    if "101" not in name:
        assert not result.detail.startswith("HTTP 1"), result.detail
    if name == "interim responses without end":
        assert len(EARLY_HINTS * 2000) > MAX_HEAD_BYTES


async def test_a_kept_connection_closed_after_an_interim_response_is_not_sent_again() -> None:
    """An interim response is a response: the server saw the request, so a kept
    connection that ends after one is no stale connection to send the request on again
    (that would be a retry of a failed probe): an ERROR."""
    script = Script([(ONE_TOKEN, "keep"), (CONTINUE, "close")])  # per connection
    async with probing(script) as (server, prober, _connections):
        first = await probe_once(prober, target(server.port))
        second = await probe_once(prober, target(server.port))
    assert first.outcome is Outcome.FAST, first
    assert second.outcome is Outcome.ERROR, second
    assert second.interim == 1
    assert prober.stale_resends == 0 and server.requests == 2


# --- an answer that began before the request was sent ----------------------------------


class Canned:
    """A loopback server in a thread of its own, with blocking sockets: what it writes
    reaches the prober's socket while the prober's loop is held (``time.sleep``), so the
    bytes are there before the request goes out. ``on_accept``: written at accept, before
    any request is read; ``unasked``: written on the kept connection when ``nudge`` is set,
    after the first answer, with no request."""

    def __init__(self, *, on_accept: bytes = b"", unasked: bytes = b"") -> None:
        self.on_accept, self.unasked = on_accept, unasked
        self.nudge, self.wrote = threading.Event(), threading.Event()
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # a close does not wake an accept: it looks again
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()

    @contextlib.contextmanager
    def running(self) -> Iterator[Canned]:
        thread = threading.Thread(target=self._serve, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self.nudge.set()
            self._listener.close()
            thread.join(5)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with client, contextlib.suppress(OSError):
                client.settimeout(5)
                self._answer(client)

    def _answer(self, client: socket.socket) -> None:
        if self.on_accept:
            client.sendall(self.on_accept)  # never reads the request
            self.wrote.set()
            client.recv(65536)
            return
        self._read_request(client)
        client.sendall(ONE_TOKEN)
        self.nudge.wait(5)
        if self._stop.is_set():
            return
        if not self.unasked:  # the connection closed while idle instead
            client.shutdown(socket.SHUT_WR)
            self.wrote.set()
            return
        client.sendall(self.unasked)  # no request asked for it
        self.wrote.set()
        self._read_request(client)
        client.sendall(ONE_TOKEN)
        client.recv(65536)

    def _read_request(self, client: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            more = client.recv(65536)
            if not more:
                raise OSError("closed")
            data += more
        self.requests += 1


def hold_the_loop(until: threading.Event) -> None:
    """Block the prober's loop (no read of any socket) until the server wrote, and a
    moment more for the bytes to reach the socket."""
    assert until.wait(5)
    time.sleep(0.05)


@pytest.mark.skipif(not STAMPS, reason="the kernel's receipt times are Linux's (x86-64, arm64)")
async def test_an_answer_written_on_accept_is_an_error_not_fast() -> None:
    """The server writes a whole good stream as it accepts, never reading the request:
    those bytes arrived before the request went out, so they answer nothing of ours."""
    with Canned(on_accept=ONE_TOKEN).running() as canned:
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            probe = asyncio.create_task(probe_once(prober, target(canned.port)))
            await asyncio.sleep(0)  # the probe starts: its connect is under way
            hold_the_loop(canned.wrote)
            result = await probe
    assert result.outcome is Outcome.ERROR, result
    assert result.detail == "answer began before the request was sent"
    assert result.ttft_ms is None


@pytest.mark.skipif(not STAMPS, reason="the kernel's receipt times are Linux's (x86-64, arm64)")
async def test_unasked_bytes_on_a_kept_connection_are_never_the_next_answer() -> None:
    """After a good answer the server writes a second good stream on the kept connection,
    unasked. Read while idle, the connection is dropped (the next probe opens another);
    here they are read only after the next request went out (the loop was held): their
    kernel time says they came before it, so the probe is an error, not FAST."""
    with Canned(unasked=ONE_TOKEN).running() as canned:
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            first = await probe_once(prober, target(canned.port))
            await asyncio.sleep(0.1)  # its tail read: the connection is kept
            canned.nudge.set()
            hold_the_loop(canned.wrote)
            second = await probe_once(prober, target(canned.port))
            reused = connections.reused
    assert first.outcome is Outcome.FAST, first
    assert reused == 1  # the second probe went on the kept connection
    assert second.outcome is Outcome.ERROR, second
    assert second.detail == "answer began before the request was sent"
    assert prober.stale_resends == 0


@pytest.mark.skipif(not STAMPS, reason="the kernel's receipt times are Linux's (x86-64, arm64)")
async def test_a_kept_connection_found_closed_at_the_send_is_sent_again() -> None:
    """What held before, through the look before the request: the server closed the kept
    connection while idle and the prober reads its end only as the next request goes
    out. That end is no answer: the request goes once more on a new connection."""
    with Canned().running() as canned:
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            first = await probe_once(prober, target(canned.port))
            await asyncio.sleep(0.1)
            canned.nudge.set()
            hold_the_loop(canned.wrote)
            second = await probe_once(prober, target(canned.port))
            opened, reused = connections.opened, connections.reused
    assert first.outcome is Outcome.FAST, first
    assert second.outcome is Outcome.FAST, second
    assert prober.stale_resends == 1
    assert opened == 2 and reused == 1


async def test_unasked_bytes_read_while_idle_drop_the_kept_connection() -> None:
    """What held before: bytes on a kept connection between exchanges close it; the next
    probe opens a new connection and reads its own answer."""
    with Canned(unasked=ONE_TOKEN).running() as canned:
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            first = await probe_once(prober, target(canned.port))
            await asyncio.sleep(0.1)
            canned.nudge.set()
            assert await asyncio.to_thread(canned.wrote.wait, 5)
            await asyncio.sleep(0.1)  # the loop reads them while the connection is idle
            second = await probe_once(prober, target(canned.port))
            opened, reused = connections.opened, connections.reused
    assert first.outcome is Outcome.FAST, first
    assert second.outcome is Outcome.FAST, second  # its own answer, on a new connection
    assert opened == 2 and reused == 0


async def test_a_read_the_kernel_timed_before_the_request_is_no_answer() -> None:
    """The other check: bytes that came after the look before the request was written
    (or on a system where it finds none) but bear a kernel time before the request's:
    the transport hands them over as it hands any read, and they are no answer."""
    async with RawServer(Script([(b"", "hold")])) as server, new_connections() as pool:
        route = route_of(f"http://127.0.0.1:{server.port}/v1/completions")
        connection, _ = await pool.take(route)
        connection.send(request_head(route, {}, 2) + b"{}")
        connection.data_stamped(ONE_TOKEN, time.perf_counter() - 1.0)
        with pytest.raises(ResponseError, match="answer began before the request was sent"):
            connection.head_ready()
        pool.release(connection, reuse=True)
        assert connection.lost  # never kept


# --- what a failed exchange leaves ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "start", "filler"),
    [
        ("endless trailer", CHUNKED_HEAD + b"0\r\nX-Trailer: ", b"a" * 16384),
        ("malformed", b"HTTP/1.1 200 OK\r\nX: y\r\n\r\n", b"\x00" * 16384),
        ("head too long", b"HTTP/1.1 200 OK\r\nX-Pad: ", b"a" * 16384),
    ],
)
async def test_a_failed_exchange_leaves_nothing_for_the_collector(
    monkeypatch: pytest.MonkeyPatch, name: str, start: bytes, filler: bytes
) -> None:
    """The connection of an exchange that failed goes when the exchange is over, its read
    buffers and parser with it, not at the collector's next run: the prober's collections
    are rare (app/heap.py), and a backend that fails every probe so grew ``serve`` by
    about 0.6 MiB a probe (a kept exception's traceback held the frames that read the
    bytes, in a cycle with the connection)."""
    made: weakref.WeakSet[Connection] = weakref.WeakSet()
    real = Connection.connection_made

    def tracked(self: Connection, transport: asyncio.BaseTransport) -> None:
        made.add(self)
        real(self, transport)

    monkeypatch.setattr(Connection, "connection_made", tracked)
    endless = Endless(start, filler)
    gc.collect()
    gc.disable()
    try:
        async with endless.serving() as port, new_connections() as connections:
            result = await probe_once(MicroProbe(connections), target(port, timeout="5s"))
            await asyncio.wait_for(endless.gone.wait(), 5)
            assert len(made) == 0 or await _gone(made), (name, result)
    finally:
        gc.enable()
    assert result.outcome is Outcome.ERROR, (name, result)


async def _gone(made: weakref.WeakSet[Connection]) -> bool:
    """Whether every connection in ``made`` goes within a few loop turns (a transport lets
    go of its protocol on the turn after its close)."""
    for _ in range(20):
        if not made:
            return True
        await asyncio.sleep(0.01)
    return False


# --- what held before, and holds with the rules above -----------------------------------

GZIPPED = gzip.compress(TOKEN)
HELD = {
    "content-length and chunked": SSE_HEAD
    + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    + ONE_TOKEN[len(CHUNKED_HEAD) :],
    "chunk size overflow": CHUNKED_HEAD + b"fffffffffffffffffff\r\n" + TOKEN + b"\r\n",
    "10 MB of headers": b"HTTP/1.1 200 OK\r\n" + (b"X-A: " + b"a" * 1000 + b"\r\n") * 10_000,
    "gzip body": SSE_HEAD
    + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(GZIPPED), GZIPPED),
    "sse line without a newline": SSE_HEAD + b"\r\n" + TOKEN.rstrip(b"\n"),
}


@pytest.mark.parametrize("name", sorted(HELD))
async def test_hostile_answers_that_were_errors_still_are(name: str) -> None:
    then = "close" if name == "sse line without a newline" else "hold"
    async with probing(Script([(HELD[name], then)])) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port))
    assert result.outcome in (Outcome.ERROR, Outcome.TIMEOUT), (name, result)


async def test_an_answer_a_byte_every_100_ms_is_a_timeout() -> None:
    script = Script([(list(ONE_TOKEN[i : i + 1] for i in range(len(ONE_TOKEN))), "keep")])
    script.pause_s = 0.1
    async with probing(script) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port, timeout="1s"))
    assert result.outcome is Outcome.TIMEOUT, result


async def test_a_reset_after_the_head_is_an_error() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(CHUNKED_HEAD)
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # an RST, not a FIN

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    try:
        async with new_connections() as connections:
            port = server.sockets[0].getsockname()[1]
            result = await probe_once(MicroProbe(connections), target(port))
    finally:
        server.close()
    assert result.outcome is Outcome.ERROR, result
