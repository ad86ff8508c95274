"""deploy/prometheus: the alerting rules and their promtool unit tests.

- the real ``promtool`` (Debian's prometheus package; ``make test`` installs it through
  ``make tools``) checks the rule file (``check rules``, lint fatal) and runs the unit
  tests in llm-health-rules.test.yaml (``test rules``); a missing promtool fails here,
  it is never skipped;
- every alert has ``for:``, a severity, summary/description/runbook annotations, and a
  unit test where it fires and one where it stays silent;
- every ``llm_health_*`` name in a rule expression is a series a real plugin exports:
  a simulator, a Redis (fleet mode), a loopback DNS server (discovery) and ``llm-health
  serve`` with an alert webhook are started, and its ``/metrics`` is scraped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dns_server import loopback_dns
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "llm-health-rules.yaml"
RULE_TESTS = RULES_DIR / "llm-health-rules.test.yaml"
SEVERITIES = {"warning", "critical"}
ANNOTATIONS = {"summary", "description", "runbook"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s", re.MULTILINE)
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found on PATH: run `make tools` (installs Debian's `prometheus` "
            "package, which ships /usr/bin/promtool; `make test` does it first)",
            pytrace=False,
        )
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60
    )


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The ``llm_health_*`` metric names in a PromQL expression: string literals (label
    values, which may look like names) are dropped, then every identifier is a candidate.
    Label names, functions and keywords never start with ``llm_health_``."""
    code = _STRING.sub(" ", expr)
    return {name for name in _IDENTIFIER.findall(code) if name.startswith("llm_health_")}


def exposed_names(text: str) -> set[str]:
    """The series names Prometheus stores from a text exposition: every sample's name,
    plus the names a declared family yields even with no sample yet (a histogram's
    ``_bucket``/``_sum``/``_count``, a counter's ``_total``)."""
    names = set(_SAMPLE.findall(text))
    for family, kind in _TYPE.findall(text):
        if kind == "histogram":
            names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        elif kind == "counter":
            names.add(family if family.endswith("_total") else f"{family}_total")
        elif kind == "summary":
            names |= {family, f"{family}_sum", f"{family}_count"}
        else:
            names.add(family)
    return names


# --- promtool -----------------------------------------------------------------------------


def test_promtool_accepts_the_rule_file() -> None:
    result = run_promtool("check", "rules", "--lint=all", "--lint-fatal", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_the_promtool_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests bite: with the unhealthy alert's ``for`` shortened they fail."""
    text = RULES.read_text(encoding="utf-8")
    broken = re.sub(r'(state="unhealthy"\}\) == 1\n\s+for: )5m', r"\g<1>1m", text, count=1)
    assert broken != text
    (tmp_path / RULES.name).write_text(broken, encoding="utf-8")
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "LLMHealthEndpointUnhealthy" in result.stdout + result.stderr


# --- the rules, statically ----------------------------------------------------------------


def test_every_alert_has_for_severity_and_annotations() -> None:
    rules = alert_rules()
    assert len(rules) >= 10
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert set(rule["annotations"]) == ANNOTATIONS, rule["alert"]
        runbook = rule["annotations"]["runbook"]
        assert "\n" not in runbook and len(runbook) > 20, rule["alert"]


def test_the_required_alerts_exist() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    wanted = {
        "LLMHealthEndpointUnhealthy": "llm_health_endpoint_state",
        "LLMHealthClusterCapacityLow": "llm_health_cluster_endpoints",
        "LLMHealthNoXdsStream": "llm_health_xds_streams_open",
        "LLMHealthXdsNacks": "llm_health_xds_nacks_total",
        "LLMHealthProbesIgnoredLoopLag": "llm_health_probes_ignored_loop_lag_total",
        "LLMHealthFleetFallback": "llm_health_fleet_fallback",
        "LLMHealthAlertDeliveryFailed": "llm_health_alerts_failed",
        "LLMHealthAlertsDropped": "llm_health_alerts_dropped",
        "LLMHealthAuthzNotServing": "llm_health_authz_own_server_serving",
        "LLMHealthDown": "up",
    }
    for alert, metric in wanted.items():
        assert alert in exprs, alert
        assert re.search(rf"\b{metric}\b", exprs[alert]), (alert, exprs[alert])


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    cases = [
        case
        for group in yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
        for case in group.get("alert_rule_test", [])
    ]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown silent"
    assert (firing | silent) - names == set(), "tests of alerts that do not exist"


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'sum by (cluster) (llm_health_cluster_endpoints{state=~"llm_health_not_a_metric"})\n'
        "  / on (cluster) rate(llm_health_xds_nacks_total[5m]) > 0 and up{job='llm_health_x'}"
    )
    assert metric_names(expr) == {"llm_health_cluster_endpoints", "llm_health_xds_nacks_total"}


def test_exposed_names_follow_the_text_format() -> None:
    text = (
        "# TYPE llm_health_probe_ttft_seconds histogram\n"
        "# TYPE llm_health_probes counter\n"
        'llm_health_probes_total{cluster="a",endpoint="b",outcome="fast"} 3\n'
        "# TYPE llm_health_fleet_fallback gauge\n"
        "llm_health_fleet_fallback 0.0\n"
    )
    names = exposed_names(text)
    assert {
        "llm_health_probe_ttft_seconds_bucket",
        "llm_health_probe_ttft_seconds_count",
        "llm_health_probes_total",
        "llm_health_fleet_fallback",
    } <= names
    # what Prometheus never stores: a histogram's or a counter's bare family name
    assert "llm_health_probe_ttft_seconds" not in names
    assert "llm_health_probes" not in names


# --- against a real plugin ----------------------------------------------------------------


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a running plugin with every optional part on: fleet mode (a real
    Redis), DNS discovery (a loopback DNS server), an alert webhook, ext_authz on its own
    port (``server.authz``); one static and one
    discovered cluster in front of a simulator. Everything is stopped afterwards."""
    workdir = tmp_path_factory.mktemp("prometheus-rules")
    redis = RedisServer(workdir / "redis").start()
    sim: SimProcess | None = None
    plugin: PluginProcess | None = None
    try:
        with loopback_dns() as dns:
            sim = SimProcess(workdir, "backend").wait_up()
            dns.set_a("llm.test", ["127.0.0.1"])
            settings = {
                "server": {"authz": f"127.0.0.1:{free_port()}"},
                "probe": {"model": "sim-model", "interval": "1s"},
                "dns": {"nameservers": [dns.nameserver], "timeout": "500ms"},
                "fleet": {"redis": redis.url, "name": "rules-test"},
                "alerts": {
                    "webhooks": [{"url": f"http://127.0.0.1:{free_port()}/hook", "on": ["fatal"]}]
                },
                "clusters": [
                    {"name": "static", "endpoints": [{"address": sim.address}]},
                    {"name": "discovered", "discovery": {"dns": "llm.test", "port": sim.port}},
                ],
            }
            plugin = PluginProcess(workdir / "plugin", settings).start().wait_ready()
            running = plugin

            def settled() -> bool:
                status = running.status()
                discovered = status["discovery"]["clusters"]["discovered"]
                return (
                    status["fleet"]["mode"] == "sharing"
                    and discovered["resolutions"] >= 1
                    and all(c["warm"] and c["endpoints"] for c in status["clusters"])
                )

            wait_until(settled, 20, "fleet sharing, discovery resolved, every cluster warm")
            url = f"http://127.0.0.1:{plugin.http_port}/metrics"
            with _OPENER.open(url, timeout=5) as response:
                body = response.read().decode()
            yield body
    finally:
        if plugin is not None:
            plugin.stop()
        if sim is not None:
            sim.stop()
        redis.stop()


def test_the_scrape_has_every_part_the_rules_watch(scrape: str) -> None:
    names = exposed_names(scrape)
    for family in (
        "fleet_fallback",
        "alerts_failed",
        "discovery_cluster_failing",
        "authz_own_server_serving",
    ):
        assert f"llm_health_{family}" in names, family


def test_every_metric_in_the_rules_is_exported(scrape: str) -> None:
    exported = exposed_names(scrape)
    used = {name for rule in alert_rules() for name in metric_names(rule["expr"])}
    assert len(used) >= 10
    assert sorted(used - exported) == []
    # the check bites: a family name Prometheus never stores is not "exported"
    assert "llm_health_probes" not in exported
    assert "llm_health_xds_nacks" not in exported
