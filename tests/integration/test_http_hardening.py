"""The HTTP port against hostile clients (loopback only): slowloris connections are closed
by the header timeout, at the connection cap a new connection takes the slot of the one
idle longest, probe paths keep a reserve of connections, /livez keeps answering, and a
malformed request is answered 400 without an error-level log record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from llm_health.ops.http_server import BUSY_TEXT, build_http_app, start_http

pytestmark = pytest.mark.timeout(60)

SLOW_CLIENTS = 400
HEADER_TIMEOUT_S = 1.0
CAP = 450  # above SLOW_CLIENTS: /livez still finds room while they hang


async def start(*, header_timeout_s: float, max_connections: int) -> tuple[web.AppRunner, int]:
    app = build_http_app(lambda: [], dict)
    runner = await start_http(
        app, "127.0.0.1:0", header_timeout_s=header_timeout_s, max_connections=max_connections
    )
    return runner, int(runner.addresses[0][1])


@pytest.fixture
async def server() -> AsyncIterator[int]:
    runner, port = await start(header_timeout_s=HEADER_TIMEOUT_S, max_connections=CAP)
    try:
        yield port
    finally:
        await runner.cleanup()


async def livez(port: int) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/livez") as response,
    ):
        return response.status


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (EOF or reset)."""
    try:
        return await reader.read(1024) == b"" or True
    except ConnectionError:
        return True


async def test_slowloris_connections_are_closed_and_livez_answers(server: int) -> None:
    port = server
    connections = []
    try:
        for _ in range(SLOW_CLIENTS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            connections.append((reader, writer))
        assert await livez(port) == 200  # answered while 400 half-open connections hang
        async with asyncio.timeout(HEADER_TIMEOUT_S * 10):
            results = await asyncio.gather(*(closed_by_server(r) for r, _ in connections))
        assert all(results) and len(results) == SLOW_CLIENTS
        assert await livez(port) == 200
    finally:
        for _, writer in connections:
            writer.close()


async def test_idle_connection_without_request_is_closed(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        async with asyncio.timeout(HEADER_TIMEOUT_S * 10):
            assert await reader.read(1024) == b""
    finally:
        writer.close()


def closed(reader: asyncio.StreamReader) -> bool:
    """The server closed it (EOF, or reset: an eviction aborts)."""
    return reader.at_eof() or reader.exception() is not None


async def get(port: int, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return reader, writer


async def status_line(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        return await reader.readline()


async def test_at_the_cap_a_new_connection_closes_the_one_idle_longest() -> None:
    runner, port = await start(header_timeout_s=30.0, max_connections=8)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(8):  # at the cap, none of them sends a byte
            held.append(await asyncio.open_connection("127.0.0.1", port))
            await asyncio.sleep(0.02)  # accepted in this order
        reader, writer = await get(port, "/livez")
        assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"  # got in
        writer.close()
        await asyncio.sleep(0.2)  # the closes reach the clients
        gone = [closed(r) for r, _ in held]
        evicted = gone.index(False)
        assert evicted >= 3 and not any(gone[evicted:]), gone  # the oldest ones, in order
    finally:
        for _, w in held:
            w.close()
        await runner.cleanup()


async def test_probe_paths_keep_a_reserve_of_connections() -> None:
    """Requests for other paths hold at most 7 of 8 connections: the last one is kept
    for the probes. Beyond that they get 503 and their connection is closed."""
    release, handling = asyncio.Event(), []

    async def slow(request: web.Request) -> web.Response:
        handling.append(request)
        await release.wait()
        return web.Response(text="slow\n")

    app = build_http_app(lambda: [], dict)
    app.router.add_get("/slow", slow)
    runner = await start_http(app, "127.0.0.1:0", max_connections=8)
    port = int(runner.addresses[0][1])
    slow_ones = []
    try:
        for _ in range(7):
            slow_ones.append(await get(port, "/slow"))
        async with asyncio.timeout(5):
            while len(handling) < 7:  # all 7 being handled
                await asyncio.sleep(0.01)
        reader, writer = await get(port, "/status")
        assert await status_line(reader) == b"HTTP/1.1 503 Service Unavailable\r\n"
        async with asyncio.timeout(5):
            assert (await reader.read()).endswith(BUSY_TEXT.encode())  # then closed
        writer.close()
        for path in ("/livez", "/readyz"):
            reader, writer = await get(port, path)
            assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"
            writer.close()
        release.set()
        for reader, _ in slow_ones:
            assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"
        reader, writer = await get(port, "/status")
        assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"  # room again
        writer.close()
    finally:
        release.set()
        for _, w in slow_ones:
            w.close()
        await runner.cleanup()


async def test_malformed_request_gets_400_and_no_error_log(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    bad = [
        b"GET /livez HTTP/1.1\r\nHost: x\r\nBad Header\x01: \x1b[31m\r\n\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n",
        b"GET /livez HTTP/9.9\r\n\r\n",
    ]
    with caplog.at_level(logging.INFO):
        for request in bad:
            reader, writer = await asyncio.open_connection("127.0.0.1", server)
            try:
                writer.write(request)
                async with asyncio.timeout(5):
                    answer = await reader.read(1024)
                assert answer.split(b" ")[1:2] == [b"400"], (request[:40], answer[:80])
            finally:
                writer.close()
        assert await livez(server) == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert "Traceback" not in caplog.text


# Empty lines before a request line are no request (RFC 9112 §2.2): each of these owes a
# request head from its first byte on, however long it keeps sending them.
async def crlf_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"\r\n\r\n")


async def crlf_slowly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One empty line every 200 ms until the server closes the connection."""
    while not closed(reader):
        writer.write(b"\r\n")
        await asyncio.sleep(0.2)


async def crlf_after_a_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
    assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"
    async with asyncio.timeout(5):
        await reader.readuntil(b"ok\n")
    writer.write(b"\r\n\r\n")


EMPTY_LINE_SENDERS = [crlf_at_once, crlf_slowly, crlf_after_a_request]


async def closed_after(
    send: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], port: int
) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await send(reader, writer)
        return await closed_by_server(reader)
    finally:
        writer.close()


async def test_empty_lines_without_a_request_are_closed_by_the_header_timeout(
    server: int,
) -> None:
    """With room to spare (no eviction), only the header timer closes them: aiohttp's own
    keep-alive timer (30 s) would take 30 times the header timeout."""
    async with asyncio.timeout(HEADER_TIMEOUT_S * 10):
        results = await asyncio.gather(
            *(closed_after(send, server) for send in EMPTY_LINE_SENDERS * 10)
        )
    assert all(results) and len(results) == 30
    assert await livez(server) == 200


async def test_at_the_cap_empty_line_connections_are_idle_and_give_way() -> None:
    """Connections that sent only empty lines hold no request: at the cap, a probe's new
    connection closes the ones idle longest, as if they had sent nothing."""
    runner, port = await start(header_timeout_s=30.0, max_connections=8)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    senders = []
    try:
        for send in EMPTY_LINE_SENDERS * 3:
            if len(held) == 8:
                break
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append((reader, writer))
            senders.append(asyncio.create_task(send(reader, writer)))
            await asyncio.sleep(0.05)
        reader, writer = await get(port, "/livez")
        assert await status_line(reader) == b"HTTP/1.1 200 OK\r\n"  # got in
        writer.close()
        await asyncio.sleep(0.2)  # the closes reach the clients
        assert sum(closed(r) for r, _ in held) >= 3, [closed(r) for r, _ in held]
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        for _, w in held:
            w.close()
        await runner.cleanup()
