"""The traffic component (docs/design.md §15): passive health from real requests.

- Serves ``AccessLogService`` on the gRPC port (Envoy's ``envoy.access_loggers.http_grpc``;
  authenticated like every service there): each counted request goes into its endpoint's
  rolling window (``traffic.window``).
- Takes the engine's TTFT histogram from every /metrics read of the engine checks
  (``feed_load``) and adds the deltas of real traffic (our own probes taken out) to the
  window.
- Every second, for the endpoints this replica probes (fleet mode: owns), judges the
  window (``traffic.quality``): over a limit → the board's "quality" limit (DEGRADED,
  cause ``quality``), lifted when the window is within limits again.
- Who may degrade (docs/design.md §15.1): entries count only from node ids that also
  hold an open xDS stream (``xds_open``, as for HDS); unless the gRPC port authenticates
  its clients (``server.token`` or mutual TLS), limits go through the board's one cap on
  outside reports (``Board.report``): a limit that would put more of the cluster out
  than ``max_ejection_percent`` allows (rounded down, never the whole cluster) is held,
  counted (``held_total``, ``held_now``), logged once and tried again every second.
- ``skip``: the scheduler's busy rule (``probe.backoff_when_busy``): this component is
  the runtime's ``core.component.SkipRule``.

In fleet mode each replica's Envoy streams to its own replica; the owner judges with the
share of the traffic its own gateway routed (docs/design.md §15.5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import grpc

from llm_health.core.component import ProbeSlot
from llm_health.core.control import BoardControl
from llm_health.model.board import Board, Reported
from llm_health.model.causes import Cause
from llm_health.model.engine_load import EngineLoad, Histogram
from llm_health.model.outcome import ProbeResult
from llm_health.model.states import State
from llm_health.probe.target import ProbeTarget
from llm_health.servers.accesslog import add_access_log_servicer
from llm_health.traffic.busy import skip as busy_skip
from llm_health.traffic.entries import Request
from llm_health.traffic.quality import note, verdict
from llm_health.traffic.settings import BusyConfig, QualityConfig
from llm_health.traffic.stream import LogStreams
from llm_health.traffic.ttft import delta
from llm_health.traffic.window import Counts, Window

QUALITY_LIMIT = "quality"
JUDGE_EVERY_S = 1.0
MAX_PENDING_PROBES = 64  # probe TTFTs remembered per endpoint between two metric reads
log = logging.getLogger("llm_health")
Sections = Mapping[str, tuple[QualityConfig | None, BusyConfig | None]]  # per cluster


@dataclasses.dataclass(slots=True)
class _Endpoint:
    window: Window
    limit: str | None = None
    last_ttft: Histogram | None = None
    probes_s: list[float] = dataclasses.field(default_factory=list)
    skipped_in_a_row: int = 0


@dataclasses.dataclass(slots=True)
class _Counters:
    unknown_endpoint_total: int = 0  # requests to hosts not on the board
    probes_skipped_total: int = 0  # backoff_when_busy
    ttft_resets_total: int = 0  # engine histograms that went back (restarts)
    held_total: int = 0  # quality limits held by the cap on unauthenticated reports


class TrafficComponent:
    name = "traffic"

    def __init__(
        self,
        control: BoardControl,
        settings: Callable[[], Sections],
        targets: list[ProbeTarget],
        clock: Callable[[], float] = time.monotonic,
        *,
        xds_open: Callable[[str], bool] | None = None,
        authenticated: bool = False,
    ) -> None:
        """``xds_open``: is this node id holding an open xDS stream (None: count every
        stream, for tests of the window alone). ``authenticated``: the gRPC port
        authenticates its clients (``server.token`` or mutual TLS): no cap."""
        self._control = control
        self._settings = settings
        self._clock = clock
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}
        self._probed: set[tuple[str, str]] = set()
        self._counters = _Counters()
        self._capped = not authenticated
        self._held: set[tuple[str, str]] = set()
        self.streams = LogStreams(self.record, clock, xds_open=xds_open)
        self._cached: Sections = {}
        self.set_targets(targets)
        control.on_probe(self._probe_seen)

    # --- endpoints --------------------------------------------------------------------

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoints on the board and which this replica probes (called on reload,
        discovery and ownership changes); windows of endpoints gone are dropped."""
        self._cached = self._settings()
        wanted: dict[tuple[str, str], ProbeTarget] = {(t.cluster, t.address): t for t in targets}
        for key in [k for k in self._endpoints if k not in wanted]:
            del self._endpoints[key]
        for key, target in wanted.items():
            quality = self._quality(target.cluster)
            span = quality.window if quality is not None else 60.0
            entry = self._endpoints.get(key)
            if entry is None or entry.window.window_s != span:
                self._endpoints[key] = _Endpoint(Window(span, target.timeout_s))
            else:
                entry.window.long_after_s = target.timeout_s

    def set_probed(self, targets: list[ProbeTarget]) -> None:
        self._probed = {(t.cluster, t.address) for t in targets}

    def _quality(self, cluster: str) -> QualityConfig | None:
        return self._cached.get(cluster, (None, None))[0]

    def _busy(self, cluster: str) -> BusyConfig | None:
        return self._cached.get(cluster, (None, None))[1]

    # --- inputs -----------------------------------------------------------------------

    def record(self, request: Request, now: float) -> None:
        entry = self._endpoints.get((request.cluster, request.address))
        if entry is None:
            self._counters.unknown_endpoint_total += 1
            return
        entry.window.add(
            now, success=request.success, error=request.error, duration_s=request.duration_s
        )

    def _probe_seen(self, cluster: str, address: str, result: ProbeResult) -> None:
        """Our own probes reach the engine's TTFT histogram too: remember their TTFTs to
        take them out of the next delta."""
        entry = self._endpoints.get((cluster, address))
        if entry is None or result.ttft_ms is None:
            return
        if len(entry.probes_s) < MAX_PENDING_PROBES:
            entry.probes_s.append(result.ttft_ms / 1000)

    def feed_load(self, target: ProbeTarget, load: EngineLoad) -> None:
        """An engine metrics read (``EngineChecks``): its TTFT histogram's growth since
        the last read, probes removed, goes into the window."""
        entry = self._endpoints.get((target.cluster, target.address))
        if entry is None or load.ttft is None:
            return
        previous, entry.last_ttft = entry.last_ttft, load.ttft
        probes, entry.probes_s = entry.probes_s, []
        if previous is None or previous.bounds != load.ttft.bounds:
            return
        counts = delta(load.ttft.bounds, previous.cumulative, load.ttft.cumulative, probes)
        if counts is None:
            self._counters.ttft_resets_total += 1
            return
        if any(counts):
            entry.window.add_ttft(self._clock(), load.ttft.bounds, counts)

    # --- the scheduler's busy rule ----------------------------------------------------

    def skip(self, target: ProbeSlot) -> bool:
        """Whether the scheduler may leave out this slot's probe (backoff_when_busy)."""
        settings = self._busy(target.cluster)
        entry = self._endpoints.get((target.cluster, target.address))
        if settings is None or entry is None:
            return False
        healthy = self._control.probe_state(target.cluster, target.address) is State.HEALTHY
        recent = entry.window.recent(self._clock(), target.interval_s)
        if busy_skip(recent, settings, entry.skipped_in_a_row, healthy):
            entry.skipped_in_a_row += 1
            self._counters.probes_skipped_total += 1
            return True
        entry.skipped_in_a_row = 0
        return False

    # --- judging ----------------------------------------------------------------------

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return [self._judge_loop]

    def register(self, server: grpc.aio.Server) -> None:
        add_access_log_servicer(server, self.streams)

    async def _judge_loop(self) -> None:
        while True:
            await asyncio.sleep(JUDGE_EVERY_S)
            await self.judge()

    async def judge(self) -> None:
        """Compare every probed endpoint's window with its limits; apply what changed. A
        limit the cap held stays unapplied (``entry.limit`` unchanged): tried again at the
        next round."""
        now = self._clock()
        changes: dict[tuple[str, str], str | None] = {}
        judged: dict[tuple[str, str], _Endpoint] = {}
        for key, entry in self._endpoints.items():
            quality = self._quality(key[0])
            reason = None
            if quality is not None and key in self._probed:
                reason = verdict(entry.window.summary(now), quality)
            if reason != entry.limit:
                changes[key], judged[key] = reason, entry
        held = await self._apply(changes) if changes else set()
        for key, entry in judged.items():
            if key not in held:
                entry.limit = changes[key]
        self._note_held(held)

    async def _apply(self, changes: dict[tuple[str, str], str | None]) -> set[tuple[str, str]]:
        """Apply ``changes`` to the board; the endpoints whose limit the cap held."""

        def apply(board: Board, now: float) -> Reported:
            return board.report(
                QUALITY_LIMIT, changes, now, cause=Cause.QUALITY, limit=True, capped=self._capped
            )

        applied = await self._control.update(
            apply, publish_when=lambda result: bool(result.transitions)
        )
        for (cluster, address), transition in applied.transitions.items():
            reason = changes[(cluster, address)]
            fields = {"cluster": cluster, "endpoint": address, "reason": reason or "within limits"}
            log.info("traffic quality: degraded" if reason else "traffic quality: ok", extra=fields)
            if transition.changed:
                self._control.notify(cluster, address, transition, None)
        return applied.held

    def _note_held(self, held: set[tuple[str, str]]) -> None:
        """Count and log each newly held limit once; forget those no longer held."""
        for cluster, address in sorted(held - self._held):
            self._counters.held_total += 1
            log.warning(
                "traffic quality held: degrading this endpoint would exceed "
                "max_ejection_percent and the access-log reporters are not authenticated "
                "(set server.token or mutual TLS)",
                extra={"cluster": cluster, "endpoint": address},
            )
        self._held = held

    # --- reading ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = self._clock()
        endpoints: dict[str, Any] = {}
        clusters: dict[str, Counts] = {}
        for (cluster, address), entry in sorted(self._endpoints.items()):
            if self._control.probe_state(cluster, address) is None:
                continue  # gone from the board before the catalog said so
            counts = entry.window.counts(now)
            quality = self._quality(cluster)
            summary = counts.summary()
            endpoints[f"{cluster}/{address}"] = {
                **summary.to_json(),
                "quality": note(summary, quality) if quality is not None else "off",
                "limited": entry.limit,
            }
            if cluster in clusters:
                clusters[cluster].merge(counts)
            else:
                clusters[cluster] = counts
        return {
            **dataclasses.asdict(self.streams.stats),
            **dataclasses.asdict(self._counters),
            "limited_now": sum(1 for e in self._endpoints.values() if e.limit),
            "held_now": len(self._held),
            "clusters": {name: c.summary().to_json() for name, c in clusters.items()},
            "endpoints": endpoints,
        }
