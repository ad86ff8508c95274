"""deploy/grafana/llm-health.json: the Grafana dashboard is importable and every metric its
PromQL names is one the plugin really exports.

- Offline: the JSON's structure (template variables, panels with targets, unique ids, no
  overlapping panels, no hard-coded datasource UID, the variables applied everywhere).
- Against real processes, loopback only: a simulator, a Redis (fleet mode), a DNS server
  (discovery) and the plugin (``llm-health serve``) with a cluster that has capacity, a
  cluster that has none, and a discovered one; a few ext_authz checks make every admission
  rule the dashboard plots count once. ``/metrics`` is scraped and parsed with
  ``prometheus_client``'s parser: the exported names are the *sample* names (a histogram's
  ``_bucket``/``_sum``/``_count``, a counter's ``_total``), the names PromQL sees.
  Every ``llm_health_*`` identifier in a query must be one of them, and every string
  literal that mentions ``llm_health_`` (a ``__name__=~`` matcher) must, as a fully
  anchored regex, match at least one of them.
- With the ``prometheus`` binary (``make tools`` installs Debian's package; skipped
  without it): a real Prometheus on loopback scrapes that plugin, and every panel query,
  with Grafana's variables filled in, evaluates without error and returns series.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.dns_server import loopback_dns
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import ROOT, PluginProcess, SimProcess
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

DASHBOARD = ROOT / "deploy" / "grafana" / "llm-health.json"
DATASOURCE = "${datasource}"

# A metric name in PromQL: an identifier not glued to a longer one (``:`` is legal in
# recording-rule names). String literals are removed first: names in them are regexes.
METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])llm_health_[a-z0-9_]+(?![A-Za-z0-9_:])")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])(llm_health_[a-z0-9_]+)?\s*(\{[^}]*\})?")
# $1, $2 ... are label_replace references, not Grafana variables.
GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[(\w+)\]\]")

# What the dashboard must keep showing (a panel dropped by an edit fails here).
REQUIRED = {
    "llm_health_cluster_endpoints",
    "llm_health_endpoint_state",
    "llm_health_endpoint_weight",
    "llm_health_probe_ttft_seconds_bucket",
    "llm_health_probes_total",
    "llm_health_xds_pushes_total",
    "llm_health_xds_acks_total",
    "llm_health_xds_nacks_total",
    "llm_health_authz_checks",
    "llm_health_authz_decisions_total",
    "llm_health_fleet_fallback",
    "llm_health_fleet_members",
    "llm_health_fleet_owned_endpoints",
    "llm_health_discovery_cluster_endpoints",
    "llm_health_discovery_cluster_failing",
    "llm_health_loop_lag_seconds",
}
# ext_authz decisions: llm_health_authz_decisions_total{cluster,rule}.
REQUIRED_DECISION_RULES = {"ok", "priority_routed", "no_capacity", "shed", "probe_denied"}

# --------------------------------------------------------------------------- the dashboard


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, and the panels inside collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p.get("type") != "row"]


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variable_query(variable: dict[str, Any]) -> str:
    """A query variable's query: a plain string (older Grafana) or ``{"query": ...}``."""
    query = variable.get("query", "")
    return str(query["query"] if isinstance(query, dict) else query)


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [
        (f"panel {p['id']} {p['title']!r} target {t['refId']}", t["expr"])
        for p in graph_panels(dashboard)
        for t in p.get("targets", [])
    ]


def all_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Panel targets, query variables and annotations: everything sent to Prometheus."""
    queries = panel_queries(dashboard)
    queries += [
        (f"variable {name}", variable_query(v))
        for name, v in variables(dashboard).items()
        if v["type"] == "query"
    ]
    queries += [
        (f"annotation {a['name']!r}", a["expr"])
        for a in dashboard.get("annotations", {}).get("list", [])
        if "expr" in a
    ]
    return queries


# --------------------------------------------------------------------------- the checker


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    return body if literal[0] == "`" else codecs.decode(body, "unicode_escape")


def references(promql: str) -> tuple[set[str], set[str]]:
    """(metric names, name regexes) a query refers to: ``llm_health_*`` identifiers outside
    string literals, and string literals that mention ``llm_health_`` (``__name__=~``)."""
    regexes = {_unquote(s) for s in STRING.findall(promql) if "llm_health_" in s}
    names = set(METRIC_NAME.findall(STRING.sub('""', promql)))
    return names, regexes


def problems(promql: str, exported: set[str]) -> list[str]:
    """Why a query does not fit the exported metrics (empty: it does)."""
    names, regexes = references(promql)
    found = [f"{name} is not exported" for name in sorted(names - exported)]
    for regex in sorted(regexes):
        # PromQL regexes are fully anchored, like re.fullmatch.
        if not any(re.fullmatch(regex, name) for name in exported):
            found.append(f"regex {regex!r} matches no exported metric")
    if not names and not regexes:
        found.append("names no llm_health_ metric")
    return found


def dashboard_problems(dashboard: dict[str, Any], exported: set[str]) -> list[str]:
    return [
        f"{where}: {problem}"
        for where, promql in all_queries(dashboard)
        for problem in problems(promql, exported)
    ]


def selectors(promql: str) -> Iterator[tuple[str | None, str]]:
    """(metric name or None, label matchers text) of each ``name{...}`` / ``{...}``."""
    for match in SELECTOR.finditer(promql):
        name, braces = match.group(1), match.group(2)
        if name or braces:
            yield name, braces or ""


# --------------------------------------------------------------------------- offline tests


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = load_dashboard()
    assert dashboard["title"] == "llm-health"
    assert dashboard["uid"] == "llm-health"
    assert dashboard["id"] is None, "an exported id would clash with the importing Grafana's"
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["time"]["from"].startswith("now-")


def test_template_variables() -> None:
    found = variables(load_dashboard())
    assert next(iter(found)) == "datasource", "the datasource variable comes first"
    datasource = found["datasource"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    cluster = found["cluster"]
    assert cluster["type"] == "query"
    assert variable_query(cluster) == "label_values(llm_health_cluster_endpoints, cluster)"
    assert cluster["datasource"] == {"type": "prometheus", "uid": DATASOURCE}
    assert cluster["multi"] and cluster["includeAll"]
    instance = found["instance"]
    assert variable_query(instance) == "label_values(llm_health_build_info, instance)"
    assert instance["multi"] and instance["includeAll"]


def test_panels_have_targets_unique_ids_and_do_not_overlap() -> None:
    dashboard = load_dashboard()
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    panels = graph_panels(dashboard)
    assert len(panels) >= 15
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(dashboard):
        assert panel["title"], panel["id"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] >= 1 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    for panel in panels:
        targets = panel.get("targets", [])
        assert targets, f"panel {panel['title']!r} has no targets"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert target["expr"].strip(), f"{panel['title']!r} {target['refId']}: empty expr"


def test_no_datasource_uid_is_hard_coded() -> None:
    """Every datasource reference is the ``${datasource}`` variable, so the dashboard
    imports into any Grafana."""
    seen: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource":
                    seen.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    dashboard = load_dashboard()
    walk({k: v for k, v in dashboard.items() if k != "templating"})
    for variable in dashboard["templating"]["list"]:
        walk({k: v for k, v in variable.items() if k != "current"})
    assert seen
    for value in seen:
        uid = value.get("uid") if isinstance(value, dict) else value
        assert uid == DATASOURCE, f"hard-coded datasource {value!r}"
    for panel in graph_panels(dashboard):
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]


def test_every_query_follows_the_instance_variable() -> None:
    """Every series selector filters on ``$instance`` (one plugin replica, or all)."""
    for where, promql in panel_queries(load_dashboard()):
        found = list(selectors(STRING.sub(_keep_matchers, promql)))
        assert found, where
        for name, matchers in found:
            assert 'instance=~"$instance"' in matchers, f"{where}: {name or matchers}"


def _keep_matchers(match: re.Match[str]) -> str:
    # Strings stay (matchers need them) but may not end a selector early: no braces inside.
    return match.group(0).replace("{", "(").replace("}", ")")


def test_ttft_quantiles_are_p50_p95_p99_of_the_ttft_histogram() -> None:
    (panel,) = [p for p in graph_panels(load_dashboard()) if "TTFT" in p["title"]]
    pattern = re.compile(
        r"histogram_quantile\((0\.\d+), sum by \([^)]*\ble\b[^)]*\) "
        r"\(rate\(llm_health_probe_ttft_seconds_bucket\{"
    )
    quantiles = [pattern.match(t["expr"]) for t in panel["targets"]]
    assert all(quantiles), [t["expr"] for t in panel["targets"]]
    assert [q.group(1) for q in quantiles if q] == ["0.5", "0.95", "0.99"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_the_tokenizer() -> None:
    names, regexes = references(
        'sum(rate(llm_health_probes_total{cluster=~"$cluster", outcome="fast"}[5m]))'
        ' / on() {__name__=~"llm_health_authz_decisions_.+_ok"} or xllm_health_no'
    )
    assert names == {"llm_health_probes_total"}
    assert regexes == {"llm_health_authz_decisions_.+_ok"}
    assert references("label_values(llm_health_cluster_endpoints, cluster)")[0] == {
        "llm_health_cluster_endpoints"
    }


def test_the_checker_reports_what_is_not_exported() -> None:
    exported = {"llm_health_probes_total", "llm_health_authz_decisions_llama_ok"}
    assert problems("rate(llm_health_probes_total[5m])", exported) == []
    assert problems('{__name__=~"llm_health_authz_decisions_.+_ok"}', exported) == []
    assert problems("rate(llm_health_no_such_metric_total[5m])", exported) == [
        "llm_health_no_such_metric_total is not exported"
    ]
    assert problems('{__name__=~"llm_health_authz_decisions_.+_shed"}', exported) == [
        "regex 'llm_health_authz_decisions_.+_shed' matches no exported metric"
    ]
    assert problems("up", exported) == ["names no llm_health_ metric"]
    # The dashboard with one target broken: reported with where it is.
    dashboard = load_dashboard()
    graph_panels(dashboard)[0]["targets"][0]["expr"] = "rate(llm_health_bogus_total[5m])"
    reported = dashboard_problems(dashboard, exported | REQUIRED | {"llm_health_build_info"})
    assert any("llm_health_bogus_total is not exported" in p for p in reported), reported


# --------------------------------------------------------------------------- real processes

POOL_NAME = "pool.llm.test"
CHECKS = {  # (cluster, request headers) -> the rule it must be counted under
    ("llama", ()): "ok",
    ("llama", (("x-llm-priority", "high"),)): "priority_routed",
    ("llama", (("x-llm-priority", "low"),)): "shed",
    ("llama", (("x-llm-probe", "1"),)): "probe_denied",
    ("down", ()): "no_capacity",
    # The same rule in a second cluster: one series per name, which a query summing rates
    # over several names must cope with ("vector cannot contain metrics with the same
    # labelset" otherwise).
    ("pool", ()): "ok",
    ("pool", (("x-llm-probe", "1"),)): "probe_denied",
}


@dataclass
class Stack:
    plugin: PluginProcess
    families: list[Any]

    @property
    def exported(self) -> set[str]:
        return {sample.name for family in self.families for sample in family.samples}

    def labels(self, name: str) -> set[str]:
        return {
            label
            for family in self.families
            for sample in family.samples
            if sample.name == name
            for label in sample.labels
        }


def plugin_settings(redis: RedisServer, nameserver: str, sim: SimProcess, dead: str) -> Any:
    """llama: the simulator and a dead address (capacity 0.5, under shed_below); down: only
    the dead address (no capacity); pool: discovered by DNS; fleet mode on one Redis."""
    return {
        "probe": {"model": "sim-model", "interval": "1s", "timeout": "2s"},
        "xds": {"warm_start_timeout": "5s"},
        "authz": {"probe_header": "deny", "shed_below": 0.9},
        "fleet": {"redis": redis.url, "name": "grafana-dashboard-test"},
        "dns": {"nameservers": [nameserver], "timeout": "500ms"},
        "clusters": [
            {"name": "llama", "endpoints": [{"address": sim.address}, {"address": dead}]},
            {"name": "down", "endpoints": [{"address": dead}]},
            {"name": "pool", "discovery": {"dns": POOL_NAME, "port": sim.port, "refresh": "1s"}},
        ],
    }


def settled(plugin: PluginProcess, sim: SimProcess) -> bool:
    status = plugin.status()
    clusters = {c["name"]: c for c in status["clusters"]}
    llama = {e["address"]: e["state"] for e in clusters["llama"]["endpoints"]}
    discovered = status["discovery"]["clusters"].get("pool", {})
    return (
        status["fleet"]["mode"] == "sharing"
        and llama.get(sim.address) == "healthy"
        and all(c["warm"] for c in clusters.values())
        and discovered.get("endpoints", 0) >= 1
    )


def check(stub: Any, cluster: str, headers: tuple[tuple[str, str], ...]) -> None:
    request = external_auth_pb2.CheckRequest()
    request.attributes.context_extensions["llm_cluster"] = cluster
    request.attributes.request.http.headers.update(dict(headers))
    stub.Check(request, timeout=5)


def every_rule_counted(plugin: PluginProcess, stub: Any) -> bool:
    for (cluster, headers), _rule in CHECKS.items():
        check(stub, cluster, headers)
    decisions = plugin.status()["authz"]["decisions"]
    return all(decisions.get(c, {}).get(rule, 0) > 0 for (c, _h), rule in CHECKS.items())


def scrape(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("grafana")
    with contextlib.ExitStack() as cleanup:
        redis = RedisServer(workdir / "redis")
        cleanup.callback(redis.stop)
        redis.start()
        dns = cleanup.enter_context(loopback_dns())
        dns.set_a(POOL_NAME, ["127.0.0.1"])
        sim = SimProcess(workdir, "a")
        cleanup.callback(sim.stop)
        sim.wait_up()
        dead = f"127.0.0.1:{free_port()}"  # nothing listens: connection refused
        plugin = PluginProcess(
            workdir / "plugin", plugin_settings(redis, dns.nameserver, sim, dead)
        )
        cleanup.callback(plugin.stop)
        plugin.start().wait_ready()
        wait_until(lambda: settled(plugin, sim), 30, "fleet sharing, llama healthy, pool found")
        options = [("grpc.enable_http_proxy", 0)]
        with grpc.insecure_channel(f"127.0.0.1:{plugin.grpc_port}", options=options) as channel:
            stub = external_auth_pb2_grpc.AuthorizationStub(channel)
            wait_until(lambda: every_rule_counted(plugin, stub), 20, "every admission rule")
        text = scrape(f"http://127.0.0.1:{plugin.http_port}/metrics")
        yield Stack(plugin, list(text_string_to_metric_families(text)))


def test_every_metric_the_dashboard_names_is_exported(stack: Stack) -> None:
    exported = stack.exported
    assert exported >= REQUIRED, f"the plugin no longer exports {REQUIRED - exported}"
    assert not dashboard_problems(load_dashboard(), exported)


def test_the_dashboard_shows_the_required_metrics(stack: Stack) -> None:
    dashboard = load_dashboard()
    named: set[str] = set()
    regexes: set[str] = set()
    for _where, promql in panel_queries(dashboard):
        names, found = references(promql)
        named |= names
        regexes |= found
    assert REQUIRED - named == set()
    counted = {
        sample.labels.get("rule")
        for family in stack.families
        for sample in family.samples
        if sample.name == "llm_health_authz_decisions_total"
    }
    assert counted >= REQUIRED_DECISION_RULES, REQUIRED_DECISION_RULES - counted
    shown = " ".join(promql for _where, promql in panel_queries(dashboard))
    for rule in sorted(REQUIRED_DECISION_RULES):
        assert re.search(rf'rule=~"[^"]*\b{rule}\b', shown), f"no panel shows {rule}"


def test_per_cluster_metrics_follow_the_cluster_variable(stack: Stack) -> None:
    """Every selector of a metric exported with a ``cluster`` label filters on
    ``$cluster``."""
    checked = 0
    for where, promql in panel_queries(load_dashboard()):
        for name, matchers in selectors(STRING.sub(_keep_matchers, promql)):
            if name is not None and "cluster" in stack.labels(name):
                checked += 1
                assert 'cluster=~"$cluster"' in matchers, f"{where}: {name}"
    assert checked >= 8


def test_the_cluster_variable_lists_every_configured_cluster(stack: Stack) -> None:
    (family,) = [f for f in stack.families if f.name == "llm_health_cluster_endpoints"]
    assert {s.labels["cluster"] for s in family.samples} == {"llama", "down", "pool"}


# --------------------------------------------------------------------------- real Prometheus


def grafana_to_promql(expr: str) -> str:
    """Fill in Grafana's variables as a dashboard with every variable at "All" would, for a
    1 s scrape interval."""
    values = {"__rate_interval": "5s", "__interval": "1s", "instance": ".*", "cluster": ".*"}

    def fill(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        assert name in values, f"unknown Grafana variable ${name} in {expr}"
        return values[name]

    return GRAFANA_VARIABLE.sub(fill, expr)


class Prometheus:
    """``prometheus`` on 127.0.0.1, scraping one target every second, storage in workdir."""

    def __init__(self, binary: str, workdir: Path, target: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "llm-health", "static_configs": [{"targets": [target]}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with self._opener.open(url, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                body = exc.read()
            if exc.code in (400, 422):  # a bad query: the error is in the JSON answer
                return json.loads(body)
            raise  # e.g. 503 while starting: an OSError, "not yet" for wait_until

    def query(self, promql: str) -> Any:
        return self.get("/api/v1/query", query=promql)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def test_every_panel_query_returns_series_in_a_real_prometheus(
    stack: Stack, tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (make tools installs Debian's prometheus package)")
    prometheus = Prometheus(binary, tmp_path, f"127.0.0.1:{stack.plugin.http_port}")
    try:
        # Enough samples for a 5 s rate window: 6 scrapes of an up target.
        scrapes = 'count_over_time(up{job="llm-health"}[1m]) >= 6 and up{job="llm-health"} == 1'
        wait_until(
            lambda: prometheus.query(scrapes)["data"]["result"],
            30,
            "six scrapes of the plugin",
            ignore=(OSError, KeyError),
        )
        dashboard = load_dashboard()
        failed, empty = [], []
        for where, expr in all_queries(dashboard):
            if where.startswith("variable"):
                continue
            answer = prometheus.query(grafana_to_promql(expr))
            if answer["status"] != "success":
                failed.append(f"{where}: {answer.get('error')}")
            elif not answer["data"]["result"] and not where.startswith("annotation"):
                empty.append(where)
        assert not failed, failed
        assert not empty, f"queries without series: {empty}"
        clusters = prometheus.get(
            "/api/v1/label/cluster/values", **{"match[]": "llm_health_cluster_endpoints"}
        )
        assert set(clusters["data"]) == {"llama", "down", "pool"}
        instances = prometheus.get(
            "/api/v1/label/instance/values", **{"match[]": "llm_health_build_info"}
        )
        assert instances["data"] == [f"127.0.0.1:{stack.plugin.http_port}"]
    finally:
        prometheus.stop()
