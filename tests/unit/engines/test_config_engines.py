"""Config: probe.verify, probe.engine_metrics, probe.engine (docs/design.md §14)."""

from __future__ import annotations

import pytest

from llm_health.config import parse_config
from llm_health.engines.settings import ClusterChecks
from llm_health.errors import ConfigError

BASE = """
probe:
  verify: {{every: 10s, prompt: "2 + 2 =", max_tokens: 2}}
{top}
clusters:
  - name: a
    model: m
    endpoints: [{{address: "127.0.0.1:8000"}}]
  - name: b
    probe: {cluster}
    endpoints: [{{address: "127.0.0.1:8001"}}]
"""


def checks(top: str = "", cluster: str = "{}") -> dict[str, ClusterChecks]:
    """Per cluster, the engine checks in force (what the engines component receives)."""
    config = parse_config(BASE.format(top=top, cluster=cluster), "engines.yaml", {})
    return config.engine_checks()


def test_defaults_verify_every_30s_and_read_metrics_every_second() -> None:
    config = parse_config(
        'clusters: [{name: a, endpoints: [{address: "127.0.0.1:1"}]}]', "d.yaml", {}
    )
    verify, metrics = config.engine_checks()["a"]
    assert verify is not None and verify.every == 30.0
    assert verify.prompt == "The capital of France is" and verify.max_tokens == 3
    assert verify.expect is None and verify.pattern is None
    assert metrics is not None and metrics.path == "/metrics"
    assert (metrics.interval, metrics.queue_threshold) == (1.0, 5.0)
    assert metrics.kv_cache_threshold == 0.8
    (target,) = config.probe_targets()
    assert target.engine == "auto" and target.cache_bust == "auto"
    assert target.models_path == "/v1/models"


def test_a_cluster_overrides_one_key_of_a_section_and_inherits_the_rest() -> None:
    found = checks(cluster='{verify: {expect: "Paris"}, engine_metrics: {queue_threshold: 9}}')
    (a, _), (b, b_metrics) = found["a"], found["b"]
    assert a is not None and b is not None and b_metrics is not None
    assert a.expect is None and a.every == 10.0
    assert b.pattern is not None and b.pattern.pattern == "Paris"
    assert b.prompt == "2 + 2 =" and b.every == 10.0
    assert b_metrics.queue_threshold == 9 and b_metrics.interval == 1.0


def test_null_turns_a_check_off_for_one_cluster() -> None:
    found = checks(cluster="{engine_metrics: {path: null}, verify: {enabled: false}}")
    assert found["b"] == (None, None)
    assert None not in found["a"]
    off = checks(top="  engine_metrics: null")
    assert off["a"][1] is None and off["b"][1] is None


@pytest.mark.parametrize(
    ("cluster", "path", "detail"),
    [
        ('{verify: {expect: "(unclosed"}}', "verify.expect", "not a regular expression"),
        ("{verify: {max_tokens: 0}}", "verify.max_tokens", "greater than or equal to 1"),
        ("{verify: {every: 0.5s}}", "verify.every", "greater than or equal to 1"),
        ("{engine_metrics: {kv_cache_threshold: 1.5}}", "kv_cache_threshold", "less than"),
        ("{engine_metrics: {path: metrics}}", "engine_metrics.path", ""),
        ("{engine: vllm2}", "engine", "is not one of"),
        ("{verify: {expekt: x}}", "verify.expekt", "unknown key"),
    ],
)
def test_bad_values_are_named(cluster: str, path: str, detail: str) -> None:
    with pytest.raises(ConfigError) as info:
        checks(cluster=cluster)
    (message,) = info.value.messages
    assert path in message and detail in message, message
