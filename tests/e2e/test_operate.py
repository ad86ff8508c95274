"""Operating llm-health (metrics, logs, admin API + CLI: docs/design.md §5) with real processes:
simulators, `llm-health serve`, the `llm-health` CLI as a subprocess, and a real Envoy."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.configs import plugin_settings
from tests.e2e.test_gateway import CLUSTER, CONFIGS, FAST, envoy_view
from tests.envoy_harness import EnvoyProcess, render_config
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess, stop_all

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-probe-secret-4f1d9a"  # a probe header value: must never be shown anywhere
TOKEN = "admin-token-7c2e5b90d1a84f36"
WITHIN_S = 1.0  # docs/design.md §5.7: `--watch` shows a change within one second of it happening


# --- helpers -------------------------------------------------------------------------------


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "plugin"), os.environ.get("PYTHONPATH", "")])
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLM_HEALTH_")}
    return {**base, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "COLUMNS": "100", **extra}


def cli(*args: str, timeout: float = 30, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_health.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra),
        cwd=ROOT,
        check=False,
    )


def scrape(plugin: PluginProcess) -> tuple[dict[tuple[str, frozenset[Any]], float], str]:
    url = f"http://127.0.0.1:{plugin.http_port}/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found, text


def metric(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def probes_of(plugin: PluginProcess, endpoint: str) -> float:
    """Probes of ``endpoint`` so far, of every outcome (from /metrics)."""
    found, _ = scrape(plugin)
    return sum(
        value
        for (name, labels), value in found.items()
        if name == "llm_health_probes_total" and dict(labels).get("endpoint") == endpoint
    )


def transitions(found: dict[Any, float], endpoint: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for (name, labels), value in found.items():
        fields = dict(labels)
        if name == "llm_health_state_transitions_total" and fields["endpoint"] == endpoint:
            out[(fields["from"], fields["to"], fields["reason"])] = value
    return out


class Procs:
    """Simulators, `llm-health serve` (full settings) and Envoy for one test; every
    process is stopped at teardown, newest first."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Any] = []

    def sim(self, name: str, *args: str) -> SimProcess:
        process = SimProcess(self.tmp_path, name, *args)
        self.started.append(process)
        return process

    def plugin(self, sims: list[SimProcess], **top: Any) -> PluginProcess:
        probe = {"model": "sim-model", "headers": {"Authorization": f"Bearer {SECRET}"}}
        sections = {"xds": {"warm_start_timeout": "5s"}, **top}
        probe = {**probe, **sections.pop("probe", {})}
        settings = plugin_settings(sims, cluster=CLUSTER, listen=False, probe=probe, **sections)
        process = PluginProcess(self.tmp_path / f"plugin-{len(self.started)}", settings)
        self.started.append(process)
        return process

    def envoy(self, plugin: PluginProcess) -> EnvoyProcess:
        rendered = render_config(
            CONFIGS / "sidecar-ads.yaml",
            self.tmp_path / f"envoy-{len(self.started)}.yaml",
            xds_port=plugin.grpc_port,
            listener_port=free_port(),
            admin_port=0,
        )
        process = EnvoyProcess(rendered, workdir=self.tmp_path / f"envoy-{len(self.started)}")
        self.started.append(process)
        return process


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    made = Procs(tmp_path)
    yield made
    stop_all(reversed(made.started))


def admin_of(plugin: PluginProcess) -> str:
    return f"127.0.0.1:{plugin.grpc_port}"


def assert_no_secret(plugin: PluginProcess, *texts: str) -> None:
    shown = [plugin.log_path.read_text(), json.dumps(plugin.status()), scrape(plugin)[1], *texts]
    for text in shown:
        assert SECRET not in text and TOKEN not in text


# --- metrics and logs ------------------------------------------------------------------------


@pytest.mark.envoy
def test_metrics_and_logs_during_a_hang(procs: Procs) -> None:
    """Scrape /metrics while one backend hangs after its headers: the transitions (with
    reason class timeout), the outcome counter and the histograms carry the right labels
    and values; xDS counters show Envoy's ACKs; every transition is logged exactly once,
    with its timings; no secret anywhere."""
    good, hung = procs.sim("good", *FAST), procs.sim("hung", *FAST)
    for sim in (good, hung):
        sim.wait_up()
    plugin = procs.plugin([good, hung], probe={"interval": "300ms"}).start().wait_ready()
    envoy = procs.envoy(plugin).start()
    healthy = {good.address: ("HEALTHY", 100), hung.address: ("HEALTHY", 100)}
    wait_until(lambda: envoy_view(envoy) == healthy, 10, "both healthy in Envoy")
    g, h = (
        {"cluster": CLUSTER, "endpoint": good.address},
        {"cluster": CLUSTER, "endpoint": hung.address},
    )
    hung.set_fault(fault="hang_after_headers")
    wait_until(lambda: plugin.states()[hung.address] == "unhealthy", 10, "hung endpoint unhealthy")
    wait_until(lambda: envoy_view(envoy)[hung.address][0] == "UNHEALTHY", 5, "Envoy sees it")
    earlier, _ = scrape(plugin)

    def more_probes_of_both() -> bool:
        now, _ = scrape(plugin)
        timeouts = [
            metric(m, "llm_health_probes_total", **h, outcome="timeout") for m in (earlier, now)
        ]
        return (
            timeouts[1] > timeouts[0]
            and timeouts[1] >= 3
            and metric(now, "llm_health_probes_total", **g, outcome="fast") >= 5
        )

    # more probes of both: another timeout (800 ms each), three in all, and five FAST of
    # the good one
    wait_until(more_probes_of_both, 10, "another timeout of the hung endpoint")
    found, text = scrape(plugin)

    moves = transitions(found, hung.address)
    assert moves.get(("starting", "healthy", "startup")) == 1
    # in-flight silence degrades it before the first timeout (docs/design.md §3.2)
    assert moves.get(("healthy", "degraded", "silent")) == 1
    assert moves.get(("degraded", "unhealthy", "timeout")) == 1
    timeouts = metric(found, "llm_health_probes_total", **h, outcome="timeout")
    new_timeouts = timeouts - metric(earlier, "llm_health_probes_total", **h, outcome="timeout")
    assert timeouts >= 3 and new_timeouts >= 1
    assert metric(found, "llm_health_probes_total", **h, outcome="fast") >= 1  # before the hang
    # a hang after the headers: every timed-out probe has a header time and no TTFT
    ttft_count = "llm_health_probe_ttft_seconds_count"
    assert metric(found, ttft_count, **h) == metric(earlier, ttft_count, **h) >= 1
    headers_count = "llm_health_probe_headers_seconds_count"
    assert metric(found, headers_count, **h) - metric(earlier, headers_count, **h) == new_timeouts
    # the healthy one: every FAST probe landed at or below healthy_ttft (0.2 s)
    fast = metric(found, "llm_health_probes_total", **g, outcome="fast")
    assert fast >= 5
    assert metric(found, "llm_health_probe_ttft_seconds_count", **g) == fast
    assert metric(found, "llm_health_probe_ttft_seconds_bucket", **g, le="0.2") == fast
    assert metric(found, "llm_health_probe_ttft_seconds_bucket", **g, le="0.01") == 0
    assert 0.015 * fast < metric(found, "llm_health_probe_ttft_seconds_sum", **g) < 0.2 * fast
    assert transitions(found, good.address) == {("starting", "healthy", "startup"): 1}
    # state gauges and the weight Envoy got
    assert metric(found, "llm_health_endpoint_state", **h, state="unhealthy") == 1
    assert metric(found, "llm_health_endpoint_state", **h, state="healthy") == 0
    assert metric(found, "llm_health_endpoint_weight", **g) == 100
    assert metric(found, "llm_health_cluster_endpoints", cluster=CLUSTER, state="healthy") == 1
    # xDS: Envoy's stream (sidecar-ads.yaml: ADS, state of the world)
    ads = {"variant": "ads_sotw", "type": "eds"}
    assert metric(found, "llm_health_xds_streams_open", **ads) == 1
    assert metric(found, "llm_health_xds_pushes_total", **ads) >= 2
    assert metric(found, "llm_health_xds_acks_total", **ads) >= 2
    assert metric(found, "llm_health_xds_nacks_total", **ads) == 0
    assert envoy.stat(f"cluster.{CLUSTER}.update_rejected", 0) == 0
    assert metric(found, "llm_health_loop_lag_max_seconds") < 1.0
    assert "no first token" not in text  # error strings are never labels

    # logs: one "state change" line per transition, with from/to/reason and timings
    records = [r for r in plugin.log_records() if r.get("msg") == "state change"]
    mine = [r for r in records if r["endpoint"] == hung.address]
    assert [(r["from"], r["to"]) for r in mine] == [
        ("starting", "healthy"),
        ("healthy", "degraded"),
        ("degraded", "unhealthy"),
    ]
    assert len(mine) == sum(moves.values())
    last = mine[-1]
    assert last["cluster"] == CLUSTER and last["level"] == "warning"
    assert last["outcome"] == "timeout" and "consecutive timeouts" in last["reason"]
    assert last["ttft_ms"] is None and last["headers_ms"] is not None and "loop_lag_ms" in last
    assert_no_secret(plugin)


# --- admin API + CLI -------------------------------------------------------------------------


def test_status_json_matches_status_and_table_fits(procs: Procs) -> None:
    sims = [procs.sim("a", *FAST), procs.sim("b", *FAST)]
    for sim in sims:
        sim.wait_up()
    # probes once a minute: after the first round nothing changes between the two reads
    plugin = procs.plugin(sims, probe={"interval": "60s"}).start().wait_ready()
    wait_until(lambda: set(plugin.states().values()) == {"healthy"}, 10, "both healthy")
    before = plugin.status()
    done = cli("status", "--json", "--admin", admin_of(plugin))
    after = plugin.status()
    assert done.returncode == 0, done.stderr
    assert before["revision"] == after["revision"], "the board changed during the comparison"
    printed = json.loads(done.stdout)
    assert printed == {"revision": after["revision"], "clusters": after["clusters"]}

    table = cli("status", "--admin", admin_of(plugin))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 4 and all(len(line) <= 100 for line in lines)
    assert lines[0].startswith(f"revision {after['revision']}: 2 endpoints (2 healthy)")
    assert all(s.address in table.stdout for s in sims)
    assert_no_secret(plugin, done.stdout, table.stdout)


class Watch:
    """`llm-health status --watch --json` with every stdout line time-stamped on arrival."""

    def __init__(self, admin: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_health.cli",
                "status",
                "--watch",
                "--json",
                "--admin",
                admin,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=ROOT,
        )
        self.lines: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.time(), json.loads(line)))

    def next(self, timeout: float = 10) -> tuple[float, dict[str, Any]]:
        return self.lines.get(timeout=timeout)

    def change_of(
        self, address: str, state: str, timeout: float = 10
    ) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            arrived, event = self.next(max(0.01, deadline - time.monotonic()))
            for endpoint in event.get("changed", []):
                if endpoint["address"] == address and endpoint["state"] == state:
                    return arrived, endpoint
        raise AssertionError(f"no change of {address} to {state} within {timeout} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def test_watch_shows_changes_within_a_second(procs: Procs) -> None:
    a, b = procs.sim("a", *FAST), procs.sim("b", *FAST)
    for sim in (a, b):
        sim.wait_up()
    plugin = procs.plugin([a, b], probe={"interval": "200ms"}).start().wait_ready()
    wait_until(lambda: set(plugin.states().values()) == {"healthy"}, 10, "both healthy")
    watch = Watch(admin_of(plugin))
    try:
        _, first = watch.next()
        assert {e["address"] for c in first["clusters"] for e in c["endpoints"]} == {
            a.address,
            b.address,
        }
        # 1. a probe-driven change: b's engine dies (CUDA error -> UNHEALTHY at once)
        b.set_fault(fault="cuda_error")
        arrived, change = watch.change_of(b.address, "unhealthy")
        assert change["previous_state"] == "healthy" and "fatal" in change["reason"]
        assert arrived - change["since_epoch"] < WITHIN_S, arrived - change["since_epoch"]
        # 2. an operator change through the CLI
        drained = cli(
            "drain", CLUSTER, a.address, "--admin", admin_of(plugin), "--reason", "upgrade"
        )
        returned = time.time()
        assert drained.returncode == 0, drained.stderr
        assert f"{a.address}: drained; now draining" in drained.stdout
        arrived, change = watch.change_of(a.address, "draining")
        assert arrived - returned < WITHIN_S and arrived - change["since_epoch"] < WITHIN_S
        assert change["reason"] == "upgrade" and change["envoy"]["health_status"] == "DRAINING"
    finally:
        watch.stop()


@pytest.mark.envoy
def test_drain_goes_draining_in_envoy_and_back(procs: Procs) -> None:
    a, b = procs.sim("a", *FAST), procs.sim("b", *FAST)
    for sim in (a, b):
        sim.wait_up()
    plugin = (
        procs.plugin([a, b], probe={"interval": "300ms", "healthy_after": 2}).start().wait_ready()
    )
    envoy = procs.envoy(plugin).start()
    healthy = {a.address: ("HEALTHY", 100), b.address: ("HEALTHY", 100)}
    wait_until(lambda: envoy_view(envoy) == healthy, 10, "both healthy in Envoy")
    admin = ("--admin", admin_of(plugin))

    done = cli("drain", CLUSTER, a.address, *admin, "--reason", "kernel upgrade")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: envoy_view(envoy)[a.address] == ("DRAINING", 100), 5, "DRAINING in Envoy")
    assert envoy_view(envoy)[b.address] == ("HEALTHY", 100)
    # Probes go on underneath (three more of it: healthy_after is 2); it stays drained.
    drained_at = probes_of(plugin, a.address)
    wait_until(lambda: probes_of(plugin, a.address) >= drained_at + 3, 10, "3 more probes")
    assert envoy_view(envoy)[a.address] == ("DRAINING", 100)
    assert plugin.states()[a.address] == "draining"

    done = cli("undrain", CLUSTER, a.address, *admin)
    assert done.returncode == 0, done.stderr
    assert "now starting" in done.stdout  # must qualify again: healthy_after probes
    wait_until(lambda: envoy_view(envoy)[a.address] == ("HEALTHY", 100), 10, "HEALTHY again")
    found, _ = scrape(plugin)
    moves = transitions(found, a.address)
    assert moves[("healthy", "draining", "drained")] == 1
    assert moves[("draining", "starting", "undrained")] == 1
    assert moves[("starting", "healthy", "startup")] == 2

    # force (maintenance) and probe-now through the CLI, seen by Envoy too
    done = cli("force", CLUSTER, b.address, "unhealthy", "--for", "10m", *admin)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: envoy_view(envoy)[b.address] == ("UNHEALTHY", 100), 5, "forced in Envoy")
    done = cli("clear-override", CLUSTER, b.address, *admin)
    assert done.returncode == 0 and "now healthy" in done.stdout, done.stderr
    wait_until(lambda: envoy_view(envoy)[b.address] == ("HEALTHY", 100), 5, "override cleared")
    before = plugin.status()["prober"]["probes_total"]
    done = cli("probe-now", CLUSTER, b.address, *admin, "--json")
    assert done.returncode == 0, done.stderr
    probed = json.loads(done.stdout)
    assert probed["outcome"] == "fast" and probed["ttft_ms"] > 0 and probed["state"] == "healthy"
    assert plugin.status()["prober"]["probes_total"] > before
    assert envoy.stat(f"cluster.{CLUSTER}.update_rejected", 0) == 0
    assert_no_secret(plugin, done.stdout)


def test_cli_errors_are_clear(procs: Procs) -> None:
    sim = procs.sim("a", *FAST)
    sim.wait_up()
    plugin = procs.plugin([sim]).start().wait_ready()
    admin = ("--admin", admin_of(plugin))
    unknown = cli("drain", CLUSTER, "127.0.0.1:1", *admin)
    assert unknown.returncode == 1 and "unknown cluster or endpoint" in unknown.stderr
    bad = cli("force", CLUSTER, sim.address, "healthy", "--for", "200h", *admin)
    assert bad.returncode == 2 and "at most 7 days" in bad.stderr
    down = cli("status", "--admin", f"127.0.0.1:{free_port()}", "--timeout", "2s")  # nobody serves
    assert down.returncode == 1 and "cannot reach the admin API" in down.stderr
    assert "Traceback" not in unknown.stderr + bad.stderr + down.stderr


# --- binds and token ---------------------------------------------------------------------------


def test_non_loopback_admin_without_token_refuses_to_start(procs: Procs) -> None:
    sim = procs.sim("a", *FAST)
    plugin = procs.plugin(
        [sim], admin={"grpc": "0.0.0.0:18999"}
    ).start()  # never bound: rejected first
    assert plugin.process is not None
    code = plugin.process.wait(20)
    assert code == 2
    assert (
        'admin: grpc "0.0.0.0:18999" is not a loopback address: set admin.token'
        in plugin.log_tail()
    )


def test_token_rejects_calls_without_it(procs: Procs, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = procs.sim("a", *FAST)
    sim.wait_up()
    port = free_port()
    monkeypatch.setenv("ADMIN_TOKEN", TOKEN)  # the plugin reads it through ${ADMIN_TOKEN}
    settings = {"grpc": f"127.0.0.1:{port}", "token": "${ADMIN_TOKEN}"}
    plugin = procs.plugin([sim], admin=settings).start().wait_ready()
    admin = ("--admin", f"127.0.0.1:{port}")
    without = cli("status", *admin)
    assert without.returncode == 1
    assert (
        "missing or wrong bearer token" in without.stderr
        and "LLM_HEALTH_ADMIN_TOKEN" in without.stderr
    )
    wrong = cli("drain", CLUSTER, sim.address, *admin, "--token", "not-the-token-at-all")
    assert wrong.returncode == 1 and "missing or wrong bearer token" in wrong.stderr
    assert plugin.states()[sim.address] != "draining"
    with_env = cli("status", "--json", *admin, LLM_HEALTH_ADMIN_TOKEN=TOKEN)
    assert with_env.returncode == 0, with_env.stderr
    assert json.loads(with_env.stdout)["clusters"][0]["name"] == CLUSTER
    with_flag = cli("drain", CLUSTER, sim.address, *admin, "--token", TOKEN)
    assert with_flag.returncode == 0, with_flag.stderr
    assert plugin.states()[sim.address] == "draining"
    status = plugin.status()["admin"]
    assert status["auth"] == "bearer token" and status["unauthenticated_total"] == 2
    # the xDS port does not serve the admin API when it has its own address
    elsewhere = cli("status", "--admin", admin_of(plugin), "--token", TOKEN)
    assert elsewhere.returncode == 1 and "does not serve the admin API" in elsewhere.stderr
    assert_no_secret(plugin, without.stderr, wrong.stderr, with_env.stdout)
