"""The board: every endpoint's health, folded from probe results, published as snapshots.

Single-owner and synchronous: one task (the app's prober loop) calls ``record``/``drain``;
readers only ever see immutable ``HealthSnapshot`` objects. ``snapshot()`` is cheap when
nothing changed (cached).

Versions: each cluster's ``envoy_version`` is a content hash of exactly what Envoy would
receive for it (addresses, health, weights, labels). It changes when and only when the
Envoy-visible view changes, so xDS pushes happen only on change and a NACKed version is
recognisable when it comes round again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from llm_health.model.envoy_view import EnvoyView, envoy_view
from llm_health.model.machine import Transition, drain, initial_health, step, undrain
from llm_health.model.outcome import ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A configured endpoint: ``address`` is "host:port" as written in the config."""

    address: str
    host: str
    port: int
    weight: int = 100


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A configured cluster (``name`` is the Envoy cluster / EDS resource name)."""

    name: str
    policy: Policy
    endpoints: tuple[EndpointSpec, ...]


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One endpoint as readers see it. ``since`` is wall-clock seconds (epoch)."""

    cluster: str
    spec: EndpointSpec
    state: State
    reason: str
    since: float
    view: EnvoyView
    last: ProbeResult | None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """``warm``: every endpoint has had a probe since boot (or the warm-up timed out):
    only warm clusters may be pushed to Envoy (DESIGN §7)."""

    name: str
    endpoints: tuple[EndpointSnapshot, ...]
    warm: bool
    envoy_version: str


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """Immutable view of the whole board. ``revision`` grows on every change of any kind."""

    revision: int
    clusters: Mapping[str, ClusterSnapshot]


@dataclass(slots=True)
class _Entry:
    spec: EndpointSpec
    health: EndpointHealth
    last: ProbeResult | None = None


@dataclass(slots=True)
class _Cluster:
    spec: ClusterSpec
    entries: dict[str, _Entry] = field(default_factory=dict)
    warm: bool = False


class Board:
    """Mutable owner of all endpoint health. Not thread-safe; one owning task.

    ``wall_offset``: add to the monotonic ``now`` the caller passes to get epoch seconds
    (the machine runs on a monotonic clock so a wall-clock jump cannot expire a grace).
    """

    def __init__(self, clusters: Iterable[ClusterSpec], now: float, wall_offset: float) -> None:
        self._wall_offset = wall_offset
        self._clusters: dict[str, _Cluster] = {}
        self._revision = 0
        self._cached: HealthSnapshot | None = None
        for spec in clusters:
            self._clusters[spec.name] = _new_cluster(spec, now, known_at_boot=True)

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(self._clusters)

    def policy(self, cluster: str) -> Policy:
        return self._clusters[cluster].spec.policy

    def record(self, cluster: str, address: str, result: ProbeResult, now: float) -> Transition:
        """Fold one probe result in. Raises KeyError for an unknown cluster/endpoint."""
        entry_cluster = self._clusters[cluster]
        entry = entry_cluster.entries[address]
        transition = step(entry.health, result, now, entry_cluster.spec.policy)
        entry.health = transition.health
        entry.last = result
        if not entry_cluster.warm and all(e.last for e in entry_cluster.entries.values()):
            entry_cluster.warm = True
        self._touch()
        return transition

    def drain(self, cluster: str, address: str, now: float, reason: str) -> Transition:
        entry = self._clusters[cluster].entries[address]
        transition = drain(entry.health, now, reason)
        entry.health = transition.health
        self._touch()
        return transition

    def undrain(self, cluster: str, address: str, now: float) -> Transition:
        entry_cluster = self._clusters[cluster]
        entry = entry_cluster.entries[address]
        transition = undrain(entry.health, now, entry_cluster.spec.policy)
        entry.health = transition.health
        self._touch()
        return transition

    def mark_warm(self, cluster: str | None = None) -> None:
        """Declare clusters warm (warm_start_timeout passed). None: all of them."""
        for name, entry_cluster in self._clusters.items():
            if cluster in (None, name) and not entry_cluster.warm:
                entry_cluster.warm = True
                self._touch()

    def is_warm(self, cluster: str) -> bool:
        return self._clusters[cluster].warm

    def health(self, cluster: str, address: str) -> EndpointHealth:
        return self._clusters[cluster].entries[address].health

    def snapshot(self) -> HealthSnapshot:
        if self._cached is None:
            clusters = {name: self._cluster_snapshot(name, c) for name, c in self._clusters.items()}
            self._cached = HealthSnapshot(self._revision, MappingProxyType(clusters))
        return self._cached

    def replace_policy(self, cluster: str, policy: Policy) -> None:
        entry_cluster = self._clusters[cluster]
        entry_cluster.spec = replace(entry_cluster.spec, policy=policy)
        self._touch()

    def _touch(self) -> None:
        self._revision += 1
        self._cached = None

    def _cluster_snapshot(self, name: str, cluster: _Cluster) -> ClusterSnapshot:
        share = cluster.spec.policy.degraded_weight
        endpoints = tuple(
            EndpointSnapshot(
                cluster=name,
                spec=e.spec,
                state=e.health.state,
                reason=e.health.reason,
                since=e.health.since + self._wall_offset,
                view=envoy_view(e.health.state, e.spec.weight, share),
                last=e.last,
            )
            for e in cluster.entries.values()
        )
        return ClusterSnapshot(name, endpoints, cluster.warm, _envoy_version(endpoints))


def _new_cluster(spec: ClusterSpec, now: float, *, known_at_boot: bool) -> _Cluster:
    cluster = _Cluster(spec)
    for endpoint in spec.endpoints:
        health = initial_health(now, spec.policy, known_at_boot=known_at_boot)
        cluster.entries[endpoint.address] = _Entry(endpoint, health)
    return cluster


def _envoy_version(endpoints: tuple[EndpointSnapshot, ...]) -> str:
    """Content hash of the Envoy-visible fields only (reasons and timings excluded)."""
    digest = hashlib.sha256()
    for e in endpoints:
        v = e.view
        digest.update(
            f"{e.spec.host}|{e.spec.port}|{v.health.value}|{v.weight}|{v.lb_label};".encode()
        )
    return digest.hexdigest()[:16]
