"""The traffic component (docs/design.md §15): passive health from real requests.

- Serves ``AccessLogService`` on the gRPC port (Envoy's ``envoy.access_loggers.http_grpc``;
  authenticated like every service there): each counted request goes into its endpoint's
  rolling window (``traffic.window``).
- From authenticated reporters only (``server.token`` or mutual TLS), each successful
  request's first byte tells the board the engine admitted it: the evidence of the
  overload rule beside the engine's own counter (docs/design.md §3.5).
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
from collections.abc import Callable, Coroutine, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llm_health.core.component import ProbeSlot
from llm_health.core.control import BoardControl
from llm_health.core.families import counter, gauge
from llm_health.model.admission import after_first_token
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
from llm_health.traffic.window import Counts, Summary, Window

QUALITY_LIMIT = "quality"
JUDGE_EVERY_S = 1.0
FIRST_TOKEN_EVERY_S = 0.25
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
    first_token_noted: float = -1e18  # when a real first token last went to the board


@dataclasses.dataclass(slots=True)
class _Counters:
    unknown_endpoint_total: int = 0  # requests to hosts not on the board
    probes_skipped_total: int = 0  # backoff_when_busy
    ttft_resets_total: int = 0  # engine histograms that went back (restarts)
    held_total: int = 0  # quality limits held by the cap on unauthenticated reports


EndpointWindow = tuple[tuple[str, str], _Endpoint, Summary]  # (cluster, address), ...
# Real traffic's quality window on /metrics: (per endpoint, per cluster, what, value),
# rounded as /status shows it; None: no sample.
_QUALITY_SERIES: tuple[tuple[str, str, str, Callable[[Summary], float | None]], ...] = (
    (
        "llm_health_quality_requests",
        "llm_health_cluster_quality_requests",
        "Real requests in the quality window (access logs).",
        lambda s: s.requests,
    ),
    (
        "llm_health_quality_error_rate",
        "llm_health_cluster_quality_error_rate",
        "Share of real requests that failed (5xx, resets, timeouts).",
        lambda s: round(s.error_rate, 6),
    ),
    (
        "llm_health_quality_ttft_p50_seconds",
        "llm_health_cluster_quality_ttft_p50_seconds",
        "Median TTFT of real traffic (engine histogram).",
        lambda s: _rounded(s.p50_ttft_s),
    ),
    (
        "llm_health_quality_ttft_p95_seconds",
        "llm_health_cluster_quality_ttft_p95_seconds",
        "p95 TTFT of real traffic (engine histogram).",
        lambda s: _rounded(s.p95_ttft_s),
    ),
    (
        "llm_health_quality_duration_p95_seconds",
        "llm_health_cluster_quality_duration_p95_seconds",
        "p95 duration of real requests (access logs).",
        lambda s: _rounded(s.p95_duration_s),
    ),
)


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

    @property
    def probed(self) -> AbstractSet[tuple[str, str]]:
        """The (cluster, address) this replica probes: the only ones ``judge`` limits."""
        return self._probed

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
        if not self._capped and request.success and request.first_byte_s is not None:
            self._note_first_token(request, entry, now)

    def _note_first_token(self, request: Request, entry: _Endpoint, now: float) -> None:
        """A real request got its first byte from the engine, ``duration - first byte``
        ago: the engine admitted it (evidence of the overload rule, docs/design.md §3.5).
        Only from authenticated reporters (``server.token`` or mutual TLS): a forged
        entry could otherwise hold a hung engine in rotation. At most one board update
        every FIRST_TOKEN_EVERY_S per endpoint: the evidence is a time, not a count."""
        if now - entry.first_token_noted < FIRST_TOKEN_EVERY_S:
            return
        entry.first_token_noted = now
        ago = request.duration_s - (request.first_byte_s or 0.0)
        cluster, address = request.cluster, request.address

        def note(board: Board, at: float) -> None:
            if board.has_endpoint(cluster, address):
                board.note_admission(cluster, address, lambda a: after_first_token(a, at - ago))

        self._control.update_now(note)

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
        if settings is None:
            return False
        entry = self._endpoints.get((target.cluster, target.address))
        if entry is None:
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
            if quality is not None and key in self._probed and not entry.window.empty(now):
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
        windows, clusters = self._windows(self._clock())
        endpoints: dict[str, Any] = {}
        for (cluster, address), entry, summary in windows:
            quality = self._quality(cluster)
            endpoints[f"{cluster}/{address}"] = {
                **summary.to_json(),
                "quality": note(summary, quality) if quality is not None else "off",
                "limited": entry.limit,
            }
        return {
            **dataclasses.asdict(self.streams.stats),
            **dataclasses.asdict(self._counters),
            "limited_now": sum(1 for e in self._endpoints.values() if e.limit),
            "held_now": len(self._held),
            "clusters": {name: summary.to_json() for name, summary in clusters.items()},
            "endpoints": endpoints,
        }

    def metrics(self) -> Iterator[Metric]:
        streams, counters = self.streams.stats, self._counters
        yield gauge(
            "llm_health_traffic_streams_open", "Access-log streams open now.", streams.streams_open
        )
        yield counter(
            "llm_health_traffic_streams_total", "Access-log streams opened.", streams.streams_total
        )
        yield counter(
            "llm_health_traffic_messages_total",
            "Access-log messages received.",
            streams.messages_total,
        )
        yield counter(
            "llm_health_traffic_entries_total",
            "HTTP access-log entries received.",
            streams.entries_total,
        )
        yield counter(
            "llm_health_traffic_counted_total",
            "Access-log entries counted as real requests.",
            streams.counted_total,
        )
        yield counter(
            "llm_health_traffic_skipped_total",
            "Access-log entries left out (our probes, intermediate entries, no upstream host).",
            streams.skipped_total,
        )
        yield counter(
            "llm_health_traffic_dropped_total",
            "Access-log entries dropped over a stream's rate budget.",
            streams.dropped_total,
        )
        yield counter(
            "llm_health_traffic_tcp_messages_total",
            "TCP access-log messages (not read).",
            streams.tcp_messages_total,
        )
        yield counter(
            "llm_health_traffic_unknown_endpoint_total",
            "Real requests to hosts not on the board.",
            counters.unknown_endpoint_total,
        )
        yield counter(
            "llm_health_traffic_probes_skipped_total",
            "Probes left out while real traffic shows the endpoint busy (backoff_when_busy).",
            counters.probes_skipped_total,
        )
        yield counter(
            "llm_health_traffic_ttft_resets_total",
            "Engine TTFT histograms that went back (an engine restart).",
            counters.ttft_resets_total,
        )
        yield gauge(
            "llm_health_traffic_limited_now",
            "Endpoints real traffic's quality holds at DEGRADED now.",
            sum(1 for e in self._endpoints.values() if e.limit),
        )
        yield counter(
            "llm_health_traffic_without_xds_total",
            "Access-log entries from a node with no open xDS stream: counted, not read.",
            streams.without_xds_total,
        )
        yield counter(
            "llm_health_traffic_held_total",
            "Quality limits held back by the cap on unauthenticated reports.",
            counters.held_total,
        )
        yield gauge(
            "llm_health_traffic_held_now",
            "Endpoints whose quality limit the unauthenticated-report cap holds back now.",
            len(self._held),
        )
        windows, clusters = self._windows(self._clock())
        yield from quality_families(windows, clusters)

    def _windows(self, now: float) -> tuple[list[EndpointWindow], dict[str, Summary]]:
        """Each endpoint's window (those still on the board), and per cluster its
        endpoints' windows added up."""
        windows: list[EndpointWindow] = []
        clusters: dict[str, Counts] = {}
        for (cluster, address), entry in sorted(self._endpoints.items()):
            if self._control.probe_state(cluster, address) is None:
                continue  # gone from the board before the catalog said so
            counts = entry.window.counts(now)
            windows.append(((cluster, address), entry, counts.summary()))
            if cluster in clusters:
                clusters[cluster].merge(counts)
            else:
                clusters[cluster] = counts
        return windows, {name: c.summary() for name, c in clusters.items()}


def quality_families(
    windows: list[EndpointWindow], clusters: Mapping[str, Summary]
) -> Iterator[Metric]:
    """Real traffic's quality window (docs/design.md §15) per endpoint and per cluster: the
    series an autoscaler reads (deploy/kubernetes/autoscaling/hpa-quality.yaml)."""
    if windows:
        labels = ["cluster", "endpoint"]
        for name, _in_cluster, what, read in _QUALITY_SERIES:
            family = GaugeMetricFamily(name, what, labels=labels)
            for key, _entry, summary in windows:
                _add(family, list(key), read(summary))
            yield family
        limited = GaugeMetricFamily(
            "llm_health_quality_limited",
            "1 while real traffic's quality holds the endpoint at DEGRADED.",
            labels=labels,
        )
        for key, entry, _summary in windows:
            limited.add_metric(list(key), 1 if entry.limit else 0)
        yield limited
    if clusters:
        for _in_endpoint, name, what, read in _QUALITY_SERIES:
            family = GaugeMetricFamily(name, what, labels=["cluster"])
            for cluster, summary in clusters.items():
                _add(family, [cluster], read(summary))
            yield family


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
