"""gRPC adapter for ``envoy.service.health.v3.HealthDiscoveryService``: one line per method.

The protocol lives in ``llm_health.hds.service``; this class only checks that HDS is
enabled, re-yields the engine, and maps its ``ProtocolError`` (bytes that are not an HDS
message) to INVALID_ARGUMENT. ``hds.enabled: false`` answers UNIMPLEMENTED, the
standard "service not offered" status: Envoy logs it and retries with its back-off
(1 s growing to 30 s), so the refusal is visible in Envoy's log and stats
(``hds_delegate.errors``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from envoy.service.health.v3 import hds_pb2, hds_pb2_grpc

from llm_health.errors import ProtocolError
from llm_health.hds.service import HdsService
from llm_health.servers.decoding import rejecting_undecodable

Requests = AsyncIterator[hds_pb2.HealthCheckRequestOrEndpointHealthResponse]
Specifiers = AsyncIterator[hds_pb2.HealthCheckSpecifier]


class HealthDiscoveryServicer:
    """grpc.aio picks streaming by ``inspect.isasyncgenfunction``: each streaming method is
    an ``async def`` that re-yields the engine."""

    def __init__(self, service: HdsService) -> None:
        self._service = service

    async def StreamHealthCheck(
        self, requests: Requests, context: grpc.aio.ServicerContext
    ) -> Specifiers:
        if not self._service.settings.enabled:
            self._service.stats.refused_streams += 1
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "HDS is off (hds.enabled: false)")
        try:
            async for specifier in self._service.stream(requests, context.peer()):
                yield specifier
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def FetchHealthCheck(
        self,
        _: hds_pb2.HealthCheckRequestOrEndpointHealthResponse,
        context: grpc.aio.ServicerContext,
    ) -> hds_pb2.HealthCheckSpecifier:
        """The unary variant is not offered (Envoy uses the stream)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "use StreamHealthCheck")
        raise AssertionError("unreachable: abort raises")


def add_hds_servicer(server: grpc.aio.Server, service: HdsService) -> None:
    """Register HDS on ``server`` (before it starts)."""
    # Undecodable bytes reach the engine as a DecodeError: counted, INVALID_ARGUMENT.
    hds_pb2_grpc.add_HealthDiscoveryServiceServicer_to_server(
        HealthDiscoveryServicer(service), rejecting_undecodable(server)
    )
