"""Immutable ``HealthSnapshot``s built incrementally from what changed on the board.

The board (``model/board.py``) holds the domain and says what it touched
(``SnapshotBuilder.touch``); this builder keeps the derived views apart from it, as
go-control-plane keeps its snapshot cache apart from the resources it caches. A snapshot is
cheap when nothing changed (the last one is returned), and after a change only what changed
is rebuilt: the snapshots of the endpoints touched since the last one, and the clusters
holding them; a cluster's ``envoy_version`` is re-hashed only when one of those endpoints
changed what Envoy sees (at thousands of endpoints a whole rebuild per probe result was
the prober's largest cost: docs/design.md §16).

Single-owner and synchronous, like the board that owns it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from llm_health.model.snapshot import ClusterSnapshot, EndpointSnapshot, HealthSnapshot

Render = Callable[[str, str], EndpointSnapshot]
"""Makes the snapshot of one endpoint (cluster name, address) from the board as it is."""


class ClusterState(Protocol):
    """What the builder reads of one of the board's clusters: its warmth, and its
    endpoints' addresses in order (the values are the board's own, never read here)."""

    @property
    def warm(self) -> bool: ...

    @property
    def entries(self) -> Mapping[str, object]: ...


class SnapshotBuilder:
    """Caches the last snapshot and its per-cluster, per-endpoint parts.

    ``touch`` after every change of the board; ``snapshot`` to read. ``revision`` grows on
    every touch.
    """

    def __init__(self) -> None:
        self._revision = 0
        self._cached: HealthSnapshot | None = None
        self._dirty = _Dirty()
        self._clusters: dict[str, ClusterSnapshot] = {}
        self._endpoints: dict[str, dict[str, EndpointSnapshot]] = {}
        self._keys: dict[str, dict[str, str]] = {}  # Envoy-visible content per endpoint

    def touch(self, cluster: str | None = None, address: str | None = None) -> None:
        """Something changed: the next ``snapshot`` rebuilds ``address`` of ``cluster``
        (both None: everything, as from scratch; address None: the whole cluster)."""
        self._revision += 1
        self._cached = None
        self._dirty.mark(cluster, address)

    def snapshot(self, clusters: Mapping[str, ClusterState], render: Render) -> HealthSnapshot:
        """The snapshot of ``clusters`` as they are; ``render`` is called only for the
        endpoints touched since the last snapshot (or all of a cluster rebuilt whole)."""
        if self._cached is None:
            self._cached = HealthSnapshot(self._revision, self._rebuild(clusters, render))
        return self._cached

    def _rebuild(
        self, clusters: Mapping[str, ClusterState], render: Render
    ) -> Mapping[str, ClusterSnapshot]:
        dirty, self._dirty = self._dirty, _Dirty()
        if dirty.everything:
            self._clusters.clear()
            self._endpoints.clear()
            self._keys.clear()
        for name in list(self._clusters):
            if name not in clusters:
                del self._clusters[name]
                self._endpoints.pop(name, None)
                self._keys.pop(name, None)
        for name, cluster in clusters.items():
            if name in self._clusters and name not in dirty.clusters:
                continue
            addresses = dirty.clusters.get(name)
            if addresses is None:  # the whole cluster, or never built
                self._endpoints.pop(name, None)
            self._clusters[name] = self._cluster(name, cluster, addresses or set(), render)
        return MappingProxyType(dict(self._clusters))

    def _cluster(
        self, name: str, cluster: ClusterState, changed: set[str], render: Render
    ) -> ClusterSnapshot:
        """``changed``: the addresses touched since this cluster's cached snapshot; the
        other endpoints' snapshots (and Envoy keys) are reused as they are."""
        previous = self._clusters.get(name)
        cache = self._endpoints.get(name)
        keys = self._keys.get(name)
        entries = cluster.entries
        if (
            previous is None
            or cache is None
            or keys is None
            or len(cache) != len(entries)
            or any(a not in cache or a not in entries for a in changed)
        ):
            fresh = {a: render(name, a) for a in entries}
            fresh_keys = {a: _envoy_key(e) for a, e in fresh.items()}
            rehash = True
        else:
            fresh, fresh_keys, rehash = dict(cache), keys, False
            for address in changed:
                new = fresh[address] = render(name, address)
                key = _envoy_key(new)
                if key != fresh_keys[address]:
                    if not rehash:  # copy on write: the previous keys stay the previous'
                        fresh_keys, rehash = dict(fresh_keys), True
                    fresh_keys[address] = key
        self._endpoints[name], self._keys[name] = fresh, fresh_keys
        endpoints = tuple(fresh.values())
        if rehash or previous is None:
            version = hashlib.sha256("".join(fresh_keys.values()).encode()).hexdigest()[:16]
        else:
            version = previous.envoy_version
        return ClusterSnapshot(name, endpoints, cluster.warm, version)


def _envoy_key(e: EndpointSnapshot) -> str:
    """The Envoy-visible fields of one endpoint (reasons and timings excluded); a
    cluster's ``envoy_version`` is a hash of its endpoints' keys in order."""
    v = e.view
    return f"{e.spec.host}|{e.spec.port}|{v.health.value}|{v.weight}|{v.lb_label};"


@dataclass(slots=True)
class _Dirty:
    """What changed since the last snapshot: ``everything``, or per cluster the addresses
    touched (None: the whole cluster)."""

    everything: bool = False
    clusters: dict[str, set[str] | None] = field(default_factory=dict)

    def mark(self, cluster: str | None, address: str | None) -> None:
        if cluster is None:
            self.everything = True
        elif address is None:
            self.clusters[cluster] = None
        else:
            touched = self.clusters.setdefault(cluster, set())
            if touched is not None:
                touched.add(address)
