"""CPU per probe: ``llm-health serve`` against Envoy's own C++ active health checker, side by
side on the same backends in the same run (the baseline of docs/benchmarks.md).

For each size N, simulator processes serve N ports (``--ttft``, no decode time after the
token: ``max_tokens`` 1 ends the stream at once). Then, at the same time:

- ``llm-health serve`` (a process of its own, as shipped: the config's defaults but for
  ``interval: 1s``; ``--workers`` sets ``server.probe_workers``) probes every port;
- two Envoys (``--concurrency 1``, each in a process of its own so that each checker's
  CPU is read from its own process) health-check every port of a static cluster: HTTP
  ``POST /v1/completions`` every 1 s, connection reused (Envoy's default),
  ``no_traffic_interval`` 1 s so the idle cluster is checked at the interval too. The two
  are configured alike but for the body. One asks for a streamed one-token completion:
  the like-for-like of the plugin's probe. The other asks for the plain one-token
  completion a user would configure (no ``stream``: Envoy reads one small JSON body), the
  cheaper check an operator would compare against.

After a warm-up it reads, over ``--duration`` seconds: the CPU of each (``/proc``: the
plugin with its worker processes, each Envoy's whole process), the probes the plugin
completed (``llm_health_probes_completed_total``) and the checks each Envoy made
(``cluster.hc.health_check.attempt``), and prints CPU per probe, per check of each kind,
and the ratio of the plugin's cost to each. The simulators' CPU is shared and counted for
none.

    .venv/bin/python bench/probe_vs_envoy.py --endpoints 200 1000 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from authz_overhead import process_tree_cpu  # noqa: E402
from probe_scale import port_block, raise_fd_limit  # noqa: E402
from procs import Sim, cpu_split, load_average  # noqa: E402

from common import add_workers_argument, write_result  # noqa: E402
from tests.envoy_harness import EnvoyProcess  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

PORTS_PER_SIM = 250
CHECK_BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1, "stream": True}
PLAIN_BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
# One Envoy checker per body, in the table's order: the like-for-like of the plugin's
# streamed probe, then the plain POST a user would configure.
CHECK_BODIES: dict[str, dict[str, Any]] = {"streamed": CHECK_BODY, "plain": PLAIN_BODY}
TIMEOUT = aiohttp.ClientTimeout(total=10)

# An Envoy's readings: (user CPU s, system CPU s, check attempts, check failures).
EnvoyReading = tuple[float, float, int, int]


def envoy_config(ports: list[int], body: dict[str, Any] = CHECK_BODY) -> dict[str, Any]:
    """A static cluster of every port, health-checked as the plugin probes (interval 1 s),
    each check POSTing ``body``."""
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in ports
    ]
    check = {
        "timeout": "0.8s",
        "interval": "1s",
        "no_traffic_interval": "1s",  # the cluster gets no traffic: check at the interval
        "initial_jitter": "1s",
        "unhealthy_threshold": 2,
        "healthy_threshold": 1,
        "http_health_check": {
            "path": "/v1/completions",
            "method": "POST",
            "send": {"text": json.dumps(body).encode().hex()},
            "request_headers_to_add": [
                {"header": {"key": "content-type", "value": "application/json"}}
            ],
        },
    }
    cluster = {
        "name": "hc",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "hc", "endpoints": [{"lb_endpoints": endpoints}]},
        "health_checks": [check],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"clusters": [cluster]},
    }


def plugin_settings(ports: list[int], workers: int | str | None) -> dict[str, Any]:
    server: dict[str, Any] = {} if workers is None else {"probe_workers": workers}
    return {
        "server": server,
        "probe": {"model": "sim-model", "interval": "1s", "timeout": "800ms"},
        "xds": {"warm_start_timeout": "30s"},
        "clusters": [
            {"name": "bench", "endpoints": [{"address": f"127.0.0.1:{p}"} for p in ports]}
        ],
    }


def envoy_processes(ports: list[int], work: Path) -> dict[str, EnvoyProcess]:
    """One Envoy per check body, configured alike but for the body (not started yet)."""
    envoys = {}
    for name, body in CHECK_BODIES.items():
        config = work / f"envoy-{name}-{len(ports)}.yaml"
        config.write_text(yaml.safe_dump(envoy_config(ports, body)))
        envoys[name] = EnvoyProcess(config, workdir=work / f"envoy-{name}-{len(ports)}")
    return envoys


async def probes_completed(session: aiohttp.ClientSession, plugin: PluginProcess) -> float:
    async with session.get(f"http://127.0.0.1:{plugin.http_port}/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llm_health_probes_completed_total")
    )


def envoy_checks(envoy: EnvoyProcess) -> tuple[int, int]:
    """(attempts, failures) of Envoy's health checker so far."""
    return (
        envoy.stat("cluster.hc.health_check.attempt", 0),
        envoy.stat("cluster.hc.health_check.failure", 0),
    )


def envoy_reading(envoy: EnvoyProcess) -> EnvoyReading:
    """The CPU of Envoy's whole process and its health checker's counters so far."""
    assert envoy.pid is not None
    return (*cpu_split(envoy.pid), *envoy_checks(envoy))


def envoy_row(then: EnvoyReading, now: EnvoyReading) -> dict[str, Any]:
    """One checker's figures over the window. Its all-in CPU is its split's sum (one
    reading)."""
    split = now[0] - then[0], now[1] - then[1]
    return {
        "cpu": sum(split),
        "split": split,
        "checks": now[2] - then[2],
        "failures": now[3] - then[3],
    }


async def measure_window(
    session: aiohttp.ClientSession,
    plugin: PluginProcess,
    envoys: dict[str, EnvoyProcess],
    duration: float,
) -> dict[str, Any]:
    """The plugin's and each Envoy's CPU and work over ``duration`` seconds."""
    assert plugin.process is not None
    pid = plugin.process.pid
    probes0 = await probes_completed(session, plugin)
    envoys0 = {name: envoy_reading(e) for name, e in envoys.items()}
    cpu0, split0 = process_tree_cpu(pid), cpu_split(pid)
    wall0 = time.monotonic()
    await asyncio.sleep(duration)
    wall = time.monotonic() - wall0
    # The plugin's all-in takes in its probe workers too, which the split of its main
    # process does not.
    cpu, split = process_tree_cpu(pid) - cpu0, _since(cpu_split(pid), split0)
    envoys1 = {name: envoy_reading(e) for name, e in envoys.items()}
    return {
        "wall": wall,
        "plugin_cpu": cpu,
        "plugin_split": split,  # (user, system) of the main process alone
        "probes": await probes_completed(session, plugin) - probes0,
        "envoy": {name: envoy_row(envoys0[name], envoys1[name]) for name in envoys},
    }


async def measure(count: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    base = port_block(count)
    ports = list(range(base, base + count))
    timing = ("--ttft", args.ttft, "--tpot", "0ms")
    sims = [
        Sim(base + i, min(PORTS_PER_SIM, count - i), timing) for i in range(0, count, PORTS_PER_SIM)
    ]
    plugin: PluginProcess | None = None
    envoys = envoy_processes(ports, work)
    for sim in sims:
        sim.spawn()
    try:
        await asyncio.gather(*(s.up(60) for s in sims))
        plugin = PluginProcess(work / f"plugin-{count}", plugin_settings(ports, args.workers))
        (work / f"plugin-{count}").mkdir(exist_ok=True)
        await asyncio.to_thread(plugin.start().wait_ready, 30 + count / 50)
        for envoy in envoys.values():
            await envoy.astart()
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            await asyncio.sleep(args.warmup)
            row = await measure_window(session, plugin, envoys, args.duration)
        states = plugin.states()
    finally:
        for envoy in envoys.values():
            await envoy.astop()
        if plugin is not None:
            plugin.stop()
        for sim in sims:
            sim.stop()
    healthy = sum(1 for s in states.values() if s == "healthy")
    return {"endpoints": count, "healthy": healthy, **row}


def _since(now: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    return now[0] - then[0], now[1] - then[1]


def _split_per(split: tuple[float, float], count: float) -> str:
    """User + system CPU per probe (or check), in µs."""
    return f"{split[0] / max(count, 1) * 1e6:.0f} + {split[1] / max(count, 1) * 1e6:.0f} µs"


def _each(values: list[str]) -> str:
    """One cell with a figure per checker, in CHECK_BODIES' order."""
    return " / ".join(values)


def render_row(r: dict[str, Any]) -> str:
    wall, per_probe = r["wall"], r["plugin_cpu"] / max(r["probes"], 1)
    checkers = [r["envoy"][name] for name in CHECK_BODIES]
    per_check = [c["cpu"] / max(c["checks"], 1) for c in checkers]
    cells = [
        str(r["endpoints"]),
        f"{r['probes'] / wall:.0f}",
        _each([f"{c['checks'] / wall:.0f}" for c in checkers]),
        f"{r['plugin_cpu'] / wall:.1%}",
        _each([f"{c['cpu'] / wall:.1%}" for c in checkers]),
        f"{per_probe * 1e6:.0f} µs",
        *(f"{p * 1e6:.0f} µs" for p in per_check),
        *(f"{per_probe / p:.2f}×" for p in per_check),
        _split_per(r["plugin_split"], r["probes"]),
        *(_split_per(c["split"], c["checks"]) for c in checkers),
        f"{r['healthy']} / {r['endpoints']}",
        *(str(c["failures"]) for c in checkers),
    ]
    return "| " + " | ".join(cells) + " |"


def render(rows: list[dict[str, Any]]) -> list[str]:
    names = list(CHECK_BODIES)
    columns = [
        "endpoints",
        "plugin probes/s",
        f"Envoy checks/s ({_each(names)})",
        "plugin CPU",
        f"Envoy CPU ({_each(names)})",
        "CPU per probe",
        *(f"CPU per {name} check" for name in names),
        *(f"ratio to {name}" for name in names),
        "user + system per probe (main process)",
        *(f"user + system per {name} check" for name in names),
        "plugin HEALTHY",
        *(f"{name} check failures" for name in names),
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + [render_row(r) for r in rows]


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="probe-vs-envoy-") as work:
        return [await measure(n, args, Path(work)) for n in args.endpoints]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--ttft", default="20ms", help="the simulators' TTFT")
    add_workers_argument(parser)
    args = parser.parse_args()
    warning = raise_fd_limit(2 * max(args.endpoints))
    load = load_average()
    started = time.monotonic()
    rows = asyncio.run(run(args))
    lines = render(rows)
    print("\n".join(lines))
    workers = "the config's default" if args.workers is None else str(args.workers)
    intro = (
        f"All three at once on the same simulators (TTFT {args.ttft}, the stream ends right"
        f" after its one token), interval 1 s, {args.warmup:g} s warm-up, {args.duration:g} s"
        f" measured; server.probe_workers: {workers}; two Envoys, --concurrency 1 each, one"
        " POSTing a streamed one-token completion, the other the same without stream."
        f" Load average before: {load}. {time.monotonic() - started:.0f} s in all. {warning}"
    )
    command = "python bench/probe_vs_envoy.py " + " ".join(sys.argv[1:])
    print(write_result("probe_vs_envoy", "\n".join([intro, "", *lines]), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
