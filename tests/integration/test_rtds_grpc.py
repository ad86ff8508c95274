"""RTDS over real gRPC, in process: the runtime layer for admission inside Envoy
(``servers.xds.add_runtime_servicer`` fed ``authz.native.shed_layer``), played by a
scripted client stream (what Envoy's ``rtds_layer`` sends)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.runtime.v3 import rtds_pb2, rtds_pb2_grpc
from google.protobuf import json_format

from llm_health.authz import AuthzConfig
from llm_health.authz.native import shed_layer
from llm_health.core.hub import SnapshotHub
from llm_health.model.board import Board
from llm_health.model.outcome import Outcome
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.xds import add_runtime_servicer
from llm_health.xds.runtime import LAYER_NAME, RUNTIME_TYPE_URL
from llm_health.xds.stream import XdsCounters
from tests.integration.test_xds_grpc import Stream, make_board, probe, sotw

pytestmark = pytest.mark.timeout(30)


@dataclass
class Runtime:
    board: Board
    hub: SnapshotHub
    stats: XdsCounters
    channel: grpc.aio.Channel
    settings: AuthzConfig

    def stream(self) -> Stream:
        return Stream(rtds_pb2_grpc.RuntimeDiscoveryServiceStub(self.channel).StreamRuntime)

    async def degrade(self, cluster: str) -> None:
        """One SLOW probe: the cluster's only endpoint DEGRADED (capacity 0.3)."""
        address = self.board.snapshot().clusters[cluster].endpoints[0].spec.address
        self.board.record(cluster, address, probe(Outcome.SLOW), 2.0)
        self.hub.put(self.board.snapshot())


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    board = make_board()
    hub, stats = SnapshotHub(board.snapshot()), XdsCounters()
    server, port = await start_grpc_server("127.0.0.1:0")
    holder = Runtime(board, hub, stats, None, AuthzConfig())  # type: ignore[arg-type]
    add_runtime_servicer(server, hub, lambda snap: shed_layer(snap, holder.settings), stats)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            holder.channel = channel
            yield holder
    finally:
        await server.stop(0)


def rtds(**kwargs: object) -> discovery_pb2.DiscoveryRequest:
    kwargs.setdefault("type_url", RUNTIME_TYPE_URL)
    return sotw((LAYER_NAME,), **kwargs)  # type: ignore[arg-type]


def layer_of(response: discovery_pb2.DiscoveryResponse) -> dict[str, object]:
    assert response.type_url == RUNTIME_TYPE_URL
    (packed,) = response.resources
    runtime = rtds_pb2.Runtime()
    assert packed.Unpack(runtime)
    assert runtime.name == LAYER_NAME
    return json_format.MessageToDict(runtime.layer)


async def test_layer_pushed_acked_and_pushed_again_when_capacity_drops(runtime: Runtime) -> None:
    stream = runtime.stream()
    stream.send(rtds())
    first = await stream.recv()
    assert layer_of(first) == {"llm_health.shed_low.a": 0, "llm_health.shed_low.b": 0}
    stream.send(rtds(ack=first))
    await stream.silent()
    await runtime.degrade("a")  # 0.3 < shed_below 0.5
    second = await stream.recv()
    assert layer_of(second) == {"llm_health.shed_low.a": 100, "llm_health.shed_low.b": 0}
    stream.send(rtds(ack=second, error="rejected for the test"))
    await stream.silent()
    assert (runtime.stats.pushes, runtime.stats.acks, runtime.stats.nacks) == (2, 1, 1)
    assert runtime.stats.last_nack == "rejected for the test"
    await stream.close()


async def test_a_settings_change_alone_reaches_the_layer(runtime: Runtime) -> None:
    """No new snapshot: the layer is worked out again every second (a config reload)."""
    stream = runtime.stream()
    stream.send(rtds())
    first = await stream.recv()
    stream.send(rtds(ack=first))
    runtime.settings = AuthzConfig(shed_below=1.0)  # capacity 1.0 is not below 1.0
    await stream.silent(1.5)
    runtime.settings = AuthzConfig(enabled=True, shed_below=1.0)
    await runtime.degrade("b")
    pushed = await stream.recv()
    assert layer_of(pushed)["llm_health.shed_low.b"] == 100
    stream.send(rtds(ack=pushed))
    runtime.settings = AuthzConfig(enabled=False)  # a reload alone, no new snapshot
    off = await stream.recv(within_s=3.0)
    assert layer_of(off) == {"llm_health.shed_low.a": 0, "llm_health.shed_low.b": 0}
    await stream.close()


async def test_other_types_and_names_get_nothing_and_the_stream_goes_on(runtime: Runtime) -> None:
    stream = runtime.stream()
    stream.send(sotw(("a",)))  # an EDS request on the RTDS stream
    stream.send(sotw(("x",), type_url=RUNTIME_TYPE_URL))  # a layer not served
    await stream.silent()
    assert runtime.stats.unknown_type_requests == 1
    stream.send(rtds())
    assert layer_of(await stream.recv())["llm_health.shed_low.a"] == 0
    await stream.close()


async def test_delta_and_fetch_are_not_offered(runtime: Runtime) -> None:
    stub = rtds_pb2_grpc.RuntimeDiscoveryServiceStub(runtime.channel)
    with pytest.raises(grpc.aio.AioRpcError) as fetch:
        await stub.FetchRuntime(rtds())
    assert fetch.value.code() is grpc.StatusCode.UNIMPLEMENTED
    call = stub.DeltaRuntime(iter([discovery_pb2.DeltaDiscoveryRequest()]))
    with pytest.raises(grpc.aio.AioRpcError) as delta:
        await call.read()
    assert delta.value.code() is grpc.StatusCode.UNIMPLEMENTED
