"""gRPC adapters for xDS: ADS and standalone EDS, SotW and delta; RTDS (one runtime layer).
One line per method.

The protocol lives in ``llm_health.xds.stream``; these classes only pick the engine and the
stats bucket. The server they are registered on comes from ``servers.grpc``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypedDict

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.runtime.v3 import rtds_pb2_grpc

from llm_health.core.control import SnapshotSource
from llm_health.model.board import HealthSnapshot
from llm_health.servers.decoding import rejecting_undecodable
from llm_health.xds.nodes import OpenNodes
from llm_health.xds.runtime import Layer
from llm_health.xds.stream import (
    DEFAULT_COALESCE_S,
    XdsCounters,
    XdsStats,
    delta_stream,
    runtime_stream,
    sotw_stream,
)

__all__ = [
    "AggregatedDiscoveryServicer",
    "EndpointDiscoveryServicer",
    "RuntimeDiscoveryServicer",
    "XdsCounters",
    "add_runtime_servicer",
    "add_xds_servicers",
]

SotwRequests = AsyncIterator[discovery_pb2.DiscoveryRequest]
SotwResponses = AsyncIterator[discovery_pb2.DiscoveryResponse]
DeltaRequests = AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]
DeltaResponses = AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]


class _EngineArgs(TypedDict):
    stats: XdsCounters
    coalesce_s: float
    nodes: OpenNodes | None


class _Servicer:
    """Shared wiring. grpc.aio picks streaming by ``inspect.isasyncgenfunction``, so each
    method is an ``async def`` that re-yields the engine (a returned generator is refused)."""

    def __init__(
        self,
        hub: SnapshotSource,
        stats: XdsStats,
        coalesce_s: float,
        nodes: OpenNodes | None = None,
    ) -> None:
        self._hub, self._stats, self._coalesce_s = hub, stats, coalesce_s
        self._nodes = nodes

    def _args(self, variant: str) -> _EngineArgs:
        stats = getattr(self._stats, variant)
        return {"stats": stats, "coalesce_s": self._coalesce_s, "nodes": self._nodes}


class AggregatedDiscoveryServicer(_Servicer):
    """``envoy.service.discovery.v3.AggregatedDiscoveryService``: only EDS is served."""

    async def StreamAggregatedResources(self, requests: SotwRequests, _: object) -> SotwResponses:
        async for response in sotw_stream(requests, self._hub, **self._args("ads_sotw")):
            yield response

    async def DeltaAggregatedResources(self, requests: DeltaRequests, _: object) -> DeltaResponses:
        async for response in delta_stream(requests, self._hub, **self._args("ads_delta")):
            yield response


class EndpointDiscoveryServicer(_Servicer):
    """``envoy.service.endpoint.v3.EndpointDiscoveryService`` (standalone EDS)."""

    async def StreamEndpoints(self, requests: SotwRequests, _: object) -> SotwResponses:
        async for response in sotw_stream(requests, self._hub, **self._args("eds_sotw")):
            yield response

    async def DeltaEndpoints(self, requests: DeltaRequests, _: object) -> DeltaResponses:
        async for response in delta_stream(requests, self._hub, **self._args("eds_delta")):
            yield response

    async def FetchEndpoints(self, _: object, context: grpc.aio.ServicerContext) -> None:
        """REST-style unary fetch: not offered (Envoy uses the streaming methods)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use StreamEndpoints/DeltaEndpoints")


def add_xds_servicers(
    server: grpc.aio.Server,
    hub: SnapshotSource,
    stats: XdsStats,
    *,
    coalesce_s: float = DEFAULT_COALESCE_S,
    nodes: OpenNodes | None = None,
) -> None:
    """Register ADS and standalone EDS on ``server`` (before it starts). ``nodes``: the
    registry of node ids with an open stream (HDS trusts only those)."""
    ads = AggregatedDiscoveryServicer(hub, stats, coalesce_s, nodes)
    eds = EndpointDiscoveryServicer(hub, stats, coalesce_s, nodes)
    lenient = rejecting_undecodable(server)  # undecodable bytes: INVALID_ARGUMENT
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, lenient)
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(eds, lenient)


class RuntimeDiscoveryServicer:
    """``envoy.service.runtime.v3.RuntimeDiscoveryService``: one layer, ``layer_of`` the
    snapshot (SotW only: Envoy's ``rtds_layer`` uses ``StreamRuntime``)."""

    def __init__(
        self,
        hub: SnapshotSource,
        layer_of: Callable[[HealthSnapshot], Layer],
        stats: XdsCounters,
        coalesce_s: float,
    ) -> None:
        self._hub, self._layer_of, self._stats = hub, layer_of, stats
        self._coalesce_s = coalesce_s

    async def StreamRuntime(self, requests: SotwRequests, _: object) -> SotwResponses:
        stream = runtime_stream(
            requests, self._hub, self._layer_of, stats=self._stats, coalesce_s=self._coalesce_s
        )
        async for response in stream:
            yield response

    async def DeltaRuntime(
        self, _: object, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        """Not offered. An async generator all the same: grpc.aio (and the undecodable
        bytes guard) stream a stream method's answers from one."""
        nothing: tuple[discovery_pb2.DeltaDiscoveryResponse, ...] = ()
        for never in nothing:
            yield never
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use StreamRuntime")

    async def FetchRuntime(self, _: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use StreamRuntime")


def add_runtime_servicer(
    server: grpc.aio.Server,
    hub: SnapshotSource,
    layer_of: Callable[[HealthSnapshot], Layer],
    stats: XdsCounters,
    *,
    coalesce_s: float = DEFAULT_COALESCE_S,
) -> None:
    """Register RTDS on ``server`` (before it starts)."""
    servicer = RuntimeDiscoveryServicer(hub, layer_of, stats, coalesce_s)
    lenient = rejecting_undecodable(server)
    rtds_pb2_grpc.add_RuntimeDiscoveryServiceServicer_to_server(servicer, lenient)
