"""The HDS component: serves ``HealthDiscoveryService`` and turns the Envoys' reports into
the board's "hds" signal (docs/design.md §5).

Three tasks on the runtime's loop:
- follow endpoints: every published snapshot's endpoint set (endpoints being removed
  from the config excluded) goes to the service, which re-assigns only on change;
- tick: expire old reports and silent Envoys (``report_ttl``) about twice a second;
- apply: whenever the service says a verdict may have changed, compare its verdicts with
  the board's "hds" signals and set or clear the ones that differ, through
  ``BoardControl.update`` (one publish per batch). A verdict that takes an endpoint
  down is a state change logged and sent to the transition observers; clearing it lets
  the endpoint recover through the normal probe hysteresis (``Board.set_signal``).

Who may eject (docs/design.md §7.6):
- reports count only from node ids that also hold an open xDS stream (``xds_open``,
  the xDS streams' registry, passed in by ``app.assemble``; see ``HdsService``);
- unless the reporters are authenticated (``server.token`` or mutual TLS), "down"
  verdicts are capped by the board's one rule for outside reports (``Board.report``,
  docs/design.md §7.3): one is applied only while the cluster's endpoints out of service
  (held by a signal or a reported limit, or UNHEALTHY by probe) stay within
  ``max_ejection_percent``, rounded down and never the whole cluster. A held verdict is
  counted (``hds.stats.held_verdicts``, ``held_now``), logged once, and re-checked on
  every report, so it applies as soon as there is room.

Settings (``hds.settings.HdsConfig``) are read once at start (``hds:`` changes apply
after a restart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import grpc
from prometheus_client.metrics_core import Metric

from llm_health.core.control import BoardControl
from llm_health.core.families import counter, gauge
from llm_health.hds.fleet import Target
from llm_health.hds.service import HdsService, HdsStats
from llm_health.hds.settings import HdsConfig
from llm_health.model.board import HealthSnapshot
from llm_health.model.causes import Cause
from llm_health.model.states import EndpointKey
from llm_health.servers.hds import add_hds_servicer

SIGNAL = "hds"
MAX_TICK_S = 0.5
log = logging.getLogger("llm_health")
# The service's counters on /metrics. Gauges, though they only grow (streams_open aside):
# the type they were first exported with, which dashboards and rules query.
_STATS: tuple[tuple[str, str, Callable[[HdsStats], int]], ...] = (
    ("llm_health_hds_stats_streams_open", "HDS streams open now.", lambda s: s.streams_open),
    (
        "llm_health_hds_stats_refused_streams",
        "HDS streams refused (hds.enabled: false).",
        lambda s: s.refused_streams,
    ),
    (
        "llm_health_hds_stats_health_check_requests",
        "HealthCheckRequests received (a node identifying itself).",
        lambda s: s.health_check_requests,
    ),
    ("llm_health_hds_stats_reports", "Health reports folded in.", lambda s: s.reports),
    (
        "llm_health_hds_stats_empty_reports",
        "Health reports with no entry.",
        lambda s: s.empty_reports,
    ),
    (
        "llm_health_hds_stats_empty_messages",
        "Messages with neither field set before the stream identified itself.",
        lambda s: s.empty_messages,
    ),
    (
        "llm_health_hds_stats_undecodable_messages",
        "Streams ended by bytes that are not an HDS message.",
        lambda s: s.undecodable_messages,
    ),
    (
        "llm_health_hds_stats_reports_before_request",
        "Reports on a stream that had not identified itself (ignored).",
        lambda s: s.reports_before_request,
    ),
    (
        "llm_health_hds_stats_malformed_entries",
        "Report entries without a usable address.",
        lambda s: s.malformed_entries,
    ),
    (
        "llm_health_hds_stats_specifiers_sent",
        "HealthCheckSpecifiers sent.",
        lambda s: s.specifiers_sent,
    ),
    (
        "llm_health_hds_stats_reports_without_xds",
        "Reports from a node id with no open xDS stream (ignored).",
        lambda s: s.reports_without_xds,
    ),
    (
        "llm_health_hds_stats_held_verdicts",
        "Down verdicts held by the max_ejection_percent cap (unauthenticated reporters).",
        lambda s: s.held_verdicts,
    ),
    (
        "llm_health_hds_stats_entries_counted",
        "Report entries counted toward a verdict.",
        lambda s: s.entries.counted,
    ),
    (
        "llm_health_hds_stats_entries_unknown_endpoint",
        "Report entries for an endpoint not on the board.",
        lambda s: s.entries.unknown_endpoint,
    ),
    (
        "llm_health_hds_stats_entries_unassigned",
        "Report entries from a node not assigned the endpoint.",
        lambda s: s.entries.unassigned,
    ),
    (
        "llm_health_hds_stats_entries_first_check",
        "Down entries of a node's first check of an endpoint (within the grace).",
        lambda s: s.entries.first_check,
    ),
    (
        "llm_health_hds_stats_entries_no_verdict",
        "Report entries that said neither up nor down.",
        lambda s: s.entries.no_verdict,
    ),
)


def endpoints_of(snapshot: HealthSnapshot) -> dict[EndpointKey, Target]:
    """Every endpoint HDS should check: all but those being removed from the config."""
    return {
        (cluster.name, e.spec.address): (e.spec.host, e.spec.port)
        for cluster in snapshot.clusters.values()
        for e in cluster.endpoints
        if not e.removing
    }


def hds_signals(snapshot: HealthSnapshot) -> dict[EndpointKey, str | None]:
    return {
        (cluster.name, e.spec.address): e.signals.get(SIGNAL)
        for cluster in snapshot.clusters.values()
        for e in cluster.endpoints
    }


class HdsComponent:
    name = "hds"

    def __init__(
        self,
        settings: HdsConfig,
        control: BoardControl,
        clock: Callable[[], float] = time.monotonic,
        *,
        xds_open: Callable[[str], bool] | None = None,
        authenticated: bool = False,
    ) -> None:
        """``xds_open``: is this node id holding an open xDS stream (None: trust every
        reporter, for tests of the engine alone). ``authenticated``: the gRPC port
        authenticates its clients (``server.token`` or mutual TLS): no ejection cap."""
        self._control = control
        self._wake = asyncio.Event()
        self._capped = not authenticated
        self._held: set[EndpointKey] = set()
        # Whether the board may hold an "hds" signal: until the first sync it may (a
        # restored board); after one, only if some decision was down.
        self._may_be_set = True
        self.tick_s = min(MAX_TICK_S, settings.report_interval / 2)
        self.service = HdsService(
            settings,
            endpoints=endpoints_of(control.published()),
            clock=clock,
            on_change=self._wake.set,
            xds_open=xds_open,
        )

    def register(self, server: grpc.aio.Server) -> None:
        add_hds_servicer(server, self.service)

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        if not self.service.settings.enabled:
            return []
        return [self._follow_endpoints, self._tick, self._apply]

    def status(self) -> dict[str, Any]:
        return {
            **self.service.status(),
            "ejection_cap": "max_ejection_percent" if self._capped else "none (authenticated)",
            "held_now": len(self._held),
        }

    def metrics(self) -> Iterator[Metric]:
        settings, stats = self.service.settings, self.service.stats
        yield gauge(
            "llm_health_hds_enabled", "1 while HDS is served (hds.enabled).", settings.enabled
        )
        yield gauge(
            "llm_health_hds_checkers_per_endpoint",
            "Envoys asked to check each endpoint (hds.checkers_per_endpoint).",
            settings.checkers_per_endpoint,
        )
        if settings.quorum is not None:
            yield gauge(
                "llm_health_hds_quorum",
                "Reporters that must say down to take an endpoint out (hds.quorum; unset: a majority).",
                settings.quorum,
            )
        yield gauge(
            "llm_health_hds_held_now",
            "Down verdicts held now by the max_ejection_percent cap.",
            len(self._held),
        )
        yield counter(
            "llm_health_hds_stats_streams_total", "HDS streams opened.", stats.streams_total
        )
        for name, what, read in _STATS:
            yield gauge(name, what, read(stats))

    async def _follow_endpoints(self) -> None:
        """Follow the published endpoint set. Most publications change a state, not the
        set: handing the service an equal set would make it recompute its plans and wake
        the signal sync for nothing (an O(endpoints) pass per state change)."""
        revision = self._control.published().revision
        current: dict[EndpointKey, Target] | None = None
        while True:
            snapshot = await self._control.wait_newer(revision)
            revision = snapshot.revision
            wanted = endpoints_of(snapshot)
            if wanted != current:
                self.service.set_endpoints(wanted)
                current = wanted

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.service.tick()

    async def _apply(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.sync()

    async def sync(self) -> None:
        """Make the board's "hds" signals match the service's verdicts. Every tick wakes
        it; when no Envoy says any endpoint is down and none is marked, there is nothing
        to compare (two passes over every endpoint, twice a second, for nothing)."""
        if not self._may_be_set and not self.service.fleet.ledger.says_down():
            self._note_held(set())
            return
        current = hds_signals(self._control.snapshot())
        decisions = self.service.decisions()
        self._may_be_set = any(reason is not None for reason in decisions.values())
        changes = {
            key: reason
            for key, reason in decisions.items()
            if key in current and current[key] != reason
        }
        if not changes:
            self._note_held(set())
            return
        applied = await self._control.update(
            lambda board, now: board.report(
                SIGNAL, changes, now, cause=Cause.SIGNAL, capped=self._capped
            ),
            publish_when=lambda result: bool(result.transitions),
        )
        self._note_held(applied.held)
        for (cluster, address), transition in applied.transitions.items():
            reason = changes[(cluster, address)]
            fields = {"cluster": cluster, "endpoint": address, "reason": reason}
            log.info("HDS verdict: down" if reason else "HDS verdict: reachable", extra=fields)
            if transition.changed:
                self._control.notify(cluster, address, transition, None)

    def _note_held(self, held: set[EndpointKey]) -> None:
        """Count and log each newly held verdict once; forget those no longer held."""
        for cluster, address in sorted(held - self._held):
            self.service.stats.held_verdicts += 1
            log.warning(
                "HDS verdict held: taking this endpoint out would exceed max_ejection_percent "
                "and the HDS reporters are not authenticated (set server.token or mutual TLS)",
                extra={"cluster": cluster, "endpoint": address},
            )
        self._held = held
