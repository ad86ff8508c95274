"""ext_authz overhead: the latency Envoy adds per request when it asks llm-health first.

One real Envoy (envoy-configs/ext-authz.yaml) with TWO listeners on the same cluster: the
shipped one (ext_authz filter on) and a copy without the filter. One ``llm-health sim``
backend with TTFT 0 and the plugin (``llm-health serve``) as subprocesses. An open-loop
load generator in this process (Python, aiohttp, a bounded number of requests sent on a
fixed schedule; latency counted from the scheduled send time, so a stall is not hidden)
drives each listener in turn at the same fixed rate: phases of ``--phase`` seconds, with
and without the filter alternating (ABBA...), so both see the same machine conditions.

Reported per rate: p50 / p99 with and without the filter and their difference, the rate
actually achieved, the plugin's CPU during the with-filter phases (probing alone during
the without-filter phases, for reference), and Envoy's ext_authz counters (a check that
failed or timed out is allowed by failure_mode_allow and counted as failure_mode_allowed).

    .venv/bin/python bench/authz_overhead.py --rates 200 1000 --phase 5 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import cpu_seconds, load_average  # noqa: E402

from common import write_result  # noqa: E402
from tests.envoy_harness import EnvoyProcess, free_port, listeners, render_config  # noqa: E402
from tests.processes import PluginProcess, SimProcess  # noqa: E402

CLUSTER = "llama-70b"
BODY = json.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 1}).encode()
MAX_CONNECTIONS = 256  # bound on concurrent requests (and connections) per phase
WITH, WITHOUT = "with ext_authz", "without"


@dataclass
class Phase:
    listener: str
    rate: float
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    plugin_cpu_s: float = 0.0
    envoy_cpu_s: float = 0.0
    self_cpu_s: float = 0.0


async def run_phase(session: aiohttp.ClientSession, url: str, phase: Phase, seconds: float) -> None:
    """Send ``rate x seconds`` requests on a fixed schedule (open loop); each latency runs
    from its scheduled time to the end of the response. Bounded by MAX_CONNECTIONS in
    flight and by ``seconds + 10`` s of wall time."""
    count = int(phase.rate * seconds)
    gate = asyncio.Semaphore(MAX_CONNECTIONS)
    start = time.perf_counter() + 0.05

    async def one(due: float) -> None:
        try:
            async with session.post(url, data=BODY) as response:
                await response.read()
                if response.status != 200:
                    key = str(response.status)
                    phase.errors[key] = phase.errors.get(key, 0) + 1
                    return
            phase.latencies_s.append(time.perf_counter() - due)
        except (aiohttp.ClientError, TimeoutError) as exc:
            key = type(exc).__name__
            phase.errors[key] = phase.errors.get(key, 0) + 1
        finally:
            gate.release()

    async with asyncio.timeout(seconds + 10.0), asyncio.TaskGroup() as group:
        for index in range(count):
            due = start + index / phase.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await gate.acquire()
            group.create_task(one(due))
    phase.wall_s = time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def add_plain_listener(config: dict[str, Any], port: int) -> None:
    """A second listener: the first one's copy without the ext_authz filter."""
    plain = copy.deepcopy(listeners(config)[0])
    plain["name"] = "llm_plain"
    plain["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    hcm = plain["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "llm_plain"
    hcm.pop("access_log", None)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if "ext_authz" not in f["name"]]
    listeners(config)[0]["filter_chains"][0]["filters"][0]["typed_config"].pop("access_log", None)
    config["static_resources"]["listeners"].append(plain)


async def measure(args: argparse.Namespace, work: Path) -> tuple[list[Phase], dict[str, Any]]:
    sim = SimProcess(work, "backend", "--ttft", "0ms", "--tpot", "0ms")
    plugin: PluginProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        await asyncio.to_thread(sim.wait_up)
        settings = {
            "probe": {"model": "sim-model"},
            "clusters": [{"name": CLUSTER, "endpoints": [{"address": sim.address}]}],
        }
        plugin = PluginProcess(work / "plugin", settings)
        await asyncio.to_thread(lambda: plugin.start().wait_ready())  # type: ignore[union-attr]
        authz_port, plain_port = free_port(), free_port()
        rendered = render_config(
            ROOT / "envoy-configs" / "ext-authz.yaml",
            work / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=authz_port,
            admin_port=0,
            extra=lambda c: add_plain_listener(c, plain_port),
        )
        envoy = EnvoyProcess(rendered, workdir=work / "envoy")
        await envoy.astart()
        urls = {
            WITH: f"http://127.0.0.1:{authz_port}/v1/completions",
            WITHOUT: f"http://127.0.0.1:{plain_port}/v1/completions",
        }
        return await drive(args, urls, plugin, envoy)
    finally:
        if envoy is not None:
            await envoy.astop()
        if plugin is not None:
            plugin.stop()
        sim.stop()


async def drive(
    args: argparse.Namespace, urls: dict[str, str], plugin: PluginProcess, envoy: EnvoyProcess
) -> tuple[list[Phase], dict[str, Any]]:
    """Per rate: a warm-up phase per listener (discarded: new connections, Envoy's gRPC
    client and the plugin's loop ramp up), then the measured rounds. Returns the phases
    and Envoy's ext_authz counters per stage (warm-up / measured) and rate."""
    assert plugin.process is not None and envoy.pid is not None
    phases: list[Phase] = []
    counters: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, force_close=False)
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for rate in args.rates:
            before = authz_counters(envoy)
            for name in urls:
                warm = Phase(name, rate)
                await run_phase(session, urls[name], warm, args.warmup)
                print("warm-up", summary_line(warm), flush=True)
            middle = authz_counters(envoy)
            order = list(urls)
            for _round in range(args.rounds):
                for name in order:
                    phases.append(
                        await timed_phase(session, urls[name], name, rate, args, plugin, envoy)
                    )
                    print(summary_line(phases[-1]), flush=True)
                order.reverse()
            after = authz_counters(envoy)
            counters[f"{rate:.0f}/s warm-up"] = diff(middle, before)
            counters[f"{rate:.0f}/s measured"] = diff(after, middle)
    return phases, counters


async def timed_phase(
    session: aiohttp.ClientSession,
    url: str,
    name: str,
    rate: float,
    args: argparse.Namespace,
    plugin: PluginProcess,
    envoy: EnvoyProcess,
) -> Phase:
    assert plugin.process is not None and envoy.pid is not None
    phase = Phase(name, rate)
    cpu = cpu_seconds(plugin.process.pid), cpu_seconds(envoy.pid), time.process_time()
    await run_phase(session, url, phase, args.phase)
    phase.plugin_cpu_s = cpu_seconds(plugin.process.pid) - cpu[0]
    phase.envoy_cpu_s = cpu_seconds(envoy.pid) - cpu[1]
    phase.self_cpu_s = time.process_time() - cpu[2]
    return phase


def authz_counters(envoy: EnvoyProcess) -> dict[str, int]:
    """Envoy's ext_authz counters of the filtered listener (ok, denied, error, ...)."""
    prefix = "http.llm_ingress.ext_authz.llm_health."
    stats = envoy.stats(r"^http\.llm_ingress\.ext_authz\.")
    return {k.removeprefix(prefix): v for k, v in stats.items() if isinstance(v, int)}


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def summary_line(phase: Phase) -> str:
    done = len(phase.latencies_s)
    return (
        f"{phase.rate:>6.0f}/s {phase.listener:<15} n={done:<6} "
        f"p50={percentile(phase.latencies_s, 0.5) * 1000:6.2f} ms "
        f"p99={percentile(phase.latencies_s, 0.99) * 1000:7.2f} ms "
        f"achieved={done / phase.wall_s if phase.wall_s else 0:7.1f}/s "
        f"plugin cpu={phase.plugin_cpu_s / phase.wall_s * 100 if phase.wall_s else 0:5.1f}% "
        f"errors={phase.errors}"
    )


def merge(phases: list[Phase], name: str, rate: float) -> Phase:
    total = Phase(name, rate)
    for phase in (p for p in phases if p.rate == rate and p.listener == name):
        total.latencies_s += phase.latencies_s
        total.wall_s += phase.wall_s
        total.plugin_cpu_s += phase.plugin_cpu_s
        total.envoy_cpu_s += phase.envoy_cpu_s
        total.self_cpu_s += phase.self_cpu_s
        for key, value in phase.errors.items():
            total.errors[key] = total.errors.get(key, 0) + value
    return total


def added(phases: list[Phase], rate: float, q: float) -> list[float]:
    """Per round: percentile q with the filter minus without (ms); a round's two phases
    ran back to back, so machine noise hits both alike."""
    with_f = [p for p in phases if p.rate == rate and p.listener == WITH]
    without = [p for p in phases if p.rate == rate and p.listener == WITHOUT]
    return [
        (percentile(a.latencies_s, q) - percentile(b.latencies_s, q)) * 1000
        for a, b in zip(with_f, without, strict=True)
    ]


def report(phases: list[Phase], envoy_stats: dict[str, Any], args: argparse.Namespace) -> str:
    overhead = [
        "| rate (req/s) | p50 added: median of rounds | p99 added: median of rounds "
        "| p99 added per round | plugin CPU (one core) |",
        "|---|---|---|---|---|",
    ]
    rows = [
        "| rate (req/s) | listener | requests | achieved (req/s) | p50 | p99 | errors "
        "| plugin CPU | Envoy CPU | load generator CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate in args.rates:
        for name in (WITH, WITHOUT):
            total = merge(phases, name, rate)
            lat, wall = total.latencies_s, total.wall_s
            rows.append(
                f"| {rate:.0f} | {name} | {len(lat)} | {len(lat) / wall:.0f} "
                f"| {percentile(lat, 0.5) * 1000:.2f} ms | {percentile(lat, 0.99) * 1000:.2f} ms "
                f"| {sum(total.errors.values())} | {total.plugin_cpu_s / wall:.0%} "
                f"| {total.envoy_cpu_s / wall:.0%} | {total.self_cpu_s / wall:.0%} |"
            )
        p50, p99 = added(phases, rate, 0.5), added(phases, rate, 0.99)
        cpu = merge(phases, WITH, rate)
        overhead.append(
            f"| {rate:.0f} | {statistics.median(p50):+.2f} ms | {statistics.median(p99):+.2f} ms "
            f"| {', '.join(f'{v:+.1f}' for v in p99)} ms "
            f"| {cpu.plugin_cpu_s / cpu.wall_s:.0%} |"
        )
    counters = "; ".join(
        f"{stage}: " + (", ".join(f"`{k}` {v}" for k, v in sorted(values.items())) or "none")
        for stage, values in envoy_stats.items()
    )
    failed = {
        stage: values.get("failure_mode_allowed", 0)
        for stage, values in envoy_stats.items()
        if values.get("failure_mode_allowed", 0)
    }
    verdict = (
        f"checks that failed or timed out (100 ms) and were let through: {failed}"
        if failed
        else "no check failed or timed out: none let through unchecked"
    )
    return "\n".join(
        [
            "Latency ext_authz adds through Envoy (Envoy 1.40, envoy-configs/ext-authz.yaml, "
            "one `llm-health sim` backend with TTFT 0, the plugin as `llm-health serve`). "
            f"Open-loop Python/aiohttp load from one process, {args.rounds} rounds of "
            f"{args.phase:g} s per listener and rate, with and without the filter back to "
            "back (order alternating); latency counted from each request's scheduled send "
            "time to the end of its response; before each rate, a discarded "
            f"{args.warmup:g} s warm-up per listener. CPU: share of one core over that listener's "
            "phases (the plugin probes in both; only the with-filter phases carry checks).",
            "",
            *overhead,
            "",
            *rows,
            "",
            f"Envoy's ext_authz counters (listener with the filter) per stage: {counters}.",
            f"So: {verdict}.",
            f"Load average at the start: {args.load_at_start}; at the end: {load_average()}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[200.0, 1000.0])
    parser.add_argument("--phase", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds, per listener/rate")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    args.load_at_start = load_average()
    with tempfile.TemporaryDirectory(prefix="authz-bench-") as tmp:
        phases, stats = asyncio.run(measure(args, Path(tmp)))
    body = report(phases, stats, args)
    print(body)
    if not args.no_write:
        command = "python bench/authz_overhead.py " + " ".join(sys.argv[1:])
        print(write_result("authz_overhead", body, command.strip()))


if __name__ == "__main__":
    main()
