"""Config: probe.verify, probe.engine_metrics, probe.engine (docs/design.md §14)."""

from __future__ import annotations

import pytest

from llm_health.config import parse_config
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


def targets(top: str = "", cluster: str = "{}") -> dict[str, object]:
    config = parse_config(BASE.format(top=top, cluster=cluster), "engines.yaml", {})
    return {t.cluster: t for t in config.probe_targets()}


def test_defaults_verify_every_30s_and_read_metrics_every_second() -> None:
    config = parse_config(
        'clusters: [{name: a, endpoints: [{address: "127.0.0.1:1"}]}]', "d.yaml", {}
    )
    (target,) = config.probe_targets()
    assert target.verify is not None and target.verify.every_s == 30.0
    assert target.verify.prompt == "The capital of France is" and target.verify.max_tokens == 3
    assert target.verify.expect is None
    assert target.metrics is not None and target.metrics.path == "/metrics"
    assert (target.metrics.interval_s, target.metrics.queue_threshold) == (1.0, 5.0)
    assert target.metrics.kv_cache_threshold == 0.8
    assert target.engine == "auto" and target.cache_bust == "auto"
    assert target.models_path == "/v1/models"


def test_a_cluster_overrides_one_key_of_a_section_and_inherits_the_rest() -> None:
    found = targets(cluster='{verify: {expect: "Paris"}, engine_metrics: {queue_threshold: 9}}')
    a, b = found["a"], found["b"]
    assert a.verify.expect is None and a.verify.every_s == 10.0  # type: ignore[attr-defined]
    assert b.verify.expect.pattern == "Paris"  # type: ignore[attr-defined]
    assert b.verify.prompt == "2 + 2 =" and b.verify.every_s == 10.0  # type: ignore[attr-defined]
    assert b.metrics.queue_threshold == 9 and b.metrics.interval_s == 1.0  # type: ignore[attr-defined]


def test_null_turns_a_check_off_for_one_cluster() -> None:
    found = targets(cluster="{engine_metrics: {path: null}, verify: {enabled: false}}")
    assert found["b"].metrics is None and found["b"].verify is None  # type: ignore[attr-defined]
    assert found["a"].metrics is not None and found["a"].verify is not None  # type: ignore[attr-defined]
    off = targets(top="  engine_metrics: null")
    assert off["a"].metrics is None and off["b"].metrics is None  # type: ignore[attr-defined]


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
        targets(cluster=cluster)
    (message,) = info.value.messages
    assert path in message and detail in message, message
