"""Passive health (docs/design.md §15): what `probe.backoff_when_busy` saves, what it
costs in isolation time, and what Envoy's access-log stream costs the plugin.

1. Probes saved. 3 simulator backends (one `llm-health sim` process each, TTFT 50 ms,
   5 ms/token) behind one real Envoy (the shipped ``sidecar-ads.yaml``: ADS from the
   plugin, LEAST_REQUEST, the ``http_grpc`` access logger streaming to the plugin) and
   ``llm-health serve`` (default probe settings, cluster ``model: sim-model``), under
   ``--rate`` non-streamed 8-token completions per second PER BACKEND through Envoy
   (bounded count). Each mode — default probing, then ``backoff_when_busy: true``
   (min_requests 10, every 5) — gets its own plugin and Envoy (same sims), ``--warmup`` s,
   then ``--duration`` s measured: probes per endpoint-hour from each sim's
   ``probe_requests`` counter, the plugin's ``probes_total`` and
   ``traffic.probes_skipped_total``, the plugin's CPU.
2. Zombie isolation under that traffic. In each mode, ``--trials`` times: wait until all
   3 backends are HEALTHY in the plugin and routable at full weight in Envoy for
   ``HOLD_S``, wait a random phase (seeded; the same phases in both modes) uniform in
   [0, every x interval = 5 s) — the longest probe gap backoff allows, so the fault lands
   anywhere in backoff's skip cycle (and anywhere in the 1-s probe interval of the
   default mode) — then backend 0 becomes a zombie (``hang_after_headers``: 200 and
   headers, then nothing). Time from the fault to the plugin's ``/status`` showing it
   UNHEALTHY and to Envoy's admin ``/clusters`` showing it UNHEALTHY (each polled every
   50 ms; the time is when the answer that first showed it arrived); then heal.
3. CPU cost of the access-log stream. A fresh plugin probing the same 3 backends (no
   Envoy, no user load); its CPU (utime + stime of /proc/PID/stat) over ``--cpu-seconds``
   s while a gRPC client streams access-log entries as Envoy does (a message of 200
   entries every 200 ms: 1,000 entries/s; entries for the plugin's 3 endpoints, status
   200, durations 80-120 ms, the fields Envoy fills), against the same process without
   the stream: half the baseline before, half after (drift cancels). Reports % of one
   core and µs per entry, and the plugin's loop lag (``prober.loop_lag_ms``, sampled every
   100 ms in both phases: the sampling's own cost cancels too).

    .venv/bin/python bench/passive.py                       # ~5 minutes
    .venv/bin/python bench/passive.py --trials 10 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, cpu_seconds, load_average  # noqa: E402

from common import free_port_block, percentile, write_result  # noqa: E402
from llm_health.xds.resources import TYPE_URL  # noqa: E402
from tests.envoy_harness import (  # noqa: E402
    EnvoyProcess,
    parse_host_statuses,
    render_config,
)
from tests.ports import free_port  # noqa: E402
from tests.processes import PluginProcess  # noqa: E402

CLUSTER = "llama-70b"
SHIPPED = ROOT / "envoy-configs" / "sidecar-ads.yaml"
BACKENDS = 3
SIM_ARGS = ("--ttft", "50ms", "--tpot", "5ms")
USER_MAX_TOKENS = 8
CLIENT_TIMEOUT_S = 5.0
MODES = {"default": None, "backoff": True}  # probe.backoff_when_busy
BUSY_EVERY = 5  # backoff_when_busy's default `every` (intervals)
INTERVAL_S = 1.0  # the default probe interval
POLL_S = 0.05
HOLD_S = 2.0  # all healthy this long before a fault (backoff's skipping is under way)
STEADY_TIMEOUT_S = 40.0
DETECT_TIMEOUT_S = 15.0
ZOMBIE = {"fault": "hang_after_headers"}
HEAL = {"fault": "none"}
ALS_BATCH = 200  # entries per message
ALS_EVERY_S = 0.2  # one message every 200 ms: 1,000 entries/s
LAG_SAMPLE_S = 0.1


# --------------------------------------------------------------------------- a stack


@dataclass
class Stack:
    mode: str
    sims: list[Sim]
    workdir: Path
    plugin: PluginProcess | None = None
    envoy: EnvoyProcess | None = None
    url: str = ""
    statuses: dict[str, int] = field(default_factory=dict)  # user outcomes by kind

    @property
    def status_url(self) -> str:
        assert self.plugin is not None
        return f"http://127.0.0.1:{self.plugin.http_port}/status"

    @property
    def clusters_url(self) -> str:
        assert self.envoy is not None
        return f"http://{self.envoy.admin_address}/clusters?format=json"

    async def start(self) -> None:
        workdir = self.workdir / self.mode
        self.plugin = PluginProcess(workdir / "plugin", plugin_settings(self.sims, self.mode))
        await asyncio.to_thread(self.plugin.start)
        await asyncio.to_thread(self.plugin.wait_ready, 30.0)
        listener = free_port()
        rendered = render_config(
            SHIPPED,
            workdir / "envoy.yaml",
            xds_port=self.plugin.grpc_port,
            listener_port=listener,
            admin_port=0,
        )
        self.envoy = EnvoyProcess(rendered, workdir=workdir / "envoy", ready_timeout=30.0)
        await self.envoy.astart()
        self.url = f"http://127.0.0.1:{listener}/v1/completions"

    async def stop(self) -> None:
        if self.envoy is not None:
            await self.envoy.astop()
        if self.plugin is not None:
            await asyncio.to_thread(self.plugin.stop)


def plugin_settings(sims: list[Sim], mode: str) -> dict[str, Any]:
    probe: dict[str, Any] = {"model": "sim-model"}
    if MODES.get(mode) is not None:
        probe["backoff_when_busy"] = MODES[mode]
    return {
        "probe": probe,
        "xds": {"warm_start_timeout": "5s"},
        "clusters": [
            {
                "name": CLUSTER,
                "model": "sim-model",
                "endpoints": [{"address": s.address} for s in sims],
            }
        ],
    }


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        return await response.json(content_type=None)


async def plugin_states(session: aiohttp.ClientSession, stack: Stack) -> dict[str, Any]:
    status = await get_json(session, stack.status_url)
    return {e["address"]: e for c in status["clusters"] for e in c["endpoints"]}


async def envoy_hosts(session: aiohttp.ClientSession, stack: Stack) -> dict[str, Any]:
    return parse_host_statuses(await get_json(session, stack.clusters_url), CLUSTER)


async def sim_stats(session: aiohttp.ClientSession, sim: Sim) -> dict[str, Any]:
    stats: dict[str, Any] = await get_json(session, f"{sim.base_url}/sim/stats")
    return stats


# --------------------------------------------------------------------------- user load


async def user_request(session: aiohttp.ClientSession, stack: Stack) -> None:
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": USER_MAX_TOKENS}
    kind = "ok"
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            async with session.post(stack.url, json=body) as response:
                await response.read()
                kind = "ok" if response.status == 200 else f"http {response.status}"
    except TimeoutError:
        kind = "timeout"
    except (aiohttp.ClientError, OSError):
        kind = "error"
    stack.statuses[kind] = stack.statuses.get(kind, 0) + 1


async def run_load(
    session: aiohttp.ClientSession, stack: Stack, rate: float, count: int, stop: asyncio.Event
) -> int:
    """At most ``count`` requests at ``rate``/s until ``stop``; each bounded by
    CLIENT_TIMEOUT_S. Returns how many were sent."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: set[asyncio.Task[None]] = set()
    sent = 0
    for i in range(count):
        if stop.is_set():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start + i / rate - loop.time()))
            break
        task = asyncio.create_task(user_request(session, stack))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    if tasks:
        await asyncio.wait(tasks, timeout=CLIENT_TIMEOUT_S + 2)
    return sent


# --------------------------------------------------------------------------- 1: probes


async def measure_probes(
    session: aiohttp.ClientSession, stack: Stack, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    assert stack.plugin is not None and stack.plugin.process is not None
    await asyncio.sleep(warmup_s)
    pid = stack.plugin.process.pid

    async def snapshot() -> tuple[float, float, list[dict[str, Any]], dict[str, Any]]:
        stats = await asyncio.gather(*(sim_stats(session, s) for s in stack.sims))
        status = await get_json(session, stack.status_url)
        return time.monotonic(), cpu_seconds(pid), list(stats), status

    t0, cpu0, sims0, status0 = await snapshot()
    await asyncio.sleep(duration_s)
    t1, cpu1, sims1, status1 = await snapshot()
    wall = t1 - t0
    probes = [b["probe_requests"] - a["probe_requests"] for a, b in zip(sims0, sims1, strict=True)]
    users = [
        (b["requests"] - b["probe_requests"]) - (a["requests"] - a["probe_requests"])
        for a, b in zip(sims0, sims1, strict=True)
    ]
    per_hour = [p / wall * 3600 for p in probes]

    def delta(path: tuple[str, str]) -> int:
        return int(status1[path[0]][path[1]]) - int(status0[path[0]][path[1]])

    return {
        "wall_s": wall,
        "probes": probes,
        "per_hour": per_hour,
        "per_hour_mean": statistics.fmean(per_hour),
        "user_per_s": [u / wall for u in users],
        "probes_total": delta(("prober", "probes_total")),
        "skipped": delta(("traffic", "probes_skipped_total")),
        "als_counted_per_s": delta(("traffic", "counted_total")) / wall,
        "als_dropped": delta(("traffic", "dropped_total")),
        "cpu_pct": 100 * (cpu1 - cpu0) / wall,
    }


# --------------------------------------------------------------------------- 2: zombie


async def wait_steady(session: aiohttp.ClientSession, stack: Stack) -> bool:
    """All backends HEALTHY in the plugin and HEALTHY at full weight in Envoy for HOLD_S
    in a row; False if not within STEADY_TIMEOUT_S."""
    deadline = time.monotonic() + STEADY_TIMEOUT_S
    since: float | None = None
    while time.monotonic() < deadline:
        try:
            states = await plugin_states(session, stack)
            hosts = await envoy_hosts(session, stack)
            ok = (
                len(states) == BACKENDS
                and all(e["state"] == "healthy" for e in states.values())
                and len(hosts) == BACKENDS
                and all(
                    h["eds_health_status"] == "HEALTHY" and h["weight"] == 100
                    for h in hosts.values()
                )
            )
        except (aiohttp.ClientError, ValueError, KeyError, TypeError, TimeoutError):
            ok = False
        now = time.monotonic()
        if ok:
            since = now if since is None else since
            if now - since >= HOLD_S:
                return True
        else:
            since = None
        await asyncio.sleep(POLL_S)
    return False


async def first_seen(check: Any, t0: float) -> float | None:
    """Seconds from ``t0`` (wall) until ``check()`` is true, polled every POLL_S: the time
    the answer that first showed it arrived. None within DETECT_TIMEOUT_S."""
    while time.time() - t0 < DETECT_TIMEOUT_S:
        with contextlib.suppress(
            aiohttp.ClientError, ValueError, KeyError, TypeError, TimeoutError
        ):
            if await check():
                return time.time() - t0
        await asyncio.sleep(POLL_S)
    return None


async def zombie_trial(
    session: aiohttp.ClientSession, stack: Stack, phase_s: float
) -> dict[str, Any] | None:
    victim = stack.sims[0]
    await victim.set_fault(session, HEAL)
    if not await wait_steady(session, stack):
        return None
    await asyncio.sleep(phase_s)
    before = await plugin_states(session, stack)
    status0 = await get_json(session, stack.status_url)
    last_probe = before[victim.address]["last_probe"]
    t0 = time.time()
    await victim.set_fault(session, ZOMBIE)
    unhealthy_at: list[float] = []
    path: list[str] = []  # the victim's states on the way, as the plugin's `since` dates them

    async def plugin_out() -> bool:
        state = (await plugin_states(session, stack))[victim.address]
        step = f"{state['state']} ({state['cause']}) +{float(state['since_epoch']) - t0:.2f}"
        if state["state"] != "healthy" and (not path or path[-1] != step):
            path.append(step)
        if state["state"] == "unhealthy":
            unhealthy_at.append(float(state["since_epoch"]))
            return True
        return False

    async def envoy_out() -> bool:
        host = (await envoy_hosts(session, stack))[victim.address]
        return bool(host["eds_health_status"] == "UNHEALTHY")

    try:
        plugin_s, envoy_s = await asyncio.gather(
            first_seen(plugin_out, t0), first_seen(envoy_out, t0)
        )
        # The victim's own record of the probes it got since the fault (its last 100
        # inference requests: enough for the few seconds to detection at these rates).
        recent = (await sim_stats(session, victim))["recent"]
        probed = sorted(r["time"] - t0 for r in recent if r["probe"] and r["time"] >= t0)
    finally:
        await victim.set_fault(session, HEAL)
    status1 = await get_json(session, stack.status_url)
    since_probe = t0 - _epoch(last_probe["at"]) if last_probe else None
    return {
        "phase_s": phase_s,
        "since_probe_s": since_probe,
        "plugin_s": plugin_s,
        "envoy_s": envoy_s,
        "plugin_own_s": unhealthy_at[0] - t0 if unhealthy_at else None,
        "first_probe_s": probed[0] if probed else None,
        "path": path,
        "confirms": status1["prober"]["overlapping_confirms"]
        - status0["prober"]["overlapping_confirms"],
        "skipped_before": status0["traffic"]["probes_skipped_total"],
        "skipped_during": status1["traffic"]["probes_skipped_total"]
        - status0["traffic"]["probes_skipped_total"],
    }


def _epoch(stamp: str) -> float:
    """'2026-12-01T02:15:05.199Z' -> seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------- 3: stream


def als_entry(address: str, duration_ms: int, rid: int) -> accesslog_pb2.HTTPAccessLogEntry:
    """One entry as Envoy's http_grpc logger fills it for a non-streamed completion."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.protocol_version = accesslog_pb2.HTTPAccessLogEntry.HTTP11
    common = entry.common_properties
    common.upstream_cluster = CLUSTER
    common.route_name = "llm"
    host, port = address.rsplit(":", 1)
    common.upstream_remote_address.socket_address.address = host
    common.upstream_remote_address.socket_address.port_value = int(port)
    common.upstream_local_address.socket_address.address = "127.0.0.1"
    common.upstream_local_address.socket_address.port_value = 40000 + rid % 20000
    common.downstream_remote_address.socket_address.address = "127.0.0.1"
    common.downstream_remote_address.socket_address.port_value = 50000 + rid % 10000
    common.downstream_local_address.socket_address.address = "127.0.0.1"
    common.downstream_local_address.socket_address.port_value = 10000
    common.start_time.FromMilliseconds(1_796_000_000_000 + rid)
    common.time_to_last_rx_byte.FromMicroseconds(300)
    common.time_to_first_upstream_tx_byte.FromMicroseconds(500)
    common.time_to_last_upstream_tx_byte.FromMicroseconds(520)
    common.time_to_first_upstream_rx_byte.FromMilliseconds(duration_ms - 35)
    common.time_to_last_upstream_rx_byte.FromMilliseconds(duration_ms)
    common.time_to_first_downstream_tx_byte.FromMilliseconds(duration_ms - 35)
    common.time_to_last_downstream_tx_byte.FromMilliseconds(duration_ms)
    common.duration.FromMilliseconds(duration_ms)
    common.upstream_request_attempt_count = 1
    request = entry.request
    request.request_method = 3  # POST (config.core.v3.RequestMethod)
    request.scheme = "http"
    request.authority = "127.0.0.1:10000"
    request.path = "/v1/completions"
    request.user_agent = "Python/3.11 aiohttp/3.9"
    request.request_id = f"{rid:08x}-0000-4000-8000-000000000000"
    request.request_headers_bytes = 180
    request.request_body_bytes = 64
    response = entry.response
    response.response_code.value = 200
    response.response_headers_bytes = 120
    response.response_body_bytes = 420
    response.response_code_details = "via_upstream"
    return entry


def als_messages(addresses: list[str], count: int = 10) -> list[als_pb2.StreamAccessLogsMessage]:
    """``count`` distinct messages of ALS_BATCH entries (cycled by the client)."""
    rng = random.Random(7)
    messages = []
    rid = 0
    for k in range(count):
        message = als_pb2.StreamAccessLogsMessage()
        if k == 0:  # Envoy sends its identifier on the first message of a stream only
            message.identifier.node.id = "bench-envoy"
            message.identifier.log_name = "llm-health"
        for _ in range(ALS_BATCH):
            address = addresses[rid % len(addresses)]
            entry = als_entry(address, rng.randint(80, 120), rid)
            message.http_logs.log_entry.append(entry)
            rid += 1
        messages.append(message)
    return messages


async def stream_access_logs(port: int, addresses: list[str], seconds: float) -> int:
    """One stream, a message every ALS_EVERY_S for ``seconds`` (bounded count), then the
    stream is closed as Envoy would at shutdown. Returns the entries sent."""
    messages = als_messages(addresses)
    count = round(seconds / ALS_EVERY_S)
    sent = 0

    async def produce() -> Any:
        nonlocal sent
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i * ALS_EVERY_S - loop.time()))
            yield messages[i % len(messages)]
            sent += ALS_BATCH

    # Entries count only from a node that holds an xDS stream: the played Envoy's.
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    async with channel, ads_stream(channel, "bench-envoy"):
        stub = als_pb2_grpc.AccessLogServiceStub(channel)
        await asyncio.wait_for(stub.StreamAccessLogs(produce()), seconds + 10)
    return sent


@contextlib.asynccontextmanager
async def ads_stream(channel: grpc.aio.Channel, node: str) -> Any:
    """An ADS stream open under ``node`` for the block, as the Envoy whose access logs
    are played holds one (docs/design.md §15.1)."""
    done = asyncio.Event()
    request = discovery_pb2.DiscoveryRequest(type_url=TYPE_URL, resource_names=[CLUSTER])
    request.node.id = node

    async def requests() -> Any:
        yield request
        await done.wait()

    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    call = stub.StreamAggregatedResources(requests())
    try:
        await asyncio.wait_for(call.read(), 10)
        yield
    finally:
        done.set()
        call.cancel()


async def sample_lag(
    session: aiohttp.ClientSession, url: str, seconds: float, into: list[float]
) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TimeoutError):
            into.append(float((await get_json(session, url))["prober"]["loop_lag_ms"]))
        await asyncio.sleep(LAG_SAMPLE_S)


async def measure_stream(
    session: aiohttp.ClientSession, sims: list[Sim], workdir: Path, seconds: float
) -> dict[str, Any]:
    plugin = PluginProcess(workdir / "cpu-plugin", plugin_settings(sims, "default"))
    try:
        await asyncio.to_thread(plugin.start)
        await asyncio.to_thread(plugin.wait_ready, 30.0)
        assert plugin.process is not None
        pid = plugin.process.pid
        url = f"http://127.0.0.1:{plugin.http_port}/status"
        await asyncio.sleep(3.0)  # first probes, engine checks: out of the way
        base_lags: list[float] = []
        lags: list[float] = []

        async def baseline(span: float) -> tuple[float, float]:
            t, c = time.monotonic(), cpu_seconds(pid)
            await sample_lag(session, url, span, base_lags)
            return time.monotonic() - t, cpu_seconds(pid) - c

        wall_a, cpu_a = await baseline(seconds / 2)
        status0 = await get_json(session, url)
        t, c = time.monotonic(), cpu_seconds(pid)
        addresses = [s.address for s in sims]
        sent, _ = await asyncio.gather(
            stream_access_logs(plugin.grpc_port, addresses, seconds),
            sample_lag(session, url, seconds, lags),
        )
        wall_s, cpu_s = time.monotonic() - t, cpu_seconds(pid) - c
        status1 = await get_json(session, url)
        wall_b, cpu_b = await baseline(seconds / 2)
    finally:
        await asyncio.to_thread(plugin.stop)
    base_rate = (cpu_a + cpu_b) / (wall_a + wall_b)
    traffic0, traffic1 = status0["traffic"], status1["traffic"]
    counted = traffic1["counted_total"] - traffic0["counted_total"]
    extra_cpu = cpu_s - base_rate * wall_s
    return {
        "sent": sent,
        "entries": traffic1["entries_total"] - traffic0["entries_total"],
        "counted": counted,
        "dropped": traffic1["dropped_total"] - traffic0["dropped_total"],
        "bytes_per_entry": len(als_messages(addresses, 1)[0].SerializeToString()) / ALS_BATCH,
        "base_pct": 100 * base_rate,
        "base_a_pct": 100 * cpu_a / wall_a,
        "base_b_pct": 100 * cpu_b / wall_b,
        "stream_pct": 100 * cpu_s / wall_s,
        "extra_pct": 100 * extra_cpu / wall_s,
        "us_per_entry": 1e6 * extra_cpu / counted if counted else float("nan"),
        "wall_s": wall_s,
        "base_lags": base_lags,
        "lags": lags,
        "probes": (status1["prober"]["probes_total"] - status0["prober"]["probes_total"]) / wall_s,
    }


# --------------------------------------------------------------------------- report


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _pq(values: list[float], q: float | None) -> str:
    if not values:
        return "—"
    return _s(max(values) if q is None else percentile(values, q))


def render(
    args: argparse.Namespace,
    probes: dict[str, dict[str, Any]],
    trials: dict[str, list[dict[str, Any] | None]],
    stream: dict[str, Any] | None,
    outcomes: dict[str, dict[str, int]],
    load_before: str,
    elapsed: float,
) -> str:
    out = [
        f"3 `llm-health sim` backends (TTFT 50 ms, 5 ms/token) behind one Envoy (shipped "
        f"sidecar-ads.yaml: ADS + access-log stream to the plugin, LEAST_REQUEST), "
        f"`llm-health serve` with default probe settings (interval 1 s, timeout 800 ms), "
        f"cluster `model: sim-model`; users: {args.rate:g} req/s per backend "
        f"({args.rate * BACKENDS:g} req/s through Envoy), {USER_MAX_TOKENS}-token non-streamed "
        f"completions. Each mode its own plugin and Envoy, same sims, measured one after the "
        f"other in this process. backoff = `probe.backoff_when_busy: true` (min_requests 10, "
        f"every {BUSY_EVERY}).",
        "",
        f"## 1. Probes saved ({args.warmup:g} s warm-up, then {args.duration:g} s measured)",
        "",
        "| mode | probes / endpoint-hour (sim counters, per backend) | mean | plugin probes_total "
        "| probes_skipped_total | user req/s per backend | access-log entries counted / s "
        "| plugin CPU (% of one core) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in probes.items():
        out.append(
            f"| {mode} | {' / '.join(f'{p:.0f}' for p in r['per_hour'])} | {r['per_hour_mean']:.0f} "
            f"| {r['probes_total']} | {r['skipped']} | "
            f"{' / '.join(f'{u:.1f}' for u in r['user_per_s'])} | {r['als_counted_per_s']:.1f} "
            f"| {r['cpu_pct']:.1f} |"
        )
    if "default" in probes and "backoff" in probes:
        d, b = probes["default"]["per_hour_mean"], probes["backoff"]["per_hour_mean"]
        out += [
            "",
            f"backoff / default: **{b / d:.2f}** of the probes ({d - b:.0f} fewer per "
            f"endpoint-hour, {100 * (1 - b / d):.0f} % saved).",
        ]
    out += [
        "",
        f"## 2. Zombie isolation under that traffic ({args.trials} trials per mode)",
        "",
        f"Backend 0 turns `hang_after_headers` after all were HEALTHY for {HOLD_S:g} s plus a "
        f"phase uniform in [0, {BUSY_EVERY * INTERVAL_S:g} s) (random.Random({args.seed}); the "
        f"same phases in both modes). Time from the fault to the first poll (every "
        f"{POLL_S * 1000:g} ms) answering UNHEALTHY: the plugin's /status, Envoy's admin "
        f"/clusters (EDS health). Healed right after, and HEALTHY again before the next.",
        "",
        "| mode | trials | plugin UNHEALTHY p50 | max | Envoy UNHEALTHY p50 | max | never |",
        "|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, tuple[list[float], list[float]]] = {}
    for mode, rows in trials.items():
        done = [r for r in rows if r is not None]
        plug = [r["plugin_s"] for r in done if r["plugin_s"] is not None]
        env = [r["envoy_s"] for r in done if r["envoy_s"] is not None]
        never = sum(1 for r in done if r["envoy_s"] is None)
        summary[mode] = (plug, env)
        count = f"{len(done)}" + (f" of {len(rows)}" if len(done) < len(rows) else "")
        out.append(
            f"| {mode} | {count} | {_pq(plug, 0.5)} | {_pq(plug, None)} | {_pq(env, 0.5)} "
            f"| {_pq(env, None)} | {never} |"
        )
    if (
        "default" in summary
        and "backoff" in summary
        and all(summary["default"])
        and all(summary["backoff"])
    ):
        (dp, de), (bp, be) = summary["default"], summary["backoff"]
        diff50 = percentile(be, 0.5) - percentile(de, 0.5)
        diffmax = max(be) - max(de)
        verdict = "within" if diff50 <= 1.0 and diffmax <= 1.0 else "NOT within"
        out += [
            "",
            f"backoff − default (Envoy UNHEALTHY): p50 {diff50:+.2f} s, max {diffmax:+.2f} s "
            f"({verdict} the 1 s target); plugin: p50 "
            f"{percentile(bp, 0.5) - percentile(dp, 0.5):+.2f} s, max {max(bp) - max(dp):+.2f} s.",
        ]
    out += [
        "",
        "Where the time goes (means over the trials, from the per-trial records below):",
        "",
    ]
    for mode, rows in trials.items():
        done = [r for r in rows if r is not None]
        firsts = [r["first_probe_s"] for r in done if r["first_probe_s"] is not None]
        after = [
            r["plugin_own_s"] - r["first_probe_s"]
            for r in done
            if r["first_probe_s"] is not None and r["plugin_own_s"] is not None
        ]
        saturated = sum(1 for r in done if r["path"] and "(saturated)" in r["path"][0])
        out.append(
            f"- {mode}: first probe of the zombie {_mean(firsts)} after the fault; UNHEALTHY "
            f"{_mean(after)} after that probe; its first change was DEGRADED (saturated), "
            f"not the probe's silence, in {saturated} of {len(done)} trials."
        )
    out += [
        "",
        "How to read it: a zombie's hung requests log neither an error nor a long duration "
        "until they end (here at the client's 5 s timeout); what changes at once is that "
        "requests stop completing. The busy rule skips a slot only while a success came in "
        "the last half second, so the first slot more than half a second after the fault "
        "is probed: the first probe comes up to one interval later than without the rule "
        "(docs/design.md §15.4), and from there the silence and its overlapping "
        "confirmation take the same time in both modes.",
    ]
    out += [
        "",
        "Per trial: phase after the hold → backend 0's last probe before the fault (s "
        "before it) and its first probe after (s after it; from the sim's record); plugin "
        "UNHEALTHY by poll / by its own `since`; Envoy UNHEALTHY; probes skipped meanwhile "
        "(all 3 endpoints); confirming probes started beside a silent one (`overlapping_"
        "confirms`); the states the plugin showed on the way (cause, `since` after the "
        "fault):",
        "",
    ]
    for mode, rows in trials.items():
        cells = []
        for r in rows:
            if r is None:
                cells.append("skipped (no steady state)")
                continue
            since = "?" if r["since_probe_s"] is None else f"-{r['since_probe_s']:.2f}"
            first = "?" if r["first_probe_s"] is None else f"+{r['first_probe_s']:.2f}"
            cells.append(
                f"{r['phase_s']:.2f} → probes {since} / {first}: {_s(r['plugin_s'])} / "
                f"{_s(r['plugin_own_s'])}; {_s(r['envoy_s'])}; {r['skipped_during']} skipped; "
                f"{r['confirms']} confirming; {' → '.join(r['path'])}"
            )
        out.append(f"- {mode}:")
        out += [f"  - {cell}" for cell in cells]
    out += [
        "",
        "User requests per mode (whole run of the mode; timeouts: requests the zombie held "
        f"past the client's {CLIENT_TIMEOUT_S:g} s): "
        + "; ".join(
            f"{mode} " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.get(mode, {}).items()))
            for mode in trials
        ),
    ]
    if stream is not None:
        lags, base = stream["lags"], stream["base_lags"]
        out += [
            "",
            f"## 3. CPU cost of the access-log stream ({ALS_BATCH * round(1 / ALS_EVERY_S):,} "
            f"entries/s, {args.cpu_seconds:g} s, same plugin process)",
            "",
            f"A fresh plugin probing the same 3 backends (no Envoy, no users). Stream: one "
            f"message of {ALS_BATCH} entries every {ALS_EVERY_S * 1000:g} ms "
            f"({stream['bytes_per_entry']:.0f} bytes per entry serialized: addresses, timings, "
            f"method, path, authority, request id, byte counts, status 200, duration "
            f"80-120 ms), entries spread over the plugin's 3 endpoints. Baseline: the same "
            f"process, {args.cpu_seconds / 2:g} s before and {args.cpu_seconds / 2:g} s after "
            f"the stream ({stream['base_a_pct']:.1f} % / {stream['base_b_pct']:.1f} %). "
            f"/status sampled every {LAG_SAMPLE_S * 1000:g} ms in both phases.",
            "",
            "| phase | plugin CPU (% of one core) | loop lag p50 | p99 | max | samples |",
            "|---|---|---|---|---|---|",
            f"| baseline (probing only) | {stream['base_pct']:.2f} | {_ms(base, 0.5)} "
            f"| {_ms(base, 0.99)} | {_ms(base, None)} | {len(base)} |",
            f"| + access-log stream | {stream['stream_pct']:.2f} | {_ms(lags, 0.5)} "
            f"| {_ms(lags, 0.99)} | {_ms(lags, None)} | {len(lags)} |",
            "",
            f"Cost of the stream: **{stream['extra_pct']:.2f} % of one core**, "
            f"**{stream['us_per_entry']:.1f} µs per entry** ({stream['sent']:,} sent, "
            f"{stream['entries']:,} received, {stream['counted']:,} counted, "
            f"{stream['dropped']} dropped; {stream['probes']:.2f} probes/s meanwhile).",
        ]
    out += [
        "",
        f"Load average before the run: {load_before}; after: {load_average()}. "
        f"Wall time: {elapsed:.0f} s.",
    ]
    return "\n".join(out)


def _mean(values: list[float]) -> str:
    return f"+{statistics.fmean(values):.2f} s" if values else "—"


def _ms(values: list[float], q: float | None) -> str:
    if not values:
        return "—"
    return f"{(max(values) if q is None else percentile(values, q)):.1f} ms"


# --------------------------------------------------------------------------- main


async def run_mode(
    session: aiohttp.ClientSession,
    stack: Stack,
    args: argparse.Namespace,
    phases: list[float],
) -> tuple[dict[str, Any], list[dict[str, Any] | None]]:
    rate = args.rate * BACKENDS
    # Bound of the load: warm-up + measure + every trial at its worst (steady wait,
    # phase, detection), then the stop event ends it sooner.
    bound_s = args.warmup + args.duration + args.trials * (STEADY_TIMEOUT_S + 5 + DETECT_TIMEOUT_S)
    stop = asyncio.Event()
    await stack.start()
    load = asyncio.create_task(run_load(session, stack, rate, int(bound_s * rate), stop))
    try:
        probes = await measure_probes(session, stack, args.warmup, args.duration)
        print(f"[{stack.mode}] probes: {probes}", flush=True)
        rows: list[dict[str, Any] | None] = []
        for k, phase in enumerate(phases):
            row = await zombie_trial(session, stack, phase)
            rows.append(row)
            print(f"[{stack.mode}] trial {k + 1}/{len(phases)}: {row}", flush=True)
    finally:
        stop.set()
        await load
        await stack.stop()
    print(f"[{stack.mode}] user outcomes: {stack.statuses}", flush=True)
    return probes, rows


async def main_async(args: argparse.Namespace) -> int:
    started = time.monotonic()
    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-passive-"))
    base = free_port_block(BACKENDS)
    sims = [Sim(base + i, 1, (*SIM_ARGS, "--seed", str(i))) for i in range(BACKENDS)]
    rng = random.Random(args.seed)
    phases = [rng.uniform(0, BUSY_EVERY * INTERVAL_S) for _ in range(args.trials)]
    probes: dict[str, dict[str, Any]] = {}
    trials: dict[str, list[dict[str, Any] | None]] = {}
    stream = None
    outcomes: dict[str, dict[str, int]] = {}
    connector = aiohttp.TCPConnector(limit=500)
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        for sim in sims:
            sim.spawn()
        await asyncio.gather(*(s.up(60) for s in sims))
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False
        ) as session:
            for mode in args.modes:
                stack = Stack(mode, sims, workdir)
                probes[mode], trials[mode] = await run_mode(session, stack, args, phases)
                outcomes[mode] = stack.statuses
            if args.cpu_seconds > 0:
                stream = await measure_stream(session, sims, workdir, args.cpu_seconds)
                print(
                    f"stream: { {k: v for k, v in stream.items() if 'lags' not in k} }", flush=True
                )
    finally:
        for sim in sims:
            sim.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    text = render(args, probes, trials, stream, outcomes, load_before, time.monotonic() - started)
    print(text)
    command = (
        f"python bench/passive.py --trials {args.trials} --duration {args.duration:g} "
        f"--cpu-seconds {args.cpu_seconds:g}"
    )
    write_result("passive", text, command)
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=20.0, help="user req/s per backend")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=40.0, help="probe count window, s")
    parser.add_argument("--trials", type=positive_int, default=5, help="zombie trials per mode")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault phases")
    parser.add_argument("--cpu-seconds", type=float, default=20.0, help="0: skip part 3")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--keep", action="store_true", help="keep plugin/Envoy logs in /tmp")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
