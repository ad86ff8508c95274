"""DNS discovery (docs/design.md §11): how fast a record change reaches Envoy, and what the
discovery loop costs in CPU.

1. Record change -> Envoy. A real DNS server on loopback (``tests/dns_server.py``), a real
   plugin process (``llm-health serve``, ``discovery: {dns: ..., refresh: --refresh}``)
   and a real Envoy (shipped ``sidecar-ads.yaml``); the backends are ``llm-health sim``
   processes on 127.0.0.x sharing one port. ``--changes`` record changes alternate: add an
   address (timed until Envoy's admin ``/clusters`` lists that host, any health), remove
   it (timed until Envoy shows it DRAINING or no longer lists it). Envoy's admin is polled
   every ~5 ms: a host shows there once Envoy has applied (ACKed) the EDS update. Changes
   are spaced by a random delay (0 .. refresh) so they fall at random phases of the
   plugin's refresh. The plugin's own log line for each change (ms resolution) splits
   the latency into "DNS" (record changed -> the plugin applied the new set) and "push"
   (applied -> Envoy shows it).

2. CPU of the discovery loop alone: a child process runs one ``Watcher`` over
   ``DnsLookup`` (no board, no prober, ``on_found`` a no-op coroutine) against a stable
   500-address A record (``refresh_s`` 1.0, TTL 0: one resolution a second), while the
   DNS server runs in this process (its CPU is not counted). The answer does not fit UDP
   (the server truncates at 1232 bytes), so each resolution is A over UDP (truncated) then
   TCP, plus AAAA over UDP. Reported: the child's CPU seconds (getrusage, user + system)
   per wall second over ``--cpu-seconds`` after a warm-up, as % of one core, next to an
   idle asyncio child measured the same way. Two more lines do the same for a stable SRV
   record of 500 targets (the test server sends no glue, so every target costs an A and
   an AAAA query), with ``dns.timeout`` 0.5 s (as for the A record) and 2 s (the
   default): the whole resolution has a budget of a few ``dns.timeout``.

    .venv/bin/python bench/discovery.py [--changes 20] [--refresh 1.0] [--cpu-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import child_env, load_average  # noqa: E402

from common import stats_row, write_result  # noqa: E402

CLUSTER = "llama-70b"
NAME = "vllm-headless.llm.test"
FAST = ("--ttft", "20ms", "--tpot", "2ms")
BASE_HOST = "127.0.0.2"  # always in the record
ROTATING = ("127.0.0.3", "127.0.0.4", "127.0.0.5")  # added and removed in turn
POLL_S = 0.005
DRAIN_S = 1.0
CPU_RECORDS = 500
CPU_A_NAME = "big.bench.test"
CPU_SRV_NAME = "_http._tcp.big.bench.test"
WARMUP_S = 3.0


# --------------------------------------------------------------------------- 1: latency


def poll_envoy(envoy: Any, done: Any, limit_s: float) -> tuple[float, float, int]:
    """Poll Envoy's admin every ~POLL_S until ``done(view)``: (monotonic, wall) when the
    answer that satisfied it arrived, and how many polls it took."""
    deadline = time.monotonic() + limit_s
    polls = 0
    while time.monotonic() < deadline:
        polls += 1
        view = envoy.view(CLUSTER)
        if done(view):
            return time.monotonic(), time.time(), polls
        time.sleep(POLL_S)
    raise TimeoutError(f"Envoy did not show the change within {limit_s} s: {envoy.view(CLUSTER)}")


def plugin_times(plugin: Any) -> dict[tuple[str, str], list[float]]:
    """(endpoint, "add"/"remove") -> wall times the plugin logged applying that change."""
    found: dict[tuple[str, str], list[float]] = {}
    for record in plugin.log_records():
        address, msg = record.get("endpoint"), str(record.get("msg", ""))
        if not address or "ts" not in record:
            continue
        if msg == "endpoint added from DNS":
            kind = "add"
        elif msg == "endpoint gone from DNS" or record.get("reason") == "gone from DNS":
            kind = "remove"
        else:
            continue
        stamp, millis = record["ts"].rstrip("Z").split(".")
        wall = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000
        found.setdefault((address, kind), []).append(wall)
    return found


def measure_changes(changes: int, refresh_s: float, seed: int) -> dict[str, Any]:
    from tests.dns_server import loopback_dns
    from tests.envoy_harness import EnvoyProcess, render_config
    from tests.ports import free_port
    from tests.processes import PluginProcess, SimProcess

    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-discovery-"))
    port = free_port()
    started: list[Any] = []
    rows: list[tuple[str, str, float, float, float, int]] = []  # kind, address, ms, walls, polls
    try:
        with loopback_dns() as dns:
            try:
                for i, host in enumerate((BASE_HOST, *ROTATING)):
                    started.append(SimProcess(workdir, f"sim{i}", *FAST, host=host, port=port))
                for sim in started:
                    sim.wait_up()
                base = f"{BASE_HOST}:{port}"
                dns.set_a(NAME, [BASE_HOST])
                settings = {
                    "probe": {
                        "model": "sim-model",
                        "healthy_after": 2,
                        "interval": "1s",
                        "drain_time": f"{DRAIN_S}s",
                    },
                    "xds": {"warm_start_timeout": "5s"},
                    "dns": {"nameservers": [dns.nameserver], "timeout": "500ms"},
                    "clusters": [
                        {
                            "name": CLUSTER,
                            "discovery": {"dns": NAME, "port": port, "refresh": f"{refresh_s}s"},
                        }
                    ],
                }
                plugin = PluginProcess(workdir / "plugin", settings)
                started.append(plugin)
                plugin.start().wait_ready()
                rendered = render_config(
                    ROOT / "envoy-configs" / "sidecar-ads.yaml",
                    workdir / "envoy.yaml",
                    xds_port=plugin.grpc_port,
                    listener_port=free_port(),
                    admin_port=0,
                )
                envoy = EnvoyProcess(rendered, workdir=workdir / "envoy", ready_timeout=60)
                started.append(envoy)
                envoy.start()
                poll_envoy(envoy, lambda v: v.get(base) == ("HEALTHY", 100), 30)
                limit_s = refresh_s + 10
                for i in range(changes):
                    address = f"{ROTATING[(i // 2) % len(ROTATING)]}:{port}"
                    if i % 2 == 0:
                        # a true add: the address must not still be there (DRAINING)
                        poll_envoy(envoy, lambda v, a=address: a not in v, DRAIN_S + limit_s)
                        time.sleep(rng.uniform(0.0, refresh_s))  # a random refresh phase
                        mono, wall = time.monotonic(), time.time()
                        dns.set_a(NAME, [BASE_HOST, address.split(":")[0]])
                        seen, seen_wall, polls = poll_envoy(
                            envoy, lambda v, a=address: a in v, limit_s
                        )
                        kind = "add"
                    else:
                        time.sleep(rng.uniform(0.0, refresh_s))
                        mono, wall = time.monotonic(), time.time()
                        dns.set_a(NAME, [BASE_HOST])

                        def gone(view: dict[str, tuple[str, int]], a: str = address) -> bool:
                            return a not in view or view[a][0] == "DRAINING"

                        seen, seen_wall, polls = poll_envoy(envoy, gone, limit_s)
                        kind = "remove"
                    rows.append((kind, address, (seen - mono) * 1000, wall, seen_wall, polls))
                    print(
                        f"  change {i + 1:2d} {kind:6s} {address}: {rows[-1][2]:7.1f} ms",
                        flush=True,
                    )
                logged = plugin_times(plugin)
                discovery = plugin.status()["discovery"]["clusters"][CLUSTER]
                nacks = envoy.stat(f"cluster.{CLUSTER}.update_rejected", 0)
            finally:
                for process in reversed(started):
                    try:
                        process.stop()
                    except Exception as exc:  # keep stopping the others
                        print(f"stopping {process}: {exc!r}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"rows": rows, "logged": logged, "discovery": discovery, "nacks": nacks}


def split(result: dict[str, Any]) -> list[tuple[str, float, float | None, float | None]]:
    """(kind, total ms, DNS part ms, push part ms) per change; the parts are None when no
    log line of the plugin matches (the log's ms truncation allowed for)."""
    out: list[tuple[str, float, float | None, float | None]] = []
    for kind, address, total, wall, seen_wall, _polls in result["rows"]:
        times = result["logged"].get((address, kind), [])
        applied = next((t for t in times if wall - 0.002 <= t <= seen_wall + 0.002), None)
        if applied is None:
            out.append((kind, total, None, None))
        else:
            dns_ms = max(0.0, (applied - wall) * 1000)
            out.append((kind, total, dns_ms, max(0.0, total - dns_ms)))
    return out


# --------------------------------------------------------------------------- 2: CPU


async def child_main(
    kind: str, nameserver: str, seconds: float, timeout_s: float
) -> dict[str, Any]:
    """In the child: run the discovery loop (or nothing) and measure its CPU."""
    from llm_health.core.settings import MERGING
    from llm_health.discovery.lookup import DnsLookup
    from llm_health.discovery.settings import DiscoveryConfig, DnsConfig
    from llm_health.discovery.watcher import Watcher
    from llm_health.model.board import EndpointSpec

    host, port = nameserver.rsplit(":", 1)
    found: list[int] = []
    faults: list[str] = []
    attempts: list[tuple[float, float]] = []  # (started, wall seconds) of every attempt
    watcher: Watcher | None = None
    task: asyncio.Task[None] | None = None
    if kind != "idle":
        name = {"dns": CPU_A_NAME, "port": 8000} if kind == "a" else {"srv": CPU_SRV_NAME}
        settings = DiscoveryConfig.model_validate({**name, "refresh": "1s"})
        dns = {"nameservers": [nameserver], "timeout": timeout_s}
        lookup = DnsLookup(DnsConfig.model_validate(dns, context=MERGING))

        async def timed(discovery: DiscoveryConfig) -> Any:
            started = time.monotonic()
            try:
                return await lookup.resolve(discovery)
            finally:
                attempts.append((started, time.monotonic() - started))

        async def on_found(_cluster: str, endpoints: tuple[EndpointSpec, ...]) -> None:
            found.append(len(endpoints))

        def on_fault(_cluster: str, fault: Any) -> None:
            if fault is not None:  # None: recovered
                faults.append(str(fault))

        watcher = Watcher(CLUSTER, settings, timed, on_found, on_fault)
        task = asyncio.create_task(watcher.run())
    await asyncio.sleep(WARMUP_S)
    before = (0, 0) if watcher is None else (watcher.stats.resolutions, watcher.stats.failures)
    usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    await asyncio.sleep(seconds)
    after_usage, after_wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    after = (0, 0) if watcher is None else (watcher.stats.resolutions, watcher.stats.failures)
    if task is not None:
        task.cancel()
    durations = [d * 1000 for started, d in attempts if wall <= started + d <= after_wall]
    parts = await asyncio.to_thread(cost_parts, host, int(port)) if kind == "a" else {}
    return {
        "kind": kind,
        "timeout_s": timeout_s,
        "wall_s": after_wall - wall,
        "user_s": after_usage.ru_utime - usage.ru_utime,
        "sys_s": after_usage.ru_stime - usage.ru_stime,
        "resolutions": after[0] - before[0],
        "failures": after[1] - before[1],
        "attempts_total": len(attempts),
        "attempt_ms": durations,
        "endpoints": found[-1] if found else 0,
        "faults": sorted(set(faults))[:3],
        "parts": parts,
    }


def cost_parts(host: str, port: int, repeat: int = 20) -> dict[str, float]:
    """CPU ms of two steps of one A resolution, each timed alone ``repeat`` times: dnspython
    decoding the 500-record TCP answer, and ``endpoints_from`` on its 500 records."""
    import dns.message
    import dns.query

    from llm_health.discovery.answers import Record, endpoints_from

    wire = dns.query.tcp(dns.message.make_query(CPU_A_NAME, "A"), host, port=port, timeout=5)
    data = wire.to_wire()
    started = time.process_time()
    for _ in range(repeat):
        dns.message.from_wire(data)
    decode = (time.process_time() - started) / repeat
    assert wire.answer
    records = [Record(rdata.address, 8000, 0) for rdata in wire.answer[0]]
    started = time.process_time()
    for _ in range(repeat):
        endpoints_from(records, 100, 1000)
    endpoints = (time.process_time() - started) / repeat
    return {"decode_ms": decode * 1000, "endpoints_from_ms": endpoints * 1000}


def run_child(kind: str, nameserver: str, seconds: float, timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind]
    command += ["--nameserver", nameserver, "--cpu-seconds", str(seconds)]
    command += ["--dns-timeout", str(timeout_s)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, env=child_env(), cwd=ROOT)
    try:
        out, _ = child.communicate(timeout=seconds + WARMUP_S + 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"child {kind} exited with {child.returncode}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def udp_truncated(port: int, name: str) -> tuple[bool, int]:
    """Whether the server's UDP answer for ``name`` A is truncated, and the TCP answer's
    size in bytes (what the resolver falls back to)."""
    import dns.flags
    import dns.message
    import dns.query

    query = dns.message.make_query(name, "A")
    udp = dns.query.udp(query, "127.0.0.1", port=port, timeout=2)
    tcp = dns.query.tcp(query, "127.0.0.1", port=port, timeout=2)
    return bool(udp.flags & dns.flags.TC), len(tcp.to_wire())


def measure_cpu(seconds: float, runs: list[tuple[str, str, float]]) -> dict[str, Any]:
    """``runs``: (label, child kind, dns timeout s), one child each, one after the other."""
    from tests.dns_server import loopback_dns

    results: dict[str, Any] = {}
    with loopback_dns() as dns:
        ips = [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(CPU_RECORDS)]
        dns.set_a(CPU_A_NAME, ips)
        targets = [(f"pod-{i}.big.bench.test", 8000) for i in range(CPU_RECORDS)]
        for (target, _port), ip in zip(targets, ips, strict=True):
            dns.set_a(target, [ip.replace("127.1.", "127.2.", 1)])
        dns.set_srv(CPU_SRV_NAME, targets)
        results["truncated"] = udp_truncated(dns.port, CPU_A_NAME)
        for label, kind, timeout_s in runs:
            queries = dns.queries
            print(f"  {label}: {WARMUP_S:.0f} s warm-up + {seconds:.0f} s", flush=True)
            result = run_child(kind, dns.nameserver, seconds, timeout_s)
            result["queries"] = dns.queries - queries
            results[label] = result
    return results


def share(got: dict[str, Any]) -> float:
    """CPU seconds per wall second, in % of one core."""
    return float(100 * (got["user_s"] + got["sys_s"]) / got["wall_s"])


def cpu_row(label: str, got: dict[str, Any]) -> str:
    cpu = got["user_s"] + got["sys_s"]
    attempts = got["resolutions"] + got["failures"]
    total = got["attempts_total"]
    per_query = f"{got['queries'] / total:.0f}" if total else "—"
    per_cpu = f"{1000 * cpu / attempts:.1f}" if attempts else "—"
    walls = got["attempt_ms"]
    per_wall = f"{statistics.mean(walls):.0f} / {max(walls):.0f}" if walls else "—"
    timeout = f"{got['timeout_s']:g} s" if got["kind"] != "idle" else "—"
    return (
        f"| {label} | {timeout} | {got['wall_s']:.1f} | {got['user_s']:.2f} + "
        f"{got['sys_s']:.2f} | {share(got):.2f} % | {got['resolutions']} | {got['failures']} "
        f"| {per_cpu} | {per_wall} | {got['endpoints'] or '—'} | {per_query} |"
    )


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=20, help="record changes (item 1)")
    parser.add_argument("--refresh", type=float, default=1.0, help="discovery refresh, s")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="CPU window (item 2)")
    parser.add_argument("--no-srv", action="store_true", help="skip the SRV CPU lines")
    parser.add_argument("--seed", type=int, default=1, help="of the random spacing")
    parser.add_argument("--child", choices=("idle", "a", "srv"), help=argparse.SUPPRESS)
    parser.add_argument("--nameserver", help=argparse.SUPPRESS)
    parser.add_argument("--dns-timeout", type=float, default=0.5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        got = asyncio.run(
            child_main(args.child, args.nameserver, args.cpu_seconds, args.dns_timeout)
        )
        print(json.dumps(got), flush=True)
        return 0
    if not 1 <= args.changes <= 500 or not 0.5 <= args.refresh <= 30:
        parser.error("--changes 1..500, --refresh 0.5..30")
    if not 1 <= args.cpu_seconds <= 600:
        parser.error("--cpu-seconds 1..600")

    load_before = load_average()
    print(
        f"1. record change -> Envoy: {args.changes} changes, refresh {args.refresh} s", flush=True
    )
    latency = measure_changes(args.changes, args.refresh, args.seed)
    parts = split(latency)
    print(f"2. CPU of discovery, {CPU_RECORDS} records, refresh 1 s", flush=True)
    runs = [("idle", "idle", 0.5), ("a", "a", 0.5)]
    if not args.no_srv:
        runs += [("srv", "srv", 0.5), ("srv-2s", "srv", 2.0)]
    cpu = measure_cpu(args.cpu_seconds, runs)

    polls = [r[5] for r in latency["rows"]]
    matched = [p for p in parts if p[2] is not None]
    lines = [
        f"Load average at the start: {load_before}; at the end: {load_average()}.",
        "",
        f"## 1. Record change -> Envoy (refresh {args.refresh:g} s)",
        "",
        f"{args.changes} A-record changes against a real DNS server (dnslib, loopback), a "
        "real plugin process and a real Envoy (`sidecar-ads.yaml`, ADS SotW); backends are "
        f"`llm-health sim` on {BASE_HOST} and {', '.join(ROTATING)} sharing one port. "
        "Adds are timed until Envoy's admin `/clusters` lists the host (any health: it "
        "arrives as UNHEALTHY = STARTING), removals until it shows DRAINING or is gone. "
        f"Envoy's admin is polled every {POLL_S * 1000:.0f} ms ({statistics.mean(polls):.0f} "
        "polls per change on average); each change is made after a random 0..refresh delay, "
        "i.e. at a random phase of the plugin's refresh.",
        "",
        "| change | n | p50 ms | p99 ms | max ms | mean ms |",
        "|---|---|---|---|---|---|",
        stats_row("all", [p[1] for p in parts]),
        stats_row("add", [p[1] for p in parts if p[0] == "add"]),
        stats_row("remove", [p[1] for p in parts if p[0] == "remove"]),
        stats_row(
            "DNS part (record -> plugin applied)", [p[2] for p in matched if p[2] is not None]
        ),
        stats_row(
            "push part (plugin applied -> Envoy)", [p[3] for p in matched if p[3] is not None]
        ),
        "",
        "Per change, in order (ms): " + ", ".join(f"{p[0]} {p[1]:.0f}" for p in parts) + ".",
        "",
        f"The split comes from the plugin's log line for each change (ms resolution; "
        f"{len(matched)}/{len(parts)} matched). The DNS part is the wait for the next "
        f"resolution, uniform over 0..refresh (mean ~{args.refresh * 500:.0f} ms expected): "
        "it dominates; the push part (20 ms coalescing window, EDS push, Envoy applying it) "
        "is what remains. "
        f"Plugin discovery status at the end: {latency['discovery']['resolutions']} "
        f"resolutions, {latency['discovery']['failures']} failures, "
        f"{latency['discovery']['changes']} changes; Envoy NACKs: {latency['nacks']}.",
        "",
        f"## 2. CPU of the discovery loop, {CPU_RECORDS} records, refresh 1 s",
        "",
        "One `Watcher` over `DnsLookup` in a child process (no board, no prober, a no-op "
        "`on_found`), the DNS server in the parent (not counted). CPU = the child's "
        f"getrusage user + system over the window, after a {WARMUP_S:.0f} s warm-up. UDP "
        f"answer for the {CPU_RECORDS}-address A record truncated: "
        f"{'yes' if cpu['truncated'][0] else 'no'} (TC bit); its TCP answer is "
        f"{cpu['truncated'][1]} bytes.",
        "",
        "| child | dns.timeout | wall s | CPU s (user + sys) | % of one core | resolutions "
        "| failed attempts | CPU ms / attempt | wall ms / attempt (mean / max) "
        "| endpoints found | DNS queries / attempt (approx.) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        cpu_row("idle asyncio loop (baseline)", cpu["idle"]),
        cpu_row(f"A/AAAA, {CPU_RECORDS} addresses (A over TCP)", cpu["a"]),
    ]
    if "srv" in cpu:
        lines.append(cpu_row(f"SRV, {CPU_RECORDS} targets, no glue", cpu["srv"]))
        lines.append(cpu_row(f"SRV, {CPU_RECORDS} targets, no glue", cpu["srv-2s"]))
    idle = share(cpu["idle"])
    extra = share(cpu["a"]) - idle
    lines += [
        "",
        f"A/AAAA ({CPU_RECORDS} addresses, refresh 1 s) over the idle baseline: "
        f"**{extra:.2f} % of one core** (target < 2 %: {'met' if extra < 2 else 'NOT met'}). "
        "A failed attempt is retried with back-off, so a failing loop makes fewer attempts "
        "than one a second.",
    ]
    parts = cpu["a"]["parts"]
    if parts:
        lines.append(
            f"Of one A resolution's CPU, timed apart in the same child: dnspython decoding "
            f"the {CPU_RECORDS}-record TCP answer {parts['decode_ms']:.1f} ms, "
            f"`endpoints_from` on its {CPU_RECORDS} records {parts['endpoints_from_ms']:.1f} "
            "ms; the rest is the queries themselves (UDP, truncated, then TCP; AAAA) and "
            "the loop."
        )
    if "srv" in cpu:
        from llm_health.discovery import lookup

        whole = getattr(lookup, "WHOLE_BUDGET", None)  # x dns.timeout for one resolution
        for label in ("srv", "srv-2s"):
            srv = cpu[label]
            budget = f"{srv['timeout_s'] * whole:g} s" if whole else "none"
            lines.append(
                f"SRV with dns.timeout {srv['timeout_s']:g} s (whole-resolution budget "
                f"{budget}): {share(srv) - idle:.2f} % of one core over the baseline; "
                f"faults: {'; '.join(srv['faults']) or 'none'}."
            )
        lines.append(
            "The test server sends no glue (no additional section), so every SRV target costs "
            "its own A and AAAA queries; CoreDNS sends glue for a headless Service. An SRV "
            "resolution's wall time (and so whether it fits the budget) depends on the test "
            "server (dnslib, a Python thread per query, in this process) and on the machine's "
            "load: these two lines vary from run to run; the A/AAAA line does not (CPU "
            "time, not wall time)."
        )
    body = "\n".join(lines)
    print("\n" + body)
    command = ".venv/bin/python bench/discovery.py " + " ".join(sys.argv[1:])
    print(f"\nwritten: {write_result('discovery', body, command.strip())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
