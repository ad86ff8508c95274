"""The ``discovery`` component: one ``discovery.Watcher`` per cluster with ``discovery:``,
following reloads (docs/design.md §11).

A watcher's new set goes to the endpoint set (``EndpointSet``: the app's catalog, board +
prober); its faults and recoveries become notices (alerts ``discovery_failed`` /
``discovery_recovered``). After every change of the endpoint set or the config (the
endpoint set tells), the watchers are brought in line with the config in force: a
cluster whose ``discovery:`` changed gets a new watcher (its last found set stays until
the new one answers), a cluster that lost it forgets what DNS gave it (those endpoints
drain out).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llm_health.core.component import Job
from llm_health.core.control import BoardControl, Notice
from llm_health.core.families import counter, gauge
from llm_health.discovery.answers import DnsFault
from llm_health.discovery.lookup import DnsLookup
from llm_health.discovery.settings import DiscoveryConfig, DnsConfig
from llm_health.discovery.watcher import Watcher, WatchStats
from llm_health.model.board import EndpointSpec

# The config in force: ``dns:`` and every cluster's ``discovery:`` by cluster name.
Settings = Callable[[], tuple[DnsConfig, Mapping[str, DiscoveryConfig]]]
RESTART_AFTER_S = 5.0
log = logging.getLogger("llm_health")


class EndpointSet(Protocol):
    """What discovery needs of the endpoint set (the app's ``EndpointCatalog``,
    docs/design.md §11.4): the found sets it holds, hand a new one on, forget clusters
    that lost ``discovery:``, and hear of every change of the endpoint set."""

    @property
    def discovered(self) -> Mapping[str, tuple[EndpointSpec, ...]]: ...

    # The listener gets the new probe targets; discovery only needs to be woken.
    def on_targets(self, listener: Callable[[list[Any]], None]) -> None: ...

    async def set_discovered(self, cluster: str, endpoints: tuple[EndpointSpec, ...]) -> None: ...

    async def forget(self, clusters: set[str]) -> None: ...


class DiscoveryComponent:
    name = "discovery"

    def __init__(
        self,
        settings: Settings,
        catalog: EndpointSet,
        control: BoardControl,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._control = control
        self._wall_clock = wall_clock
        self._dns: DnsConfig | None = None
        self._lookup: DnsLookup | None = None
        self._watchers: dict[str, tuple[Watcher, asyncio.Task[None]]] = {}
        self._changed = asyncio.Event()
        catalog.on_targets(lambda _targets: self._changed.set())

    # --- Component protocol -------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """No gRPC service."""

    def tasks(self) -> list[Job]:
        return [self.run]

    def status(self) -> dict[str, Any]:
        now = self._wall_clock()
        clusters = {name: w.status(now) for name, (w, _task) in self._watchers.items()}
        return {
            "clusters_watched": len(clusters),
            "clusters_failing": sum(1 for c in clusters.values() if c["failing"]),
            "resolutions_total": sum(c["resolutions"] for c in clusters.values()),
            "failures_total": sum(c["failures"] for c in clusters.values()),
            "clusters": clusters,
        }

    def metrics(self) -> Iterator[Metric]:
        stats = {name: w.stats for name, (w, _task) in self._watchers.items()}
        yield gauge(
            "llm_health_discovery_clusters_watched",
            "Clusters whose endpoints DNS discovery finds.",
            len(stats),
        )
        yield gauge(
            "llm_health_discovery_clusters_failing",
            "Clusters whose DNS resolution fails now (last known endpoints kept).",
            sum(1 for s in stats.values() if s.failing_since is not None),
        )
        yield counter(
            "llm_health_discovery_resolutions_total",
            "Successful DNS resolutions, all clusters.",
            sum(s.resolutions for s in stats.values()),
        )
        yield counter(
            "llm_health_discovery_failures_total",
            "Failed DNS resolution attempts, all clusters.",
            sum(s.failures for s in stats.values()),
        )
        if stats:
            yield from _cluster_families(stats)

    # --- running ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await self._sync()
                await self._changed.wait()
                self._changed.clear()
        finally:
            for _watcher, task in self._watchers.values():
                task.cancel()

    async def _sync(self) -> None:
        dns, wanted = self._settings()
        if dns != self._dns:
            self._dns, self._lookup = dns, DnsLookup(dns)
            self._stop(set(self._watchers))  # new servers: every name asked again
        changed = {
            c
            for c, (w, task) in self._watchers.items()
            if wanted.get(c) != w.settings or task.done()
        }
        self._stop(changed)
        gone = {c for c in self._catalog.discovered if c not in wanted}
        for cluster, settings in wanted.items():
            if cluster not in self._watchers:
                self._start(cluster, settings)
        if gone:
            await self._catalog.forget(gone)

    def _start(self, cluster: str, settings: DiscoveryConfig) -> None:
        assert self._lookup is not None
        watcher = Watcher(
            cluster,
            settings,
            self._lookup.resolve,
            self._catalog.set_discovered,
            self._on_fault,
            wall_clock=self._wall_clock,
        )
        task = asyncio.create_task(watcher.run(), name=f"discovery-{cluster}")
        task.add_done_callback(self._ended)
        self._watchers[cluster] = (watcher, task)

    def _stop(self, clusters: set[str]) -> None:
        for cluster in clusters:
            _watcher, task = self._watchers.pop(cluster)
            task.cancel()

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A watcher ends only when cancelled; anything else is a bug: said, and the
        watcher started again in RESTART_AFTER_S (not in a tight loop), the last found set
        kept meanwhile."""
        if not task.cancelled() and task.exception() is not None:
            log.error("discovery: watcher stopped; restarting it", exc_info=task.exception())
            asyncio.get_running_loop().call_later(RESTART_AFTER_S, self._changed.set)

    def _on_fault(self, cluster: str, fault: DnsFault | None) -> None:
        if fault is None:
            self._control.announce(Notice("discovery_recovered", cluster, "DNS answers again"))
        else:
            reason = f"DNS {fault.kind.value}: {fault.reason}; keeping the last known endpoints"
            self._control.announce(Notice("discovery_failed", cluster, reason))


def _cluster_families(stats: Mapping[str, WatchStats]) -> Iterator[Metric]:
    """Per-cluster DNS discovery series (docs/design.md §11): cluster names are labels
    here, not parts of a metric name."""
    endpoints = GaugeMetricFamily(
        "llm_health_discovery_cluster_endpoints",
        "Addresses in the last good DNS answer.",
        labels=["cluster"],
    )
    failing = GaugeMetricFamily(
        "llm_health_discovery_cluster_failing",
        "1 while DNS resolution fails and the last known endpoints are kept.",
        labels=["cluster"],
    )
    resolutions = CounterMetricFamily(
        "llm_health_discovery_cluster_resolutions",
        "Successful DNS resolutions.",
        labels=["cluster"],
    )
    failures = CounterMetricFamily(
        "llm_health_discovery_cluster_failures",
        "Failed DNS resolution attempts (timeout, SERVFAIL, REFUSED, NXDOMAIN, empty).",
        labels=["cluster"],
    )
    for name, cluster in stats.items():
        endpoints.add_metric([name], cluster.endpoints)
        failing.add_metric([name], 1 if cluster.failing_since is not None else 0)
        resolutions.add_metric([name], cluster.resolutions)
        failures.add_metric([name], cluster.failures)
    yield from (endpoints, failing, resolutions, failures)
