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

``--native`` measures admission inside Envoy instead (envoy-configs/admission-native.yaml:
the fault filter and the routes acting on the runtime layer the plugin pushes over RTDS,
docs/admission.md "Admission inside Envoy"): the listener with the filters against the
same listener with only the router. Every request then says ``x-llm-priority: low``, so
each one goes through the fault filter's header match and runtime lookup (the capacity
stays above ``shed_below``: nothing is shed, every request reaches the backend).

``--with-probing N`` adds N simulated endpoints (``llm-health sim`` processes of at most
500 ports, TTFT 100 ms, as in probe_scale.py) as a second cluster of the plugin's config:
the same plugin process probes them at 1/s while the admission latency is measured (Envoy
does not route to them). Reported: the probes/s the simulators received during the
measured rounds, and the target "every request admitted, added latency <= 1 ms p50 and
<= 3 ms p99 at 500 req/s while the prober runs 1,000 endpoints". ``--workers N`` sets ``server.probe_workers: N`` (probe worker
processes; their CPU is counted in the plugin's); left out, the config's default applies.

    .venv/bin/python bench/authz_overhead.py --rates 200 1000 --phase 5 --rounds 5
    .venv/bin/python bench/authz_overhead.py --rates 1000 --with-probing 1000
    .venv/bin/python bench/authz_overhead.py --rates 500 --with-probing 1000 --native
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import resource
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

from procs import Sim, cpu_seconds, load_average  # noqa: E402

from common import add_workers_argument, free_port_block, write_result  # noqa: E402
from tests.envoy_harness import EnvoyProcess, listeners, render_config  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess, SimProcess  # noqa: E402

CLUSTER = "llama-70b"
BODY = json.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 1}).encode()
MAX_CONNECTIONS = 256  # bound on concurrent requests (and connections) per phase
WITH, WITHOUT = "with ext_authz", "without"
NATIVE = "native admission"  # --native: the listener with the fault filter (WITH's place)
NATIVE_HEADERS = {"x-llm-priority": "low"}
PROBED_CLUSTER = "probed"  # --with-probing: in the plugin's config only, not in Envoy's
PORTS_PER_SIM = 500
PROBED_SIM_ARGS = ("--ttft", "100ms", "--tpot", "5ms")
TARGET_RATE, TARGET_ENDPOINTS, TARGET_P50_MS, TARGET_P99_MS = 500.0, 1000, 1.0, 3.0
LOW_PORTS = (10000, 20000)  # blocks that do not fit above 61000 (see probe_scale.py)
ROUTER = "envoy.filters.http.router"
STATS_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)


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


@dataclass
class Probing:
    """``--with-probing``: the simulators of the probed cluster and, per rate, the probes
    they received during the measured rounds and over how many seconds."""

    sims: list[Sim] = field(default_factory=list)
    probes: dict[float, tuple[int, float]] = field(default_factory=dict)

    @property
    def endpoints(self) -> int:
        return sum(s.count for s in self.sims)

    async def probe_count(self) -> int:
        """Probe requests the simulators have received so far (``/sim/stats``)."""
        async with aiohttp.ClientSession(timeout=STATS_TIMEOUT) as session:
            counts = await asyncio.gather(*(_probe_requests(session, s) for s in self.sims))
        return sum(counts)


async def _probe_requests(session: aiohttp.ClientSession, sim: Sim) -> int:
    async with session.get(f"{sim.base_url}/sim/stats") as response:
        response.raise_for_status()
        return int((await response.json())["probe_requests"])


async def start_probed(probing: Probing, count: int) -> None:
    """``count`` simulated endpoints on consecutive ports, at most 500 per process (kept
    in ``probing.sims`` as soon as spawned, so the caller stops them whatever happens)."""
    if count <= 0:
        return
    try:
        base = free_port_block(count)
    except RuntimeError:
        base = free_port_block(count, *LOW_PORTS)
    for i in range(0, count, PORTS_PER_SIM):
        sim = Sim(base + i, min(PORTS_PER_SIM, count - i), PROBED_SIM_ARGS)
        probing.sims.append(sim.spawn())
    await asyncio.gather(*(s.up(60) for s in probing.sims))


def probed_cluster(probing: Probing) -> dict[str, Any]:
    addresses = [f"127.0.0.1:{s.port + i}" for s in probing.sims for i in range(s.count)]
    return {"name": PROBED_CLUSTER, "endpoints": [{"address": a} for a in addresses]}


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: the plugin (a child) keeps one connection
    per probed endpoint."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (e.g. the plugin's probe workers)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        todo += parents.get(current, [])
    return total


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
    """A second listener: the first one's copy with the router as its only HTTP filter
    (without ext_authz, or without the fault filter)."""
    plain = copy.deepcopy(listeners(config)[0])
    plain["name"] = "llm_plain"
    plain["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    hcm = plain["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "llm_plain"
    hcm.pop("access_log", None)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == ROUTER]
    listeners(config)[0]["filter_chains"][0]["filters"][0]["typed_config"].pop("access_log", None)
    config["static_resources"]["listeners"].append(plain)


async def measure(
    args: argparse.Namespace, work: Path, probing: Probing
) -> tuple[list[Phase], dict[str, Any]]:
    sim = SimProcess(work, "backend", "--ttft", "0ms", "--tpot", "0ms")
    plugin: PluginProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        await asyncio.to_thread(sim.wait_up)
        await start_probed(probing, args.with_probing)
        clusters = [{"name": CLUSTER, "endpoints": [{"address": sim.address}]}]
        if probing.sims:
            clusters.append(probed_cluster(probing))
        own = free_port() if args.own_authz else None
        server: dict[str, Any] = {}
        if own is not None:
            server |= {"authz": f"127.0.0.1:{own}", "authz_isolation": args.authz_isolation}
        if args.workers is not None:
            server["probe_workers"] = args.workers
        settings = {"server": server, "probe": {"model": "sim-model"}, "clusters": clusters}
        plugin = PluginProcess(work / "plugin", settings)
        ready_s = 20.0 + probing.endpoints / 50  # the first probe round of every endpoint
        started = plugin.start()
        await asyncio.to_thread(started.wait_ready, ready_s)
        authz_port, plain_port = free_port(), free_port()
        shipped = "admission-native.yaml" if args.native else "ext-authz.yaml"
        rendered = render_config(
            ROOT / "envoy-configs" / shipped,
            work / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=authz_port,
            admin_port=0,
            authz_port=own,
            extra=lambda c: add_plain_listener(c, plain_port),
        )
        envoy = EnvoyProcess(rendered, workdir=work / "envoy")
        await envoy.astart()
        urls = {
            with_name(args): f"http://127.0.0.1:{authz_port}/v1/completions",
            WITHOUT: f"http://127.0.0.1:{plain_port}/v1/completions",
        }
        return await drive(args, urls, plugin, envoy, probing)
    finally:
        if envoy is not None:
            await envoy.astop()
        if plugin is not None:
            plugin.stop()
        sim.stop()
        for probed in probing.sims:
            probed.stop()


async def drive(
    args: argparse.Namespace,
    urls: dict[str, str],
    plugin: PluginProcess,
    envoy: EnvoyProcess,
    probing: Probing,
) -> tuple[list[Phase], dict[str, Any]]:
    """Per rate: a warm-up phase per listener (discarded: new connections, Envoy's gRPC
    client and the plugin's loop ramp up), then the measured rounds. Returns the phases
    and Envoy's ext_authz counters per stage (warm-up / measured) and rate; with probing,
    records the probes received during each rate's measured rounds in ``probing``."""
    assert plugin.process is not None and envoy.pid is not None
    phases: list[Phase] = []
    counters: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, force_close=False)
    timeout = aiohttp.ClientTimeout(total=5.0)
    headers = NATIVE_HEADERS if args.native else None
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        for rate in args.rates:
            before = authz_counters(envoy)
            for name in urls:
                warm = Phase(name, rate)
                await run_phase(session, urls[name], warm, args.warmup)
                print("warm-up", summary_line(warm), flush=True)
            middle = authz_counters(envoy)
            probes0 = await probing.probe_count() if probing.sims else 0
            started = time.monotonic()
            order = list(urls)
            for _round in range(args.rounds):
                for name in order:
                    phases.append(
                        await timed_phase(session, urls[name], name, rate, args, plugin, envoy)
                    )
                    print(summary_line(phases[-1]), flush=True)
                order.reverse()
            if probing.sims:
                probes = await probing.probe_count() - probes0
                probing.probes[rate] = (probes, time.monotonic() - started)
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
    plugin_pid = plugin.process.pid
    cpu = process_tree_cpu(plugin_pid), cpu_seconds(envoy.pid), time.process_time()
    await run_phase(session, url, phase, args.phase)
    phase.plugin_cpu_s = process_tree_cpu(plugin_pid) - cpu[0]
    phase.envoy_cpu_s = cpu_seconds(envoy.pid) - cpu[1]
    phase.self_cpu_s = time.process_time() - cpu[2]
    return phase


def with_name(args: argparse.Namespace) -> str:
    return NATIVE if args.native else WITH


def authz_counters(envoy: EnvoyProcess) -> dict[str, int]:
    """Envoy's admission counters of the filtered listener: ext_authz's (ok, denied,
    error, ...) or the fault filter's (aborts_injected, ...) and the cluster's
    ``upstream_cx_none_healthy`` (503 with nothing routable)."""
    prefixes = (
        "http.llm_ingress.ext_authz.llm_health.",
        "http.llm_ingress.",
        f"cluster.{CLUSTER}.",
    )
    pattern = (
        r"^(http\.llm_ingress\.(ext_authz|fault)\.|cluster\."
        + CLUSTER
        + r"\.upstream_cx_none_healthy$)"
    )
    found: dict[str, int] = {}
    for key, value in envoy.stats(pattern).items():
        if isinstance(value, int):
            found[next((key.removeprefix(p) for p in prefixes if key.startswith(p)), key)] = value
    return found


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
    """Per round: percentile q with the filter(s) minus without (ms); a round's two phases
    ran back to back, so machine noise hits both alike."""
    with_f = [p for p in phases if p.rate == rate and p.listener != WITHOUT]
    without = [p for p in phases if p.rate == rate and p.listener == WITHOUT]
    return [
        (percentile(a.latencies_s, q) - percentile(b.latencies_s, q)) * 1000
        for a, b in zip(with_f, without, strict=True)
    ]


def probing_lines(
    phases: list[Phase], probing: Probing, args: argparse.Namespace, unchecked: int
) -> list[str]:
    """With --with-probing: the endpoints probed, probes/s achieved per rate during the
    measured rounds, and the target with met / not met (nothing without probing)."""
    if not probing.sims:
        return []
    workers = "" if args.workers is None else f", `server.probe_workers: {args.workers}`"
    where = {"process": "its own process", "threads": "own threads"}[args.authz_isolation]
    workers += f", ext_authz on `server.authz` ({where})" if args.own_authz else ""
    workers += ", admission inside Envoy (`--native`)" if args.native else ""
    lines = [
        f"Probing meanwhile: the same plugin probed {probing.endpoints} more endpoints "
        f"(cluster `{PROBED_CLUSTER}`, {len(probing.sims)} simulator processes, TTFT 100 ms, "
        f"interval 1 s{workers}) besides the backend; probes the simulators received "
        "during the measured rounds: "
        + "; ".join(
            f"at {rate:.0f} req/s {count / seconds:.0f} probes/s "
            f"({100 * count / seconds / probing.endpoints:.1f} % of {probing.endpoints}/s)"
            for rate, (count, seconds) in probing.probes.items()
        )
        + "."
    ]
    return [*lines, target_line(phases, probing, unchecked)]


def target_line(phases: list[Phase], probing: Probing, unchecked: int) -> str:
    """The target: every request admitted (none let through unchecked), added p50 and
    p99 (medians of rounds) within bounds at 500 req/s while 1,000 endpoints are probed."""
    head = (
        f"Target: every request admitted, added latency <= {TARGET_P50_MS:g} ms p50 and "
        f"<= {TARGET_P99_MS:g} ms p99 at {TARGET_RATE:,.0f} req/s while the prober runs "
        f"{TARGET_ENDPOINTS:,} endpoints: "
    )
    if TARGET_RATE not in probing.probes:
        return head + f"not measured (rate {TARGET_RATE:.0f} req/s not run)."
    p50 = statistics.median(added(phases, TARGET_RATE, 0.5))
    p99 = statistics.median(added(phases, TARGET_RATE, 0.99))
    count, seconds = probing.probes[TARGET_RATE]
    measured = (
        f"{p50:+.2f} ms p50 and {p99:+.2f} ms p99 added, {unchecked} let through unchecked, "
        f"with {probing.endpoints} endpoints probed ({count / seconds:.0f} probes/s)"
    )
    if probing.endpoints < TARGET_ENDPOINTS:
        return head + f"{measured}: not applicable (fewer than {TARGET_ENDPOINTS:,} probed)."
    met = p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS and not unchecked
    return head + f"{measured}: {'met' if met else 'not met'}."


def report(
    phases: list[Phase],
    envoy_stats: dict[str, Any],
    args: argparse.Namespace,
    probing: Probing | None = None,
) -> str:
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
        for name in (with_name(args), WITHOUT):
            total = merge(phases, name, rate)
            lat, wall = total.latencies_s, total.wall_s
            rows.append(
                f"| {rate:.0f} | {name} | {len(lat)} | {len(lat) / wall:.0f} "
                f"| {percentile(lat, 0.5) * 1000:.2f} ms | {percentile(lat, 0.99) * 1000:.2f} ms "
                f"| {sum(total.errors.values())} | {total.plugin_cpu_s / wall:.0%} "
                f"| {total.envoy_cpu_s / wall:.0%} | {total.self_cpu_s / wall:.0%} |"
            )
        p50, p99 = added(phases, rate, 0.5), added(phases, rate, 0.99)
        cpu = merge(phases, with_name(args), rate)
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
    measured_unchecked = sum(n for stage, n in failed.items() if stage.endswith("measured"))
    if args.native:
        verdict = "no check is sent: every request is admitted by Envoy's own filters"
    what = (
        "admission inside Envoy adds (envoy-configs/admission-native.yaml, every request "
        "`x-llm-priority: low`, nothing shed"
        if args.native
        else "ext_authz adds (envoy-configs/ext-authz.yaml"
    )
    return "\n".join(
        [
            f"Latency {what}; Envoy 1.40, "
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
            f"Envoy's admission counters (listener with the filter) per stage: {counters}.",
            f"So: {verdict}.",
            *probing_lines(phases, probing or Probing(), args, measured_unchecked),
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
    parser.add_argument(
        "--with-probing",
        type=int,
        default=0,
        metavar="N",
        help="meanwhile the plugin probes N more simulated endpoints at 1/s (TTFT 100 ms; "
        "a second cluster; default 0: only the backend)",
    )
    add_workers_argument(parser)
    parser.add_argument(
        "--own-authz",
        action="store_true",
        help="ext_authz on the plugin's own port (server.authz), not on the event loop's "
        "gRPC server",
    )
    parser.add_argument(
        "--authz-isolation",
        choices=["process", "threads"],
        default="process",
        help="with --own-authz: server.authz_isolation (default: process, the default)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="admission inside Envoy (envoy-configs/admission-native.yaml: fault filter and "
        "routes on the runtime layer pushed over RTDS) instead of ext_authz",
    )
    args = parser.parse_args()
    if args.native and args.own_authz:
        parser.error("--native: no ext_authz to put on its own port (drop --own-authz)")
    if args.with_probing < 0:
        parser.error("--with-probing: must not be negative")
    if args.with_probing:
        raise_fd_limit()
    args.load_at_start = load_average()
    probing = Probing()
    with tempfile.TemporaryDirectory(prefix="authz-bench-") as tmp:
        phases, stats = asyncio.run(measure(args, Path(tmp), probing))
    body = report(phases, stats, args, probing)
    print(body)
    if not args.no_write:
        command = "python bench/authz_overhead.py " + " ".join(sys.argv[1:])
        name = "authz_overhead"
        name += f"_probing{args.with_probing}" if args.with_probing else ""
        name += "_own_authz" if args.own_authz else ""
        name += "_process" if args.own_authz and args.authz_isolation == "process" else ""
        name += "_native" if args.native else ""
        print(write_result(name, body, command.strip()))


if __name__ == "__main__":
    main()
