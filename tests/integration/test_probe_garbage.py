"""Garbage, truncated and oversized streams never raise out of the prober."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome
from llm_health.probe.client import MAX_BYTES_BEFORE_TOKEN, MicroProbe, new_connections
from tests.started import probe_once

Body = Callable[[web.StreamResponse], object]


class RawServer:
    """A real loopback HTTP server whose /v1/completions answer is set by the test."""

    def __init__(self) -> None:
        self.status = 200
        self.chunks: list[bytes] = []
        self.content_type = "text/event-stream"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=self.status)
        response.content_type = self.content_type
        await response.prepare(request)
        for chunk in self.chunks:
            await response.write(chunk)
        return response


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawServer, MicroProbe, str]]:
    server = RawServer()
    app = web.Application()
    app.router.add_post("/v1/completions", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with new_connections() as connections:
        yield server, MicroProbe(connections), f"127.0.0.1:{port}"
    await runner.cleanup()


def target(address: str):  # type: ignore[no-untyped-def]
    # These tests are about what the stream holds, not its timing: a timeout long enough
    # that a loaded CI machine parsing a 1 MiB flood never turns ERROR into TIMEOUT.
    settings = ProbeSettings.model_validate({"timeout": "10s", "healthy_ttft": "200ms"})
    return settings.to_target("c", address)


EDGE_CASES = {
    "truncated-json": [b'data: {"choices": [{"text": "hel'],
    "empty-200": [],
    "done-only": [b"data: [DONE]\n\n"],
    "invalid-utf8": [b"data: \xff\xfe\xfd\n\n"],
    "oversized-line": [b"data: " + b"x" * (200 * 1024)],
    "no-token-flood": [b'data: {"choices": []}\n\n' * 60_000],
    "json-array": [b"data: [1, 2, 3]\n\n"],
    "only-comments": [b": ping\n\n" * 100],
    "usage-then-end": [b'data: {"choices": [], "usage": {"prompt_tokens": 1}}\n\n'],
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
async def test_edge_streams_are_errors(raw: tuple[RawServer, MicroProbe, str], name: str) -> None:
    server, prober, address = raw
    server.chunks = EDGE_CASES[name]
    result = await probe_once(prober, target(address))
    assert result.outcome is Outcome.ERROR, result
    assert result.detail


async def test_flood_is_cut_at_the_byte_limit(raw: tuple[RawServer, MicroProbe, str]) -> None:
    server, prober, address = raw
    server.chunks = [b'data: {"choices": []}\n\n' * 60_000]
    assert len(server.chunks[0]) > MAX_BYTES_BEFORE_TOKEN
    result = await probe_once(prober, target(address))
    assert "no token in the first" in result.detail


async def test_token_after_noise_is_found(raw: tuple[RawServer, MicroProbe, str]) -> None:
    server, prober, address = raw
    server.chunks = [b": keepalive\r\n\r\n", b'data: {"choices":[{"te', b'xt":"hi"}]}\r\n\r\n']
    result = await probe_once(prober, target(address))
    assert result.outcome is Outcome.FAST


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(max_size=300), max_size=6), st.sampled_from([200, 500, 429, 503, 404]))
async def test_random_bytes_never_raise(
    raw: tuple[RawServer, MicroProbe, str], chunks: list[bytes], status: int
) -> None:
    server, prober, address = raw
    server.chunks, server.status = chunks, status
    result = await probe_once(prober, target(address))
    assert isinstance(result.outcome, Outcome)
    if status != 200:
        assert result.outcome in (Outcome.ERROR, Outcome.OVERLOADED, Outcome.FATAL)
