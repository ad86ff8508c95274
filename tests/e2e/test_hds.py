"""HDS end to end: simulators -> `llm-health serve` -> two real Envoys (envoy-configs/
hds.yaml, node ids gw-1 and gw-2) that run the plugin's HDS checks and also take EDS from it.

What is proven against the real Envoy 1.40:
- both Envoys connect over HDS, each backend is assigned to exactly
  ``checkers_per_endpoint`` of them, and both send reports (the plugin's /status shows
  what each said; each Envoy's own stats show the checks it runs);
- a backend whose check path becomes unreachable (the simulator's ``health: reset``
  knob) while its TTFT probe target keeps answering is marked UNHEALTHY with the HDS
  reason, and both Envoys' EDS view shows it UNHEALTHY; reachable again, it recovers;
- a killed Envoy's assignments move to the other within one report interval + 1 s, and
  its old reports expire after ``report_ttl``.
Every process is stopped at teardown.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envoy_harness import EnvoyProcess, render_config
from tests.polling import WaitTimeout, wait_until
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess, stop_all

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "llama-70b"
HDS_CLUSTER = f"hds_{CLUSTER}"
FAST = ("--ttft", "20ms", "--tpot", "2ms")
REPORT_INTERVAL_S = 1.0


class Stack:
    """Four simulators, the plugin with ``hds`` settings, and Envoys by node id."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Any] = []
        self.sims: list[SimProcess] = []
        self.plugin: PluginProcess | None = None

    def start(self, count: int = 4, **hds: Any) -> PluginProcess:
        for index in range(count):
            sim = SimProcess(self.workdir, f"b{index}", *FAST)
            self.started.append(sim)
            self.sims.append(sim)
        for sim in self.sims:
            sim.wait_up()
        settings = {
            "probe": {"model": "sim-model"},
            "xds": {"warm_start_timeout": "5s"},
            "hds": {"check": "http", "path": "/health", "report_interval": "1s", **hds},
            "clusters": [
                {"name": CLUSTER, "endpoints": [{"address": s.address} for s in self.sims]}
            ],
        }
        self.plugin = PluginProcess(self.workdir / "plugin", settings)
        self.started.append(self.plugin)
        return self.plugin.start().wait_ready()

    def envoy(self, node_id: str) -> EnvoyProcess:
        assert self.plugin is not None
        rendered = render_config(
            ROOT / "envoy-configs" / "hds.yaml",
            self.workdir / f"{node_id}.yaml",
            xds_port=self.plugin.grpc_port,
            listener_port=free_port(),
            admin_port=0,
            extra=lambda c: c["node"].update(id=node_id),
        )
        envoy = EnvoyProcess(rendered, workdir=self.workdir / node_id)
        self.started.append(envoy)
        return envoy.start()

    def wait_reported(self, nodes: dict[str, EnvoyProcess], timeout: float = 15) -> None:
        """``all_reported`` for ``nodes``; on time-out the failure shows what each side saw."""
        try:
            wait_until(lambda: all_reported(self.hds(), set(nodes)), timeout, "reports")
        except WaitTimeout as exc:
            envoys = {n: e.stats(r"hds_delegate|health_check") for n, e in nodes.items()}
            raise AssertionError(f"{exc}\nplugin: {self.hds()}\nenvoys: {envoys}") from None

    def hds(self) -> dict[str, Any]:
        assert self.plugin is not None
        status: dict[str, Any] = self.plugin.status()["hds"]
        return status

    def endpoint(self, address: str) -> dict[str, Any]:
        assert self.plugin is not None
        clusters = self.plugin.status()["clusters"]
        (found,) = [e for c in clusters for e in c["endpoints"] if e["address"] == address]
        return found

    def stop(self) -> None:
        stop_all(reversed(self.started))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def eds_status(envoy: EnvoyProcess, address: str) -> str:
    return str(envoy.host_statuses(CLUSTER)[address]["eds_health_status"])


def all_reported(hds: dict[str, Any], nodes: set[str], said: str = "healthy") -> bool:
    """Exactly ``nodes`` joined (an Envoy is LIVE before its HDS stream is up), each has
    sent a report (even one with nothing to check), and every endpoint has a word from
    each of its checkers, all ``said``."""
    joined = {n["node"] for n in hds["nodes"] if n["reports"] >= 1}
    return joined == nodes and all(
        set(e["checkers"]) <= nodes
        and {r["node"] for r in e["reporters"] if r["said"] == said} >= set(e["checkers"])
        and e["checkers"]
        for e in hds["endpoints"]
    )


def test_two_envoys_check_all_backends_and_an_unreachable_one_is_taken_out(
    stack: Stack,
) -> None:
    stack.start(checkers_per_endpoint=2, timeout="500ms")
    gw1, gw2 = stack.envoy("gw-1"), stack.envoy("gw-2")
    stack.wait_reported({"gw-1": gw1, "gw-2": gw2})

    hds = stack.hds()
    assert sorted(n["node"] for n in hds["nodes"]) == ["gw-1", "gw-2"]
    assert all(n["usable"] and n["reports"] >= 1 for n in hds["nodes"])
    assert all(n["capability"] == ["HTTP", "TCP"] for n in hds["nodes"])
    for entry in hds["endpoints"]:  # exactly checkers_per_endpoint = 2 each
        assert sorted(entry["checkers"]) == ["gw-1", "gw-2"], entry
    # Envoy's side: each runs the 4 checks it was given, all passing, and took one
    # specifier (an unchanged assignment is never re-sent).
    prefix = f"cluster.{HDS_CLUSTER}.health_check."
    for envoy in (gw1, gw2):
        wait_until(lambda e=envoy: e.stat(prefix + "healthy") == 4, 10, "4 healthy HDS hosts")
        assert envoy.stat(prefix + "attempt") >= 4
        assert envoy.stat(prefix + "failure", 0) == 0
        assert envoy.stat("hds_delegate.updates") == 1
        assert envoy.stat("hds_delegate.errors", 0) == 0

    # The check path of backend 0 becomes unreachable; inference keeps working.
    target = stack.sims[0]
    probes_before = target.stats()["probe_requests"]
    target.set_fault(health="reset")
    started = time.monotonic()
    wait_until(
        lambda: eds_status(gw1, target.address) == eds_status(gw2, target.address) == "UNHEALTHY",
        15,
        "both Envoys' EDS view to show the backend UNHEALTHY",
    )
    isolated_s = time.monotonic() - started
    endpoint = stack.endpoint(target.address)
    assert endpoint["state"] == "unhealthy"
    assert endpoint["reason"] == "unreachable from gw-1, gw-2"
    assert endpoint["last_probe"]["outcome"] == "fast"  # the TTFT probe target stayed up
    assert target.stats()["probe_requests"] > probes_before
    (entry,) = [e for e in stack.hds()["endpoints"] if e["address"] == target.address]
    assert {r["node"]: r["said"] for r in entry["reporters"]} == {
        "gw-1": "unhealthy",
        "gw-2": "unhealthy",
    }
    assert entry["verdict"] == "unreachable from gw-1, gw-2"
    for other in stack.sims[1:]:
        assert eds_status(gw1, other.address) == "HEALTHY"
    # Envoy's own checker agrees: it failed the check of that host.
    assert gw1.stat(f"cluster.{HDS_CLUSTER}.health_check.failure") >= 1
    assert isolated_s < 10, isolated_s

    # Reachable again: the signal clears and the probe hysteresis brings it back.
    target.set_fault(health="ok")
    wait_until(
        lambda: eds_status(gw1, target.address) == eds_status(gw2, target.address) == "HEALTHY",
        20,
        "the backend back to HEALTHY in both Envoys",
    )
    assert stack.endpoint(target.address)["state"] == "healthy"


@pytest.mark.timed  # the checks move within a report interval + 1 s
def test_a_killed_envoys_checks_move_to_the_other_and_its_reports_expire(
    stack: Stack,
) -> None:
    ttl_s = 3.0
    stack.start(checkers_per_endpoint=1, report_ttl=f"{ttl_s:g}s")
    envoys = {"gw-1": stack.envoy("gw-1"), "gw-2": stack.envoy("gw-2")}
    stack.wait_reported(envoys)
    hds = stack.hds()
    for entry in hds["endpoints"]:
        assert len(entry["checkers"]) == 1, entry  # exactly checkers_per_endpoint
    load = {n["node"]: n["assigned_endpoints"] for n in hds["nodes"]}
    assert sum(load.values()) == 4
    assert all(n["reports"] >= 1 for n in hds["nodes"])  # both report, even an idle one

    # Kill the busier Envoy (SIGKILL: no goodbye, the kernel closes its connection).
    victim = max(sorted(load), key=lambda n: load[n])
    survivor = next(n for n in envoys if n != victim)
    moved = {e["address"] for e in hds["endpoints"] if e["checkers"] == [victim]}
    pid = envoys[victim].pid
    assert pid is not None and moved
    updates = envoys[survivor].stat("hds_delegate.updates")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def survivor_reports_the_moved_ones() -> bool:
        current = stack.hds()
        entries = [e for e in current["endpoints"] if e["address"] in moved]
        return all(
            e["checkers"] == [survivor]
            and any(
                r["node"] == survivor
                and r["said"] == "healthy"
                and r["age_s"] is not None
                and r["age_s"] < time.monotonic() - killed_at
                for r in e["reporters"]
            )
            for e in entries
        )

    wait_until(survivor_reports_the_moved_ones, 10, "the survivor to report the moved backends")
    moved_s = time.monotonic() - killed_at
    assert moved_s <= REPORT_INTERVAL_S + 1.0, f"moved after {moved_s:.2f} s"
    assert [n["node"] for n in stack.hds()["nodes"]] == [survivor]
    assert envoys[survivor].stat(f"cluster.{HDS_CLUSTER}.health_check.healthy") == 4
    assert envoys[survivor].stat("hds_delegate.updates") == updates + 1  # one re-send

    def victim_forgotten() -> bool:
        return not any(
            r["node"] == victim for e in stack.hds()["endpoints"] for r in e["reporters"]
        )

    wait_until(victim_forgotten, ttl_s + 5, "the killed Envoy's reports to expire")
    expired_s = time.monotonic() - killed_at
    assert expired_s >= ttl_s - REPORT_INTERVAL_S - 0.5, expired_s  # kept until the TTL
    # Nothing was taken down on the way.
    assert {stack.endpoint(s.address)["state"] for s in stack.sims} == {"healthy"}


def test_an_http_check_can_post_a_body(stack: Stack) -> None:
    """``hds.body`` makes Envoy's check a POST carrying it (HttpHealthCheck.method + send):
    here a 1-token completion the simulator answers (and counts as a non-probe request)."""
    body = '{"model": "sim-model", "prompt": "hello-hds", "max_tokens": 1}'
    stack.start(count=1, path="/v1/completions", body=body)
    envoy = stack.envoy("gw-1")
    stack.wait_reported({"gw-1": envoy})
    sim = stack.sims[0]
    posted = [r for r in sim.stats()["recent"] if r["prompt"] == "hello-hds"]
    assert posted and all(not r["probe"] and r["path"] == "/v1/completions" for r in posted)
    assert envoy.stat(f"cluster.{HDS_CLUSTER}.health_check.success") >= 1
    assert envoy.stat(f"cluster.{HDS_CLUSTER}.health_check.failure", 0) == 0


def test_an_envoy_with_nothing_to_check_keeps_reporting_and_stays_usable(stack: Stack) -> None:
    """One backend, one checker, two Envoys: one of them is handed an empty specifier.
    Envoy then reports a message with neither field set every interval; that must count
    as a report, or the idle Envoy would go stale after report_ttl and not be there to
    take over."""
    stack.start(count=1, checkers_per_endpoint=1, report_ttl="2s")
    envoys = {"gw-1": stack.envoy("gw-1"), "gw-2": stack.envoy("gw-2")}
    stack.wait_reported(envoys)
    updates = {node: envoy.stat("hds_delegate.updates") for node, envoy in envoys.items()}
    time.sleep(3.5)  # longer than report_ttl
    nodes = {n["node"]: n for n in stack.hds()["nodes"]}
    (idle,) = [n for n in nodes.values() if n["assigned_endpoints"] == 0]
    assert idle["usable"] and idle["reports"] >= 3
    assert idle["last_seen_s_ago"] < 1.5
    # Nothing moved meanwhile: no Envoy was sent a new specifier.
    assert {node: e.stat("hds_delegate.updates") for node, e in envoys.items()} == updates
    assert stack.hds()["stats"]["empty_reports"] >= 3
