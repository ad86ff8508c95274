"""Footprint of `llm-health serve` (a real subprocess) probing N endpoints at interval 1s.

Simulators serve N ports (``--port-count``, at most ``--ports-per-sim`` per process, TTFT
50 ms). The plugin runs as ``llm-health serve`` with a generated config; after it is
ready and a warm-up, this script samples for ``--duration`` seconds:

- the serve process's CPU (``/proc/PID/stat``, user + system) and RSS (``VmRSS``; and
  the peak ``VmHWM``);
- probes/s achieved (``/status`` prober.probes_total) against N/s scheduled, probes
  ignored for loop lag, and how many endpoints are HEALTHY at the end;
- ``/metrics``: body size, series count and scrape time (scraped every ``--scrape-every``
  seconds as a Prometheus would, or only once at the end with 0), and the prober's worst
  loop lag (``llm_health_loop_lag_max_seconds``, a 30 s window);
- the wall time of ``llm-health status --json`` (a fresh CLI process over the admin API).

    .venv/bin/python bench/serve_footprint.py --endpoints 100 1000 --scrape-every 5 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, cpu_seconds, load_average, rss_mb  # noqa: E402

from common import free_port_block, wait_port, write_result  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

CLUSTER = "bench"


def settings(addresses: list[str]) -> dict[str, Any]:
    return {
        "probe": {"model": "sim-model", "interval": "1s", "timeout": "800ms"},
        "xds": {"warm_start_timeout": "30s"},
        "clusters": [{"name": CLUSTER, "endpoints": [{"address": a} for a in addresses]}],
    }


def get(url: str, timeout: float = 10.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def cli_status(grpc_port: int) -> tuple[float, int]:
    """Wall time of `llm-health status --json` (a new process) and the endpoints it listed."""
    started = time.perf_counter()
    admin = f"127.0.0.1:{grpc_port}"
    done = subprocess.run(
        [sys.executable, "-m", "llm_health.cli", "status", "--json", "--admin", admin],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "plugin")},
        check=True,
    )
    took_ms = (time.perf_counter() - started) * 1000
    listed = sum(len(c["endpoints"]) for c in json.loads(done.stdout)["clusters"])
    return took_ms, listed


async def scrape(url: str) -> tuple[float, int, int, float]:
    """(milliseconds, bytes, series, worst loop lag in s) of one /metrics scrape."""
    started = time.perf_counter()
    body = await asyncio.to_thread(get, url)
    took_ms = (time.perf_counter() - started) * 1000
    text = body.decode()
    series = sum(1 for line in text.splitlines() if line and line[0] != "#")
    return took_ms, len(body), series, lag_max_s(text)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def lag_max_s(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("llm_health_loop_lag_max_seconds "):
            return float(line.split()[1])
    return float("nan")


async def measure(
    n: int, ports_per_sim: int, warmup_s: float, duration_s: float, scrape_every_s: float
) -> dict[str, Any]:
    first = free_port_block(n)
    sims = [
        Sim(port, min(ports_per_sim, first + n - port), ("--ttft", "50ms", "--tpot", "1ms"))
        for port in range(first, first + n, ports_per_sim)
    ]
    workdir = Path(tempfile.mkdtemp(prefix="serve-footprint-"))
    plugin = PluginProcess(workdir, settings([f"127.0.0.1:{first + i}" for i in range(n)]))
    try:
        for sim in sims:
            sim.spawn()
        for sim in sims:
            await sim.up(60)
        plugin.start()
        await asyncio.to_thread(plugin.wait_ready, 90)
        await wait_port(plugin.grpc_port, 10)
        assert plugin.process is not None
        pid = plugin.process.pid
        base = f"http://127.0.0.1:{plugin.http_port}"
        await asyncio.sleep(warmup_s)
        status = json.loads(get(f"{base}/status"))
        probes0, ignored0 = (
            status["prober"]["probes_total"],
            status["prober"]["probes_ignored_loop_lag"],
        )
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        rss: list[float] = []
        scrapes: list[tuple[float, int, int, float]] = []  # ms, bytes, series, lag max
        next_scrape = t0
        while time.monotonic() - t0 < duration_s:
            rss.append(rss_mb(pid))
            if scrape_every_s > 0 and time.monotonic() >= next_scrape:
                scrapes.append(await scrape(f"{base}/metrics"))
                next_scrape += scrape_every_s
            await asyncio.sleep(0.5)
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
        final = await scrape(f"{base}/metrics")  # after the window: its lag max covers it
        cli_ms, listed = await asyncio.to_thread(cli_status, plugin.grpc_port)
        timed = scrapes or [final]
        status = json.loads(get(f"{base}/status"))
        states = [e["state"] for c in status["clusters"] for e in c["endpoints"]]
        sims_cpu = sum(cpu_seconds(s.pid) for s in sims)
        return {
            "n": n,
            "sims": len(sims),
            "cpu_pct": 100 * cpu / elapsed,
            "rss_mb": statistics.median(rss),
            "peak_rss_mb": peak_rss_mb(pid),
            "probes_per_s": (status["prober"]["probes_total"] - probes0) / elapsed,
            "ignored": status["prober"]["probes_ignored_loop_lag"] - ignored0,
            "healthy": states.count("healthy"),
            "scrape_every_s": scrape_every_s,
            "scrape_ms": statistics.median(t[0] for t in timed),
            "scrape_max_ms": max(t[0] for t in timed),
            "metrics_kib": final[1] / 1024,
            "series": final[2],
            "lag_max_ms": 1000 * max(t[3] for t in [*scrapes, final]),
            "sims_cpu_s": sims_cpu,
            "cli_ms": cli_ms,
            "cli_listed": listed,
        }
    finally:
        plugin.stop()
        for sim in sims:
            sim.stop()


def table(rows: list[dict[str, Any]], duration_s: float) -> str:
    head = (
        "| endpoints | /metrics scraped | serve CPU | serve RSS (peak) | probes/s (scheduled) "
        "| ignored (lag) | healthy at end | scrape p50 / max | /metrics size, series "
        "| worst loop lag | `status --json` |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['n']} | {_every(r['scrape_every_s'])} | {r['cpu_pct']:.0f} % of one core | {r['rss_mb']:.0f} MiB ({r['peak_rss_mb']:.0f}) "
        f"| {r['probes_per_s']:.0f} ({r['n']}) | {r['ignored']} | {r['healthy']} / {r['n']} "
        f"| {r['scrape_ms']:.0f} / {r['scrape_max_ms']:.0f} ms | {r['metrics_kib']:.0f} KiB, {r['series']} "
        f"| {r['lag_max_ms']:.0f} ms | {r['cli_ms']:.0f} ms, {r['cli_listed']} endpoints |"
        for r in rows
    ]
    return head + "\n".join(lines)


def _every(seconds: float) -> str:
    return f"every {seconds:g} s" if seconds > 0 else "once, at the end"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1000])
    parser.add_argument("--ports-per-sim", type=int, default=500)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--scrape-every", type=float, nargs="+", default=[5.0])
    args = parser.parse_args()
    load = load_average()
    rows = [
        asyncio.run(measure(n, args.ports_per_sim, args.warmup, args.duration, every))
        for n in args.endpoints
        for every in args.scrape_every
    ]
    body = (
        f"`llm-health serve` as a subprocess, interval 1 s, timeout 800 ms, simulator TTFT 50 ms "
        f"({args.ports_per_sim} ports per simulator process, on the same 2 cores), no Envoy "
        f"attached. {args.warmup:g} s warm-up after ready, then {args.duration:g} s measured. "
        f"Load average before: {load}, after: {load_average()}.\n\n" + table(rows, args.duration)
    )
    command = "python bench/serve_footprint.py " + " ".join(sys.argv[1:])
    print(body)
    print(write_result("serve_footprint", body, command.strip()))


if __name__ == "__main__":
    main()
