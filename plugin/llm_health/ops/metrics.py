"""Prometheus metrics on ``/metrics``: ``llm_health_*`` (docs/design.md §5).

Two kinds of series, no double bookkeeping:
- events, fed by the board control's observers: probe TTFT / connect / header-time
  histograms and an outcome counter per endpoint (probe observer), and a state-transition
  counter (transition observer) labelled with the transition's typed *cause*
  (``model.causes``), never the free-text reason;
- state, read at scrape time (``_ScrapeCollector``): every endpoint's state and Envoy
  weight from the board snapshot, xDS counters, the prober's loop lag and counters
  (``ProberStats``), and the families each component declares itself
  (``core.component.MetricsSource``: HDS, ext_authz, alerts, admin, ...), collected here
  as they are, never derived from ``status()``.

Cardinality is bounded: labels are cluster and endpoint names from the config, enum
values (state, outcome, cause, xDS variant), nothing else (no salts, prompts or
error strings). Series of endpoints that left the board (hot reload) are dropped at the
next scrape. The registry is private to one runtime (tests run several).

Thread and task safety: observers run on the runtime's loop. A scrape gathers its inputs
(the components' families included) on the loop, then renders the text in a worker
thread so a large exposition (1,000 endpoints) does not stall the loop that times the
probes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from llm_health import __version__
from llm_health.core.component import MetricsSource
from llm_health.core.control import BoardControl, ProberStats
from llm_health.model.board import EndpointSnapshot, HealthSnapshot
from llm_health.model.causes import Cause
from llm_health.model.machine import Transition
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import EndpointKey, State
from llm_health.ops.endpoint_series import (
    TTFT_BUCKETS_S,
    EndpointCounter,
    EndpointHistogram,
    endpoint_labels,
    header,
)
from llm_health.xds.stream import XdsStats

HEADERS_BUCKETS_S = (0.005, 0.025, 0.1, 0.2, 0.5, 0.8)
CONNECT_BUCKETS_S = (0.001, 0.005, 0.025, 0.1, 0.5)
LAG_WINDOW_S = 30.0
_XDS_COUNTERS = (
    "streams_total",
    "requests",
    "pushes",
    "acks",
    "nacks",
    "stale_nonces",
    "unknown_type_requests",
)
# No *_created series: they would double the count and nobody reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _probe_histogram(name: str, what: str, buckets: tuple[float, ...]) -> EndpointHistogram:
    help_text = f"Probe {what}, seconds from the request start, per endpoint."
    return EndpointHistogram(f"llm_health_probe_{name}_seconds", help_text, buckets)


# Each outcome's label, looked up (an enum's ``.value`` is Python code: one call a probe).
_OUTCOME_LABELS = {outcome: outcome.value for outcome in Outcome}


class RuntimeMetrics:
    """All metrics of one runtime. Construct once, before the runtime starts."""

    def __init__(
        self,
        control: BoardControl,
        stats: ProberStats,
        xds: XdsStats,
        components: Sequence[MetricsSource],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.ttft = _probe_histogram("ttft", "time to first token", TTFT_BUCKETS_S)
        self.connect = _probe_histogram("connect", "TCP connect time", CONNECT_BUCKETS_S)
        self.headers = _probe_histogram("headers", "time to response headers", HEADERS_BUCKETS_S)
        self.outcomes = EndpointCounter(
            "llm_health_probes_total",
            "Probes by outcome (fast, slow, overloaded, timeout, fatal, error); probes ignored "
            "for loop lag are not counted here (llm_health_probes_ignored_loop_lag_total).",
            "outcome",
        )
        self.interim = EndpointCounter(
            "llm_health_probe_interim_responses_total",
            "Interim (1xx) responses probes read past before their answer (RFC 9110 §15.2).",
            None,
        )
        self.transitions = Counter(
            "llm_health_state_transitions",
            "State changes by from, to and cause (reason label: "
            + ", ".join(c.value for c in Cause)
            + ").",
            ["cluster", "endpoint", "from", "to", "reason"],
            registry=self.registry,
        )
        self._transition_labels: dict[EndpointKey, set[tuple[str, ...]]] = {}
        self._scrape = _ScrapeCollector()
        self.registry.register(self._scrape)
        ProcessCollector(registry=self.registry)
        self._control, self._stats, self._xds, self._components = control, stats, xds, components
        self._lock = asyncio.Lock()
        control.on_probe(self.on_probe)
        control.on_transition(self.on_transition)

    # --- observers (on the loop, O(1)) --------------------------------------------------

    def on_probe(self, cluster: str, address: str, result: ProbeResult) -> None:
        key = (cluster, address)
        self.outcomes.inc(key, _OUTCOME_LABELS[result.outcome])
        if result.interim:
            self.interim.inc(key, amount=result.interim)
        if result.ttft_ms is not None:
            self.ttft.observe(key, result.ttft_ms / 1000)
        if result.connect_ms is not None:
            self.connect.observe(key, result.connect_ms / 1000)
        if result.headers_ms is not None:
            self.headers.observe(key, result.headers_ms / 1000)

    def on_transition(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        if not transition.changed:
            return
        labels = (
            cluster,
            address,
            transition.from_state.value,
            transition.to_state.value,
            transition.cause.value,
        )
        self._transition_labels.setdefault((cluster, address), set()).add(labels)
        self.transitions.labels(*labels).inc()

    # --- scrape ---------------------------------------------------------------------------

    async def exposition(self) -> tuple[bytes, str]:
        """The /metrics body and its content type. One scrape at a time; the text is
        rendered in a worker thread from data taken on the loop."""
        async with self._lock:
            scrape = self._gather()
            self._prune({(e.cluster, e.spec.address) for e in _endpoints(scrape.snapshot)})
            self._scrape.current = scrape
            body = await asyncio.to_thread(self._render, scrape.snapshot)
        return body, CONTENT_TYPE_LATEST

    def _render(self, snapshot: HealthSnapshot) -> bytes:
        out: list[str] = []
        for series in (self.ttft, self.connect, self.headers, self.outcomes, self.interim):
            series.render(out)
        _render_endpoint_gauges(snapshot, out)
        return generate_latest(self.registry) + "".join(out).encode()

    def _gather(self) -> Scrape:
        stats, lag = self._stats, self._stats.lag
        return Scrape(
            snapshot=self._control.snapshot(),
            xds={name: _xds_numbers(c) for name, c in self._xds.by_variant().items()},
            components=tuple(f for source in self._components for f in source.metrics()),
            loop_lag_s=lag.current_ms / 1000,
            loop_lag_max_s=lag.max_since(time.perf_counter() - LAG_WINDOW_S) / 1000,
            probes_total=stats.probes_total,
            probes_ignored=stats.probes_ignored_loop_lag,
            overlapping_confirms=stats.overlapping_confirms,
            silences_ignored=stats.silences_ignored_loop_lag,
        )

    def _prune(self, alive: set[EndpointKey]) -> None:
        """Drop the series of endpoints no longer on the board (bounded cardinality)."""
        per_endpoint = (self.ttft, self.connect, self.headers, self.outcomes, self.interim)
        known = {k for series in per_endpoint for k in series.endpoints()} | set(
            self._transition_labels
        )
        for key in known - alive:
            for series in per_endpoint:
                series.drop(key)
            for labels in self._transition_labels.pop(key, ()):
                self.transitions.remove(*labels)


def _render_endpoint_gauges(snapshot: HealthSnapshot, out: list[str]) -> None:
    state = "llm_health_endpoint_state"
    weight = "llm_health_endpoint_weight"
    forced = "llm_health_endpoint_override"
    rows = [(endpoint_labels((e.cluster, e.spec.address)), e) for e in _endpoints(snapshot)]
    out.append(
        header(state, "1 for the endpoint's current (effective) state, 0 for the others.", "gauge")
    )
    for labels, e in rows:
        for candidate in State:
            value = 1 if candidate is e.state else 0
            out.append(f'{state}{{{labels},state="{candidate.value}"}} {value}\n')
    out.append(
        header(weight, "load_balancing_weight sent to Envoy (ignored unless healthy).", "gauge")
    )
    out.extend(f"{weight}{{{labels}}} {e.view.weight}\n" for labels, e in rows)
    out.append(header(forced, "1 while an operator override holds.", "gauge"))
    out.extend(f"{forced}{{{labels}}} {int(e.override_until is not None)}\n" for labels, e in rows)


@dataclass(frozen=True, slots=True)
class Scrape:
    """Everything the scrape-time collector reads, taken on the loop."""

    snapshot: HealthSnapshot
    xds: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    components: tuple[Metric, ...] = ()  # every component's families
    loop_lag_s: float = 0.0
    loop_lag_max_s: float = 0.0
    probes_total: int = 0
    probes_ignored: int = 0
    overlapping_confirms: int = 0
    silences_ignored: int = 0


class _ScrapeCollector(Collector):
    """State series, computed from the ``Scrape`` of the current request."""

    def __init__(self) -> None:
        self.current: Scrape | None = None

    def collect(self) -> Iterator[Metric]:
        scrape = self.current
        if scrape is None:
            return
        yield _info()
        yield from _cluster_families(scrape.snapshot)
        yield from _xds_families(scrape.xds)
        yield from _prober_families(scrape)
        yield from scrape.components


def _info() -> Metric:
    info = GaugeMetricFamily("llm_health_build_info", "Always 1; the version.", labels=["version"])
    info.add_metric([__version__], 1)
    return info


def _cluster_families(snapshot: HealthSnapshot) -> Iterator[Metric]:
    counts = GaugeMetricFamily(
        "llm_health_cluster_endpoints", "Endpoints per state.", labels=["cluster", "state"]
    )
    warm = GaugeMetricFamily(
        "llm_health_cluster_warm",
        "1 once the cluster may be pushed to Envoy (first probe round done).",
        labels=["cluster"],
    )
    for name, cluster in snapshot.clusters.items():
        for candidate in State:
            n = sum(1 for e in cluster.endpoints if e.state is candidate)
            counts.add_metric([name, candidate.value], n)
        warm.add_metric([name], float(cluster.warm))
    yield from (counts, warm)


def _xds_families(xds: Mapping[str, Mapping[str, int]]) -> Iterator[Metric]:
    """Per variant (ads_sotw, ads_delta, eds_sotw, eds_delta); EDS is the only type served."""
    labels = ["variant", "type"]
    open_streams = GaugeMetricFamily(
        "llm_health_xds_streams_open", "xDS streams open now.", labels=labels
    )
    counters = {
        name: CounterMetricFamily(
            f"llm_health_xds_{name.removesuffix('_total')}", _XDS_HELP[name], labels=labels
        )
        for name in _XDS_COUNTERS
    }
    for variant, numbers in xds.items():
        key = [variant, "eds"]
        open_streams.add_metric(key, numbers.get("streams_open", 0))
        for name, family in counters.items():
            family.add_metric(key, numbers.get(name, 0))
    yield open_streams
    yield from counters.values()


_XDS_HELP = {
    "streams_total": "xDS streams opened.",
    "requests": "xDS requests received (of any type).",
    "pushes": "xDS responses sent.",
    "acks": "ACKs received.",
    "nacks": "NACKs received (Envoy rejected an update; see the error log).",
    "stale_nonces": "Requests with a stale nonce (ignored in SotW).",
    "unknown_type_requests": "Requests for a type other than EDS (ignored).",
}


def _prober_families(scrape: Scrape) -> Iterator[Metric]:
    lag = GaugeMetricFamily(
        "llm_health_loop_lag_seconds",
        "How late the prober's event loop runs now (its TTFTs include this).",
        value=scrape.loop_lag_s,
    )
    lag_max = GaugeMetricFamily(
        "llm_health_loop_lag_max_seconds",
        f"Worst event-loop lag over the last {LAG_WINDOW_S:g} s.",
        value=scrape.loop_lag_max_s,
    )
    ignored = CounterMetricFamily(
        "llm_health_probes_ignored_loop_lag",
        "SLOW/TIMEOUT verdicts ignored because the prober's loop lagged (max_loop_lag).",
        value=scrape.probes_ignored,
    )
    done = CounterMetricFamily(
        "llm_health_probes_completed", "Probe results received.", value=scrape.probes_total
    )
    overlaps = CounterMetricFamily(
        "llm_health_probes_overlapping_confirms",
        "Confirming probes started beside a probe still silent in flight.",
        value=scrape.overlapping_confirms,
    )
    silences = CounterMetricFamily(
        "llm_health_silences_ignored_loop_lag",
        "In-flight silences not acted on because the prober's loop lagged (max_loop_lag).",
        value=scrape.silences_ignored,
    )
    yield from (lag, lag_max, ignored, done, overlaps, silences)


def _xds_numbers(counters: Any) -> dict[str, int]:
    names = ("streams_open", *_XDS_COUNTERS)
    return {name: int(getattr(counters, name, 0)) for name in names}


def _endpoints(snapshot: HealthSnapshot) -> Iterator[EndpointSnapshot]:
    for cluster in snapshot.clusters.values():
        yield from cluster.endpoints
