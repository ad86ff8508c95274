"""The probe's own HTTP/1.1 exchange (``probe.http1``, docs/design.md §2) against a raw
loopback TCP server whose every byte the test writes: framing, kept connections, broken
kept connections, bounds, and fuzzed responses that never raise and are never a success."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome
from llm_health.probe.client import MAX_TAIL_BYTES, REUSE_GRACE_S, MicroProbe, new_connections
from llm_health.probe.http1 import (
    MAX_HEAD_BYTES,
    Connection,
    Connections,
    request_head,
    route_of,
)
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.target import ProbeTarget
from tests.raw_http import RawServer, Script, heard, until
from tests.started import probe_once

TOKEN = b'data: {"choices": [{"index": 0, "text": "Hi", "finish_reason": "length"}]}\n\n'
DONE = b"data: [DONE]\n\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def chunked(*parts: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body + (b"0\r\n\r\n" if end else b"")


ONE_TOKEN = chunked(TOKEN, DONE)  # what an engine sends for max_tokens 1
SIZED = b"Content-Length: %d\r\n\r\n%s" % (len(TOKEN), TOKEN)


def target(port: int, **probe: object) -> ProbeTarget:
    settings = ProbeSettings.model_validate(
        {"timeout": "2s", "healthy_ttft": "500ms", "cache_bust": "none", **probe}
    )
    return settings.to_target("c", f"127.0.0.1:{port}")


@contextlib.asynccontextmanager
async def probing(script: Script) -> AsyncIterator[tuple[RawServer, MicroProbe, Connections]]:
    async with RawServer(script) as server, new_connections() as connections:
        yield server, MicroProbe(connections), connections


async def test_a_one_token_stream_that_ends_at_once_keeps_its_connection() -> None:
    async with probing(Script([(ONE_TOKEN, "keep")])) as (server, prober, connections):
        results = [await probe_once(prober, target(server.port)) for _ in range(5)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 5, results
    assert server.connections == 1 and server.requests == 5
    assert connections.opened == 1 and connections.reused == 4
    assert prober.stale_resends == 0
    assert all(r.ttft_ms is not None and r.connect_ms is not None for r in results)


def head_status(connection: Connection) -> int | None:
    """The answer's status once ``head_ready`` says the head (and the first of the body)
    came, else None."""
    return connection.status if connection.head_ready() else None


async def test_a_closed_connection_is_freed_at_once_not_by_the_collector() -> None:
    """No cycle through the parser (it refers back to its protocol): a closed connection
    goes when its last reference does. A cycle would keep it, its transport and buffers
    until a collection, and for ever if it was alive when start-up froze the heap."""
    async with RawServer(Script([(ONE_TOKEN, "keep")])) as server, new_connections() as pool:
        route = route_of(f"http://127.0.0.1:{server.port}/v1/completions")
        gc.disable()
        try:
            connection, _ = await pool.take(route)
            connection.send(request_head(route, {}, 2) + b"{}")
            assert await heard(connection, partial(head_status, connection)) == 200
            while await heard(connection, connection.take_body):
                pass
            gone = weakref.ref(connection)
            pool.release(connection, reuse=True)  # kept idle
            del connection
            assert gone() is not None
            pool.close()
            await asyncio.wait_for(until(lambda: gone() is None), 2)
        finally:
            gc.enable()


async def test_a_stream_whose_rest_dawdles_is_cut_after_the_token() -> None:
    """The rest does not follow within the grace: the connection is closed (the engine
    sees the client go and stops decoding), and the next probe opens a new one."""
    dawdling = chunked(TOKEN, end=False)
    async with probing(Script([(dawdling, "hold")])) as (server, prober, connections):
        first = await probe_once(prober, target(server.port))
        await asyncio.wait_for(until(lambda: server.eofs == 1), 2)
        second = await probe_once(prober, target(server.port))
    assert first.outcome is Outcome.FAST and second.outcome is Outcome.FAST
    assert first.total_ms < first.ttft_ms + 1000 * REUSE_GRACE_S + 200  # type: ignore[operator]
    assert server.connections == 2 and connections.reused == 0


async def test_a_tail_past_its_bound_is_cut() -> None:
    """The rest follows within the grace, but more of it than MAX_TAIL_BYTES: cut."""
    noise = b": " + b"x" * 1000 + b"\n\n"
    whole = chunked(TOKEN, *[noise] * (MAX_TAIL_BYTES // 1000 + 8), DONE)
    first = whole.index(b": xx")  # the head and the token, then the flood 10 ms later
    flood = [whole[:first], whole[first:]]
    async with probing(Script([(flood, "keep")])) as (server, prober, connections):
        results = [await probe_once(prober, target(server.port)) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 2
    assert server.connections == 2 and connections.reused == 0


@pytest.mark.parametrize(
    ("name", "reply", "kept"),
    [
        ("content-length", SSE_HEAD + SIZED, True),
        ("until close", SSE_HEAD + b"\r\n" + TOKEN, False),
        ("connection close", SSE_HEAD + b"Connection: close\r\n" + SIZED, False),
        ("http/1.0", SSE_HEAD.replace(b"1.1", b"1.0") + SIZED, False),
        ("a second answer after it", ONE_TOKEN + ONE_TOKEN, False),
    ],
)
async def test_framing_decides_whether_a_connection_is_kept(
    name: str, reply: bytes, kept: bool
) -> None:
    then = "close" if name == "until close" else "keep"
    async with probing(Script([(reply, then)])) as (server, prober, connections):
        first = await probe_once(prober, target(server.port))
        second = await probe_once(prober, target(server.port))
    assert first.outcome is Outcome.FAST, first
    assert second.outcome is Outcome.FAST, second
    assert connections.reused == (1 if kept else 0), name
    assert server.connections == (1 if kept else 2), name


async def test_a_kept_connection_the_server_closed_is_sent_again_once_and_counted() -> None:
    """The second request dies on the kept connection before any answer: it is sent once
    more on a new connection (the engine never saw it), counted, and never a verdict."""
    script = Script([(ONE_TOKEN, "keep"), (b"", "close")])  # per connection: 2nd dies
    async with probing(script) as (server, prober, _connections):
        first = await probe_once(prober, target(server.port))
        second = await probe_once(prober, target(server.port))
    assert first.outcome is Outcome.FAST
    assert second.outcome is Outcome.FAST, second
    assert prober.stale_resends == 1
    assert server.connections == 2 and server.requests == 3


async def test_the_resend_goes_on_a_new_connection_not_on_another_kept_one() -> None:
    """Two connections kept, then the server drops both while idle (a restart): the probe
    dies on one and is sent again on a new connection, not on the other dead one (which
    would turn a restart into a false ERROR)."""
    script = Script([(ONE_TOKEN, "keep"), (b"", "close")])  # per connection: 2nd dies
    async with probing(script) as (server, prober, connections):
        both = await asyncio.gather(*(probe_once(prober, target(server.port)) for _ in range(2)))
        assert connections.opened == 2  # both kept
        after = await probe_once(prober, target(server.port))
    assert [r.outcome for r in both] == [Outcome.FAST] * 2
    assert after.outcome is Outcome.FAST, after
    assert prober.stale_resends == 1
    assert connections.opened == 3 and server.connections == 3


async def test_a_kept_connection_never_hides_a_listener_that_is_gone() -> None:
    async with probing(Script([(ONE_TOKEN, "keep")])) as (server, prober, _connections):
        first = await probe_once(prober, target(server.port))
        server.script.replies = [(ONE_TOKEN, "keep"), (b"", "close")]
        server.stop()  # no listener any more; the kept connection dies on its next request
        second = await probe_once(prober, target(server.port))
    assert first.outcome is Outcome.FAST
    assert second.outcome is Outcome.ERROR, second
    assert second.detail.startswith("connect failed"), second.detail
    assert second.connect_ms is None  # what the agent reads as "the engine is not listening"


async def test_a_head_past_its_bound_is_an_error() -> None:
    huge = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
    async with probing(Script([(huge, "hold")])) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port))
    assert result.outcome is Outcome.ERROR
    assert result.detail == f"response head longer than {MAX_HEAD_BYTES} bytes"


async def test_an_answer_a_byte_at_a_time_is_read_whole() -> None:
    async with RawServer(Script([(ONE_TOKEN, "keep")])) as server:
        server._send = _bytewise  # type: ignore[method-assign,assignment]
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            results = [await probe_once(prober, target(server.port)) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 2


async def _bytewise(writer: asyncio.StreamWriter, data: bytes | list[bytes]) -> None:
    whole = data if isinstance(data, bytes) else b"".join(data)
    for index in range(len(whole)):
        writer.write(whole[index : index + 1])
        await writer.drain()
        await asyncio.sleep(0)


@pytest.mark.parametrize("bad", ["a\r\nX-Injected: 1", "a\nb", "a\0b"])
async def test_a_header_that_would_split_the_request_is_refused(bad: str) -> None:
    async with probing(Script([(ONE_TOKEN, "keep")])) as (server, prober, _connections):
        probe = dataclasses.replace(target(server.port), headers={"X-Tenant": bad})
        result = await probe_once(prober, probe)
    assert result.outcome is Outcome.ERROR
    assert "character a header cannot hold" in result.detail
    assert server.requests == 0


async def test_an_error_status_is_read_within_its_bound_and_classified() -> None:
    body = b'{"error": {"message": "CUDA error: an illegal memory access"}}'
    reply = b"HTTP/1.1 500 Internal\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with probing(Script([(reply, "keep")])) as (server, prober, connections):
        results = [await probe_once(prober, target(server.port)) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FATAL] * 2
    assert results[0].status == 500
    assert connections.reused == 1  # an error body read whole keeps the connection too


# --- fuzzed answers: never raise, never a success ------------------------------------------

HEADS = st.sampled_from(
    [
        b"",
        b"HTTP/1.1 200 OK\r\n",
        SSE_HEAD,
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n",
        SSE_HEAD + b"Content-Length: 10\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/9.9 999 ?\r\n\r\n",
    ]
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=HEADS, tail=st.binary(max_size=400))
async def test_fuzzed_answers_never_raise_and_are_never_a_success(head: bytes, tail: bytes) -> None:
    async with probing(Script([(head + tail, "close")])) as (server, prober, _connections):
        result = await probe_once(prober, target(server.port))
    assert result.outcome not in (Outcome.FAST, Outcome.SLOW), (head + tail, result)
    assert result.detail.isprintable() and len(result.detail) <= 500


async def test_a_stall_after_the_token_arrived_does_not_make_a_slow_engine_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first token is timed when its bytes arrive, and the result is made right there,
    in the callback that took them in: a stall of the loop after that (the rest of the
    same turn, before the awaiting task resumes) is neither in the TTFT nor subtracted
    from it: a token at 400 ms with healthy_ttft 200 ms stays SLOW behind a 250 ms stall
    (subtracted, it read FAST), and the stall is not in the probe's lag either. A stall
    before the bytes arrived still would be (``LoopLagMonitor.stalled_within``)."""
    head = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    token = b"%x\r\n%s\r\n0\r\n\r\n" % (len(TOKEN), TOKEN)
    script = Script([([head, token], "keep")], pause_s=0.4)
    real = Connection._take  # what both carriers hand the bytes to

    def stalled(self: Connection, data: bytes) -> None:
        real(self, data)
        if b'"Hi"' in data:
            time.sleep(0.25)  # the rest of the loop turn, after the bytes were taken in

    monkeypatch.setattr(Connection, "_take", stalled)
    lag = LoopLagMonitor(tick_s=0.02)
    ticker = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(0.05)
        async with RawServer(script) as server, new_connections() as connections:
            began = time.perf_counter()
            result = await probe_once(
                MicroProbe(connections, lag), target(server.port, healthy_ttft="200ms")
            )
            waited = time.perf_counter() - began
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert result.ttft_ms is not None and result.ttft_ms >= 395, result
    assert waited >= 0.4 + 0.25  # the stall came, between the result and the awaiter ...
    assert result.loop_lag_ms < 200, result  # ... after the result was made ...
    assert result.outcome is Outcome.SLOW, result  # ... and was not taken off the TTFT


async def test_the_head_alone_wakes_no_one_and_is_timed_when_it_came() -> None:
    """An engine sends its head at once and its first token later: the exchange waits
    through both in one wake-up (``head_ready`` says so only with the first body bytes),
    and the head is still timed when its own bytes came (``head_at``), not with the
    token's."""
    head = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    rest = ONE_TOKEN[len(head) :]
    script = Script([([head, rest], "keep")], pause_s=0.15)
    async with RawServer(script) as server, new_connections() as pool:
        route = route_of(f"http://127.0.0.1:{server.port}/v1/completions")
        connection, _ = await pool.take(route)
        connection.send(request_head(route, {}, 2) + b"{}")
        waiting = asyncio.create_task(heard(connection, partial(head_status, connection)))
        await until(lambda: connection.head_at is not None)
        head_came = time.perf_counter()
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the head is in, and nobody was woken for it
        assert await waiting == 200
        assert connection.arrived - head_came >= 0.05  # the body came later
        assert connection.head_at is not None and connection.head_at <= head_came
        connection.begin_drain(MAX_TAIL_BYTES)
        assert await heard(connection, connection.drained) and connection.reusable
        pool.release(connection, reuse=True)
    async with probing(script) as (server, prober, _):
        result = await probe_once(prober, target(server.port))
    assert result.outcome is Outcome.FAST
    assert result.headers_ms is not None and result.ttft_ms is not None
    assert result.ttft_ms - result.headers_ms >= 100  # the pause between them


async def test_a_timeout_after_the_head_says_the_headers_came() -> None:
    head = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    async with probing(Script([(head, "hold")])) as (server, prober, _):
        result = await probe_once(
            prober, target(server.port, timeout="300ms", healthy_ttft="100ms")
        )
    assert result.outcome is Outcome.TIMEOUT
    assert "no first token within 300 ms (headers after" in result.detail, result.detail
    assert result.headers_ms is not None and result.headers_ms < 200


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_connect_that_never_completes_times_out_and_leaves_no_socket() -> None:
    """The connect runs on the loop's writer callback (``StampedConnect``), no task: a
    listener whose accept queue is full drops the SYN, the probe reads TIMEOUT at its
    deadline and the half-open socket is closed with it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    waiting: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(8):  # fill the accept queue (never accepted)
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            waiting.append(filler)
        await asyncio.sleep(0.05)
        async with new_connections() as connections:
            before = open_fds()
            probe = target(port, timeout="300ms", healthy_ttft="100ms")
            result = await probe_once(MicroProbe(connections), probe)
            assert result.outcome is Outcome.TIMEOUT, result
            assert connections.opened == 0
            assert open_fds() == before  # the socket being connected is closed
    finally:
        for sock in [listener, *waiting]:
            sock.close()


async def test_a_refused_connect_is_an_error_that_names_it() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]  # bound, not listening: refused
        async with new_connections() as connections:
            before = open_fds()
            result = await probe_once(MicroProbe(connections), target(port))
            assert open_fds() == before
    assert result.outcome is Outcome.ERROR
    assert result.detail == "connect failed: Connection refused"
