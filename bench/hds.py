"""HDS benchmark: how fast a backend unreachable from the gateways leaves Envoy's EDS view,
and how many HDS checks each Envoy runs.

Everything is real and on loopback: `llm-health sim` backends, `llm-health serve` (HDS
`check: tcp`, interval 1 s, timeout 1 s, unhealthy_threshold 2, report_interval 1 s,
checkers_per_endpoint 2: the defaults), and Envoys started from envoy-configs/hds.yaml
with their own node ids (each is an HDS checker and an EDS subscriber).

1. Port closed -> UNHEALTHY in a second Envoy. Two Envoys (gw-1, gw-2) check all 3
   backends. Each round SIGKILLs one backend (its port closes), polls gw-2's admin
   /clusters every 20 ms until that host's EDS status is UNHEALTHY, then restarts it on
   the same port. Two modes:
   ``hds-only``: the TTFT probe is made slow to conclude (``unhealthy_after: 100``: a
   refused probe only DEGRADES, status stays HEALTHY), so only the HDS quorum can take the
   host out, and the plugin's reason is checked to be the HDS one; ``default``: default
   probe settings too (whichever of probe and HDS concludes first).
2. Checks per second: one simulator process serving 100 ports, 100 endpoints, 3 Envoys.
   After every endpoint has reports, ``cluster.hds_<cluster>.health_check.attempt`` of
   each Envoy is read twice, ``--window`` seconds apart; with it each Envoy's CPU time.

    .venv/bin/python bench/hds.py                  # ~2 min
    .venv/bin/python bench/hds.py --rounds 8 --window 30
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, cpu_seconds, load_average  # noqa: E402

from common import free_port_block, write_result  # noqa: E402
from tests.envoy_harness import EnvoyProcess, render_config  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

CLUSTER = "llama-70b"
HDS_STATS = f"cluster.hds_{CLUSTER}.health_check."
POLL_S = 0.02
PHASES = random.Random(4)  # seeded: the same kill phases on every run


class Stack:
    """Processes of one scenario; ``close`` stops all of them (reverse order)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[Any] = []

    def plugin(self, addresses: list[str], probe: dict[str, Any]) -> PluginProcess:
        settings = {
            "probe": {"model": "sim-model", **probe},
            "xds": {"warm_start_timeout": "10s"},
            "hds": {"check": "tcp"},
            "clusters": [{"name": CLUSTER, "endpoints": [{"address": a} for a in addresses]}],
        }
        plugin = PluginProcess(self.workdir / "plugin", settings)
        self.processes.append(plugin)
        return plugin.start().wait_ready(timeout=60)

    def envoy(self, plugin: PluginProcess, node_id: str) -> EnvoyProcess:
        config = render_config(
            ROOT / "envoy-configs" / "hds.yaml",
            self.workdir / f"{node_id}.yaml",
            xds_port=plugin.grpc_port,
            listener_port=free_port(),
            admin_port=0,
            extra=lambda c: c["node"].update(id=node_id),
        )
        envoy = EnvoyProcess(config, workdir=self.workdir / node_id)
        self.processes.append(envoy)
        return envoy.start()

    def close(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop()


@contextlib.contextmanager
def stack() -> Iterator[Stack]:
    running = Stack(Path(tempfile.mkdtemp(prefix="bench-hds-")))
    try:
        yield running
    finally:
        running.close()


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, KeyError, ValueError):
            if result := predicate():
                return result
        time.sleep(0.05)
    raise TimeoutError(f"no {what} within {timeout_s} s")


def every_endpoint_reported(plugin: PluginProcess, checkers: int, nodes: int) -> bool:
    """All ``nodes`` Envoys joined (an Envoy is LIVE before its HDS stream is up) and
    every endpoint has a HEALTHY word from each of its ``checkers``."""
    hds = plugin.status()["hds"]
    endpoints = hds["endpoints"]
    return (
        len(hds["nodes"]) == nodes
        and bool(endpoints)
        and all(
            len(e["checkers"]) == checkers
            and sum(r["said"] == "healthy" for r in e["reporters"]) == checkers
            for e in endpoints
        )
    )


# --------------------------------------------------------------------------- 1


def close_to_unhealthy(rounds: int, mode: str) -> list[tuple[float, str]]:
    """Each round kills backend ``round % 3`` and restarts it on the same port once gw-2
    shows it UNHEALTHY; the next round starts when all 3 are HEALTHY again."""
    probe = {"unhealthy_after": 100} if mode == "hds-only" else {}
    with stack() as running:
        base = free_port_block(3)
        sims = [Sim(base + i, 1, ("--ttft", "20ms")).spawn() for i in range(3)]
        try:
            for sim in sims:
                _wait_sim(sim)
            plugin = running.plugin([s.address for s in sims], probe)
            running.envoy(plugin, "gw-1")
            observer = running.envoy(plugin, "gw-2")
            wait_until(lambda: every_endpoint_reported(plugin, 2, 2), 30, "reports from both")
            return [_one_round(plugin, observer, sims, sims[i % 3]) for i in range(rounds)]
        finally:
            for sim in sims:
                sim.stop()


def _one_round(
    plugin: PluginProcess, observer: EnvoyProcess, sims: list[Sim], sim: Sim
) -> tuple[float, str]:
    def status(address: str = sim.address) -> str:
        return str(observer.host_statuses(CLUSTER)[address]["eds_health_status"])

    # Every backend back first (the last round's one recovers through probe hysteresis),
    # so the probe's max_ejection_percent cap is never what decides a round.
    wait_until(lambda: all(status(s.address) == "HEALTHY" for s in sims), 30, "all HEALTHY")
    time.sleep(1.0 + PHASES.random())  # a random phase against the 1 s check/report timers
    started = time.monotonic()
    sim.kill()
    deadline = started + 30
    while status() != "UNHEALTHY":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sim.address} never UNHEALTHY in gw-2")
        time.sleep(POLL_S)
    took = time.monotonic() - started
    (endpoint,) = [
        e
        for c in plugin.status()["clusters"]
        for e in c["endpoints"]
        if e["address"] == sim.address
    ]
    sim.spawn()  # back on the same port: it must come back before its next round
    _wait_sim(sim)
    return took, endpoint["reason"]


# --------------------------------------------------------------------------- 2


def checks_per_second(endpoints: int, envoys: int, window_s: float) -> dict[str, Any]:
    with stack() as running:
        base = free_port_block(endpoints)
        sim = Sim(base, endpoints, ("--ttft", "20ms")).spawn()
        try:
            _wait_sim(sim)
            addresses = [f"127.0.0.1:{base + i}" for i in range(endpoints)]
            plugin = running.plugin(addresses, {})
            gateways = {f"gw-{i + 1}": running.envoy(plugin, f"gw-{i + 1}") for i in range(envoys)}
            wait_until(
                lambda: every_endpoint_reported(plugin, 2, envoys), 60, "reports on every endpoint"
            )
            return _measure(plugin, gateways, window_s)
        finally:
            sim.stop()


def _wait_sim(sim: Sim) -> None:
    import asyncio

    asyncio.run(sim.up(30))


def _measure(
    plugin: PluginProcess, gateways: dict[str, EnvoyProcess], window_s: float
) -> dict[str, Any]:
    """Checks/s per Envoy between two burst edges. Envoy starts all sessions of a
    specifier at once and (no jitter configured) checks them together every interval, so
    ``attempt`` grows in steps; counting between steps avoids a one-step error."""
    plugin_pid = plugin.process.pid if plugin.process else 0
    plugin_cpu, started = cpu_seconds(plugin_pid), time.monotonic()
    first = {node: _edge(envoy) for node, envoy in gateways.items()}
    time.sleep(window_s)
    last = {node: _edge(envoy) for node, envoy in gateways.items()}
    elapsed = time.monotonic() - started
    plugin_cpu = cpu_seconds(plugin_pid) - plugin_cpu
    assigned = {n["node"]: n["assigned_endpoints"] for n in plugin.status()["hds"]["nodes"]}
    rows = {}
    for node in gateways:
        (t0, attempts0, failures0, cpu0), (t1, attempts1, failures1, cpu1) = first[node], last[node]
        rows[node] = {
            "assigned": assigned.get(node, 0),
            "checks_per_s": (attempts1 - attempts0) / (t1 - t0),
            "failures": failures1 - failures0,
            "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        }
    return {"rows": rows, "plugin_cpu_pct": 100 * plugin_cpu / elapsed, "window_s": elapsed}


def _edge(envoy: EnvoyProcess) -> tuple[float, int, int, float]:
    """(time of the next step of ``attempt``, attempts, failures, Envoy CPU s) just after it."""
    before = envoy.stat(HDS_STATS + "attempt")
    deadline = time.monotonic() + 5
    while envoy.stat(HDS_STATS + "attempt") == before and time.monotonic() < deadline:
        time.sleep(0.005)
    at = time.monotonic()
    time.sleep(0.2)  # let the step finish (all sessions fire within a few ms)
    attempts, failures = envoy.stat(HDS_STATS + "attempt"), envoy.stat(HDS_STATS + "failure", 0)
    return at, attempts, failures, cpu_seconds(envoy.pid or 0)


# --------------------------------------------------------------------------- report


def _summary(results: list[tuple[float, str]]) -> str:
    times = sorted(t for t, _ in results)
    return (
        f"median {statistics.median(times):.2f} s, min {times[0]:.2f} s, max {times[-1]:.2f} s"
        f" ({len(times)} rounds)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--envoys", type=int, default=3)
    parser.add_argument("--window", type=float, default=15.0, help="seconds")
    args = parser.parse_args()

    lines = ["## 1. Backend port closed -> EDS UNHEALTHY in a second Envoy", ""]
    lines += ["| mode | time to UNHEALTHY in gw-2 | reasons seen |", "|---|---|---|"]
    rounds: list[str] = []
    for mode in ("hds-only", "default"):
        results = close_to_unhealthy(args.rounds, mode)
        reasons = sorted({reason.split(" (")[0] for _, reason in results})
        row = f"| {mode} | {_summary(results)} | {'; '.join(reasons)} |"
        print(row, flush=True)
        lines.append(row)
        rounds.append(f"- {mode}: " + ", ".join(f"{t:.2f} s ({r})" for t, r in results))
    lines += ["", "Rounds (time, the plugin's reason when gw-2 saw UNHEALTHY):", "", *rounds]
    lines += [
        "",
        "`hds-only`: the TTFT probe alone needs 100 failures (`probe.unhealthy_after: 100`), "
        "so the HDS quorum (gw-1 and gw-2 both report the host UNHEALTHY) takes it out. "
        "Expected: Envoy's 2 consecutive failed TCP checks at a 1 s interval, then up to one "
        "1 s report interval, then the EDS push. `default`: default probe settings too, "
        "whichever concludes first (the reason says which); usually the probe "
        "(a refused connection is an ERROR, a confirm-probe follows at once).",
        "",
    ]

    load = checks_per_second(args.endpoints, args.envoys, args.window)
    lines += [
        f"## 2. HDS checks per second, {args.endpoints} endpoints, {args.envoys} Envoys, "
        "checkers_per_endpoint 2, interval 1 s",
        "",
        "| Envoy | endpoints assigned | HDS checks/s | failed checks | Envoy CPU |",
        "|---|---|---|---|---|",
    ]
    for node, row in sorted(load["rows"].items()):
        line = (
            f"| {node} | {row['assigned']} | {row['checks_per_s']:.1f} | {row['failures']} "
            f"| {row['cpu_pct']:.1f} % |"
        )
        print(line, flush=True)
        lines.append(line)
    total = sum(r["checks_per_s"] for r in load["rows"].values())
    lines += [
        "",
        f"Total {total:.1f} checks/s (expected {args.endpoints} x 2 / interval = "
        f"{args.endpoints * 2}/s); counted between steps of each Envoy's `attempt` counter "
        f"over about {load['window_s']:.0f} s. Plugin CPU "
        f"(probing {args.endpoints} endpoints at 1/s + serving HDS and EDS): "
        f"{load['plugin_cpu_pct']:.1f} %. Load average at the end: {load_average()}.",
    ]
    body = "\n".join(lines)
    print(body)
    write_result("hds", body, "python bench/hds.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
