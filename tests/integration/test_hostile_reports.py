"""Forged outside reports against the in-process runtime, over real gRPC on loopback, with
no ``server.token`` (the sidecar default: the port authenticates nobody).

Two clusters over three simulators: ``solo`` (one endpoint) and ``llama`` (three),
``max_ejection_percent`` 50, so unauthenticated reports may hold out at most
floor(n × 50 %) endpoints and never all: none of ``solo``, one of ``llama``.

- Fake gateways that open an ADS stream under their node id and report every endpoint
  UNHEALTHY over HDS: ``solo`` stays in (ext_authz never answers 503 for it), ``llama``
  loses at most one endpoint.
- A forged access-log stream (6,000 HTTP 500 entries) from a node id that holds no xDS
  stream: nothing changes.
- The same from a node that holds an xDS stream: the quality limit applies, within the
  same cap (``solo`` stays HEALTHY, one ``llama`` endpoint DEGRADED; no 429).
- Both at once: one cap for both kinds.
- With ``server.token`` the reporters are authenticated: no cap (as designed).

Throughout: /livez on the runtime's loop answers within 100 ms (polled every 50 ms),
the log stays under ``MAX_LOG_BYTES``, the probe secret appears nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc

from llm_health.app.runtime import Runtime
from llm_health.model.states import State
from tests.integration.test_grpc_auth import (
    BEARER,
    NO_TOKEN,
    TOKEN,
    FakeGateways,
    Metadata,
    running,
    xds_request,
)
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.processes import SimProcess

# timed: /livez within 100 ms while forged reports come in (one process: one core)
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.timed,
    pytest.mark.sims(3, "--ttft", "20ms", prefix="r", per_module=True),
]

SECRET = "probe-secret-5f0c2a9e7d31"
SOLO, TRIO = "solo", "llama"  # "llama": the cluster FakeGateways' ADS streams ask for
FORGED = 6_000
BATCH = 500  # entries per access-log message
MAX_LIVEZ_S = 0.1
LIVEZ_EVERY_S = 0.05
MAX_LOG_BYTES = 20_000
OUT = (State.UNHEALTHY, State.DEGRADED)


def config_text(sims: list[SimProcess], server: str = "") -> str:
    trio = ", ".join(f'{{address: "{s.address}"}}' for s in sims)
    return f"""
server: {{grpc: "127.0.0.1:{free_port()}", http: "127.0.0.1:{free_port()}"{server}}}
probe:
  model: sim-model
  interval: 60s
  healthy_after: 1
  headers: {{x-probe-key: "{SECRET}"}}
xds: {{warm_start_timeout: 2s}}
hds: {{timeout: 200ms, interval: 500ms, report_interval: 500ms}}
clusters:
  - name: {SOLO}
    endpoints: [{{address: "{sims[0].address}"}}]
  - name: {TRIO}
    endpoints: [{trio}]
"""


# --------------------------------------------------------------------------- reading


def states(runtime: Runtime) -> dict[str, list[State]]:
    clusters = runtime.control.published().clusters
    return {name: [e.state for e in clusters[name].endpoints] for name in (SOLO, TRIO)}


def out(runtime: Runtime, cluster: str) -> int:
    return sum(1 for state in states(runtime)[cluster] if state in OUT)


def all_healthy(runtime: Runtime) -> bool:
    return all(s is State.HEALTHY for found in states(runtime).values() for s in found)


async def admission(channel: grpc.aio.Channel, cluster: str, md: Metadata = NO_TOKEN) -> int:
    """ext_authz's answer for a low-priority request to ``cluster``: 200, or the HTTP
    status of the denial (503 no capacity, 429 shed)."""
    request = external_auth_pb2.CheckRequest()
    request.attributes.request.http.headers["x-llm-priority"] = "low"
    request.attributes.context_extensions["llm_cluster"] = cluster
    stub = external_auth_pb2_grpc.AuthorizationStub(channel)
    response = await stub.Check(request, metadata=md, timeout=5)
    if response.HasField("denied_response"):
        return int(response.denied_response.status.code)
    return 200


class Livez:
    """Polls the runtime's /livez every ``LIVEZ_EVERY_S`` and keeps the worst latency."""

    def __init__(self, runtime: Runtime) -> None:
        self.url = f"http://127.0.0.1:{runtime.http_port}/livez"
        self.worst, self.answers = 0.0, 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Livez:
        self._session = aiohttp.ClientSession()
        await self._get()  # the connection is set up before the clock matters
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
            await asyncio.sleep(LIVEZ_EVERY_S)
            await self._get()

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.wait([self._task])
        await self._session.close()

    def check(self) -> None:
        assert self.answers > 0 and self.worst < MAX_LIVEZ_S, self.worst


@contextlib.asynccontextmanager
async def attacked(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture, server: str = ""
) -> AsyncIterator[tuple[Runtime, grpc.aio.Channel, Livez]]:
    """A ready runtime with every endpoint HEALTHY, a channel to its gRPC port, /livez
    polled; at the end: the log bounded and free of the secret."""
    async with running(config_text(sims, server)) as runtime:
        await wait_until_async(lambda: all_healthy(runtime), 10, "every endpoint HEALTHY")
        caplog.clear()
        with caplog.at_level(logging.INFO):
            target = f"127.0.0.1:{runtime.grpc_port}"
            async with grpc.aio.insecure_channel(target) as channel, Livez(runtime) as livez:
                yield runtime, channel, livez
            status = json.dumps(runtime.status())
        livez.check()
        logged = len(caplog.text.encode())
        assert logged < MAX_LOG_BYTES, f"logged {logged} bytes: {caplog.text[:3000]}"
        assert SECRET not in caplog.text and SECRET not in status
        assert TOKEN not in caplog.text and TOKEN not in status


# --------------------------------------------------------------------------- forging


def http_500(cluster: str, address: str) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    common = entry.common_properties
    common.upstream_cluster = cluster
    host, port = address.rsplit(":", 1)
    common.upstream_remote_address.socket_address.address = host
    common.upstream_remote_address.socket_address.port_value = int(port)
    common.duration.FromMilliseconds(40)
    common.upstream_request_attempt_count = 1
    entry.response.response_code.value = 500
    return entry


async def forge_access_logs(
    channel: grpc.aio.Channel, node: str, sims: list[SimProcess], md: Metadata = NO_TOKEN
) -> None:
    """One access-log stream under ``node`` (the identifier in its first message, as
    Envoy sends it): ``FORGED`` HTTP 500 entries spread over every endpoint."""
    keys = [(SOLO, sims[0].address)] + [(TRIO, s.address) for s in sims]
    entries = [http_500(*keys[i % len(keys)]) for i in range(FORGED)]

    async def messages() -> AsyncIterator[als_pb2.StreamAccessLogsMessage]:
        for start in range(0, FORGED, BATCH):
            message = als_pb2.StreamAccessLogsMessage()
            if start == 0:
                message.identifier.node.id = node
                message.identifier.log_name = "forged"
            message.http_logs.log_entry.extend(entries[start : start + BATCH])
            yield message

    stub = als_pb2_grpc.AccessLogServiceStub(channel)
    await stub.StreamAccessLogs(messages(), metadata=md, timeout=10)


@contextlib.asynccontextmanager
async def xds_stream(channel: grpc.aio.Channel, node: str, md: Metadata = NO_TOKEN) -> Any:
    """An ADS stream open under ``node`` for the block (its first answer read)."""
    done = asyncio.Event()

    async def requests() -> AsyncIterator[Any]:
        yield xds_request(node)
        await done.wait()

    call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources(
        requests(), metadata=md
    )
    try:
        await asyncio.wait_for(call.read(), 5)
        yield call
    finally:
        done.set()
        call.cancel()


async def judged(runtime: Runtime) -> None:
    """Every forged entry read, then two quality rounds (one a second)."""
    await wait_until_async(
        lambda: runtime.status()["traffic"]["entries_total"] >= FORGED, 10, "entries read"
    )
    await asyncio.sleep(2.5)


# --------------------------------------------------------------------------- HDS


async def test_forged_hds_verdicts_leave_a_small_cluster_in(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with attacked(sims, caplog) as (runtime, channel, livez):
        addresses = [s.address for s in sims]
        fakes = await FakeGateways(channel, 8, addresses, NO_TOKEN).start(
            xds_open=runtime.xds_nodes.is_open
        )
        try:
            await wait_until_async(lambda: out(runtime, TRIO) == 1, 10, "one llama endpoint out")
            await asyncio.sleep(2.0)  # reports go on four times a second: nothing more
            assert out(runtime, TRIO) == 1  # floor(3 × 50 %)
            assert await admission(channel, SOLO) == 200  # not 503
            assert out(runtime, SOLO) == 0  # floor(1 × 50 %) = 0: never the last one
            assert await admission(channel, TRIO) == 200
            assert runtime.status()["hds"]["held_now"] == 3  # 2 of llama, 1 of solo
        finally:
            await fakes.close()
        livez.check()


# --------------------------------------------------------------------------- access logs


async def test_forged_access_logs_from_a_node_without_xds_change_nothing(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with attacked(sims, caplog) as (runtime, channel, _livez):
        await forge_access_logs(channel, "forged-gw", sims)
        await judged(runtime)
        assert all_healthy(runtime), states(runtime)
        traffic = runtime.status()["traffic"]
        assert traffic["counted_total"] == 0 and traffic["limited_now"] == 0
        assert traffic["without_xds_total"] == FORGED
        assert await admission(channel, SOLO) == 200
        assert await admission(channel, TRIO) == 200
    lines = [r for r in caplog.records if "holds no xDS stream" in r.getMessage()]
    assert len(lines) == 1  # once per node


async def test_forged_access_logs_from_an_xds_node_stay_within_the_cap(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with attacked(sims, caplog) as (runtime, channel, _livez):
        async with xds_stream(channel, "gw-1"):
            await forge_access_logs(channel, "gw-1", sims)
            await judged(runtime)
        assert await admission(channel, SOLO) == 200  # not 429
        assert out(runtime, TRIO) == 1 and out(runtime, SOLO) == 0, states(runtime)
        assert states(runtime)[TRIO].count(State.DEGRADED) == 1  # quality still applies
        traffic = runtime.status()["traffic"]
        assert traffic["limited_now"] == 1 and traffic["held_now"] == 3
        assert await admission(channel, TRIO) == 200  # capacity 0.77: not shed


async def test_both_kinds_share_one_cap(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with attacked(sims, caplog) as (runtime, channel, _livez):
        addresses = [s.address for s in sims]
        fakes = await FakeGateways(channel, 4, addresses, NO_TOKEN).start(
            xds_open=runtime.xds_nodes.is_open
        )
        try:
            await wait_until_async(lambda: out(runtime, TRIO) == 1, 10, "one llama endpoint out")
            await forge_access_logs(channel, "fake-gw-0", sims)  # holds an ADS stream
            await judged(runtime)
            assert out(runtime, TRIO) == 1 and out(runtime, SOLO) == 0, states(runtime)
            assert await admission(channel, SOLO) == 200
        finally:
            await fakes.close()


async def test_authenticated_access_logs_are_not_capped(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    async with attacked(sims, caplog, server=f", token: {TOKEN}") as (runtime, channel, _):
        async with xds_stream(channel, "gw-1", BEARER):
            await forge_access_logs(channel, "gw-1", sims, BEARER)
            await judged(runtime)
        assert out(runtime, TRIO) == 3 and out(runtime, SOLO) == 1, states(runtime)
        assert runtime.status()["traffic"]["held_now"] == 0
