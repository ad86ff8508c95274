"""The engine side reads (``engines.side_reads``, docs/design.md §14) over the prober's
HTTP/1.1 exchange, on connections of their own, against a raw loopback TCP server whose
every byte the test writes: whole documents, errors, the size bound, chunked framing,
kept connections, a kept connection the server closed, and a server that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from llm_health.config import ProbeSettings
from llm_health.engines.metrics import MAX_DOCUMENT, MetricsError, MetricsOverrun
from llm_health.engines.side_reads import (
    READ_ERRORS,
    SideReads,
    open_connections,
    read_error,
)
from llm_health.errors import ProtocolError
from llm_health.probe.http1 import Connections, ResponseError
from llm_health.probe.target import ProbeTarget
from tests.raw_http import RawServer, Script, until

KEY = "sk-side-read-secret-0123456789"
DOCUMENT = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n"


def sized(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\n%s" % (status, extra)
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def chunked(*parts: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


def target(port: int) -> ProbeTarget:
    settings = ProbeSettings.model_validate(
        {"timeout": "2s", "headers": {"Authorization": f"Bearer {KEY}"}}
    )
    return settings.to_target("c", f"127.0.0.1:{port}")


@contextlib.asynccontextmanager
async def reading(script: Script) -> AsyncIterator[tuple[RawServer, SideReads, Connections]]:
    async with RawServer(script) as server, open_connections() as connections:
        yield server, SideReads(connections), connections


async def test_a_document_is_read_whole_with_the_probe_headers() -> None:
    async with reading(Script([(sized(DOCUMENT), "keep")])) as (server, reads, _connections):
        text = await reads.metrics(target(server.port), "/metrics", 1.0)
    assert text == DOCUMENT.decode()
    (head,) = server.heads
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "GET /metrics HTTP/1.1", lines
    assert f"Host: 127.0.0.1:{server.port}" in lines, lines
    assert f"Authorization: Bearer {KEY}" in lines, lines
    assert "X-LLM-Probe: true" in lines, lines
    assert not any(line.lower().startswith("accept-encoding") for line in lines), lines
    assert not any(line.lower().startswith("content-length") for line in lines), lines


async def test_a_non_200_is_a_metrics_error_and_no_model_list() -> None:
    reply = sized(b"no such path", b"404 Not Found")
    async with reading(Script([(reply, "keep")])) as (server, reads, connections):
        with pytest.raises(MetricsError) as raised:
            await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
        with pytest.raises(ValueError, match="HTTP 404"):
            await reads.models(target(server.port), "/v1/models", keep=True)
    assert read_error(raised.value, target(server.port)) == "HTTP 404"
    assert connections.reused == 1  # an error body read whole keeps its connection


@pytest.mark.parametrize(("size", "kept"), [(MAX_DOCUMENT, True), (MAX_DOCUMENT + 1, False)])
async def test_a_body_over_its_bound_is_refused_and_its_connection_closed(
    size: int, kept: bool
) -> None:
    body = (b"# padding\n" * (size // 10 + 1))[:size]
    async with reading(Script([(sized(body), "keep")])) as (server, reads, connections):
        answers: list[str | BaseException] = []
        for _ in range(2):
            try:
                answers.append(await reads.metrics(target(server.port), "/metrics", 2.0, keep=True))
            except MetricsOverrun as exc:  # read whole up to the bound, never parsed in part
                answers.append(exc)
            if not kept:
                await asyncio.wait_for(until(lambda: server.eofs == len(answers)), 2)
    if kept:
        assert answers == [body.decode()] * 2
    else:
        assert [
            read_error(a, target(server.port)) for a in answers if isinstance(a, MetricsError)
        ] == [f"document over {MAX_DOCUMENT} bytes"] * 2
    assert connections.reused == (1 if kept else 0)
    assert server.connections == (1 if kept else 2)


async def test_a_chunked_body_is_read_whole() -> None:
    parts = [DOCUMENT[:20], DOCUMENT[20:40], DOCUMENT[40:]]
    whole = chunked(*parts)
    segments = [whole[:50], whole[50:90], whole[90:]]  # chunk boundaries across segments
    async with reading(Script([(segments, "keep")])) as (server, reads, connections):
        first = await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
        second = await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
    assert first == second == DOCUMENT.decode()
    assert connections.reused == 1


async def test_two_reads_in_a_row_share_one_connection() -> None:
    models = b'{"object": "list", "data": [{"id": "sim-model"}]}'
    script = Script([(sized(DOCUMENT), "keep"), (sized(models), "keep")])
    async with reading(script) as (server, reads, connections):
        text = await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
        served = await reads.models(target(server.port), "/v1/models", keep=True)
    assert text == DOCUMENT.decode() and served == ("sim-model",)
    assert connections.opened == 1 and connections.reused == 1
    assert server.connections == 1 and server.requests == 2
    assert reads.stale_resends == 0


async def test_a_kept_connection_the_server_closed_is_sent_again_once() -> None:
    """The second read dies on the kept connection before any status line: it is sent
    once more on a new connection, and succeeds."""
    script = Script([(sized(DOCUMENT), "keep"), (b"", "close")])  # per connection: 2nd dies
    async with reading(script) as (server, reads, connections):
        first = await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
        second = await reads.metrics(target(server.port), "/metrics", 1.0, keep=True)
    assert first == second == DOCUMENT.decode()
    assert reads.stale_resends == 1
    assert connections.opened == 2 and connections.reused == 1
    assert server.connections == 2 and server.requests == 3


async def test_a_new_connection_that_dies_before_its_answer_is_not_sent_again() -> None:
    async with reading(Script([(b"", "close")])) as (server, reads, _connections):
        with pytest.raises(READ_ERRORS) as raised:
            await reads.metrics(target(server.port), "/metrics", 1.0)
    assert isinstance(raised.value, OSError), raised.value
    assert reads.stale_resends == 0 and server.requests == 1


async def test_a_server_that_never_answers_times_out_within_the_bound() -> None:
    async with reading(Script([(b"", "hold")])) as (server, reads, connections):
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            await reads.metrics(target(server.port), "/metrics", 0.3)
        elapsed = time.monotonic() - started
        await asyncio.wait_for(until(lambda: server.eofs == 1), 2)  # closed, not kept
    assert 0.25 <= elapsed < 1.0, elapsed
    assert read_error(raised.value, target(server.port)) == "timed out"
    assert connections.reused == 0 and server.requests == 1


async def test_bytes_that_are_not_http_are_a_read_error_of_one_line() -> None:
    async with reading(Script([(b"SSH-2.0-OpenSSH\r\n\r\n", "hold")])) as (server, reads, _c):
        with pytest.raises(READ_ERRORS) as raised:
            await reads.metrics(target(server.port), "/metrics", 1.0)
        assert await reads.engine(target(server.port)) is None  # no engine, no exception
    assert isinstance(raised.value, ProtocolError), raised.value
    text = read_error(raised.value, target(server.port))
    assert text.startswith("ResponseError: malformed HTTP response"), text
    leaking = ResponseError(f"malformed HTTP response: {KEY}\r\nX-Injected: 1")
    shown = read_error(leaking, target(server.port))
    assert KEY not in shown and "\n" not in shown and "\r" not in shown, shown


async def test_a_connection_is_kept_only_when_asked() -> None:
    """The engine checks keep a side read's connection only while the endpoint's next
    read comes before the idle sweep would close it (``SideReadQueue.keeps``)."""
    models = b'{"object": "list", "data": [{"id": "sim-model"}]}'
    script = Script([(sized(models), "keep")])  # each connection's first answer
    async with reading(script) as (server, reads, connections):
        await reads.metrics(target(server.port), "/metrics", 1.0)
        await asyncio.wait_for(until(lambda: server.eofs == 1), 2)  # closed by us
        await reads.models(target(server.port), "/v1/models")
        await asyncio.wait_for(until(lambda: server.eofs == 2), 2)
        await reads.models(target(server.port), "/v1/models", keep=True)
        await asyncio.sleep(0.1)
        assert server.eofs == 2  # kept
    assert connections.opened == 3 and connections.reused == 0
