"""Each component's own /metrics families (``core.component.MetricsSource``): the names,
types and labels it declares, with values read from its typed counters, never from its
``status()``. The full list of families is tests/integration/test_metric_names.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric

from llm_health.app.assemble import build_runtime
from llm_health.app.runtime import Runtime
from llm_health.authz import AuthzCounters
from llm_health.config import parse_config
from llm_health.core.component import MetricsSource
from llm_health.core.families import counter, gauge
from llm_health.discovery.component import DiscoveryComponent
from llm_health.discovery.settings import DiscoveryConfig
from llm_health.discovery.watcher import Watcher
from llm_health.engines.metrics import Reading
from llm_health.hds.fleet import ReportEntry
from llm_health.hds.ledger import Said
from llm_health.model.engine_load import EngineLoad
from llm_health.traffic.entries import Request

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
CONFIG = f"""
server: {{authz: "127.0.0.1:1"}}
alerts: {{webhooks: [{{url: "http://127.0.0.1:1/a"}}, {{url: "http://127.0.0.1:1/b"}}]}}
fleet: {{redis: "redis://127.0.0.1:1/0", name: unit}}
remediation:
  - when: {{state: unhealthy, for: 1h}}
    run: ["/bin/true"]
probe: {{quality: {{min_requests: 4}}}}
clusters:
  - name: llama
    endpoints: [{{address: "{A}"}}, {{address: "{B}"}}]
"""
NOW = 1000.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def runtime(extra: str = "") -> Runtime:
    return build_runtime(parse_config(extra + CONFIG, "t.yaml", {}), clock=lambda: NOW)


def component(rt: Runtime, name: str) -> Any:
    (found,) = [c for c in rt.components if c.name == name]
    return found


def types(families: Iterable[Metric]) -> dict[str, str]:
    """``name type`` as the exposition's ``# TYPE`` lines write them."""
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}


def samples(families: Iterable[Metric]) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in families
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def read(source: MetricsSource) -> tuple[dict[str, str], Samples]:
    families = list(source.metrics())
    assert len(types(families)) == len(families), "a family declared twice"
    return types(families), samples(families)


def test_plain_family_builders() -> None:
    built = counter("llm_health_x_total", "X.", 3)
    assert (built.name, built.type, built.samples[0].name) == (
        "llm_health_x",
        "counter",
        "llm_health_x_total",
    )
    assert gauge("llm_health_y", "Y.", True).samples[0].value == 1.0
    try:
        counter("llm_health_z", "Z.", 1)
    except ValueError:
        pass
    else:
        raise AssertionError("a counter without _total was accepted")


def test_grpc_auth() -> None:
    auth = component(runtime(), "grpc_auth")
    auth.stats.rejected_total = 3
    kinds, found = read(auth)
    assert kinds == {
        "llm_health_grpc_auth_rejected_total": "counter",
        "llm_health_grpc_auth_tls": "gauge",
    }
    assert value(found, "llm_health_grpc_auth_rejected_total") == 3
    assert value(found, "llm_health_grpc_auth_tls") == 0


def test_admin() -> None:
    admin = component(runtime(), "admin")
    admin.stats.calls, admin.stats.rejected = 5, 2
    kinds, found = read(admin)
    assert kinds == {
        "llm_health_admin_calls_total": "counter",
        "llm_health_admin_unauthenticated_total": "counter",
    }
    assert value(found, "llm_health_admin_calls_total") == 5
    assert value(found, "llm_health_admin_unauthenticated_total") == 2


def test_alerts_sum_every_webhook() -> None:
    alerts = component(runtime(), "alerts")
    alerts.events, alerts.deduplicated, alerts.observer_errors = 9, 4, 1
    first, second = alerts.webhooks
    first.stats.sent, second.stats.sent = 2, 3
    first.stats.dropped, second.stats.rate_limited, second.stats.summaries = 1, 6, 7
    kinds, found = read(alerts)
    assert set(kinds.values()) == {"gauge"} and len(kinds) == 9
    expected = {"events": 9, "deduplicated": 4, "observer_errors": 1, "sent": 5, "failed": 0}
    expected |= {"retried": 0, "dropped": 1, "rate_limited": 6, "summaries": 7}
    assert {n: value(found, f"llm_health_alerts_{n}") for n in expected} == expected


def test_authz_decisions_are_labelled_and_problems_show_once_counted() -> None:
    """Counted by the admission process (server.authz: its own process), taken from its
    counters report as the runtime takes it off the pipe."""
    authz = component(runtime(), "authz")
    counters = AuthzCounters()
    kinds, found = read(authz)
    assert "llm_health_authz_decisions_total" not in kinds  # no decision yet
    assert not any("problems" in name for name in kinds)
    counters.checks = 6
    counters.decisions["llama"]["ok"] = 4
    counters.decisions["(none)"]["no_cluster"] = 2
    counters.problems["no_cluster"] = 2
    counters.probe_headers_stripped = 1
    counters.observe(0.001)
    counters.observe(0.0005)
    authz.process.take(("counters", counters.state(), 3, 0))
    kinds, found = read(authz)
    assert kinds["llm_health_authz_decisions_total"] == "counter"
    assert kinds["llm_health_authz_checks"] == "gauge"
    decisions = "llm_health_authz_decisions_total"
    assert value(found, decisions, cluster="llama", rule="ok") == 4
    assert value(found, decisions, cluster="(none)", rule="no_cluster") == 2
    assert value(found, "llm_health_authz_checks") == 6
    assert value(found, "llm_health_authz_problems_no_cluster") == 2
    assert value(found, "llm_health_authz_probe_headers_stripped") == 1
    assert value(found, "llm_health_authz_latency_s_count") == 2
    assert value(found, "llm_health_authz_latency_s_sum") == 0.0015
    assert value(found, "llm_health_authz_enabled") == 1
    assert value(found, "llm_health_authz_shed_below") == 0.5
    assert value(found, "llm_health_authz_own_server_serving") == 0  # server.authz, not started
    assert value(found, "llm_health_authz_own_server_restarts") == 0
    assert value(found, "llm_health_authz_view_rebuilds") == 3


async def hold_one_down_verdict(hds: Any) -> None:
    """Two Envoys say both endpoints are down (each has seen them up first: past the
    first-check grace); unauthenticated, the cap holds one of the two down verdicts."""
    fleet = hds.service.fleet
    for stream, node in enumerate(("envoy-1", "envoy-2")):
        fleet.open_stream(stream, node, [hds.service.settings.protocol], NOW)
        for said in (Said.HEALTHY, Said.UNHEALTHY):
            entries = [ReportEntry("llama", "127.0.0.1", port, said) for port in (8001, 8002)]
            fleet.report(stream, entries, NOW)
    await hds.sync()


async def test_hds() -> None:
    hds = component(runtime("hds: {quorum: 2}\n"), "hds")
    await hold_one_down_verdict(hds)
    stats = hds.service.stats
    stats.streams_total, stats.streams_open, stats.reports = 3, 1, 7
    stats.entries.counted, stats.entries.first_check = 5, 2
    kinds, found = read(hds)
    assert kinds["llm_health_hds_stats_streams_total"] == "counter"
    assert kinds["llm_health_hds_stats_reports"] == "gauge"
    assert value(found, "llm_health_hds_stats_streams_total") == 3
    assert value(found, "llm_health_hds_stats_streams_open") == 1
    assert value(found, "llm_health_hds_stats_reports") == 7
    assert value(found, "llm_health_hds_stats_entries_counted") == 5
    assert value(found, "llm_health_hds_stats_entries_first_check") == 2
    assert value(found, "llm_health_hds_held_now") == 1
    assert value(found, "llm_health_hds_quorum") == 2
    assert value(found, "llm_health_hds_checkers_per_endpoint") == 2
    assert "llm_health_hds_quorum" not in read(component(runtime(), "hds"))[0]  # unset


class _Catalog:
    def __init__(self) -> None:
        self.discovered: dict[str, Any] = {}

    def on_targets(self, listener: Any) -> None: ...


async def test_discovery_labels_clusters() -> None:
    rt = runtime()
    discovery = DiscoveryComponent(lambda: (None, {}), _Catalog(), rt.control)  # type: ignore[arg-type]
    kinds, found = read(discovery)
    assert not any("cluster_" in name for name in kinds)  # no cluster watched
    assert value(found, "llm_health_discovery_clusters_watched") == 0
    idle = asyncio.create_task(asyncio.sleep(3600))
    for name, (endpoints, resolutions, failures, failing) in {
        "llama-70b": (4, 10, 3, True),
        "mixtral": (2, 2, 0, False),
    }.items():
        watcher = Watcher(name, DiscoveryConfig(dns=f"{name}.example", port=8000), None, None, None)  # type: ignore[arg-type]
        watcher.stats.endpoints, watcher.stats.resolutions = endpoints, resolutions
        watcher.stats.failures = failures
        watcher.stats.failing_since = NOW if failing else None
        discovery._watchers[name] = (watcher, idle)
    kinds, found = read(discovery)
    idle.cancel()
    assert kinds["llm_health_discovery_cluster_resolutions_total"] == "counter"
    assert kinds["llm_health_discovery_cluster_failing"] == "gauge"
    for name, expected in {
        "llm_health_discovery_cluster_endpoints": {"llama-70b": 4, "mixtral": 2},
        "llm_health_discovery_cluster_failing": {"llama-70b": 1, "mixtral": 0},
        "llm_health_discovery_cluster_resolutions_total": {"llama-70b": 10, "mixtral": 2},
        "llm_health_discovery_cluster_failures_total": {"llama-70b": 3, "mixtral": 0},
    }.items():
        assert {c: value(found, name, cluster=c) for c in expected} == expected
    assert value(found, "llm_health_discovery_clusters_watched") == 2
    assert value(found, "llm_health_discovery_clusters_failing") == 1
    assert value(found, "llm_health_discovery_resolutions_total") == 12
    assert value(found, "llm_health_discovery_failures_total") == 3
    # Cluster names never become parts of metric names.
    assert not any("mixtral" in name or "llama" in name for name in kinds)


def test_remediation() -> None:
    remediation = component(runtime(), "remediation")
    remediation.counters.runs_total, remediation.counters.refused_total = 2, 5
    remediation.counters.killed_total = 1
    kinds, found = read(remediation)
    assert kinds["llm_health_remediation_runs_total"] == "counter"
    assert kinds["llm_health_remediation_rules"] == "gauge"
    assert value(found, "llm_health_remediation_runs_total") == 2
    assert value(found, "llm_health_remediation_refused_total") == 5
    assert value(found, "llm_health_remediation_killed_total") == 1
    assert value(found, "llm_health_remediation_succeeded_total") == 0
    assert value(found, "llm_health_remediation_rules") == 1
    assert value(found, "llm_health_remediation_dry_run") == 0
    assert remediation.status()["runs_total"] == 2  # /status: the same counters, same keys


def request(address: str, status: int, duration_s: float) -> Request:
    return Request("llama", address, status, status >= 500, duration_s, 0.01, 1, ())


async def test_traffic_quality_per_endpoint_and_cluster() -> None:
    traffic = component(runtime(), "traffic")
    for status in (200, 200, 200, 503):
        traffic.record(request(A, status, 0.2), NOW)
    traffic.record(request("10.9.9.9:1", 200, 0.2), NOW)  # not on the board
    traffic.streams.stats.entries_total, traffic.streams.stats.streams_open = 6, 1
    await traffic.judge()  # A: 25 % errors over max_error_rate: limited; B: no traffic
    kinds, found = read(traffic)
    assert kinds["llm_health_traffic_entries_total"] == "counter"
    assert kinds["llm_health_traffic_streams_open"] == "gauge"
    assert kinds["llm_health_quality_requests"] == "gauge"
    assert value(found, "llm_health_traffic_entries_total") == 6
    assert value(found, "llm_health_traffic_unknown_endpoint_total") == 1
    assert value(found, "llm_health_traffic_limited_now") == 1
    a, b = {"cluster": "llama", "endpoint": A}, {"cluster": "llama", "endpoint": B}
    assert value(found, "llm_health_quality_requests", **a) == 4
    assert value(found, "llm_health_quality_error_rate", **a) == 0.25
    assert value(found, "llm_health_quality_requests", **b) == 0
    assert value(found, "llm_health_quality_limited", **a) == 1
    assert value(found, "llm_health_quality_limited", **b) == 0
    assert value(found, "llm_health_quality_ttft_p50_seconds", **a) is None  # no TTFT yet
    assert value(found, "llm_health_cluster_quality_requests", cluster="llama") == 4
    assert value(found, "llm_health_cluster_quality_error_rate", cluster="llama") == 0.25
    duration = value(found, "llm_health_quality_duration_p95_seconds", **a)
    status = traffic.status()["endpoints"][f"llama/{A}"]
    assert duration is not None and duration == status["p95_duration_s"]


def test_engines_load_per_endpoint() -> None:
    checks = component(runtime(), "engines")
    checks.book.counters.passes_total, checks.book.counters.metrics_reads_total = 3, 8
    state = checks.book.endpoint(f"llama/{A}")
    state.reading = Reading().read(EngineLoad("vllm", waiting=3.0, running=2.0, kv_cache=0.5))
    state.limit = "queue 3 >= 2"
    checks.engines[f"llama/{A}"] = "vllm"
    kinds, found = read(checks)
    assert kinds["llm_health_engines_passes_total"] == "counter"
    assert kinds["llm_health_engine_requests_waiting"] == "gauge"
    assert value(found, "llm_health_engines_passes_total") == 3
    assert value(found, "llm_health_engines_metrics_reads_total") == 8
    assert value(found, "llm_health_engines_saturated_now") == 1
    a = {"cluster": "llama", "endpoint": A, "engine": "vllm"}
    assert value(found, "llm_health_engine_requests_waiting", **a) == 3
    assert value(found, "llm_health_engine_requests_running", **a) == 2
    assert value(found, "llm_health_engine_kv_cache_usage", **a) == 0.5
    assert value(found, "llm_health_engine_saturated", **a) == 1


def test_fleet() -> None:
    fleet = component(runtime(), "fleet")
    fleet.counters["takeovers_total"], fleet.counters["verdicts_published_total"] = 2, 7
    kinds, found = read(fleet)
    assert kinds["llm_health_fleet_takeovers_total"] == "counter"
    assert kinds["llm_health_fleet_fallback"] == "gauge"
    assert value(found, "llm_health_fleet_fallback") == 1  # starting: not sharing yet
    assert value(found, "llm_health_fleet_takeovers_total") == 2
    assert value(found, "llm_health_fleet_verdicts_published_total") == 7
    assert "llm_health_fleet_epoch" not in kinds and "llm_health_fleet_owned_endpoints" not in kinds
    roster = fleet.roster
    roster.mode, roster.epoch, roster.owned = "sharing", 4, frozenset({f"llama/{A}"})
    kinds, found = read(fleet)
    assert value(found, "llm_health_fleet_fallback") == 0
    assert value(found, "llm_health_fleet_epoch") == 4
    assert value(found, "llm_health_fleet_owned_endpoints") == 1
