"""Admission inside Envoy end to end (docs/admission.md "Admission inside Envoy"):
simulators -> llm-health serve (EDS over ADS, the runtime layer over RTDS) -> a real Envoy
started from the shipped envoy-configs/admission-native.yaml -> user requests.

No check reaches the plugin: what a user sees (status, Retry-After, JSON body, which
backend served) comes from Envoy's own filters acting on what the plugin pushed, read here
next to Envoy's runtime (``/runtime``) and stats.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_authz import DEAD, FAST, SLOW, Reply, call, call_many, sim_requests
from tests.envoy_harness import EnvoyProcess, render_config
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess, stop_all

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "envoy-configs" / "admission-native.yaml"
CLUSTER = "llama-70b"
SHED_KEY = f"llm_health.shed_low.{CLUSTER}"


@dataclass
class Gateway:
    sims: list[SimProcess]
    plugin: PluginProcess
    envoy: EnvoyProcess
    url: str

    def runtime(self, key: str) -> str | None:
        """Envoy's final runtime value of ``key`` (None: no layer sets it)."""
        entries = json.loads(self.envoy.admin_get("/runtime"))["entries"]
        entry = entries.get(key)
        return None if entry is None else str(entry["final_value"])

    def served(self) -> dict[str, int]:
        return {s.address: s.user_requests() for s in self.sims}

    def native_status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.plugin.status()["authz"]["native"]
        return status

    def rewrite(self, authz: dict[str, Any]) -> None:
        """Change the plugin's ``authz:`` section (the config file watcher reloads it)."""
        settings = yaml.safe_load(self.plugin.config_path.read_text())
        settings["authz"] = authz
        self.plugin.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Factory: simulators (one per argument tuple), the plugin with ``authz`` settings,
    Envoy from admission-native.yaml; waits until Envoy shows ``want`` health per
    simulator and holds the plugin's runtime layer. Every process is stopped at teardown."""
    started: list[Any] = []

    def build(
        sim_args: list[tuple[str, ...]], want: list[str], authz: dict[str, Any] | None = None
    ) -> Gateway:
        sims = [SimProcess(tmp_path, f"b{i}", *args) for i, args in enumerate(sim_args)]
        started.extend(sims)
        for sim in sims:
            sim.wait_up()
        settings = {
            "probe": {"model": "sim-model"},
            "xds": {"warm_start_timeout": "5s"},
            "authz": authz or {},
            "clusters": [{"name": CLUSTER, "endpoints": [{"address": s.address} for s in sims]}],
        }
        plugin = PluginProcess(tmp_path / "plugin", settings)
        started.append(plugin)
        plugin.start().wait_ready()
        listener = free_port()
        rendered = render_config(
            CONFIG,
            tmp_path / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=listener,
            admin_port=0,
        )
        envoy = EnvoyProcess(rendered, workdir=tmp_path / "envoy")
        started.append(envoy)
        envoy.start()
        gw = Gateway(sims, plugin, envoy, f"http://127.0.0.1:{listener}/v1/completions")
        expected = {s.address: w for s, w in zip(sims, want, strict=True)}
        wait_until(
            lambda: {a: v[0] for a, v in envoy.view(CLUSTER).items()} == expected,
            15,
            f"Envoy to show {expected}",
        )
        wait_until(lambda: gw.runtime(SHED_KEY) is not None, 10, "the runtime layer in Envoy")
        return gw

    yield build
    stop_all(reversed(started))


def assert_shed(replies: list[Reply]) -> None:
    for reply in replies:
        assert reply.status == 429, reply
        assert reply.headers.get("retry-after") == "1", reply.headers
        error = reply.json()["error"]
        assert error["type"] == "shed" and error["cluster"] == CLUSTER, error


def test_all_unhealthy_gets_envoys_503_with_retry_after_and_a_json_body(
    gateway: Callable[..., Gateway],
) -> None:
    gw = gateway([DEAD, DEAD], ["UNHEALTHY", "UNHEALTHY"], {"shed_below": 0.5})
    before = gw.served()
    replies = [call(gw.url, prompt=f"u-{i}") for i in range(10)]
    replies += [call(gw.url, {"x-llm-priority": "low"}, f"ul-{i}") for i in range(5)]
    for reply in replies:
        assert reply.status == 503, reply
        assert reply.headers.get("retry-after") == "1", reply.headers
        error = reply.json()["error"]  # not Envoy's plain "no healthy upstream"
        assert error["type"] == "no_capacity" and error["cluster"] == CLUSTER, error
    assert gw.served() == before  # the backends saw nothing
    # Nothing routable is Envoy's 503, not a shed: the plugin keeps the key at 0 then.
    assert gw.runtime(SHED_KEY) == "0"
    assert gw.envoy.stat(f"cluster.{CLUSTER}.upstream_cx_none_healthy", 0) >= len(replies)


def test_low_priority_shed_follows_capacity_reloads_and_outlives_the_plugin(
    gateway: Callable[..., Gateway],
) -> None:
    """1 HEALTHY of 2 (capacity 0.5). shed_below 0.5: nothing shed. A reload to 0.9 (no
    new health snapshot) sheds low priority within the layer's refresh; high priority and
    unmarked requests still pass; with the plugin gone Envoy keeps shedding."""
    gw = gateway([FAST, DEAD], ["HEALTHY", "UNHEALTHY"], {"shed_below": 0.5})
    healthy = gw.sims[0]
    assert gw.runtime(SHED_KEY) == "0"
    assert [call(gw.url, {"x-llm-priority": "low"}, f"pass-{i}").status for i in range(5)] == [
        200
    ] * 5

    gw.rewrite({"shed_below": 0.9})
    wait_until(lambda: gw.runtime(SHED_KEY) == "100", 10, "the shed key at 100 after the reload")
    assert_shed([call(gw.url, {"x-llm-priority": "LOW"}, f"low-{i}") for i in range(10)])
    high = [call(gw.url, {"x-llm-priority": "high"}, f"high-{i}") for i in range(10)]
    plain = [call(gw.url, prompt=f"plain-{i}") for i in range(10)]
    assert [r.status for r in high + plain] == [200] * 20
    assert sim_requests(healthy, "low-") == []
    assert len(sim_requests(healthy, "high-")) == 10
    assert len(sim_requests(healthy, "plain-")) == 10
    assert gw.envoy.stat("http.llm_ingress.fault.aborts_injected", 0) == 10
    native = gw.native_status()
    assert native["streams_open"] == 1 and native["acks"] >= 2 and native["nacks"] == 0, native

    gw.plugin.stop()  # Envoy keeps the last layer it accepted
    assert_shed([call(gw.url, {"x-llm-priority": "low"}, f"gone-{i}") for i in range(5)])
    assert gw.runtime(SHED_KEY) == "100"


def test_high_priority_lands_on_healthy_endpoints_and_the_probe_header_is_stripped(
    gateway: Callable[..., Gateway],
) -> None:
    """1 HEALTHY (weight 100) + 2 DEGRADED (30 each): every high-priority request on the
    HEALTHY one, with no exception (no check to time out); unmarked ones on all three."""
    gw = gateway([FAST, SLOW, SLOW], ["HEALTHY", "HEALTHY", "HEALTHY"])
    healthy, slow1, slow2 = (s.address for s in gw.sims)
    want = {healthy: ("HEALTHY", 100), slow1: ("HEALTHY", 30), slow2: ("HEALTHY", 30)}
    wait_until(lambda: gw.envoy.view(CLUSTER) == want, 15, f"Envoy weights {want}")

    def share(headers: dict[str, str] | None, count: int) -> dict[str, int]:
        before = gw.served()
        replies = call_many(gw.url, count, headers, concurrency=8)
        assert [r.status for r in replies] == [200] * count
        after = gw.served()
        return {a: after[a] - before[a] for a in after}

    assert share({"x-llm-priority": "High"}, 100) == {healthy: 100, slow1: 0, slow2: 0}
    plain = share(None, 160)
    assert plain[slow1] > 0 and plain[slow2] > 0, plain

    replies = [call(gw.url, {"X-LLM-Probe": "true"}, prompt=f"disguised-{i}") for i in range(3)]
    assert [r.status for r in replies] == [200] * 3
    seen = [r for sim in gw.sims for r in sim_requests(sim, "disguised-")]
    assert len(seen) == 3 and all(r["probe_header"] is None for r in seen), seen
