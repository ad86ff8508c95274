"""/metrics content from a Runtime that is built but not started: observers fed by hand,
the exposition parsed back with prometheus_client's own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from llm_health import __version__
from llm_health.app.assemble import build_runtime
from llm_health.app.runtime import Runtime
from llm_health.config import parse_config
from llm_health.model.causes import Cause
from llm_health.model.machine import Transition
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import EndpointHealth, State
from llm_health.ops.metrics import RuntimeMetrics
from llm_health.xds.stream import XdsStats

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
CONFIG = f"""
probe: {{headers: {{Authorization: "Bearer sk-secret-in-headers"}}}}
clusters:
  - name: llama
    endpoints: [{{address: "{A}"}}, {{address: "{B}", weight: 50}}]
"""


def runtime() -> Runtime:
    return build_runtime(parse_config(CONFIG, "t.yaml", {}))


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


async def scrape(rt: Runtime) -> tuple[dict[Any, float], str]:
    body, content_type = await rt.metrics.exposition()
    assert content_type.startswith("text/plain")
    text = body.decode()
    return samples(text), text


def feed(rt: Runtime, address: str, result: ProbeResult) -> None:
    """What the board control's probe observers receive for a trusted probe."""
    (target,) = [t for t in rt.targets if t.address == address]
    rt.metrics.on_probe(target.cluster, target.address, result)


async def test_probe_histograms_and_outcomes() -> None:
    rt = runtime()
    feed(rt, A, ProbeResult(Outcome.FAST, 0.0, ttft_ms=41.0, connect_ms=0.4, headers_ms=2.0))
    feed(rt, A, ProbeResult(Outcome.SLOW, 0.0, ttft_ms=450.0, connect_ms=0.3, headers_ms=3.0))
    feed(rt, B, ProbeResult(Outcome.TIMEOUT, 0.0, connect_ms=0.5, detail="no first token"))
    found, text = await scrape(rt)
    ep = {"cluster": "llama", "endpoint": A}
    assert value(found, "llm_health_probe_ttft_seconds_count", **ep) == 2
    assert value(found, "llm_health_probe_ttft_seconds_bucket", **ep, le="0.025") == 0
    assert value(found, "llm_health_probe_ttft_seconds_bucket", **ep, le="0.05") == 1
    assert value(found, "llm_health_probe_ttft_seconds_bucket", **ep, le="0.5") == 2
    assert abs(value(found, "llm_health_probe_ttft_seconds_sum", **ep) - 0.491) < 1e-9  # type: ignore[operator]
    assert value(found, "llm_health_probe_connect_seconds_count", **ep) == 2
    assert value(found, "llm_health_probe_headers_seconds_count", **ep) == 2
    # a timeout has no TTFT: no observation, but a connect time and an outcome
    assert value(found, "llm_health_probe_ttft_seconds_count", cluster="llama", endpoint=B) is None
    assert value(found, "llm_health_probe_connect_seconds_count", cluster="llama", endpoint=B) == 1
    assert value(found, "llm_health_probes_total", **ep, outcome="fast") == 1
    assert value(found, "llm_health_probes_total", **ep, outcome="slow") == 1
    assert (
        value(found, "llm_health_probes_total", cluster="llama", endpoint=B, outcome="timeout") == 1
    )
    assert "no first token" not in text and "sk-secret" not in text
    assert "_created" not in text


async def test_transitions_counted_by_reason_class() -> None:
    rt = runtime()
    healthy = EndpointHealth(State.HEALTHY, 1.0, "ready", 0.0, 1)
    degraded = EndpointHealth(State.DEGRADED, 2.0, "timeout: no first token in 800 ms", 0.0, 1)
    timeout = ProbeResult(Outcome.TIMEOUT, 0.0)
    rt.control.notify(
        "llama", A, Transition(State.HEALTHY, degraded, changed=True, cause=Cause.TIMEOUT), timeout
    )
    rt.control.notify("llama", A, Transition(State.DEGRADED, degraded, changed=False), timeout)
    rt.control.notify("llama", A, Transition(State.DEGRADED, healthy, changed=True), None)
    found, text = await scrape(rt)
    labels = {"cluster": "llama", "endpoint": A}
    name = "llm_health_state_transitions_total"
    assert (
        value(found, name, **labels, **{"from": "healthy", "to": "degraded", "reason": "timeout"})
        == 1
    )
    assert (
        value(found, name, **labels, **{"from": "degraded", "to": "healthy", "reason": "other"})
        == 1
    )
    assert (
        sum(v for (n, _), v in found.items() if n == name) == 2
    )  # the unchanged one is not counted
    assert "no first token in 800 ms" not in text  # free text never becomes a label


async def test_state_weight_and_prober_series_read_the_board() -> None:
    rt = runtime()
    (target,) = [t for t in rt.targets if t.address == B]
    rt.on_result(target, ProbeResult(Outcome.FAST, 0.0, ttft_ms=10.0))
    rt.control.board.set_override("llama", A, State.DRAINING, until=1e12, reason="m")
    found, _ = await scrape(rt)
    a, b = {"cluster": "llama", "endpoint": A}, {"cluster": "llama", "endpoint": B}
    assert value(found, "llm_health_endpoint_state", **a, state="draining") == 1
    assert value(found, "llm_health_endpoint_state", **a, state="starting") == 0
    assert value(found, "llm_health_endpoint_state", **b, state="healthy") == 1
    assert sum(v for (n, ls), v in found.items() if n == "llm_health_endpoint_state") == 2
    assert value(found, "llm_health_endpoint_weight", **b) == 50
    assert value(found, "llm_health_endpoint_override", **a) == 1
    assert value(found, "llm_health_cluster_endpoints", cluster="llama", state="healthy") == 1
    assert value(found, "llm_health_probes_completed_total") == 1
    assert value(found, "llm_health_xds_nacks_total", variant="ads_sotw", type="eds") == 0
    assert value(found, "llm_health_loop_lag_seconds") is not None
    assert value(found, "llm_health_admin_calls_total") == 0  # a component's status()
    assert value(found, "process_resident_memory_bytes")


async def test_series_of_removed_endpoints_are_dropped() -> None:
    rt = runtime()
    feed(rt, B, ProbeResult(Outcome.FAST, 0.0, ttft_ms=10.0, connect_ms=1.0, headers_ms=2.0))
    found, _ = await scrape(rt)
    assert value(found, "llm_health_probe_ttft_seconds_count", cluster="llama", endpoint=B) == 1
    smaller = parse_config(CONFIG.replace(f', {{address: "{B}", weight: 50}}', ""), "t.yaml", {})
    rt.control.board.apply_specs(smaller.cluster_specs(), now=0.0)
    rt.control.board.expire(now=1e9)
    found, text = await scrape(rt)
    assert B not in text
    assert value(found, "llm_health_endpoint_weight", cluster="llama", endpoint=A) == 100


async def test_component_families_come_from_metrics_never_from_status() -> None:
    """A renamed /status key renames no series: /metrics reads only ``metrics()``."""
    rt = runtime()
    for component in rt.components:
        component.status = lambda: {"renamed_total": 5, "calls_total": 9}  # type: ignore[method-assign]
    found, text = await scrape(rt)
    assert value(found, "llm_health_admin_calls_total") == 0
    assert "renamed" not in text and value(found, "llm_health_hds_enabled") == 1


class Source:
    def metrics(self) -> list[Metric]:
        return [GaugeMetricFamily("llm_health_test_things", "Things.", value=3)]


async def test_every_source_is_collected_as_it_is() -> None:
    rt = runtime()
    metrics = RuntimeMetrics(rt.control, rt.control.stats, XdsStats(), [Source(), Source()])
    body, _ = await metrics.exposition()
    text = body.decode()
    assert text.count("# TYPE llm_health_test_things gauge") == 2  # not merged, not renamed
    assert "llm_health_admin_" not in text  # only the sources given
    assert value(samples(text), "llm_health_build_info", version=__version__) == 1


async def test_interim_responses_are_counted_per_endpoint() -> None:
    """1xx responses a probe read past (``ProbeResult.interim``): a counter per endpoint,
    never a verdict of their own."""
    rt = runtime()
    feed(rt, A, ProbeResult(Outcome.FAST, 0.0, ttft_ms=41.0, interim=2))
    feed(rt, A, ProbeResult(Outcome.FAST, 0.0, ttft_ms=42.0, interim=1))
    feed(rt, B, ProbeResult(Outcome.FAST, 0.0, ttft_ms=43.0))
    found, text = await scrape(rt)
    name = "llm_health_probe_interim_responses_total"
    assert value(found, name, cluster="llama", endpoint=A) == 3
    assert value(found, name, cluster="llama", endpoint=B) is None
    assert "# TYPE llm_health_probe_interim_responses counter" in text
