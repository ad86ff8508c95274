"""gRPC adapter of the admin API (``llm_health.v1.Admin``, proto/llm_health/v1/admin.proto).

Thin: each method translates protobuf to domain calls on an ``AdminBackend`` (implemented
by ``admin.component`` over the board control) and back. Errors map at this edge:
KeyError -> NOT_FOUND, ValueError -> INVALID_ARGUMENT, ``NotReady`` -> UNAVAILABLE.
Every endpoint and probe result sent has its free texts (reasons, details: they may quote
a backend) passed through the backend's ``redact`` (docs/design.md §10).

Authentication: ``add_admin_service(server, servicer, token)`` wraps every method handler
of the service so that, when a token is configured, a call without the metadata
``authorization: Bearer <token>`` ends with UNAUTHENTICATED before the method runs. It
works on a shared server (the xDS one) too, where a server-wide interceptor would also
hit Envoy's xDS streams. The check is ``core.tokens``'s; every refusal is counted
(``AuthStats.rejected``) and logged at most once per peer host per minute, as
``server.token`` refusals are.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from llm_health.adminpb import admin_pb2 as pb
from llm_health.adminpb import admin_pb2_grpc as pb_grpc
from llm_health.core.problems import peer_host
from llm_health.core.tokens import bearer_matches, expected_value, refusal_log
from llm_health.model.board import EndpointSnapshot, HealthSnapshot
from llm_health.model.outcome import ProbeResult
from llm_health.model.redact import printable_line
from llm_health.model.states import State
from llm_health.model.watch import diff
from llm_health.servers.admin_codec import (
    duration_from_pb,
    endpoint_to_pb,
    keys_to_pb,
    result_to_pb,
    snapshot_to_pb,
    state_from_pb,
)
from llm_health.servers.decoding import rejecting_undecodable

SERVICE = "llm_health.v1.Admin"
MAX_FORCE_S = 7 * 24 * 3600.0
MAX_TEXT = 500  # operator-supplied reasons are cut to this many characters
_LOG = logging.getLogger("llm_health.admin")
T = TypeVar("T")


class NotReady(RuntimeError):
    """The runtime cannot do this yet (e.g. probe-now before the prober runs)."""


@dataclass(frozen=True, slots=True)
class Changed:
    """An endpoint after an operator action; ``changed``: the action changed something."""

    endpoint: EndpointSnapshot
    changed: bool


@dataclass(frozen=True, slots=True)
class Probed:
    result: ProbeResult
    endpoint: EndpointSnapshot
    ignored: bool  # not folded in: the prober's loop lagged


class AdminBackend(Protocol):
    """What the admin API needs from the runtime. Unknown cluster/endpoint: KeyError."""

    def snapshot(self) -> HealthSnapshot:
        """The board now (freshest, includes the latest probe of every endpoint)."""

    def published(self) -> HealthSnapshot:
        """The latest snapshot published to watchers (and xDS)."""

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        """The next published snapshot whose revision differs from ``revision``."""

    async def drain(self, cluster: str, address: str, reason: str) -> Changed: ...

    async def undrain(self, cluster: str, address: str) -> Changed: ...

    async def force(
        self, cluster: str, address: str, state: State, duration_s: float, reason: str
    ) -> Changed: ...

    async def clear_override(self, cluster: str, address: str) -> Changed: ...

    async def probe_now(self, cluster: str, address: str) -> Probed: ...

    def redact(self, text: str) -> str:
        """``text`` without any configured secret (applied to every text sent)."""


class AdminServicer(pb_grpc.AdminServicer):
    """``llm_health.v1.Admin``. One instance per server; task-safe (no own state)."""

    def __init__(self, backend: AdminBackend) -> None:
        self._backend = backend

    async def ListEndpoints(
        self, request: pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEndpointsResponse:
        answer = await _mapped(context, lambda: _list(self._backend, request.cluster))
        self._clean_clusters(answer.clusters)
        return answer

    async def WatchEndpoints(
        self, request: pb.WatchEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchEndpointsResponse]:
        base = self._backend.snapshot()
        if request.cluster and request.cluster not in base.clusters:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown cluster {request.cluster!r}")
        cluster = request.cluster or None
        first = snapshot_to_pb(base, request.cluster)
        self._clean_clusters(first.clusters)
        yield pb.WatchEndpointsResponse(
            revision=base.revision, initial=True, clusters=first.clusters
        )
        seen = self._backend.published().revision
        while True:
            snapshot = await self._backend.wait_newer(seen)
            seen = snapshot.revision
            if snapshot.revision <= base.revision:
                continue  # published before our first answer was taken
            changes, base = diff(base, snapshot, cluster), snapshot
            if changes:
                yield pb.WatchEndpointsResponse(
                    revision=snapshot.revision,
                    endpoints=[self._endpoint(e) for e in changes.changed],
                    removed=keys_to_pb(changes.removed),
                )

    async def Drain(
        self, request: pb.DrainRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndpointResponse:
        reason = _text(request.reason) or "drained by operator"
        action = self._backend.drain(request.cluster, request.address, reason)
        return self._changed(await _mapped(context, lambda: action))

    async def Undrain(
        self, request: pb.EndpointRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndpointResponse:
        action = self._backend.undrain(request.cluster, request.address)
        return self._changed(await _mapped(context, lambda: action))

    async def ForceState(
        self, request: pb.ForceStateRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndpointResponse:
        async def force() -> Changed:
            state, seconds = _force_args(request)
            return await self._backend.force(
                request.cluster, request.address, state, seconds, _text(request.reason)
            )

        return self._changed(await _mapped(context, force))

    async def ClearOverride(
        self, request: pb.EndpointRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndpointResponse:
        action = self._backend.clear_override(request.cluster, request.address)
        return self._changed(await _mapped(context, lambda: action))

    async def ProbeNow(
        self, request: pb.EndpointRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProbeNowResponse:
        probed = await _mapped(
            context, lambda: self._backend.probe_now(request.cluster, request.address)
        )
        result = result_to_pb(probed.result)
        result.detail = self._backend.redact(result.detail)
        return pb.ProbeNowResponse(
            result=result, endpoint=self._endpoint(probed.endpoint), ignored=probed.ignored
        )

    # --- what is sent: every free text scrubbed --------------------------------------------

    def _changed(self, result: Changed) -> pb.EndpointResponse:
        return pb.EndpointResponse(endpoint=self._endpoint(result.endpoint), changed=result.changed)

    def _endpoint(self, endpoint: EndpointSnapshot) -> pb.Endpoint:
        message = endpoint_to_pb(endpoint)
        self._clean(message)
        return message

    def _clean_clusters(self, clusters: Iterable[pb.Cluster]) -> None:
        for cluster in clusters:
            for endpoint in cluster.endpoints:
                self._clean(endpoint)

    def _clean(self, message: pb.Endpoint) -> None:
        """The endpoint's reason, its signals' reasons and its last probe's detail,
        redacted (rewritten only where something was)."""
        redact = self._backend.redact
        if (reason := redact(message.reason)) != message.reason:
            message.reason = reason
        for source, text in list(message.signals.items()):
            if (clean := redact(text)) != text:
                message.signals[source] = clean
        if message.HasField("last_probe"):
            detail = message.last_probe.detail
            if (clean := redact(detail)) != detail:
                message.last_probe.detail = clean


async def _list(backend: AdminBackend, cluster: str) -> pb.ListEndpointsResponse:
    return snapshot_to_pb(backend.snapshot(), cluster)


def _force_args(request: pb.ForceStateRequest) -> tuple[State, float]:
    state = state_from_pb(request.state)
    if state is State.STARTING:
        raise ValueError("STARTING cannot be forced (use drain/undrain to re-qualify)")
    seconds = duration_from_pb(request.duration)
    if not 0 < seconds <= MAX_FORCE_S:
        raise ValueError(f"duration must be > 0 and at most {MAX_FORCE_S / 86400:g} days")
    return state, seconds


def _text(value: str) -> str:
    """An operator's free text, bounded, printable and on one line (it reaches logs,
    terminals and /status): an ANSI escape in a drain reason is dropped."""
    return printable_line(value, MAX_TEXT)


async def _mapped(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call``; map domain errors to gRPC status codes (abort raises)."""
    try:
        return await call()
    except KeyError as exc:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown cluster or endpoint: {exc}")
    except ValueError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except NotReady as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover


# --- authentication --------------------------------------------------------------------


@dataclass(slots=True)
class AuthStats:
    """Counters of the guard (plain ints, one event loop)."""

    calls: int = 0
    rejected: int = 0


def add_admin_service(
    server: grpc.aio.Server, servicer: AdminServicer, token: str | None, stats: AuthStats
) -> None:
    """Register the Admin service on ``server`` (before it starts). With ``token``, calls
    must carry ``authorization: Bearer <token>``; others end UNAUTHENTICATED."""
    guarded = _GuardedServer(server, token, stats)
    # The token is checked first, then undecodable bytes answer INVALID_ARGUMENT.
    lenient = rejecting_undecodable(guarded)
    pb_grpc.add_AdminServicer_to_server(servicer, lenient)  # type: ignore[no-untyped-call]


class _GuardedServer:
    """Stands in for the server while the generated code registers its handlers, wrapping
    each one with the token check."""

    def __init__(self, server: grpc.aio.Server, token: str | None, stats: AuthStats) -> None:
        self._server, self._stats = server, stats
        self._expected = None if token is None else expected_value(token)
        self._refusals = refusal_log(_LOG)

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedHandler(h, self) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        guarded = {name: self.guard(h) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, guarded)

    def guard(self, handler: Any) -> Any:
        if handler is None:
            return None
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(handler.unary_stream))
        raise TypeError("the Admin service has only unary and server-streaming methods")

    def _unary(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._check(context)
            return await method(request, context)

        return guarded

    def _streaming(self, method: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await self._check(context)
            async for response in method(request, context):
                yield response

        return guarded

    async def _check(self, context: grpc.aio.ServicerContext) -> None:
        self._stats.calls += 1
        if self._expected is None:
            return
        if bearer_matches(context.invocation_metadata(), self._expected):
            return
        self._stats.rejected += 1
        peer = context.peer() or "?"
        self._refusals.report(
            peer_host(peer), "admin call rejected: missing or wrong bearer token", {"peer": peer}
        )
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class _GuardedHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: Any, guard: _GuardedServer) -> None:
        self._inner, self._guard = inner, guard

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        return self._guard.guard(self._inner.service(details))
