"""xDS over real gRPC, in process: a grpc.aio server on 127.0.0.1:0 and client stubs that
play scripted ACK/NACK sequences (SotW and delta, ADS and standalone EDS)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from google.rpc import status_pb2

from llm_health.core.hub import SnapshotHub
from llm_health.model.board import Board, ClusterSpec, EndpointSpec, HealthSnapshot
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.servers.grpc import GrpcBindError, start_grpc_server
from llm_health.servers.xds import add_xds_servicers
from llm_health.xds.resources import TYPE_URL
from llm_health.xds.stream import XdsCounters, XdsStats
from tests.grpc_stream import ScriptedStream
from tests.polling import wait_until_async

pytestmark = pytest.mark.timeout(30)

CDS_TYPE_URL = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
SILENCE_S = 0.2  # 10x the coalescing window: long enough to see a push that should not come
POLICY = Policy(healthy_after=1)  # one FAST probe recovers DEGRADED -> HEALTHY


def endpoint(port: int) -> EndpointSpec:
    return EndpointSpec(f"127.0.0.1:{port}", "127.0.0.1", port, 100)


def probe(outcome: Outcome) -> ProbeResult:
    return ProbeResult(outcome, 0.0, ttft_ms=10 if outcome is Outcome.FAST else 500)


@dataclass
class Plugin:
    board: Board
    hub: SnapshotHub
    stats: XdsStats
    channel: grpc.aio.Channel
    now: float = 1.0

    async def publish(self) -> HealthSnapshot:
        snapshot = self.board.snapshot()
        self.hub.put(snapshot)
        return snapshot

    async def flip(self, cluster: str = "a") -> HealthSnapshot:
        """Change what Envoy sees for ``cluster``: HEALTHY <-> DEGRADED."""
        address = self.board.snapshot().clusters[cluster].endpoints[0].spec.address
        state = self.board.health(cluster, address).state.value
        self.now += 1
        outcome = Outcome.SLOW if state == "healthy" else Outcome.FAST
        self.board.record(cluster, address, probe(outcome), self.now)
        return await self.publish()

    async def drop(self, cluster: str) -> None:
        """Publish a snapshot without ``cluster`` (as after a config reload)."""
        current = self.hub.current()
        clusters = {k: v for k, v in current.clusters.items() if k != cluster}
        self.hub.put(HealthSnapshot(current.revision + 1000, clusters))


def make_board(*, warm: bool = True) -> Board:
    specs = [
        ClusterSpec("a", POLICY, (endpoint(9001),)),
        ClusterSpec("b", POLICY, (endpoint(9002),)),
    ]
    board = Board(specs, now=0.0, wall_offset=0.0)
    if warm:
        board.record("a", "127.0.0.1:9001", probe(Outcome.FAST), 0.5)
        board.record("b", "127.0.0.1:9002", probe(Outcome.FAST), 0.5)
    return board


async def serve(board: Board) -> AsyncIterator[Plugin]:
    hub, stats = SnapshotHub(board.snapshot()), XdsStats()
    server, port = await start_grpc_server("127.0.0.1:0")
    add_xds_servicers(server, hub, stats)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Plugin(board, hub, stats, channel)
    finally:
        await server.stop(0)


@pytest.fixture
async def plugin() -> AsyncIterator[Plugin]:
    async for running in serve(make_board()):
        yield running


@pytest.fixture
async def cold_plugin() -> AsyncIterator[Plugin]:
    async for running in serve(make_board(warm=False)):
        yield running


class Stream(ScriptedStream):
    """One client xDS stream (see ScriptedStream)."""

    silence_s = SILENCE_S


def sotw(
    names: Sequence[str] = ("a",),
    *,
    ack: Any = None,
    nonce: str | None = None,
    version: str | None = None,
    error: str | None = None,
    type_url: str = TYPE_URL,
) -> discovery_pb2.DiscoveryRequest:
    """A SotW request; ``ack=response`` answers that response (NACK if ``error``)."""
    request = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=list(names))
    request.node.id = "test-envoy"
    if ack is not None:
        request.response_nonce = ack.nonce
        request.version_info = "" if error is not None else ack.version_info
    if nonce is not None:
        request.response_nonce = nonce
    if version is not None:
        request.version_info = version
    if error is not None:
        request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return request


def delta(
    subscribe: Sequence[str] = (),
    unsubscribe: Sequence[str] = (),
    *,
    nonce: str = "",
    error: str | None = None,
    initial: dict[str, str] | None = None,
) -> discovery_pb2.DeltaDiscoveryRequest:
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=TYPE_URL,
        resource_names_subscribe=list(subscribe),
        resource_names_unsubscribe=list(unsubscribe),
        initial_resource_versions=initial or {},
        response_nonce=nonce,
    )
    if error is not None:
        request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return request


def ads_sotw(plugin: Plugin) -> Stream:
    return Stream(
        ads_pb2_grpc.AggregatedDiscoveryServiceStub(plugin.channel).StreamAggregatedResources
    )


def ads_delta(plugin: Plugin) -> Stream:
    return Stream(
        ads_pb2_grpc.AggregatedDiscoveryServiceStub(plugin.channel).DeltaAggregatedResources
    )


def names_of(response: Any) -> list[str]:
    """Cluster names in a SotW or delta response."""
    result = []
    for item in response.resources:
        packed = item.resource if isinstance(item, discovery_pb2.Resource) else item
        assignment = endpoint_pb2.ClusterLoadAssignment()
        assert packed.Unpack(assignment)
        result.append(assignment.cluster_name)
    return result


async def all_closed(stats: XdsCounters, within_s: float = 2.0) -> None:
    """The server notices a cancelled stream a moment after the client does."""
    await wait_until_async(lambda: stats.streams_open == 0, within_s, "every stream closed")


def counters(stats: XdsCounters) -> dict[str, Any]:
    return {k: v for k, v in vars_of(stats).items() if v}


def vars_of(stats: XdsCounters) -> dict[str, Any]:
    return {name: getattr(stats, name) for name in XdsCounters.__dataclass_fields__}


# --------------------------------------------------------------------------- SotW


async def test_sotw_initial_ack_then_push_on_change(plugin: Plugin) -> None:
    stream = ads_sotw(plugin)
    stream.send(sotw(["a"]))
    first = await stream.recv()
    assert (first.type_url, first.nonce, names_of(first)) == (TYPE_URL, "1", ["a"])
    stream.send(sotw(["a"], ack=first))
    await stream.silent()  # a plain ACK is never answered
    await plugin.flip("a")
    second = await stream.recv()
    assert second.nonce == "2" and second.version_info != first.version_info
    assert names_of(second) == ["a"]
    await stream.close()
    await all_closed(plugin.stats.ads_sotw)
    assert counters(plugin.stats.ads_sotw) == {
        "streams_total": 1,
        "requests": 2,
        "pushes": 2,
        "acks": 1,
    }


async def test_sotw_nack_is_counted_logged_and_not_resent(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    stream = ads_sotw(plugin)
    stream.send(sotw(["a"]))
    first = await stream.recv()
    with caplog.at_level(logging.ERROR, logger="llm_health.xds"):
        stream.send(sotw(["a"], ack=first, error="weight 0 is invalid"))
        await stream.silent()
    assert plugin.stats.ads_sotw.nacks == 1
    assert plugin.stats.ads_sotw.last_nack == "weight 0 is invalid"
    assert "weight 0 is invalid" in caplog.text and "test-envoy" in caplog.text
    await plugin.publish()  # a new revision with the same Envoy view: still not resent
    await stream.silent()
    await plugin.flip("a")
    assert (await stream.recv()).nonce == "2"
    await stream.close()


async def test_sotw_stale_nonce_is_ignored(plugin: Plugin) -> None:
    stream = ads_sotw(plugin)
    stream.send(sotw(["a"]))
    first = await stream.recv()
    await plugin.flip("a")
    second = await stream.recv()
    stream.send(sotw(["a", "b"], ack=first))  # answers nonce 1 after nonce 2 was sent
    await stream.silent()
    assert plugin.stats.ads_sotw.stale_nonces == 1
    stream.send(sotw(["a"], ack=second))
    await stream.silent()  # the stale request did not subscribe b
    await stream.close()


async def test_sotw_subscription_change_sends_new_set(plugin: Plugin) -> None:
    stream = ads_sotw(plugin)
    stream.send(sotw(["a"]))
    first = await stream.recv()
    stream.send(sotw(["a", "b"], ack=first))
    assert names_of(await stream.recv()) == ["a", "b"]
    await stream.close()


async def test_bad_input_leaves_the_stream_working(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    stream = ads_sotw(plugin)
    with caplog.at_level(logging.WARNING, logger="llm_health.xds"):
        stream.send(sotw(["x"], type_url=CDS_TYPE_URL))
        stream.send(sotw(["y"], type_url=CDS_TYPE_URL))
        stream.send(sotw(["a", "ghost"], nonce="not-a-nonce"))
        first = await stream.recv()
        stream.send(sotw(["a", "ghost"], nonce="garbage-after-push"))
        await stream.silent()
    assert names_of(first) == ["a"]
    stats = plugin.stats.ads_sotw
    assert (stats.unknown_type_requests, stats.stale_nonces) == (2, 1)
    assert caplog.text.count(CDS_TYPE_URL) == 1  # logged once per stream
    assert caplog.text.count("'ghost'") == 1
    stream.send(sotw(["a", "ghost"], ack=first))
    await plugin.flip("a")
    assert names_of(await stream.recv()) == ["a"]
    await stream.close()


async def test_cold_cluster_is_held_until_warm(cold_plugin: Plugin) -> None:
    stream = ads_sotw(cold_plugin)
    stream.send(sotw(["a", "b"]))
    await stream.silent()
    cold_plugin.board.mark_warm("b")
    await cold_plugin.publish()
    assert names_of(await stream.recv()) == ["b"]
    await stream.close()


async def test_burst_of_changes_is_coalesced(plugin: Plugin) -> None:
    """10 board changes within a few ms: one or two pushes, the last one current."""
    stream = ads_sotw(plugin)
    stream.send(sotw(["a", "b"]))
    first = await stream.recv()
    stream.send(sotw(["a", "b"], ack=first))
    await stream.silent()
    for index in range(10):
        last = await plugin.flip("ab"[index % 2])  # 5 flips each: both end DEGRADED
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.3)
    pushes = [stream.responses.get_nowait() for _ in range(stream.responses.qsize())]
    assert 1 <= len(pushes) <= 2, len(pushes)
    for packed in pushes[-1].resources:
        final = endpoint_pb2.ClusterLoadAssignment()
        packed.Unpack(final)
        weight = final.endpoints[0].lb_endpoints[0].load_balancing_weight.value
        assert weight == last.clusters[final.cluster_name].endpoints[0].view.weight == 30
    await stream.close()


async def test_standalone_eds_sotw_and_fetch_unimplemented(plugin: Plugin) -> None:
    stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(plugin.channel)
    stream = Stream(stub.StreamEndpoints)
    stream.send(sotw(["b"]))
    assert names_of(await stream.recv()) == ["b"]
    await stream.close()
    assert plugin.stats.eds_sotw.pushes == 1 and plugin.stats.ads_sotw.pushes == 0
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.FetchEndpoints(sotw(["b"]))
    assert failure.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_client_going_away_cleans_up(plugin: Plugin) -> None:
    tasks_before = len(asyncio.all_tasks())
    streams = [ads_sotw(plugin) for _ in range(3)]
    for stream in streams:
        stream.send(sotw(["a"]))
        await stream.recv()
    assert plugin.stats.ads_sotw.streams_open == 3
    for stream in streams:
        await stream.close()
    await all_closed(plugin.stats.ads_sotw)
    assert plugin.stats.ads_sotw.streams_total == 3
    await wait_until_async(
        lambda: len(asyncio.all_tasks()) <= tasks_before, 5, "the streams' tasks to end"
    )


# --------------------------------------------------------------------------- delta


async def test_delta_subscribe_change_unsubscribe_remove(plugin: Plugin) -> None:
    stream = ads_delta(plugin)
    stream.send(delta(["a", "b"]))
    first = await stream.recv()
    assert sorted(names_of(first)) == ["a", "b"]
    assert {r.name: r.version for r in first.resources} == {
        n: c.envoy_version for n, c in plugin.hub.current().clusters.items()
    }
    stream.send(delta(nonce=first.nonce))
    await stream.silent()
    await plugin.flip("a")
    second = await stream.recv()
    assert names_of(second) == ["a"] and list(second.removed_resources) == []
    stream.send(delta(nonce=second.nonce))
    stream.send(delta(unsubscribe=["a"]))
    await stream.silent()  # unsubscribing needs no answer
    await plugin.flip("a")
    await stream.silent()  # and a is no longer pushed
    await plugin.drop("b")
    third = await stream.recv()
    assert (names_of(third), list(third.removed_resources)) == ([], ["b"])
    await stream.close()
    assert plugin.stats.ads_delta.acks == 2


async def test_delta_reconnect_with_initial_resource_versions(plugin: Plugin) -> None:
    current = plugin.hub.current().clusters
    stream = ads_delta(plugin)
    stream.send(delta(["a", "b"], initial={"a": current["a"].envoy_version, "b": "old"}))
    response = await stream.recv()
    assert names_of(response) == ["b"]  # a is already current in the client
    await stream.close()


async def test_delta_nack_then_stale_nonce_subscription(plugin: Plugin) -> None:
    stream = ads_delta(plugin)
    stream.send(delta(["a"]))
    first = await stream.recv()
    stream.send(delta(nonce=first.nonce, error="rejected"))
    await stream.silent()
    assert plugin.stats.ads_delta.nacks == 1
    assert plugin.stats.ads_delta.last_nack == "rejected"
    stream.send(delta(["b"], nonce="stale-or-garbage"))
    assert names_of(await stream.recv()) == ["b"]  # honoured despite the nonce
    assert plugin.stats.ads_delta.stale_nonces == 1
    await plugin.flip("a")
    assert names_of(await stream.recv()) == ["a"]
    await stream.close()


async def test_standalone_delta_endpoints(plugin: Plugin) -> None:
    stream = Stream(eds_pb2_grpc.EndpointDiscoveryServiceStub(plugin.channel).DeltaEndpoints)
    stream.send(delta(["a"]))
    assert names_of(await stream.recv()) == ["a"]
    await stream.close()
    assert plugin.stats.eds_delta.pushes == 1


# --------------------------------------------------------------------------- binding


async def test_taken_port_is_a_clear_error() -> None:
    server, port = await start_grpc_server("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(GrpcBindError, match=f"127.0.0.1:{port}"):
            await start_grpc_server(f"127.0.0.1:{port}")
    finally:
        await server.stop(0)


async def test_taken_port_held_by_another_socket() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(GrpcBindError):
            await start_grpc_server(f"127.0.0.1:{holder.getsockname()[1]}")


async def test_unix_socket_bind_and_live_socket_refused(tmp_path: Path) -> None:
    path = tmp_path / "xds.sock"
    board = make_board()
    hub, stats = SnapshotHub(board.snapshot()), XdsStats()
    server, port = await start_grpc_server(f"unix:{path}")
    add_xds_servicers(server, hub, stats)
    await server.start()
    try:
        assert port == 0 and path.exists()
        with pytest.raises(GrpcBindError):
            await start_grpc_server(f"unix:{path}")
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stream = Stream(
                ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources
            )
            stream.send(sotw(["a"]))
            assert names_of(await stream.recv()) == ["a"]
            await stream.close()
    finally:
        await server.stop(0)
