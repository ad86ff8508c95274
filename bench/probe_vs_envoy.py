"""CPU per probe: ``llm-health serve`` against Envoy's own C++ active health checker, side by
side on the same backends in the same run (the baseline of docs/benchmarks.md).

For each size N, simulator processes serve N ports (``--ttft``, no decode time after the
token: ``max_tokens`` 1 ends the stream at once). Then, at the same time:

- ``llm-health serve`` (a process of its own, as shipped: the config's defaults but for
  ``interval: 1s``; ``--workers`` sets ``server.probe_workers``) probes every port;
- Envoy (``--concurrency 1``) health-checks every port of a static cluster: HTTP
  ``POST /v1/completions`` with the same kind of body (streamed, one token), every
  1 s, connection reused (Envoy's default), ``no_traffic_interval`` 1 s so the idle
  cluster is checked at the interval too.

After a warm-up it reads, over ``--duration`` seconds: the CPU of each (``/proc``: the
plugin with its worker processes, Envoy's whole process), the probes the plugin completed
(``llm_health_probes_completed_total``) and the checks Envoy made
(``cluster.hc.health_check.attempt``), and prints CPU per probe, per check and the ratio.
The simulators' CPU is shared and counted for neither.

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
TIMEOUT = aiohttp.ClientTimeout(total=10)


def envoy_config(ports: list[int]) -> dict[str, Any]:
    """A static cluster of every port, health-checked as the plugin probes (interval 1 s)."""
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
            "send": {"text": json.dumps(CHECK_BODY).encode().hex()},
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


async def measure(count: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    base = port_block(count)
    ports = list(range(base, base + count))
    timing = ("--ttft", args.ttft, "--tpot", "0ms")
    sims = [
        Sim(base + i, min(PORTS_PER_SIM, count - i), timing) for i in range(0, count, PORTS_PER_SIM)
    ]
    plugin: PluginProcess | None = None
    envoy: EnvoyProcess | None = None
    for sim in sims:
        sim.spawn()
    try:
        await asyncio.gather(*(s.up(60) for s in sims))
        plugin = PluginProcess(work / f"plugin-{count}", plugin_settings(ports, args.workers))
        (work / f"plugin-{count}").mkdir(exist_ok=True)
        await asyncio.to_thread(plugin.start().wait_ready, 30 + count / 50)
        config = work / f"envoy-{count}.yaml"
        config.write_text(yaml.safe_dump(envoy_config(ports)))
        envoy = EnvoyProcess(config, workdir=work / f"envoy-{count}")
        await envoy.astart()
        assert plugin.process is not None and envoy.pid is not None
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            await asyncio.sleep(args.warmup)
            probes0, checks0 = await probes_completed(session, plugin), envoy_checks(envoy)
            cpu0 = process_tree_cpu(plugin.process.pid)
            split0 = cpu_split(plugin.process.pid), cpu_split(envoy.pid)
            wall0 = time.monotonic()
            await asyncio.sleep(args.duration)
            wall = time.monotonic() - wall0
            split = (
                _since(cpu_split(plugin.process.pid), split0[0]),
                _since(cpu_split(envoy.pid), split0[1]),
            )
            # Envoy's all-in is its split's sum (one reading); the plugin's takes in its
            # probe workers too, which the split of its main process does not.
            cpu = process_tree_cpu(plugin.process.pid) - cpu0, sum(split[1])
            probes = await probes_completed(session, plugin) - probes0
            checks = envoy_checks(envoy)
        states = plugin.states()
    finally:
        if envoy is not None:
            await envoy.astop()
        if plugin is not None:
            plugin.stop()
        for sim in sims:
            sim.stop()
    attempts, failures = checks[0] - checks0[0], checks[1] - checks0[1]
    return {
        "endpoints": count,
        "wall": wall,
        "plugin_cpu": cpu[0],
        "envoy_cpu": cpu[1],
        "plugin_split": split[0],  # (user, system) of the main process alone
        "envoy_split": split[1],
        "probes": probes,
        "checks": attempts,
        "check_failures": failures,
        "healthy": sum(1 for s in states.values() if s == "healthy"),
    }


def _since(now: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    return now[0] - then[0], now[1] - then[1]


def _split_per(split: tuple[float, float], count: float) -> str:
    """User + system CPU per probe (or check), in µs."""
    return f"{split[0] / max(count, 1) * 1e6:.0f} + {split[1] / max(count, 1) * 1e6:.0f} µs"


def render(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| endpoints | plugin probes/s | Envoy checks/s | plugin CPU | Envoy CPU"
        " | CPU per probe | CPU per check | ratio | user + system per probe (main process)"
        " | user + system per check | plugin HEALTHY | Envoy check failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_probe = r["plugin_cpu"] / max(r["probes"], 1)
        per_check = r["envoy_cpu"] / max(r["checks"], 1)
        lines.append(
            f"| {r['endpoints']} | {r['probes'] / r['wall']:.0f} | {r['checks'] / r['wall']:.0f}"
            f" | {r['plugin_cpu'] / r['wall']:.1%} | {r['envoy_cpu'] / r['wall']:.1%}"
            f" | {per_probe * 1e6:.0f} µs | {per_check * 1e6:.0f} µs"
            f" | {per_probe / per_check:.2f}× | {_split_per(r['plugin_split'], r['probes'])}"
            f" | {_split_per(r['envoy_split'], r['checks'])}"
            f" | {r['healthy']} / {r['endpoints']}"
            f" | {r['check_failures']} |"
        )
    return lines


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
        f"Both at once on the same simulators (TTFT {args.ttft}, the stream ends right after"
        f" its one token), interval 1 s, {args.warmup:g} s warm-up, {args.duration:g} s"
        f" measured; server.probe_workers: {workers}; Envoy --concurrency 1."
        f" Load average before: {load}. {time.monotonic() - started:.0f} s in all. {warning}"
    )
    command = "python bench/probe_vs_envoy.py " + " ".join(sys.argv[1:])
    print(write_result("probe_vs_envoy", "\n".join([intro, "", *lines]), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
