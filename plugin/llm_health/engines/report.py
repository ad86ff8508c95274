"""What the engine checks show: ``/status`` and their Prometheus families
(docs/design.md §14, docs/operations.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llm_health.core.families import counter, gauge
from llm_health.engines.book import Book, EndpointState
from llm_health.model.engine_load import EngineLoad


def status(
    book: Book, stretch: float, consensus: Callable[[str], dict[str, object]]
) -> dict[str, Any]:
    clusters = sorted({key.split("/", 1)[0] for key in book.endpoints})
    return {
        **dataclasses.asdict(book.counters),
        "saturated_now": book.saturated_now(),
        # Each endpoint's /metrics is read at most this often (the configured interval,
        # stretched to fit MAX_METRICS_READS_PER_S across all endpoints).
        "metrics_min_interval_s": round(stretch, 3),
        "consensus": {name: consensus(name) for name in clusters},
        "endpoints": {
            key: _endpoint_status(state, book.engines.get(key))
            for key, state in sorted(book.endpoints.items())
        },
    }


def _endpoint_status(state: EndpointState, engine: str | None) -> dict[str, Any]:
    load: EngineLoad | None = state.reading.load
    return {
        "engine": engine,
        "load": load.to_json() if load is not None else None,
        "metrics_failures": state.reading.failures,
        "metrics_error": state.reading.error,
        "saturated": state.limit,
        "last_answer": state.last_answer,
        "last_verdict": state.last_verdict,
        "served_models": list(state.models),
        "models_error": state.model_error,
    }


def metrics(book: Book, stretch: float) -> Iterator[Metric]:
    counters = book.counters
    yield counter(
        "llm_health_engines_checks_total",
        "Known-answer probe answers judged.",
        counters.checks_total,
    )
    yield counter(
        "llm_health_engines_garbage_total",
        "Known-answer verdicts: garbage (held UNHEALTHY at once).",
        counters.garbage_total,
    )
    yield counter(
        "llm_health_engines_misses_total", "Known-answer verdicts: miss.", counters.misses_total
    )
    yield counter(
        "llm_health_engines_passes_total", "Known-answer verdicts: pass.", counters.passes_total
    )
    yield counter(
        "llm_health_engines_metrics_reads_total",
        "Reads of the engines' /metrics.",
        counters.metrics_reads_total,
    )
    yield counter(
        "llm_health_engines_metrics_bracket_reads_total",
        "Reads of an engine's /metrics that bracket a slow probe's wait, a quarter of its "
        "timeout in and at its timeout (the overload rule: docs/design.md §3.5); also "
        "counted as reads.",
        counters.metrics_bracket_reads_total,
    )
    bracketed = CounterMetricFamily(
        "llm_health_engines_bracketed_timeouts_total",
        "Probe timeouts whose wait was bracketed by /metrics reads, by what the reads "
        "showed: admission (excused as load), none, no_baseline, no_confirm, late "
        "(docs/design.md §3.5).",
        labels=["evidence"],
    )
    for evidence, value in counters.bracketed_timeouts_total.items():
        bracketed.add_metric([evidence], value)
    yield bracketed
    yield counter(
        "llm_health_engines_metrics_failures_total",
        "Engine /metrics reads that failed or did not parse (no verdict).",
        counters.metrics_failures_total,
    )
    yield counter(
        "llm_health_engines_metrics_overruns_total",
        "Engine /metrics reads refused for a document past a read's bounds (size, lines, "
        "labels: docs/engines.md); also counted as failures.",
        counters.metrics_overruns_total,
    )
    yield counter(
        "llm_health_engines_model_checks_total",
        "Served-model checks (GET /v1/models).",
        counters.model_checks_total,
    )
    yield counter(
        "llm_health_engines_model_failures_total",
        "Served-model checks that could not read the model list (no verdict).",
        counters.model_failures_total,
    )
    yield counter(
        "llm_health_engines_side_reads_deferred_total",
        "Times due side reads waited for a later tick: MAX_PENDING_READS were already "
        "running or waiting.",
        counters.side_reads_deferred_total,
    )
    yield gauge(
        "llm_health_engines_saturated_now",
        "Endpoints an engine threshold holds at DEGRADED now.",
        book.saturated_now(),
    )
    yield gauge(
        "llm_health_engines_metrics_min_interval_s",
        "Seconds between two reads of one endpoint's /metrics, at least (the interval, "
        "stretched to the read budget).",
        round(stretch, 3),
    )
    if book.endpoints:
        yield from _load_families(sorted(book.endpoints.items()), book.engines)


def _load_families(
    endpoints: list[tuple[str, EndpointState]], engines: Mapping[str, str]
) -> Iterator[Metric]:
    """The engines' own load as each endpoint's /metrics reports it (docs/design.md §14.3),
    and whether it counts as saturated: one series per endpoint checked here."""
    labels = ["cluster", "endpoint", "engine"]
    waiting = GaugeMetricFamily(
        "llm_health_engine_requests_waiting", "Requests the engine has queued.", labels=labels
    )
    running = GaugeMetricFamily(
        "llm_health_engine_requests_running", "Requests the engine is running.", labels=labels
    )
    kv_cache = GaugeMetricFamily(
        "llm_health_engine_kv_cache_usage", "KV cache used, 0 to 1.", labels=labels
    )
    saturated = GaugeMetricFamily(
        "llm_health_engine_saturated",
        "1 while a queue or KV-cache threshold holds the endpoint at DEGRADED.",
        labels=labels,
    )
    for key, state in endpoints:
        cluster, _, address = key.partition("/")
        names = [cluster, address, engines.get(key) or "unknown"]
        saturated.add_metric(names, 1 if state.limit else 0)
        load = state.reading.load
        if load is None:
            continue
        for family, value in (
            (waiting, load.waiting),
            (running, load.running),
            (kv_cache, load.kv_cache),
        ):
            if value is not None:
                family.add_metric(names, float(value))
    yield from (waiting, running, kv_cache, saturated)
