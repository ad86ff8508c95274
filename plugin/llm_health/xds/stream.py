"""The xDS stream engines: SotW and delta EDS over any request iterator (no gRPC here).

Shape (a thin dispatcher, STYLE.md): one task reads requests into the stream's pure state
(``protocol.SotwState`` / ``DeltaState``), one task waits on ``SnapshotHub.wait_newer``;
either wakes the generator, which waits ``coalesce_s`` (a burst of board changes becomes
one push), then asks the state what to send and yields it. Both tasks are cancelled and
awaited in ``finally`` when the client goes away or the caller stops iterating.

Only the EDS type URL is served. Requests for other types (possible on ADS) are counted,
logged once per type per stream, and ignored; the stream keeps working (spec "Aggregated
Discovery Service": each type URL is an independent request/response sequence).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, fields
from typing import Protocol, TypeAlias, TypeVar

from envoy.service.discovery.v3 import discovery_pb2

from llm_health.hub import SnapshotHub
from llm_health.model.board import HealthSnapshot
from llm_health.xds import protocol
from llm_health.xds.protocol import DeltaPush, RequestKind, RequestOutcome, SotwPush
from llm_health.xds.resources import RESOURCES, TYPE_URL

DEFAULT_COALESCE_S = 0.02
MAX_ERROR_CHARS = 2000
MAX_LOGGED_TYPES = 16  # per stream: a client cycling type URLs cannot grow memory or logs
_LOG = logging.getLogger("llm_health.xds")

SotwRequest: TypeAlias = discovery_pb2.DiscoveryRequest
SotwResponse: TypeAlias = discovery_pb2.DiscoveryResponse
DeltaRequest: TypeAlias = discovery_pb2.DeltaDiscoveryRequest
DeltaResponse: TypeAlias = discovery_pb2.DeltaDiscoveryResponse


@dataclass(slots=True)
class XdsCounters:
    """Counters of one xDS variant (e.g. ADS SotW). Plain ints, mutated by stream tasks on
    one event loop; read them from that loop. ``last_nack``: the latest NACK's message."""

    streams_open: int = 0
    streams_total: int = 0
    requests: int = 0
    pushes: int = 0
    acks: int = 0
    nacks: int = 0
    stale_nonces: int = 0
    unknown_type_requests: int = 0
    last_nack: str | None = None


@dataclass(slots=True)
class XdsStats:
    """Per-variant xDS counters (EDS is the only type served, so variant = service x
    flavour). ``as_dict()`` is the JSON-ready view for /status and metrics."""

    ads_sotw: XdsCounters = field(default_factory=XdsCounters)
    ads_delta: XdsCounters = field(default_factory=XdsCounters)
    eds_sotw: XdsCounters = field(default_factory=XdsCounters)
    eds_delta: XdsCounters = field(default_factory=XdsCounters)

    def by_variant(self) -> dict[str, XdsCounters]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, dict[str, int | str | None]]:
        return {name: asdict(counters) for name, counters in self.by_variant().items()}


ReqT = TypeVar("ReqT", contravariant=True)
RespT = TypeVar("RespT", covariant=True)


class _Session(Protocol[ReqT, RespT]):
    def on_request(self, request: ReqT) -> None: ...

    def plan(self, snapshot: HealthSnapshot) -> RespT | None: ...


class _Base:
    """What both sessions share: type filtering, stats, and log lines."""

    def __init__(
        self, type_url: str, stats: XdsCounters, log: logging.Logger, flavour: str
    ) -> None:
        self.type_url = type_url
        self.stats = stats
        self.log = log
        self.flavour = flavour
        self.node = "?"
        self._unknown_types: set[str] = set()

    def accept(self, type_url: str, node_id: str) -> bool:
        """Count the request; False (and log once per type) if it is not our type URL.
        An empty type URL is ours: it is implicit on non-aggregated streams."""
        self.stats.requests += 1
        if node_id and self.node == "?":
            self.node = node_id
        if type_url in ("", self.type_url):
            return True
        self.stats.unknown_type_requests += 1
        if type_url not in self._unknown_types and len(self._unknown_types) < MAX_LOGGED_TYPES:
            self._unknown_types.add(type_url)
            self.log.warning(
                "%s %s: ignoring type %s (only EDS)", self.node, self.flavour, type_url
            )
        return False

    def count(self, outcome: RequestOutcome) -> None:
        """Stats and logs for one classified request; a NACK is an ERROR with Envoy's text."""
        kind = outcome.kind
        if kind is RequestKind.ACK:
            self.stats.acks += 1
        elif kind is RequestKind.STALE:
            self.stats.stale_nonces += 1
        elif kind is RequestKind.NACK:
            self.stats.nacks += 1
            self.stats.last_nack = outcome.error
            self.log.error(
                "%s %s NACK of %s (not resent until it changes): %s",
                self.node,
                self.flavour,
                outcome.rejected,
                outcome.error,
                extra={
                    "node": self.node,
                    "flavour": self.flavour,
                    "rejected": outcome.rejected,
                    "error_detail": outcome.error,
                },
            )

    def report(self, plan: protocol.Plan[object]) -> None:
        for name in plan.unknown:
            self.log.warning("%s %s: unknown cluster %r ignored", self.node, self.flavour, name)
        if plan.push is not None:
            self.stats.pushes += 1


def _error(request: SotwRequest | DeltaRequest) -> str | None:
    """``error_detail`` presence, not content, makes a NACK (spec "ACK/NACK"). The text is
    the peer's: cut to ``MAX_ERROR_CHARS`` before it reaches logs and stats."""
    if not request.HasField("error_detail"):
        return None
    detail = request.error_detail
    text: str = detail.message or f"(no message, code {detail.code})"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


class _SotwSession(_Base):
    def __init__(self, type_url: str, stats: XdsCounters, log: logging.Logger) -> None:
        super().__init__(type_url, stats, log, "sotw")
        self.state = protocol.SotwState()

    def on_request(self, request: SotwRequest) -> None:
        if not self.accept(request.type_url, request.node.id):
            return
        self.count(
            self.state.on_request(
                version_info=request.version_info,
                resource_names=request.resource_names,
                response_nonce=request.response_nonce,
                error=_error(request),
            )
        )

    def plan(self, snapshot: HealthSnapshot) -> SotwResponse | None:
        plan = self.state.plan(snapshot)
        self.report(plan)
        return None if plan.push is None else self._response(plan.push)

    def _response(self, push: SotwPush) -> SotwResponse:
        self.log.debug("%s sotw push %s nonce %s", self.node, push.version, push.nonce)
        return SotwResponse(
            version_info=push.version,
            resources=[RESOURCES.get(c).packed for c in push.clusters],
            type_url=self.type_url,
            nonce=push.nonce,
        )


class _DeltaSession(_Base):
    def __init__(self, type_url: str, stats: XdsCounters, log: logging.Logger) -> None:
        super().__init__(type_url, stats, log, "delta")
        self.state = protocol.DeltaState()

    def on_request(self, request: DeltaRequest) -> None:
        if not self.accept(request.type_url, request.node.id):
            return
        self.count(
            self.state.on_request(
                subscribe=request.resource_names_subscribe,
                unsubscribe=request.resource_names_unsubscribe,
                initial_versions=request.initial_resource_versions,
                response_nonce=request.response_nonce,
                error=_error(request),
            )
        )

    def plan(self, snapshot: HealthSnapshot) -> DeltaResponse | None:
        plan = self.state.plan(snapshot)
        self.report(plan)
        return None if plan.push is None else self._response(plan.push)

    def _response(self, push: DeltaPush) -> DeltaResponse:
        self.log.debug("%s delta push %s nonce %s", self.node, push.system_version, push.nonce)
        return DeltaResponse(
            system_version_info=push.system_version,
            resources=[RESOURCES.get(c).delta for c in push.clusters],
            removed_resources=push.removed,
            type_url=self.type_url,
            nonce=push.nonce,
        )


async def sotw_stream(
    requests: AsyncIterator[SotwRequest],
    hub: SnapshotHub,
    *,
    type_url: str = TYPE_URL,
    stats: XdsCounters,
    coalesce_s: float = DEFAULT_COALESCE_S,
    log: logging.Logger = _LOG,
) -> AsyncIterator[SotwResponse]:
    """Serve one state-of-the-world stream (``StreamAggregatedResources``/``StreamEndpoints``).
    Ends when the client closes its side; cancellation-safe."""
    session = _SotwSession(type_url, stats, log)
    async for response in _serve(requests, hub, session, stats, coalesce_s):
        yield response


async def delta_stream(
    requests: AsyncIterator[DeltaRequest],
    hub: SnapshotHub,
    *,
    type_url: str = TYPE_URL,
    stats: XdsCounters,
    coalesce_s: float = DEFAULT_COALESCE_S,
    log: logging.Logger = _LOG,
) -> AsyncIterator[DeltaResponse]:
    """Serve one incremental stream (``DeltaAggregatedResources``/``DeltaEndpoints``)."""
    session = _DeltaSession(type_url, stats, log)
    async for response in _serve(requests, hub, session, stats, coalesce_s):
        yield response


Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def _serve(
    requests: AsyncIterator[Req],
    hub: SnapshotHub,
    session: _Session[Req, Resp],
    stats: XdsCounters,
    coalesce_s: float,
) -> AsyncIterator[Resp]:
    """The dispatcher: wake on a request or a newer snapshot, coalesce, plan, yield."""
    wake = asyncio.Event()
    reader = asyncio.create_task(_read(requests, session, wake))
    watcher = asyncio.create_task(_watch(hub, wake))
    stats.streams_open += 1
    stats.streams_total += 1
    try:
        while not reader.done():
            await wake.wait()
            await asyncio.sleep(coalesce_s)
            wake.clear()
            response = session.plan(hub.current())
            if response is not None:
                yield response
        reader.result()  # re-raise a broken request stream
    finally:
        stats.streams_open -= 1
        await _cancel(reader, watcher)


async def _read(
    requests: AsyncIterator[Req], session: _Session[Req, Resp], wake: asyncio.Event
) -> None:
    try:
        async for request in requests:
            session.on_request(request)
            wake.set()
    finally:
        wake.set()  # let the dispatcher see the end of the request stream


async def _watch(hub: SnapshotHub, wake: asyncio.Event) -> None:
    revision = hub.current().revision
    while True:
        revision = (await hub.wait_newer(revision)).revision
        wake.set()


async def _cancel(*tasks: asyncio.Task[None]) -> None:
    """Cancel and await ``tasks`` without swallowing a cancellation of the caller."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # mark retrieved: the stream is over either way
