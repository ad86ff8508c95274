"""The connected Envoys, what each is told to check, and what they reported.

``Fleet`` is the HDS decision state behind every stream: nodes (by Envoy node id) with
their open streams and capabilities, the endpoints to check, the rendezvous assignment,
and the ``Ledger`` of reports. The assignment is recomputed only when the set of usable
nodes or the set of endpoints changes; ``generation`` grows exactly then, so streams
re-send a specifier only when their node's plan really changed (Envoy rebuilds its HDS
clusters on every new specifier that differs from the last one).

A node is *usable* while it has an open stream, can run the configured check (its
``Capability``), and has said something within ``report_ttl`` (a connected Envoy that
went silent is not checking anything). Several streams of one node id (a reconnect that
overlaps the old stream) share one node: it goes away with its last stream.

Pure and synchronous (no I/O, no protobuf); one owner; monotonic seconds passed in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llm_health.hds.assign import Assignment, assign
from llm_health.hds.ledger import Ledger, Reporter, Said
from llm_health.hds.settings import HdsConfig
from llm_health.model.states import EndpointKey

Target = tuple[str, int]
"""Where an endpoint is checked: (IP literal, port)."""


@dataclass(frozen=True, slots=True)
class ReportEntry:
    """One endpoint in a report. ``cluster``: the plugin cluster it was reported under, or
    None for the flat (cluster-less) form, which matches the address in every cluster."""

    cluster: str | None
    host: str
    port: int
    said: Said


@dataclass(slots=True)
class ReportTally:
    """What became of the entries of one report (and of every report, summed)."""

    counted: int = 0
    unknown_endpoint: int = 0
    unassigned: int = 0
    first_check: int = 0
    no_verdict: int = 0

    def add(self, other: ReportTally) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What one Envoy checks: per cluster (sorted), its targets (sorted)."""

    clusters: tuple[tuple[str, tuple[Target, ...]], ...] = ()

    @property
    def endpoint_count(self) -> int:
        return sum(len(targets) for _, targets in self.clusters)


@dataclass(slots=True)
class NodeInfo:
    """One Envoy node. ``last_seen``: monotonic time of its latest message."""

    node_id: str
    streams: set[int] = field(default_factory=set)
    protocols: frozenset[str] = frozenset()
    last_seen: float = 0.0
    stale: bool = False
    reports: int = 0


class Fleet:
    """Mutable HDS state. Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        settings: HdsConfig,
        endpoints: Mapping[EndpointKey, Target] | None = None,
        now: float = 0.0,
    ) -> None:
        self.settings = settings
        self.ledger = Ledger(
            quorum=settings.quorum,
            ttl_s=settings.report_ttl,
            grace_s=settings.first_check_grace_s,
        )
        self.generation = 0
        self._nodes: dict[str, NodeInfo] = {}
        self._stream_node: dict[int, str] = {}
        self._given: dict[EndpointKey, Target] | None = None
        self._endpoints: dict[EndpointKey, Target] = {}
        self._by_target: dict[Target, list[EndpointKey]] = {}
        self.set_endpoints(endpoints or {}, now)

    # --- membership -----------------------------------------------------------------

    def open_stream(self, stream: int, node_id: str, protocols: Iterable[str], now: float) -> None:
        """A stream identified itself (its HealthCheckRequest). A second request on the
        same stream may update the capability; it cannot change the node id."""
        known = self._stream_node.get(stream)
        node = self._nodes.setdefault(known or node_id, NodeInfo(known or node_id))
        node.streams.add(stream)
        node.protocols = frozenset(protocols)
        self._stream_node[stream] = node.node_id
        self._seen(node, now)
        self._reassign(now)

    def close_stream(self, stream: int, now: float) -> None:
        node_id = self._stream_node.pop(stream, None)
        if node_id is None:
            return
        node = self._nodes[node_id]
        node.streams.discard(stream)
        if not node.streams:
            del self._nodes[node_id]
        self._reassign(now)

    def node_of(self, stream: int) -> str | None:
        return self._stream_node.get(stream)

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(self._nodes[n] for n in sorted(self._nodes))

    def set_endpoints(self, endpoints: Mapping[EndpointKey, Target], now: float) -> bool:
        """The endpoints to check (from the board). True when the set changed. Called on
        every published snapshot: an unchanged mapping returns before any parsing."""
        if endpoints == self._given:
            return False
        self._given = dict(endpoints)
        wanted = {key: (_canonical(host), port) for key, (host, port) in endpoints.items()}
        if wanted == self._endpoints:
            return False
        self._endpoints = wanted
        self._by_target = {}
        for key in sorted(wanted):
            self._by_target.setdefault(wanted[key], []).append(key)
        self._reassign(now)
        return True

    def tick(self, now: float) -> None:
        """Expire old reports; nodes silent for the TTL stop (and resume) being used."""
        self.ledger.expire(now)
        changed = False
        for node in self._nodes.values():
            stale = now - node.last_seen > self.settings.report_ttl
            changed |= stale != node.stale
            node.stale = stale
        if changed:
            self._reassign(now)

    # --- reports --------------------------------------------------------------------

    def report(self, stream: int, entries: Iterable[ReportEntry], now: float) -> ReportTally:
        """Fold one EndpointHealthResponse (already translated) from ``stream`` in."""
        tally = ReportTally()
        node_id = self._stream_node.get(stream)
        if node_id is None:
            return tally  # no HealthCheckRequest yet: nobody to attribute it to
        node = self._nodes[node_id]
        node.reports += 1
        self._seen(node, now)
        for entry in entries:
            self._count(tally, node_id, entry, now)
        return tally

    def touch(self, stream: int, now: float) -> None:
        """Any sign of life from ``stream`` (e.g. an empty report)."""
        node_id = self._stream_node.get(stream)
        if node_id is not None:
            self._seen(self._nodes[node_id], now)

    def _count(self, tally: ReportTally, node_id: str, entry: ReportEntry, now: float) -> None:
        keys = [
            key
            for key in self._by_target.get((_canonical(entry.host), entry.port), ())
            if entry.cluster is None or key[0] == entry.cluster
        ]
        if not keys:
            tally.unknown_endpoint += 1
            return
        for key in keys:
            outcome = self.ledger.record(node_id, key, entry.said, now)
            name = outcome.value
            setattr(tally, name, getattr(tally, name) + 1)

    # --- what to tell and what to conclude ------------------------------------------

    @property
    def assignment(self) -> Assignment:
        return self.ledger.assignment

    def usable(self, node: NodeInfo) -> bool:
        return not node.stale and self.settings.protocol in node.protocols

    def plan(self, node_id: str) -> NodePlan:
        clusters: dict[str, list[Target]] = {}
        for key in self.assignment.endpoints_of(node_id):
            clusters.setdefault(key[0], []).append(self._endpoints[key])
        return NodePlan(tuple((name, tuple(sorted(t))) for name, t in sorted(clusters.items())))

    def endpoints(self) -> tuple[EndpointKey, ...]:
        return tuple(sorted(self._endpoints))

    def decisions(self, now: float) -> dict[EndpointKey, str | None]:
        """Every endpoint's HDS verdict: the down reason, or None (reachable/unknown)."""
        return {key: self.ledger.decide(key, now) for key in self._endpoints}

    def reporters(self, key: EndpointKey, now: float) -> tuple[Reporter, ...]:
        return self.ledger.reporters(key, now)

    # --- internals ------------------------------------------------------------------

    def _seen(self, node: NodeInfo, now: float) -> None:
        node.last_seen = now
        if node.stale:
            node.stale = False
            self._reassign(now)

    def _reassign(self, now: float) -> None:
        usable = [n.node_id for n in self._nodes.values() if self.usable(n)]
        new = assign(self._endpoints, usable, self.settings.checkers_per_endpoint)
        if new != self.ledger.assignment:
            self.generation += 1
        self.ledger.reassign(new, self._nodes.keys(), now)


def _canonical(host: str) -> str:
    """One spelling per IP ("::0001" and "::1" are one host); other names lower-cased."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()
