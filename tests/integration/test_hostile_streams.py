"""Hostile gRPC peers against an in-process server (loopback only).

- One ADS request (SotW, and delta) naming 300,000 unknown clusters: the log stays small
  (one line per kind of problem, with a count), the event loop keeps answering /livez on
  the same loop within 100 ms, and the stream still serves a known cluster afterwards.
- Bytes that are not a protobuf message, to every gRPC service we serve (ADS/EDS/RTDS
  streams, HDS, ext_authz Check, admin): INVALID_ARGUMENT, and no traceback in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from llm_health.authz import AuthzConfig, AuthzCounters, Gate
from llm_health.core.hub import SnapshotHub
from llm_health.core.problems import ProblemLog
from llm_health.hds import HdsConfig
from llm_health.hds.service import HdsService
from llm_health.ops.http_server import build_http_app, start_http
from llm_health.servers.accesslog import add_access_log_servicer
from llm_health.servers.admin import AdminServicer, AuthStats, add_admin_service
from llm_health.servers.authz import add_authz_servicer
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.hds import add_hds_servicer
from llm_health.servers.xds import add_runtime_servicer, add_xds_servicers
from llm_health.traffic.stream import LogStreams
from llm_health.xds.protocol import MAX_UNKNOWN_NAMES
from llm_health.xds.resources import TYPE_URL
from llm_health.xds.stream import XdsCounters, XdsStats
from tests.integration.test_xds_grpc import make_board

pytestmark = pytest.mark.timeout(60)

UNKNOWN = 300_000
MAX_LOG_BYTES = 10_000
MAX_LIVEZ_S = 0.1  # the acceptance bound: /livez on the same loop during the request
POLL_S = 0.01
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"


@dataclass
class Server:
    hub: SnapshotHub
    stats: XdsStats
    hds: HdsService
    channel: grpc.aio.Channel
    livez: str


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """Every gRPC service we serve on one server, and the HTTP port, on the test's loop."""
    board = make_board()
    hub, stats = SnapshotHub(board.snapshot()), XdsStats()
    hds = HdsService(HdsConfig())
    grpc_server, port = await start_grpc_server("127.0.0.1:0")
    add_xds_servicers(grpc_server, hub, stats)
    add_runtime_servicer(grpc_server, hub, lambda _snapshot: {"k": 0}, XdsCounters())
    add_hds_servicer(grpc_server, hds)
    gate = Gate(hub.current, AuthzConfig)
    add_authz_servicer(
        grpc_server,
        gate,
        AuthzCounters(),
        ProblemLog(logging.getLogger("llm_health.authz"), every_s=0.0),
    )
    add_admin_service(grpc_server, AdminServicer(None), None, AuthStats())  # type: ignore[arg-type]
    add_access_log_servicer(grpc_server, LogStreams(lambda _request, _now: None, time.monotonic))
    runner = await start_http(build_http_app(lambda: [], dict), "127.0.0.1:0")
    try:
        await grpc_server.start()
        http_port = runner.addresses[0][1]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Server(hub, stats, hds, channel, f"http://127.0.0.1:{http_port}/livez")
    finally:
        await runner.cleanup()
        await grpc_server.stop(0)


class LivezProbe:
    """Polls /livez every ``POLL_S`` on the test's (= the server's) event loop and keeps
    the worst latency seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.answers = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LivezProbe:
        self._session = aiohttp.ClientSession()
        await self._get()  # connection set up before the clock matters
        self.worst, self.answers = 0.0, 0
        self._task = asyncio.create_task(self._poll())
        return self

    async def _get(self) -> None:
        started = time.perf_counter()
        async with self._session.get(self.url) as response:
            assert response.status == 200
            await response.read()
        self.worst = max(self.worst, time.perf_counter() - started)
        self.answers += 1

    async def _poll(self) -> None:
        while True:
            await self._get()
            await asyncio.sleep(POLL_S)

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.wait([self._task])
        await self._session.close()


def raw_stream(channel: grpc.aio.Channel, method: str, decode: Callable[[bytes], Any]) -> Any:
    """A stream-stream call that sends pre-serialized bytes (no client-side encoding work
    on the loop being measured)."""
    return channel.stream_stream(method, request_serializer=None, response_deserializer=decode)


async def hostile_exchange(
    server: Server,
    method: str,
    huge: bytes,
    follow_up: bytes,
    decode: Callable[[bytes], Any],
    counters: Any,
) -> list[Any]:
    """Send ``huge``, wait until the server has taken it in, then ``follow_up`` (naming a
    known cluster); returns the responses up to the first one carrying resources."""
    outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[bytes]:
        while (item := await outgoing.get()) is not None:
            yield item

    call = raw_stream(server.channel, method, decode)(requests())
    responses: list[Any] = []
    try:
        outgoing.put_nowait(huge)
        deadline = time.monotonic() + 20
        while counters.requests < 1 and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        assert counters.requests == 1, "the huge request never arrived"
        await asyncio.sleep(0.2)  # screening and the coalesced plan run inside this window
        outgoing.put_nowait(follow_up)
        async with asyncio.timeout(10):
            async for response in call:
                responses.append(response)
                if response.resources:
                    break
    finally:
        outgoing.put_nowait(None)
        call.cancel()
    return responses


def unknown_names() -> list[str]:
    return [f"u{i:05x}" for i in range(UNKNOWN)]


@pytest.mark.timed  # a 300,000-name request parsed; /livez answered within 100 ms meanwhile
async def test_sotw_request_naming_300000_unknown_clusters(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    huge = discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=unknown_names())
    huge.node.id = "attacker\n\x1b[31m"
    follow_up = discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=["a"])
    with caplog.at_level(logging.INFO):
        async with LivezProbe(server.livez) as livez:
            responses = await hostile_exchange(
                server,
                ADS + "StreamAggregatedResources",
                huge.SerializeToString(),
                follow_up.SerializeToString(),
                discovery_pb2.DiscoveryResponse.FromString,
                server.stats.ads_sotw,
            )
    assert [r.resources[0].type_url for r in responses[-1:]] == [TYPE_URL]
    assert len(caplog.text) < MAX_LOG_BYTES, caplog.text[:2000]
    assert f"unknown clusters ignored: {UNKNOWN}" in caplog.text
    assert "\x1b" not in caplog.text and "attacker\\n" in caplog.text
    assert livez.answers > 0 and livez.worst < MAX_LIVEZ_S, livez.worst


@pytest.mark.timed  # a 300,000-name request parsed; /livez answered within 100 ms meanwhile
async def test_delta_request_subscribing_300000_unknown_clusters(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    huge = discovery_pb2.DeltaDiscoveryRequest(
        type_url=TYPE_URL, resource_names_subscribe=unknown_names()
    )
    follow_up = discovery_pb2.DeltaDiscoveryRequest(
        type_url=TYPE_URL, resource_names_subscribe=["a"]
    )
    with caplog.at_level(logging.INFO):
        async with LivezProbe(server.livez) as livez:
            responses = await hostile_exchange(
                server,
                ADS + "DeltaAggregatedResources",
                huge.SerializeToString(),
                follow_up.SerializeToString(),
                discovery_pb2.DeltaDiscoveryResponse.FromString,
                server.stats.ads_delta,
            )
    assert [r.name for r in responses[-1].resources] == ["a"]
    assert len(caplog.text) < MAX_LOG_BYTES, caplog.text[:2000]
    # the first MAX_UNKNOWN_NAMES are kept (a reload may add them) and reported by the
    # plan, the rest are dropped at once: one line with the total either way
    assert f"unknown clusters ignored: {UNKNOWN}" in caplog.text
    assert MAX_UNKNOWN_NAMES < UNKNOWN
    assert livez.answers > 0 and livez.worst < MAX_LIVEZ_S, livez.worst


# --------------------------------------------------------------------------- garbage bytes

GARBAGE = b"\xff\xfe not a protobuf \x00\x01\n\x1b[31m"
STREAMS = [
    ADS + "StreamAggregatedResources",
    ADS + "DeltaAggregatedResources",
    "/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints",
    "/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints",
    "/envoy.service.health.v3.HealthDiscoveryService/StreamHealthCheck",
    "/envoy.service.runtime.v3.RuntimeDiscoveryService/StreamRuntime",
]
UNARY = [
    "/envoy.service.auth.v3.Authorization/Check",
    "/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints",
    "/envoy.service.health.v3.HealthDiscoveryService/FetchHealthCheck",
    "/envoy.service.runtime.v3.RuntimeDiscoveryService/FetchRuntime",
    "/llm_health.v1.Admin/ListEndpoints",
    "/llm_health.v1.Admin/Drain",
    "/llm_health.v1.Admin/ForceState",
]
SERVER_STREAMS = ["/llm_health.v1.Admin/WatchEndpoints"]
CLIENT_STREAMS = ["/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"]


def _bytes(data: bytes) -> bytes:
    return data


async def garbage_call(channel: grpc.aio.Channel, method: str) -> grpc.StatusCode:
    """Send ``GARBAGE`` as the request (or first stream message); the status it ends with."""
    try:
        if method in STREAMS:

            async def requests() -> AsyncIterator[bytes]:
                yield GARBAGE
                await asyncio.sleep(10)  # keep our side open: the server must end the call

            call = channel.stream_stream(method, _bytes, _bytes)(requests())
            async with asyncio.timeout(5):
                async for _ in call:
                    pass
        elif method in CLIENT_STREAMS:

            async def logs() -> AsyncIterator[bytes]:
                yield GARBAGE
                await asyncio.sleep(10)  # the server must end the call

            async with asyncio.timeout(5):
                await channel.stream_unary(method, _bytes, _bytes)(logs())
        elif method in SERVER_STREAMS:
            async with asyncio.timeout(5):
                async for _ in channel.unary_stream(method, _bytes, _bytes)(GARBAGE):
                    pass
        else:
            async with asyncio.timeout(5):
                await channel.unary_unary(method, _bytes, _bytes)(GARBAGE)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", STREAMS + UNARY + SERVER_STREAMS + CLIENT_STREAMS)
async def test_garbage_bytes_answer_invalid_argument_without_traceback(
    server: Server, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    with caplog.at_level(logging.INFO):
        assert await garbage_call(server.channel, method) is grpc.StatusCode.INVALID_ARGUMENT
        # again from the same peer: answered the same, not logged again
        assert await garbage_call(server.channel, method) is grpc.StatusCode.INVALID_ARGUMENT
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "\x1b" not in caplog.text
    assert len(caplog.text) < 2000, caplog.text


async def test_a_flood_of_garbage_is_logged_at_most_once_per_peer_host(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """300 undecodable calls from loopback, each on a method of its own kind: every one
    answered INVALID_ARGUMENT, at most one line (loopback may have logged already)."""
    methods = ["/envoy.service.auth.v3.Authorization/Check", "/llm_health.v1.Admin/Drain"]
    with caplog.at_level(logging.WARNING, logger="llm_health.grpc"):
        for n in range(300):
            code = await garbage_call(server.channel, methods[n % 2])
            assert code is grpc.StatusCode.INVALID_ARGUMENT
    lines = [r for r in caplog.records if "undecodable request" in r.getMessage()]
    assert len(lines) <= 1, [r.getMessage() for r in lines]


async def test_after_garbage_the_stream_service_still_works(server: Server) -> None:
    """A good request after a garbage call on another stream: served."""
    method = ADS + "StreamAggregatedResources"
    assert await garbage_call(server.channel, method) is grpc.StatusCode.INVALID_ARGUMENT
    good = discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=["a"])

    async def requests() -> AsyncIterator[bytes]:
        yield good.SerializeToString()
        await asyncio.sleep(10)

    call = raw_stream(server.channel, method, discovery_pb2.DiscoveryResponse.FromString)
    stream = call(requests())
    try:
        async with asyncio.timeout(5):
            first = await stream.read()
        assert [r.type_url for r in first.resources] == [TYPE_URL]
    finally:
        stream.cancel()
