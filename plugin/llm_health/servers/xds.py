"""gRPC adapters for xDS: ADS and standalone EDS, SotW and delta. One line per method.

The protocol lives in ``llm_health.xds.stream``; these classes only pick the engine and the
stats bucket. ``start_grpc_server`` builds the one gRPC server the plugin runs (xDS, HDS,
ext_authz and admin servicers are all registered on it).
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypedDict

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from llm_health.errors import LLMHealthError
from llm_health.hub import SnapshotHub
from llm_health.xds.stream import (
    DEFAULT_COALESCE_S,
    XdsCounters,
    XdsStats,
    delta_stream,
    sotw_stream,
)

_LOG = logging.getLogger("llm_health.xds")

SotwRequests = AsyncIterator[discovery_pb2.DiscoveryRequest]
SotwResponses = AsyncIterator[discovery_pb2.DiscoveryResponse]
DeltaRequests = AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]
DeltaResponses = AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]

GRPC_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    # grpcio sets SO_REUSEPORT by default: a second instance would silently share the port
    # and half of the Envoys would talk to it (DESIGN §7).
    ("grpc.so_reuseport", 0),
    # xDS streams live for hours and may be idle for minutes. Ping the peer every 30 s so a
    # vanished Envoy is noticed (20 s to answer) ...
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # ... and accept Envoy's own HTTP/2 keepalive pings (http2_protocol_options.
    # connection_keepalive; shipped configs: every 30 s) on a stream with nothing to send.
    # gRPC's defaults (at most one ping per 5 min without data, 2 strikes) answer them with
    # GOAWAY "too_many_pings" and Envoy reconnects over and over (seen with Envoy 1.40;
    # tests/integration/test_xds_envoy.py). 0 strikes = never GOAWAY for pings.
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
)


class _EngineArgs(TypedDict):
    stats: XdsCounters
    coalesce_s: float


class GrpcBindError(LLMHealthError, OSError):
    """The gRPC server could not bind its address (in use, or not permitted)."""


class _Servicer:
    """Shared wiring. grpc.aio picks streaming by ``inspect.isasyncgenfunction``, so each
    method is an ``async def`` that re-yields the engine (a returned generator is refused)."""

    def __init__(self, hub: SnapshotHub, stats: XdsStats, coalesce_s: float) -> None:
        self._hub, self._stats, self._coalesce_s = hub, stats, coalesce_s

    def _args(self, variant: str) -> _EngineArgs:
        return {"stats": getattr(self._stats, variant), "coalesce_s": self._coalesce_s}


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
    hub: SnapshotHub,
    stats: XdsStats,
    *,
    coalesce_s: float = DEFAULT_COALESCE_S,
) -> None:
    """Register ADS and standalone EDS on ``server`` (before it starts)."""
    ads = AggregatedDiscoveryServicer(hub, stats, coalesce_s)
    eds = EndpointDiscoveryServicer(hub, stats, coalesce_s)
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(eds, server)


def create_grpc_server(
    options: Sequence[tuple[str, Any]] = GRPC_SERVER_OPTIONS,
) -> grpc.aio.Server:
    """A grpc.aio server with the plugin's options (must run inside the event loop)."""
    server: grpc.aio.Server = grpc.aio.server(options=tuple(options))
    return server


def bind_grpc(server: grpc.aio.Server, bind: str) -> int:
    """Bind ``host:port`` or ``unix:/path`` (insecure, loopback or socket file).

    Returns the bound port (0 for Unix sockets). Raises ``GrpcBindError`` when the address
    is taken: gRPC would silently replace a live Unix socket file, so that is checked first.
    """
    unix = bind.startswith("unix:")
    if unix:
        _check_unix_socket_free(bind.removeprefix("unix:").removeprefix("//"))
    try:
        port: int = server.add_insecure_port(bind)
    except RuntimeError as exc:
        raise _bind_error(bind) from exc
    if port == 0:  # older grpcio reported a failed bind this way
        raise _bind_error(bind)
    return 0 if unix else port


async def start_grpc_server(
    bind: str, *, options: Sequence[tuple[str, Any]] = GRPC_SERVER_OPTIONS
) -> tuple[grpc.aio.Server, int]:
    """Create the plugin's gRPC server and bind ``bind``; returns ``(server, port)``.

    Not started yet: the caller registers its servicers (``add_xds_servicers`` ...) and
    then ``await server.start()``; stop it with ``await server.stop(grace_s)``. ``port`` is
    the bound TCP port (useful with ``:0``), 0 for a Unix socket. Raises ``GrpcBindError``.
    Call from inside the event loop that will run the server.
    """
    server = create_grpc_server(options)
    port = bind_grpc(server, bind)
    _LOG.info("gRPC server bound to %s", bind)
    return server, port


def _check_unix_socket_free(path: str) -> None:
    """Refuse a socket path another process is serving on (a stale file is fine)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return  # absent, or a stale file nobody listens on: gRPC replaces it
    raise _bind_error(f"unix:{path}")


def _bind_error(bind: str) -> GrpcBindError:
    return GrpcBindError(
        errno.EADDRINUSE,
        f"gRPC server cannot bind {bind}: address already in use (another llm-health?) "
        "or not permitted",
    )
