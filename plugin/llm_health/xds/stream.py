"""The xDS stream engines: SotW and delta EDS, and SotW RTDS (one runtime layer,
``xds.runtime``), over any request iterator (no gRPC here).

Shape (a thin dispatcher): one task reads requests into the stream's pure state
(``protocol.SotwState`` / ``DeltaState``), one task waits on ``SnapshotSource.wait_newer``;
either wakes the generator, which waits ``coalesce_s`` (a burst of board changes becomes
one push), then asks the state what to send and yields it. Both tasks are cancelled and
awaited in ``finally`` when the client goes away or the caller stops iterating.

Each stream serves one type URL (EDS; RTDS on its own stream). Requests for other types
(possible on ADS) are counted, logged, and ignored; the stream keeps working (spec "Aggregated Discovery Service": each
type URL is an independent request/response sequence).

Logs stay bounded whatever a peer sends (``xds.tally``: one line per kind of problem per
stream, a running count and a few samples, repeated at most every minute while the count
grows). A request's names are screened in chunks of ``SCREEN_CHUNK``
(``protocol.NameScreen``) with a yield to the event loop between chunks, so a request
naming 300,000 clusters neither stalls the loop nor grows the stream's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import islice
from typing import Protocol, TypeAlias, TypeVar

from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.runtime.v3 import rtds_pb2
from google.protobuf import any_pb2, struct_pb2

from llm_health.core.control import SnapshotSource
from llm_health.model.board import HealthSnapshot
from llm_health.model.redact import printable
from llm_health.xds import protocol
from llm_health.xds.nodes import OpenNodes
from llm_health.xds.protocol import DeltaPush, RequestKind, RequestOutcome, SotwPush
from llm_health.xds.resources import RESOURCES, TYPE_URL
from llm_health.xds.runtime import LAYER_NAME, RUNTIME_TYPE_URL, Layer, LayerPush, LayerState
from llm_health.xds.tally import MAX_LOGGED_CHARS, ProblemTally

DEFAULT_COALESCE_S = 0.02
DEFAULT_LAYER_REFRESH_S = 1.0  # RTDS: how soon a settings-only reload reaches the layer
MAX_ERROR_CHARS = 2000
SCREEN_CHUNK = 4096  # names screened between two yields to the event loop
KIND_TYPES = "requests for other types ignored (only EDS)"
KIND_UNKNOWN = "unknown clusters ignored"
KIND_UNKNOWN_LAYERS = "unknown runtime layers ignored"
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


async def _screen(screen: protocol.NameScreen, names: Sequence[str]) -> list[str]:
    """Feed ``names`` (a protobuf repeated field: sliceable) to ``screen`` chunk by chunk,
    yielding to the event loop between chunks."""
    for start in range(0, len(names), SCREEN_CHUNK):
        if start:
            await asyncio.sleep(0)
        screen.feed(names[start : start + SCREEN_CHUNK])
    return screen.kept


async def _screen_keys(screen: protocol.NameScreen, keys: Iterator[str]) -> list[str]:
    """``_screen`` for the keys of a protobuf map (iterable, not sliceable)."""
    while chunk := list(islice(keys, SCREEN_CHUNK)):
        screen.feed(chunk)
        if len(chunk) == SCREEN_CHUNK:
            await asyncio.sleep(0)
    return screen.kept


ReqT = TypeVar("ReqT", contravariant=True)
RespT = TypeVar("RespT", covariant=True)


class _Session(Protocol[ReqT, RespT]):
    async def on_request(self, request: ReqT) -> None: ...

    def plan(self, snapshot: HealthSnapshot) -> RespT | None: ...

    def release(self) -> None: ...


class _Base:
    """What both sessions share: type filtering, stats, and log lines."""

    def __init__(
        self,
        type_url: str,
        stats: XdsCounters,
        log: logging.Logger,
        flavour: str,
        known: Callable[[], Collection[str]],
    ) -> None:
        self.type_url = type_url
        self.stats = stats
        self.log = log
        self.flavour = flavour
        self.node = "?"
        self.known = known  # the current snapshot's cluster names
        self.problems = ProblemTally(log, self.label)
        self.nodes: OpenNodes | None = None  # registered in once the node is known
        self.unknown_kind = KIND_UNKNOWN

    def accept(self, type_url: str, node_id: str) -> bool:
        """Count the request; False (counted and logged) if it is not our type URL.
        An empty type URL is ours: it is implicit on non-aggregated streams."""
        self.stats.requests += 1
        if node_id and self.node == "?":
            self.node = node_id
            if self.nodes is not None:
                self.nodes.add(node_id)
        if type_url in ("", self.type_url):
            return True
        self.stats.unknown_type_requests += 1
        self.problems.add(KIND_TYPES, 1, (type_url,))
        self.problems.flush()
        return False

    def label(self) -> str:
        """``node flavour`` for log lines (the node id is the peer's: made printable)."""
        return f"{printable(self.node, MAX_LOGGED_CHARS)} {self.flavour}"

    def release(self) -> None:
        """The stream is over: its node id leaves the open-node registry."""
        if self.nodes is not None and self.node != "?":
            self.nodes.remove(self.node)
            self.nodes = None

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
            rejected = printable(outcome.rejected, MAX_ERROR_CHARS)
            error = printable(outcome.error, MAX_ERROR_CHARS)
            self.log.error(
                "%s NACK of %s (not resent until it changes): %s",
                self.label(),
                rejected,
                error,
                extra={
                    "node": printable(self.node, MAX_LOGGED_CHARS),
                    "flavour": self.flavour,
                    "rejected": rejected,
                    "error_detail": error,
                },
            )

    def screened(self, screen: protocol.NameScreen) -> list[str]:
        """Count a request's unknown names (logged with the next plan); the kept ones
        are returned, for the state not to report them again."""
        self.problems.add(self.unknown_kind, screen.unknown, screen.samples)
        return screen.kept_unknown

    def report(self, plan: protocol.Plan[object]) -> None:
        self.problems.add(self.unknown_kind, len(plan.unknown), plan.unknown)
        self.problems.flush()
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


async def _fold_sotw(session: _Base, state: protocol.SotwTracker, request: SotwRequest) -> None:
    """One SotW request into ``state`` (EDS or RTDS): type, names screened, outcome counted."""
    if not session.accept(request.type_url, request.node.id):
        return
    screen = protocol.NameScreen(session.known(), protocol.sotw_room())
    names = await _screen(screen, request.resource_names)
    state.note_reported(session.screened(screen))
    session.count(
        state.on_request(
            version_info=request.version_info,
            resource_names=names,
            response_nonce=request.response_nonce,
            error=_error(request),
        )
    )


class _SotwSession(_Base):
    def __init__(
        self,
        type_url: str,
        stats: XdsCounters,
        log: logging.Logger,
        known: Callable[[], Collection[str]],
    ) -> None:
        super().__init__(type_url, stats, log, "sotw", known)
        self.state = protocol.SotwState()

    async def on_request(self, request: SotwRequest) -> None:
        await _fold_sotw(self, self.state, request)

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
    def __init__(
        self,
        type_url: str,
        stats: XdsCounters,
        log: logging.Logger,
        known: Callable[[], Collection[str]],
    ) -> None:
        super().__init__(type_url, stats, log, "delta", known)
        self.state = protocol.DeltaState()

    async def on_request(self, request: DeltaRequest) -> None:
        if not self.accept(request.type_url, request.node.id):
            return
        state, known = self.state, set(self.known())
        screen = protocol.NameScreen(known, protocol.delta_room(state, known))
        subscribe = await _screen(screen, request.resource_names_subscribe)
        initial: dict[str, str] = {}
        if not state.started:  # initial_resource_versions only count on the first request
            versions = request.initial_resource_versions
            declared = protocol.NameScreen(known | screen.names.keys(), screen.room)
            initial = {n: versions[n] for n in await _screen_keys(declared, iter(versions))}
            self.state.note_reported(self.screened(declared))
        self.state.note_reported(self.screened(screen))
        # Unsubscribing a name this stream does not hold changes nothing: skip those.
        held = state.subscription.names | state.known.keys() | screen.names.keys()
        unsubscribe = await _screen(
            protocol.NameScreen(held, 0), request.resource_names_unsubscribe
        )
        self.count(
            state.on_request(
                subscribe=subscribe,
                unsubscribe=unsubscribe,
                initial_versions=initial,
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


class _RuntimeSession(_Base):
    """One RTDS stream: the layer is ``layer_of(snapshot)``, worked out at each plan."""

    def __init__(
        self, stats: XdsCounters, log: logging.Logger, layer_of: Callable[[HealthSnapshot], Layer]
    ) -> None:
        super().__init__(RUNTIME_TYPE_URL, stats, log, "rtds", lambda: (LAYER_NAME,))
        self.unknown_kind = KIND_UNKNOWN_LAYERS
        self.state = LayerState()
        self.layer_of = layer_of

    async def on_request(self, request: SotwRequest) -> None:
        await _fold_sotw(self, self.state, request)

    def plan(self, snapshot: HealthSnapshot) -> SotwResponse | None:
        plan = self.state.plan(self.layer_of(snapshot))
        self.report(plan)
        return None if plan.push is None else self._response(plan.push)

    def _response(self, push: LayerPush) -> SotwResponse:
        self.log.debug("%s rtds push %s nonce %s", self.node, push.version, push.nonce)
        layer = struct_pb2.Struct()
        layer.update(push.layer)
        resource = any_pb2.Any()
        resource.Pack(rtds_pb2.Runtime(name=push.name, layer=layer))
        return SotwResponse(
            version_info=push.version,
            resources=[resource],
            type_url=self.type_url,
            nonce=push.nonce,
        )


async def sotw_stream(
    requests: AsyncIterator[SotwRequest],
    hub: SnapshotSource,
    *,
    type_url: str = TYPE_URL,
    stats: XdsCounters,
    coalesce_s: float = DEFAULT_COALESCE_S,
    log: logging.Logger = _LOG,
    nodes: OpenNodes | None = None,
) -> AsyncIterator[SotwResponse]:
    """Serve one state-of-the-world stream (``StreamAggregatedResources``/``StreamEndpoints``).
    Ends when the client closes its side; cancellation-safe. ``nodes``: where the stream's
    node id is registered while it is open."""
    session = _SotwSession(type_url, stats, log, lambda: hub.current().clusters)
    session.nodes = nodes
    async for response in _serve(requests, hub, session, stats, coalesce_s):
        yield response


async def delta_stream(
    requests: AsyncIterator[DeltaRequest],
    hub: SnapshotSource,
    *,
    type_url: str = TYPE_URL,
    stats: XdsCounters,
    coalesce_s: float = DEFAULT_COALESCE_S,
    log: logging.Logger = _LOG,
    nodes: OpenNodes | None = None,
) -> AsyncIterator[DeltaResponse]:
    """Serve one incremental stream (``DeltaAggregatedResources``/``DeltaEndpoints``)."""
    session = _DeltaSession(type_url, stats, log, lambda: hub.current().clusters)
    session.nodes = nodes
    async for response in _serve(requests, hub, session, stats, coalesce_s):
        yield response


async def runtime_stream(
    requests: AsyncIterator[SotwRequest],
    hub: SnapshotSource,
    layer_of: Callable[[HealthSnapshot], Layer],
    *,
    stats: XdsCounters,
    coalesce_s: float = DEFAULT_COALESCE_S,
    refresh_s: float = DEFAULT_LAYER_REFRESH_S,
    log: logging.Logger = _LOG,
) -> AsyncIterator[SotwResponse]:
    """Serve one RTDS stream (``StreamRuntime``). The layer is worked out again on every
    newer snapshot and at least every ``refresh_s`` (``layer_of`` may read settings that a
    reload changed without a new snapshot); it is sent only when it differs."""
    session = _RuntimeSession(stats, log, layer_of)
    async for response in _serve(requests, hub, session, stats, coalesce_s, refresh_s):
        yield response


Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def _serve(
    requests: AsyncIterator[Req],
    hub: SnapshotSource,
    session: _Session[Req, Resp],
    stats: XdsCounters,
    coalesce_s: float,
    refresh_s: float | None = None,
) -> AsyncIterator[Resp]:
    """The dispatcher: wake on a request or a newer snapshot (or after ``refresh_s``, if
    set), coalesce, plan, yield."""
    wake = asyncio.Event()
    reader = asyncio.create_task(_read(requests, session, wake))
    watcher = asyncio.create_task(_watch(hub, wake))
    stats.streams_open += 1
    stats.streams_total += 1
    try:
        while not reader.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), refresh_s)
            await asyncio.sleep(coalesce_s)
            wake.clear()
            response = session.plan(hub.current())
            if response is not None:
                yield response
        reader.result()  # re-raise a broken request stream
    finally:
        stats.streams_open -= 1
        session.release()
        await _cancel(reader, watcher)


async def _read(
    requests: AsyncIterator[Req], session: _Session[Req, Resp], wake: asyncio.Event
) -> None:
    try:
        async for request in requests:
            await session.on_request(request)
            wake.set()
    finally:
        wake.set()  # let the dispatcher see the end of the request stream


async def _watch(hub: SnapshotSource, wake: asyncio.Event) -> None:
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
