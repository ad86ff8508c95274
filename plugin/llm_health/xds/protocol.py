"""Per-stream xDS rules for EDS, state-of-the-world (SotW) and delta. Pure: no gRPC, no I/O.

References are to the xDS REST and gRPC protocol spec (envoy ``api-docs/xds_protocol``):
- "ACK/NACK": a NACK is a request with ``error_detail`` set; its ``version_info`` is the
  client's previous version, so versions never identify a NACK.
- "Resource updates": a SotW request with a stale nonce (a newer response was sent since)
  must not be answered; the client re-requests with the newer nonce anyway.
- "Incremental xDS": a delta request's subscription changes are honoured even when its
  nonce is stale; the nonce only pairs an ACK/NACK with a response.
- "How the client specifies what resources to return": legacy wildcard = no names on the
  first request(s); ``"*"`` is an explicit wildcard; newly requested names must be sent
  even if unchanged.
- "Deleting Resources": only delta can delete (``removed_resources``); SotW EDS cannot.

A NACKed version is remembered and never resent until the state changes (the
go-control-plane weak spot). Versions are opaque strings compared for equality;
nonces are a per-stream counter. Each state object belongs to one stream (one task).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from llm_health.model.board import ClusterSnapshot, HealthSnapshot

WILDCARD = "*"
MAX_PENDING_RESPONSES = 64
"""Delta responses remembered for ACK/NACK pairing (Envoy answers each one at once)."""
MAX_UNKNOWN_NAMES = 1000
"""Requested names the snapshot does not have, kept per stream and type (so a cluster a
reload adds later is still sent to an Envoy that asked for it). Further unknown names are
ignored and only counted: a request naming 300,000 clusters costs no state."""


class RequestKind(enum.Enum):
    """What one request means to the stream (see ``classify``)."""

    INITIAL = "initial"  # the first request of this type on the stream
    UPDATE = "update"  # no nonce to answer: a spontaneous subscription change
    ACK = "ack"  # answers a live response, no error_detail
    NACK = "nack"  # answers a live response, error_detail set
    STALE = "stale"  # answers a response that a newer one has superseded (or no response)


def classify(
    *,
    first: bool,
    response_nonce: str,
    has_error: bool,
    latest_nonce: str,
    awaiting: Collection[str],
) -> RequestKind:
    """Classify a request by nonce and ``error_detail`` presence, never by version.

    ``awaiting``: nonces of responses not yet ACKed/NACKed (SotW: at most the latest;
    delta: every unanswered one). ``latest_nonce``: the last nonce sent, "" if none.
    A nonce that is neither awaited nor the latest is STALE, garbage included; but while
    nothing was sent no nonce can be stale (spec: "a nonce becomes stale following a newer
    nonce being presented"), so a client with a bogus nonce still gets its first answer.
    """
    if first:
        return RequestKind.INITIAL
    if not response_nonce:
        return RequestKind.UPDATE
    if response_nonce in awaiting:
        return RequestKind.NACK if has_error else RequestKind.ACK
    if response_nonce == latest_nonce or not latest_nonce:
        return RequestKind.UPDATE
    return RequestKind.STALE


@dataclass(frozen=True, slots=True)
class Subscription:
    """Resource names a stream asked for. ``explicit``: names were given at least once, so
    an empty list no longer means "legacy wildcard" but "nothing"."""

    names: frozenset[str] = frozenset()
    wildcard: bool = False
    explicit: bool = False


def sotw_subscription(previous: Subscription, resource_names: Sequence[str]) -> Subscription:
    """A SotW request carries the full list (spec: "Unsubscribing From Resources")."""
    names = frozenset(resource_names)
    explicit = previous.explicit or bool(names)
    wildcard = WILDCARD in names or not explicit
    return Subscription(names - {WILDCARD}, wildcard, explicit)


def delta_subscription(
    previous: Subscription, *, first: bool, subscribe: Sequence[str], unsubscribe: Sequence[str]
) -> Subscription:
    """Apply ``resource_names_(un)subscribe``. Legacy wildcard: a first request with both
    lists empty; it then continues as an explicit ``"*"`` (spec example, incremental)."""
    added, dropped = frozenset(subscribe), frozenset(unsubscribe)
    legacy = first and not added and not dropped
    wildcard = (previous.wildcard or legacy or WILDCARD in added) and WILDCARD not in dropped
    names = (previous.names | added) - dropped - {WILDCARD}
    return Subscription(names, wildcard, previous.explicit or bool(added or dropped))


@dataclass(frozen=True, slots=True)
class Selection:
    """Which requested clusters can be sent now. ``ready``: known and warm (sorted by name);
    ``cold``: known but not warm yet (held, docs/design.md §7); ``missing``: not in the snapshot."""

    ready: tuple[ClusterSnapshot, ...]
    cold: tuple[str, ...]
    missing: tuple[str, ...]


def select(interest: Iterable[str], snapshot: HealthSnapshot) -> Selection:
    ready: list[ClusterSnapshot] = []
    cold: list[str] = []
    missing: list[str] = []
    for name in sorted(set(interest)):
        cluster = snapshot.clusters.get(name)
        if cluster is None:
            missing.append(name)
        elif cluster.warm:
            ready.append(cluster)
        else:
            cold.append(name)
    return Selection(tuple(ready), tuple(cold), tuple(missing))


def interest(subscription: Subscription, available: Iterable[str]) -> frozenset[str]:
    """The names a subscription covers: its names, plus everything ``available`` if
    wildcard. (EDS clients normally name clusters; wildcard is accepted for completeness.)"""
    if subscription.wildcard:
        return subscription.names | frozenset(available)
    return subscription.names


def set_version(versions: Mapping[str, str]) -> str:
    """An opaque version for a set of resources: hash of sorted ``name:version``. Equal
    sets give equal versions across streams and plugin restarts (content hashes)."""
    digest = hashlib.sha256()
    for name in sorted(versions):
        digest.update(f"{name}:{versions[name]};".encode())
    return digest.hexdigest()[:16]


def sotw_needs_push(version: str, *, client: str, sent: str, nacked: str) -> bool:
    """Push unless the client has ``version`` (ACKed, or announced on reconnect: spec
    "ACK/NACK and resource type instance version"), it is in flight, or it was NACKed."""
    return version not in (client, sent, nacked)


def new_unknown(missing: Iterable[str], reported: set[str]) -> tuple[str, ...]:
    """Names in ``missing`` not reported before; marks them reported (log once per stream).
    ``reported`` is bounded: past ``2 * MAX_UNKNOWN_NAMES`` it starts over."""
    fresh = tuple(name for name in missing if name not in reported)
    if len(reported) + len(fresh) > 2 * MAX_UNKNOWN_NAMES:
        reported.clear()
    reported.update(fresh)
    return fresh


class NameScreen:
    """Bounds what one request adds to a stream's state: names in ``known`` (the current
    snapshot's clusters, plus ``"*"``) are always kept, at most ``room`` others are kept,
    the rest are dropped. ``unknown`` counts the names not in ``known`` (kept or dropped),
    ``samples`` holds the first few of them (for the log), ``kept_unknown`` the kept ones.

    Fed in chunks (``feed``) so a huge request can be screened between other work; every
    name is looked at once, and nothing is kept per dropped name.
    """

    __slots__ = (
        "_max_samples",
        "dropped",
        "kept_unknown",
        "known",
        "names",
        "room",
        "samples",
        "unknown",
    )

    def __init__(self, known: Container[str], room: int, *, samples: int = 3) -> None:
        self.known = known
        self.room = max(room, 0)
        self.names: dict[str, None] = {}  # kept, in request order, each once
        self.kept_unknown: list[str] = []
        self.unknown = 0
        self.dropped = 0
        self.samples: list[str] = []
        self._max_samples = samples

    @property
    def kept(self) -> list[str]:
        return list(self.names)

    def feed(self, names: Iterable[str]) -> None:
        known, kept = self.known, self.names
        for name in names:
            if name in kept:
                continue
            if name in known or name == WILDCARD:
                kept[name] = None
                continue
            self.unknown += 1
            if len(self.samples) < self._max_samples:
                self.samples.append(name)
            if self.room > 0:
                self.room -= 1
                kept[name] = None
                self.kept_unknown.append(name)
            else:
                self.dropped += 1


def sotw_room() -> int:
    """Unknown names a SotW request may keep: its list replaces the subscription."""
    return MAX_UNKNOWN_NAMES


def delta_room(state: DeltaState, known: Container[str]) -> int:
    """Unknown names a delta request may still add: subscriptions accumulate, so the
    unknown names already kept (subscribed or declared in ``initial_resource_versions``)
    use up the room."""
    kept = state.subscription.names | state.known.keys()
    return MAX_UNKNOWN_NAMES - sum(1 for name in kept if name not in known)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request meant. For a NACK: ``error`` is Envoy's ``error_detail.message``
    and ``rejected`` names what was refused (SotW: the version; delta: name@version)."""

    kind: RequestKind
    error: str = ""
    rejected: str = ""


PushT = TypeVar("PushT", covariant=True)


@dataclass(frozen=True, slots=True)
class Plan(Generic[PushT]):
    """``plan()`` result: an optional push, plus requested names the snapshot does not
    have that were not reported before on this stream (to be logged once)."""

    push: PushT | None
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SotwPush:
    """One SotW response: every requested, known, warm cluster (the full set)."""

    nonce: str
    version: str
    clusters: tuple[ClusterSnapshot, ...]


class SotwTracker:
    """What one SotW stream of any type URL keeps: the subscription, nonces and versions
    (which request answers which response, what the client has, what it refused). The
    type's own ``plan`` builds what to send and calls ``record`` when it sends it."""

    def __init__(self) -> None:
        self.subscription = Subscription()
        self.started = False
        self.last_nonce = ""
        self.answered = True
        self.client_version = ""
        self.sent_version = ""
        self.nacked_version = ""
        self._counter = 0
        self._reported: set[str] = set()

    def on_request(
        self,
        *,
        version_info: str,
        resource_names: Sequence[str],
        response_nonce: str,
        error: str | None,
    ) -> RequestOutcome:
        """Fold one request in. ``error``: None when ``error_detail`` is absent, else its
        message. A stale request changes nothing (spec "Resource updates")."""
        kind = classify(
            first=not self.started,
            response_nonce=response_nonce,
            has_error=error is not None,
            latest_nonce=self.last_nonce,
            awaiting=() if self.answered else (self.last_nonce,),
        )
        if kind is RequestKind.STALE:
            return RequestOutcome(kind)
        self.started = True
        self.answered = self.answered or kind in (RequestKind.ACK, RequestKind.NACK)
        self.client_version = version_info  # ACK: the new one; NACK: the one still in use
        self.subscription = sotw_subscription(self.subscription, resource_names)
        if kind is not RequestKind.NACK:
            return RequestOutcome(kind)
        self.nacked_version = self.sent_version
        return RequestOutcome(kind, error or "", f"version {self.sent_version}")

    def note_reported(self, names: Iterable[str]) -> None:
        """``names`` were reported unknown already (when the request was screened)."""
        new_unknown(names, self._reported)

    def unreported(self, missing: Iterable[str]) -> tuple[str, ...]:
        """The names of ``missing`` not reported before on this stream (now reported)."""
        return new_unknown(missing, self._reported)

    def needs(self, version: str) -> bool:
        return sotw_needs_push(
            version, client=self.client_version, sent=self.sent_version, nacked=self.nacked_version
        )

    def record(self, version: str) -> str:
        """``version`` is being sent: its nonce."""
        self._counter += 1
        self.last_nonce, self.sent_version, self.answered = str(self._counter), version, False
        return self.last_nonce


class SotwState(SotwTracker):
    """State of one SotW EDS stream.

    Every push carries all requested, known, warm clusters: EDS may send only changed
    resources ("Grouping Resources into Responses"), but the full set makes ``version_info``
    mean "exactly these clusters at these versions", which keeps reconnects and NACKs simple
    (a changed name set is a changed version, so newly requested names are always sent).
    """

    def plan(self, snapshot: HealthSnapshot) -> Plan[SotwPush]:
        """The response to send now, if any; records it as sent."""
        if not self.started:
            return Plan(None)
        selection = select(interest(self.subscription, snapshot.clusters), snapshot)
        unknown = self.unreported(selection.missing)
        version = set_version({c.name: c.envoy_version for c in selection.ready})
        if not selection.ready or not self.needs(version):
            return Plan(None, unknown)
        return Plan(SotwPush(self.record(version), version, selection.ready), unknown)


@dataclass(frozen=True, slots=True)
class DeltaPush:
    """One delta response: changed clusters and names to remove."""

    nonce: str
    system_version: str
    clusters: tuple[ClusterSnapshot, ...]
    removed: tuple[str, ...]


_Change = tuple[str | None, str | None]  # (version sent or None = removed, version before)


class DeltaState:
    """State of one delta stream for one type URL: per-resource versions the client has.

    ``known`` is what the client has, or will have once it applies what was sent (updated
    on send, rolled back on NACK). ``nacked`` holds versions the client refused: not
    resent until the resource changes.
    """

    def __init__(self) -> None:
        self.subscription = Subscription()
        self.started = False
        self.last_nonce = ""
        self.known: dict[str, str] = {}
        self.nacked: dict[str, str] = {}
        self.pending: dict[str, dict[str, _Change]] = {}
        self._counter = 0
        self._reported: set[str] = set()

    def on_request(
        self,
        *,
        subscribe: Sequence[str],
        unsubscribe: Sequence[str],
        initial_versions: Mapping[str, str],
        response_nonce: str,
        error: str | None,
    ) -> RequestOutcome:
        """Fold one request in. Subscription changes apply whatever the nonce says (spec
        "Incremental xDS"); the nonce only pairs an ACK/NACK with its response."""
        first = not self.started
        kind = classify(
            first=first,
            response_nonce=response_nonce,
            has_error=error is not None,
            latest_nonce=self.last_nonce,
            awaiting=self.pending,
        )
        self.started = True
        self._subscribe(first, subscribe, unsubscribe, initial_versions)
        if kind is RequestKind.ACK:
            self._ack(self.pending.pop(response_nonce))
        if kind is not RequestKind.NACK:
            return RequestOutcome(kind)
        rejected = self._nack(self.pending.pop(response_nonce))
        text = ", ".join(f"{name}@{version}" for name, version in sorted(rejected.items()))
        return RequestOutcome(kind, error or "", text)

    def _subscribe(
        self,
        first: bool,
        subscribe: Sequence[str],
        unsubscribe: Sequence[str],
        initial_versions: Mapping[str, str],
    ) -> None:
        """Spec "Subscribing to Resources": a (re)subscribed name must be sent even if the
        server thinks the client has it, except what ``initial_resource_versions`` declares
        on a reconnect ("Incremental xDS")."""
        self.subscription = delta_subscription(
            self.subscription, first=first, subscribe=subscribe, unsubscribe=unsubscribe
        )
        if first:
            self.known.update(initial_versions)
        for name in (*unsubscribe, *([] if first else subscribe)):
            self.known.pop(name, None)
            self.nacked.pop(name, None)

    def _ack(self, changes: Mapping[str, _Change]) -> None:
        for name in changes:
            self.nacked.pop(name, None)

    def _nack(self, changes: Mapping[str, _Change]) -> dict[str, str]:
        """Roll ``known`` back where nothing newer was sent since; remember the rejects."""
        rejected = {name: sent for name, (sent, _) in changes.items() if sent is not None}
        for name, (sent, before) in changes.items():
            if self.known.get(name) == sent:
                _restore(self.known, name, before)
        self.nacked.update(rejected)
        return rejected

    def note_reported(self, names: Iterable[str]) -> None:
        """``names`` were reported unknown already (when the request was screened)."""
        new_unknown(names, self._reported)

    def plan(self, snapshot: HealthSnapshot) -> Plan[DeltaPush]:
        """Changed clusters and removals to send now, if any; records them as sent."""
        if not self.started:
            return Plan(None)
        names = interest(self.subscription, (*snapshot.clusters, *self.known))
        selection = select(names, snapshot)
        removed = tuple(n for n in selection.missing if n in self.known)
        unknown = new_unknown((n for n in selection.missing if n not in removed), self._reported)
        changed = tuple(c for c in selection.ready if self._outdated(c))
        if not changed and not removed:
            return Plan(None, unknown)
        return Plan(self._record(changed, removed), unknown)

    def _outdated(self, cluster: ClusterSnapshot) -> bool:
        version = cluster.envoy_version
        return version not in (self.known.get(cluster.name), self.nacked.get(cluster.name))

    def _record(self, changed: tuple[ClusterSnapshot, ...], removed: tuple[str, ...]) -> DeltaPush:
        self._counter += 1
        nonce = self.last_nonce = str(self._counter)
        changes: dict[str, _Change] = {}
        for cluster in changed:
            changes[cluster.name] = (cluster.envoy_version, self.known.get(cluster.name))
            self.known[cluster.name] = cluster.envoy_version
        for name in removed:
            changes[name] = (None, self.known.pop(name))
        self.pending[nonce] = changes
        while len(self.pending) > MAX_PENDING_RESPONSES:
            del self.pending[next(iter(self.pending))]
        return DeltaPush(nonce, set_version(self.known), changed, removed)


def _restore(versions: dict[str, str], name: str, before: str | None) -> None:
    if before is None:
        versions.pop(name, None)
    else:
        versions[name] = before
