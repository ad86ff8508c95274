"""The admin gRPC API against a real runtime in process (probing a real simulator
subprocess) over real gRPC on loopback: list, watch, drain, force, probe-now, errors,
and the bearer token (which must not touch Envoy's xDS on the same server)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf.duration_pb2 import Duration

from llm_health.admin.component import AdminComponent
from llm_health.adminpb import admin_pb2 as pb
from llm_health.adminpb import admin_pb2_grpc as pb_grpc
from llm_health.app.assemble import build_runtime
from llm_health.app.runtime import Runtime
from llm_health.config import parse_config
from llm_health.ops.status_document import status_document
from llm_health.servers.admin import AdminServicer, AuthStats, add_admin_service
from llm_health.servers.admin_codec import result_from_pb, snapshot_from_pb
from llm_health.servers.grpc import start_grpc_server
from llm_health.xds.resources import TYPE_URL
from tests.configs import plugin_yaml
from tests.ports import free_port
from tests.processes import SimProcess
from tests.runtime import Running

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.sims(2, "--ttft", "20ms", prefix="", per_module=True),
]
TOKEN = "test-token-0123456789abcdef"
ADMIN_REFUSED = "admin call rejected: missing or wrong bearer token"
CLUSTER = "llama"
WATCH_WITHIN_S = 1.0


@dataclass
class Admin:
    runtime: Runtime
    stub: Any
    channel: grpc.aio.Channel
    a: str
    b: str
    metadata: tuple[tuple[str, str], ...] = ()


def started(sims: list[SimProcess], admin: dict[str, str] | None = None) -> Running:
    """The runtime probing both simulators once a minute; ``admin``: its ``admin:`` section."""
    text = plugin_yaml(
        sims,
        probe={"model": "sim-model", "interval": "60s", "healthy_after": 1},
        xds={"warm_start_timeout": "2s"},
        admin=admin,
    )
    return Running.from_config(text, "admin-test.yaml")


@pytest.fixture
async def running(sims: list[SimProcess]) -> AsyncIterator[Admin]:
    async with started(sims) as run:
        runtime = (await run.ready()).runtime
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            a, b = (t.address for t in runtime.targets)
            yield Admin(runtime, pb_grpc.AdminStub(channel), channel, a, b)


def key(address: str) -> dict[str, str]:
    return {"cluster": CLUSTER, "address": address}


async def test_list_matches_status(running: Admin) -> None:
    answer = await running.stub.ListEndpoints(pb.ListEndpointsRequest())
    status = running.runtime.status()
    rebuilt = status_document(snapshot_from_pb(answer))
    assert rebuilt["clusters"] == status["clusters"]
    assert answer.revision == status["revision"]
    states = {e.address: e.state for c in answer.clusters for e in c.endpoints}
    assert states == {running.a: pb.STATE_HEALTHY, running.b: pb.STATE_HEALTHY}


async def test_drain_and_undrain(running: Admin) -> None:
    drained = await running.stub.Drain(
        pb.DrainRequest(**key(running.a), reason="kernel  upgrade\n now")
    )
    assert drained.changed and drained.endpoint.state == pb.STATE_DRAINING
    assert drained.endpoint.envoy_health == pb.ENVOY_HEALTH_DRAINING
    assert drained.endpoint.reason == "kernel upgrade now"  # one line
    again = await running.stub.Drain(pb.DrainRequest(**key(running.a)))
    assert not again.changed
    back = await running.stub.Undrain(pb.EndpointRequest(**key(running.a)))
    assert back.changed and back.endpoint.state == pb.STATE_STARTING
    # the published snapshot (what xDS pushes) has it too
    published = running.runtime.control.published().clusters[CLUSTER].endpoints
    assert {e.spec.address: e.state.value for e in published}[running.a] == "starting"
    noop = await running.stub.Undrain(pb.EndpointRequest(**key(running.b)))
    assert not noop.changed and noop.endpoint.state == pb.STATE_HEALTHY


async def test_force_and_clear(running: Admin) -> None:
    request = pb.ForceStateRequest(
        **key(running.b),
        state=pb.STATE_UNHEALTHY,
        duration=Duration(seconds=600),
        reason="maintenance",
    )
    forced = await running.stub.ForceState(request)
    assert forced.endpoint.state == pb.STATE_UNHEALTHY
    assert forced.endpoint.probe_state == pb.STATE_HEALTHY
    assert forced.endpoint.reason == "override: maintenance"
    assert abs(forced.endpoint.override_until - (time.time() + 600)) < 5
    cleared = await running.stub.ClearOverride(pb.EndpointRequest(**key(running.b)))
    assert cleared.changed and cleared.endpoint.state == pb.STATE_HEALTHY
    assert not cleared.endpoint.HasField("override_until")
    again = await running.stub.ClearOverride(pb.EndpointRequest(**key(running.b)))
    assert not again.changed


@pytest.mark.parametrize(
    ("state", "seconds", "needle"),
    [
        (pb.STATE_UNSPECIFIED, 60, "state 0"),
        (pb.STATE_STARTING, 60, "STARTING cannot be forced"),
        (pb.STATE_DRAINING, 0, "duration must be > 0"),
        (pb.STATE_DRAINING, 8 * 86400, "at most 7 days"),
    ],
)
async def test_force_rejects_bad_arguments(
    running: Admin, state: int, seconds: int, needle: str
) -> None:
    request = pb.ForceStateRequest(
        **key(running.a), state=state, duration=Duration(seconds=seconds)
    )  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await running.stub.ForceState(request)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (caught.value.details() or "")


INVALID_DURATIONS = [  # google.protobuf.Duration: |nanos| <= 999,999,999, sign of seconds
    ((0, 2**31 - 1), "nanos must be within ±999,999,999"),
    ((0, 1_000_000_000), "nanos must be within ±999,999,999"),
    ((60, -(2**31)), "nanos must be within ±999,999,999"),
    ((60, -1), "nanos must have the sign of seconds"),
    ((-1, 5), "nanos must have the sign of seconds"),
]
BAD_CALLS = 100  # each kind 20 times, 10 at a time
LOG_BOUND_BYTES = 2048  # a refused admin call logs nothing (its answer says it all)


@pytest.mark.timed  # /livez within 100 ms while 100 invalid calls are refused
async def test_force_rejects_invalid_protobuf_durations(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """A Duration the spec does not allow (nanos = 2^31-1 once read as 2.147 s) is refused
    with INVALID_ARGUMENT, never applied; the service keeps answering meanwhile."""
    livez = f"http://127.0.0.1:{running.runtime.http_port}/livez"
    latencies: list[float] = []
    done = asyncio.Event()

    async def poll_livez() -> None:
        async with aiohttp.ClientSession() as session:
            while not done.is_set():
                started = time.monotonic()
                async with session.get(livez) as answer:
                    assert answer.status == 200
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

    async def refused(seconds: int, nanos: int) -> str:
        request = pb.ForceStateRequest(
            **key(running.a),
            state=pb.STATE_UNHEALTHY,
            duration=Duration(seconds=seconds, nanos=nanos),
            reason="attack",
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await running.stub.ForceState(request)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        return caught.value.details() or ""

    calls = [INVALID_DURATIONS[i % len(INVALID_DURATIONS)] for i in range(BAD_CALLS)]
    poller = asyncio.create_task(poll_livez())
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="llm_health"):
        for batch in (calls[i : i + 10] for i in range(0, len(calls), 10)):
            details = await asyncio.gather(*(refused(*duration) for duration, _ in batch))
            for text, (duration, why) in zip(details, batch, strict=True):
                assert text == (
                    "duration is not a valid google.protobuf.Duration (seconds="
                    f"{duration[0]}, nanos={duration[1]}): {why}"
                )
    elapsed = time.monotonic() - started
    await asyncio.sleep(0.2)
    done.set()
    await poller
    ours = [r for r in caplog.records if r.name.startswith("llm_health")]
    logged = sum(len(r.getMessage()) + len(str(r.__dict__)) for r in ours)
    assert logged < LOG_BOUND_BYTES, [r.getMessage() for r in ours]
    assert elapsed < 10, elapsed
    assert latencies and max(latencies) < 0.1, max(latencies)
    endpoints = running.runtime.control.board.snapshot().clusters[CLUSTER].endpoints
    assert [(e.state.value, e.override_until) for e in endpoints] == [("healthy", None)] * 2


@pytest.mark.parametrize("method", ["Drain", "Undrain", "ClearOverride", "ProbeNow"])
async def test_unknown_endpoint_is_not_found(running: Admin, method: str) -> None:
    request_type = pb.DrainRequest if method == "Drain" else pb.EndpointRequest
    for cluster, address in [(CLUSTER, "127.0.0.1:1"), ("nope", running.a)]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(running.stub, method)(request_type(cluster=cluster, address=address))
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND


async def test_probe_now_folds_in_and_never_overlaps(running: Admin) -> None:
    before = running.runtime.stats.probes_total
    answers = await asyncio.gather(
        *(running.stub.ProbeNow(pb.EndpointRequest(**key(running.a))) for _ in range(4))
    )
    results = sorted((result_from_pb(a.result) for a in answers), key=lambda r: r.started_at)
    assert all(
        r.outcome.value == "fast" and r.ttft_ms is not None and r.ttft_ms >= 15 for r in results
    )
    assert running.runtime.stats.probes_total == before + 4
    for earlier, later in itertools.pairwise(results):
        # one probe in flight per endpoint (docs/design.md §2): the next starts after the last ended
        assert later.started_at >= earlier.started_at + earlier.total_ms / 1000 - 0.002
    last = running.runtime.control.board.snapshot().clusters[CLUSTER].endpoints
    newest = {e.spec.address: e.last for e in last}[running.a]
    assert newest is not None and newest.started_at == results[-1].started_at


async def test_watch_streams_changes_within_a_second(running: Admin) -> None:
    call = running.stub.WatchEndpoints(pb.WatchEndpointsRequest(cluster=CLUSTER))
    try:
        first = await asyncio.wait_for(call.read(), 5)
        assert first.initial
        assert {e.address for c in first.clusters for e in c.endpoints} == {running.a, running.b}
        for method, request, expected in [
            ("Drain", pb.DrainRequest(**key(running.b)), pb.STATE_DRAINING),
            ("Undrain", pb.EndpointRequest(**key(running.b)), pb.STATE_STARTING),
        ]:
            started = time.monotonic()
            await getattr(running.stub, method)(request)
            message = await asyncio.wait_for(call.read(), WATCH_WITHIN_S)
            assert time.monotonic() - started < WATCH_WITHIN_S
            assert not message.initial
            assert [(e.address, e.state) for e in message.endpoints] == [(running.b, expected)]
    finally:
        call.cancel()


async def test_watch_unknown_cluster(running: Admin) -> None:
    call = running.stub.WatchEndpoints(pb.WatchEndpointsRequest(cluster="nope"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


# --- token and binds -----------------------------------------------------------------------


async def test_token_required_for_every_method_but_not_for_xds(
    sims: list[SimProcess],
) -> None:
    async with started(sims, admin={"token": TOKEN}) as run:
        runtime = (await run.ready()).runtime
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            stub = pb_grpc.AdminStub(channel)
            for metadata in [
                (),
                (("authorization", "Bearer wrong-token-0123456789"),),
                (("authorization", TOKEN),),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ListEndpoints(pb.ListEndpointsRequest(), metadata=metadata)
                assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
                watch = stub.WatchEndpoints(pb.WatchEndpointsRequest(), metadata=metadata)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await watch.read()
                assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
            address = runtime.targets[0].address
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Drain(pb.DrainRequest(cluster=CLUSTER, address=address))
            assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert (
                runtime.control.board.snapshot().clusters[CLUSTER].endpoints[0].state.value
                == "healthy"
            )
            good = (("authorization", f"Bearer {TOKEN}"),)
            answer = await stub.ListEndpoints(pb.ListEndpointsRequest(), metadata=good)
            assert len(answer.clusters) == 1
            # Envoy's xDS on the same server carries no token and must keep working.
            ads = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            stream = ads.StreamAggregatedResources()
            await stream.write(
                discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=[CLUSTER])
            )
            response = await asyncio.wait_for(stream.read(), 5)
            assert response.type_url == TYPE_URL and len(response.resources) == 1
            stream.cancel()
        status = runtime.status()["admin"]
        assert status["auth"] == "bearer token" and status["unauthenticated_total"] == 7
        assert TOKEN not in repr(runtime.status())


async def test_a_flood_of_wrong_tokens_is_counted_and_logged_once_per_peer_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """500 refused admin calls from loopback (unary and streaming): every one counted, one
    log line per peer host per minute, as for server.token refusals."""
    stats = AuthStats()
    server, port = await start_grpc_server("127.0.0.1:0")
    add_admin_service(server, AdminServicer(None), TOKEN, stats)  # type: ignore[arg-type]
    await server.start()
    wrong = (("authorization", "Bearer wrong-token-0123456789"),)
    caplog.set_level(logging.WARNING, logger="llm_health.admin")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.AdminStub(channel)
            for n in range(500):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    if n % 2:
                        await stub.ListEndpoints(pb.ListEndpointsRequest(), metadata=wrong)
                    else:
                        await stub.WatchEndpoints(pb.WatchEndpointsRequest(), metadata=()).read()
                assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(0)
    lines = [r for r in caplog.records if r.getMessage() == ADMIN_REFUSED]
    assert len(lines) == 1 and vars(lines[0])["peer"].startswith("ipv4:127.0.0.1:")
    assert (stats.calls, stats.rejected) == (500, 500)


async def test_own_bind_moves_the_api_off_the_xds_server(
    sims: list[SimProcess],
) -> None:
    port = free_port()
    async with started(sims, admin={"grpc": f"127.0.0.1:{port}"}) as run:
        runtime = (await run.ready()).runtime
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = await pb_grpc.AdminStub(channel).ListEndpoints(pb.ListEndpointsRequest())
            assert len(answer.clusters[0].endpoints) == 2
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.AdminStub(channel).ListEndpoints(pb.ListEndpointsRequest())
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert runtime.status()["admin"]["grpc"] == f"127.0.0.1:{port}"


class _RecordingServer:
    def __init__(self) -> None:
        self.added: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.added.append(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.added.append((service, handlers))


def test_not_served_on_a_non_loopback_xds_server_without_token() -> None:
    """Off loopback the config demands server.token (or mTLS); should a server still
    authenticate nobody, the admin API without its own token is not put on it."""
    base = "clusters:\n  - name: a\n    endpoints: [{address: 127.0.0.1:8000}]\n"
    server_token = "s" * 24
    exposed = parse_config(
        f"server: {{grpc: 0.0.0.0:18000, token: {server_token}}}\n" + base, "t.yaml", {}
    )
    control = build_runtime(exposed).control
    component = AdminComponent(exposed.admin, exposed.server.grpc, control)
    server = _RecordingServer()
    component.register(server)  # type: ignore[arg-type]
    assert server.added == [] and component.status()["grpc"] is None
    component = AdminComponent(
        exposed.admin, exposed.server.grpc, control, shared_authenticated=True
    )
    component.register(server)  # type: ignore[arg-type]
    assert server.added and component.status()["grpc"] == "0.0.0.0:18000"
    server.added.clear()
    with_token = parse_config(
        f"server: {{grpc: 0.0.0.0:18000, token: {server_token}}}\nadmin: {{token: {TOKEN}}}\n"
        + base,
        "t.yaml",
        {},
    )
    component = AdminComponent(
        with_token.admin, with_token.server.grpc, build_runtime(with_token).control
    )
    component.register(server)  # type: ignore[arg-type]
    assert server.added and component.status()["grpc"] == "0.0.0.0:18000"
