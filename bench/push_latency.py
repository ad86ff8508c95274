"""Push latency: an endpoint's state changes in the plugin -> Envoy ACKs the new EDS ->
Envoy routes the first request by the new state.

One cluster of N endpoints is served from an in-process Board over the plugin's real xDS
server to a real Envoy (shipped sidecar-ads.yaml / delta-ads.yaml). Two endpoints (one
when N = 1) are real backends, served by a helper process (``route_probe.py``) that also
sends ``GET /`` through Envoy every ``--period`` seconds and records which backend
answered; the other N-2 endpoints are DRAINING (not routable), so exactly one backend is
routable at a time. Each round swaps which of the two is routable the way probes do it
(a FATAL probe result takes one out, three FAST results bring the other back; N = 1:
alternately out and back) in ONE publish, and times:

- ACK: until Envoy's ACK for that push reaches the xDS server;
- routed: until the first response served by the newly routable backend (N = 1: the first
  503 "no healthy upstream" after a drain, the first 200 after an un-drain). Resolution:
  one ``--period`` plus one round trip.

The default 20 ms coalescing window is part of the measured path (it is what users run);
``--coalesce 0`` shows the protocol cost alone.

    .venv/bin/python bench/push_latency.py --endpoints 1 100 1000 5000 --rounds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import load_average  # noqa: E402

from common import RESULTS, percentile, write_result  # noqa: E402
from llm_health.core.hub import SnapshotHub  # noqa: E402
from llm_health.model.board import Board, ClusterSpec, EndpointSpec  # noqa: E402
from llm_health.model.outcome import Outcome, ProbeResult  # noqa: E402
from llm_health.model.policy import Policy  # noqa: E402
from llm_health.servers import xds as xds_servers  # noqa: E402
from llm_health.servers.grpc import start_grpc_server  # noqa: E402
from llm_health.servers.xds import add_xds_servicers  # noqa: E402
from llm_health.xds.stream import XdsCounters, XdsStats  # noqa: E402
from tests.envoy_harness import EnvoyProcess, render_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

CLUSTER = "llama-70b"
CONFIGS = {"sotw": "sidecar-ads.yaml", "delta": "delta-ads.yaml"}
Record = tuple[float, float, int, str]
ENVOY_STATS_FLUSH_S = 5.5  # Envoy's stats_flush_interval (5 s by default) and a margin
HELPER = Path(__file__).resolve().parent / "route_probe.py"


def make_board(count: int, real_ports: list[int]) -> Board:
    """N endpoints: the real ones first (127.0.0.1:port), then fake ones, DRAINING."""
    fake = [f"127.0.{i // 250 + 1}.{i % 250 + 1}" for i in range(count - len(real_ports))]
    endpoints = tuple(EndpointSpec(f"127.0.0.1:{p}", "127.0.0.1", p) for p in real_ports) + tuple(
        EndpointSpec(f"{host}:8000", host, 8000) for host in fake
    )
    board = Board([ClusterSpec(CLUSTER, Policy(), endpoints)], now=0.0, wall_offset=0.0)
    for endpoint in endpoints:
        board.record(CLUSTER, endpoint.address, ProbeResult(Outcome.FAST, 0.0, ttft_ms=5), 1.0)
    for endpoint in endpoints[len(real_ports) :]:
        board.drain(CLUSTER, endpoint.address, 1.5, "bench")
    if len(real_ports) == 2:
        _fail(board, endpoints[1].address, 1.5)  # exactly one backend routable
    return board


async def wait_acks(counters: XdsCounters, above: int, limit_s: float = 20.0) -> float:
    deadline = time.monotonic() + limit_s
    while counters.acks <= above:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no ACK (nacks={counters.nacks}, last={counters.last_nack})")
        await asyncio.sleep(0.0005)
    return time.monotonic()


class RouteProbe:
    """The helper process: backends A/B + a paced client through Envoy."""

    def __init__(self, backends: list[int], target: int, period: float) -> None:
        self.args = [str(p) for p in backends], target, period
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        backends, target, period = self.args
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(HELPER),
            "--backends",
            *backends,
            "--target",
            str(target),
            "--period",
            str(period),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 20)
        if line.strip() != b"ready":
            raise RuntimeError(f"route_probe.py did not start: {line!r}")

    async def send(self, word: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(word.encode() + b"\n")
        await self.process.stdin.drain()

    async def records(self) -> list[Record]:
        await self.send("stop")
        assert self.process is not None and self.process.stdout is not None
        out = await asyncio.wait_for(self.process.stdout.read(), 30)
        await self.process.wait()
        records = []
        for line in out.decode().splitlines():
            parts = line.split()
            if len(parts) == 4:
                records.append((float(parts[0]), float(parts[1]), int(parts[2]), parts[3]))
        return records

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def measure(
    count: int, variant: str, rounds: int, coalesce_s: float, period: float
) -> dict[str, list[float]]:
    server, port = await start_grpc_server("127.0.0.1:0")  # first: it binds port 0 too
    real_ports = [free_port()] if count == 1 else [free_port(), free_port()]
    listener = free_port()
    board = make_board(count, real_ports)
    hub = SnapshotHub(board.snapshot())
    stats = XdsStats()
    counters = stats.ads_sotw if variant == "sotw" else stats.ads_delta
    add_xds_servicers(server, hub, stats, coalesce_s=coalesce_s)
    await server.start()
    workdir = Path(tempfile.mkdtemp(prefix="push-latency-"))
    config = render_config(
        ROOT / "envoy-configs" / CONFIGS[variant],
        workdir / "envoy.yaml",
        xds_port=port,
        listener_port=listener,
        admin_port=0,
    )
    envoy = EnvoyProcess(config, workdir=workdir / "envoy", ready_timeout=60)
    probe = RouteProbe(real_ports, listener, period)
    try:
        await probe.start()
        await envoy.astart()
        await wait_acks(counters, 0, limit_s=30)
        await probe.send("go")
        await asyncio.sleep(0.2)
        changes = await _rounds(board, hub, counters, rounds, real_ports)
        records = await probe.records()
        await asyncio.sleep(ENVOY_STATS_FLUSH_S)  # histograms are merged at a stats flush
        apply_ms = envoy_update_duration(envoy)
    finally:
        await probe.stop()
        await envoy.astop()
        await server.stop(0)
        shutil.rmtree(workdir, ignore_errors=True)
    return {**_latencies(changes, records), "envoy_apply": apply_ms}


YIELDED: list[float] = []  # when the xDS stream handed each response to gRPC (monotonic)


def _timed(stream: Any) -> Any:
    """The plugin's stream generator, with the moment of each response it yields recorded:
    the plugin's own part of a push ends there (gRPC serialises and sends after it)."""

    async def timed(*args: Any, **kwargs: Any) -> Any:
        async for response in stream(*args, **kwargs):
            YIELDED.append(time.monotonic())
            yield response

    return timed


xds_servers.sotw_stream = _timed(xds_servers.sotw_stream)  # type: ignore[assignment]
xds_servers.delta_stream = _timed(xds_servers.delta_stream)  # type: ignore[assignment]


def envoy_update_duration(envoy: EnvoyProcess) -> list[float]:
    """Envoy's own time applying EDS updates: p50 and p99 of its ``update_duration``
    histograms (the subscription's update callbacks, ms; every update of the run, the
    first one included). Empty when Envoy has none. Envoy computes histogram quantiles
    only when it flushes its stats, hence the wait before this is read."""
    status, body = envoy.admin_request("/stats?format=json&filter=update_duration")
    if status != 200:
        return []
    for entry in json.loads(body).get("stats", []):
        histograms = entry.get("histograms")
        if not isinstance(histograms, dict):
            continue
        supported = histograms.get("supported_quantiles", [])
        for quantiles in histograms.get("computed_quantiles", []):
            if "eds" not in quantiles.get("name", "") and CLUSTER not in quantiles.get("name", ""):
                continue
            values = [v.get("cumulative") for v in quantiles.get("values", [])]
            picked = [values[supported.index(q)] for q in (50, 99) if q in supported]
            if len(picked) == 2 and all(isinstance(v, int | float) for v in picked):
                return [float(v) for v in picked]
    return []


Change = tuple[float, float, str]  # (changed at, ACK at, what the first routed answer is)


def _fail(board: Board, address: str, now: float) -> None:
    """A FATAL probe: UNHEALTHY at once (what a CUDA error does)."""
    board.record(CLUSTER, address, ProbeResult(Outcome.FATAL, now, detail="bench"), now)


def _recover(board: Board, address: str, now: float) -> None:
    """``healthy_after`` (3) FAST probes: UNHEALTHY -> HEALTHY on the last one."""
    for k in range(3):
        board.record(CLUSTER, address, ProbeResult(Outcome.FAST, now, ttft_ms=5), now + k * 1e-3)


async def _rounds(
    board: Board, hub: SnapshotHub, counters: XdsCounters, rounds: int, real_ports: list[int]
) -> list[Change]:
    """Probe-driven changes, as the runtime makes them: FATAL takes the routable backend
    out, three FAST probes bring the other one back; one publish per round."""
    addresses = [f"127.0.0.1:{p}" for p in real_ports]
    changes: list[Change] = []
    for i in range(rounds):
        acks = counters.acks
        started = time.monotonic()
        now = 2.0 + i
        if len(addresses) == 1:
            (_fail if i % 2 == 0 else _recover)(board, addresses[0], now)
            expect = "503" if i % 2 == 0 else "A"
        else:
            old, new = (0, 1) if i % 2 == 0 else (1, 0)
            _fail(board, addresses[old], now)
            _recover(board, addresses[new], now)
            expect = "AB"[new]
        await hub.publish(board.snapshot())
        acked = await wait_acks(counters, acks)
        changes.append((started, acked, expect))
        await asyncio.sleep(max(0.1, 3 * (acked - started)))
    return changes


def _latencies(changes: list[Change], records: list[Record]) -> dict[str, list[float]]:
    ack, routed, stale, handed = [], [], [], []
    for started, acked, expect in changes:
        ack.append((acked - started) * 1000)
        sent = next((t for t in YIELDED if started <= t <= acked), None)
        if sent is not None:
            handed.append((sent - started) * 1000)
        first = next((r for r in records if r[1] >= started and _matches(r, expect)), None)
        if first is not None:
            routed.append((first[1] - started) * 1000)
        # answered by the old state although sent after the ACK had arrived
        until = first[1] if first is not None else acked
        stale.append(sum(1 for r in records if acked < r[0] and r[1] < until))
    return {"ack": ack, "routed": routed, "stale": [float(s) for s in stale], "handed": handed}


def _matches(record: Record, expect: str) -> bool:
    return record[3] == expect if expect != "503" else record[2] == 503


def row(count: int, variant: str, got: dict[str, list[float]], rounds: int) -> str:
    ack, routed = got["ack"], got["routed"]
    cells = [
        f"{count}",
        variant,
        f"{statistics.median(ack):.1f} ms",
        f"{percentile(ack, 0.99):.1f} ms",
        f"{statistics.median(routed):.1f} ms" if routed else "—",
        f"{percentile(routed, 0.99):.1f} ms" if routed else "—",
        f"{len(routed)}/{rounds}",
        f"{sum(got['stale']):.0f}",
        _p50_p99(got["handed"]),
        " / ".join(f"{v:.1f}" for v in got["envoy_apply"]) + " ms" if got["envoy_apply"] else "—",
    ]
    return "| " + " | ".join(cells) + " |"


def _p50_p99(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.1f} / {percentile(values, 0.99):.1f} ms"


def plot(results: dict[tuple[int, str], dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in sorted({v for _, v in results}):
        counts = sorted(c for c, v in results if v == variant)
        for key, style in (("ack", "o-"), ("routed", "x--")):
            ys = [statistics.median(results[(c, variant)][key] or [float("nan")]) for c in counts]
            ax.plot(counts, ys, style, label=f"{variant}: change -> {key} (p50)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("endpoints in the cluster")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# The scale targets: state change -> ACK p99, beyond the coalescing window.
TARGETS_MS = {1000: 10.0, 10_000: 50.0}


def targets(
    results: dict[tuple[int, str], dict[str, list[float]]], coalesce_ms: float
) -> list[str]:
    """Each target with what was measured (the worse variant) and met / not met."""
    lines = ["targets (state change -> Envoy ACK p99, beyond the coalescing window):"]
    for count, limit in TARGETS_MS.items():
        measured = [results[(c, v)]["ack"] for c, v in results if c == count]
        if not measured or not all(measured):
            lines.append(f"- {count:,} endpoints: <= {limit:g} ms: not run")
            continue
        worst = max(percentile(acks, 0.99) for acks in measured) - coalesce_ms
        verdict = "met" if worst <= limit else "not met"
        lines.append(f"- {count:,} endpoints: <= {limit:g} ms: {worst:.1f} ms: {verdict}")
    return lines


HEADER = [
    "| endpoints | variant | -> ACK p50 | ACK p99 | -> routed p50 | routed p99 | rounds routed | stale answers after ACK | -> handed to gRPC p50 / p99 | Envoy applying p50 / p99 |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 100, 1000, 5000, 10_000])
    parser.add_argument("--variants", nargs="+", default=["sotw", "delta"], choices=sorted(CONFIGS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--coalesce", type=float, default=0.02, help="seconds")
    parser.add_argument("--period", type=float, default=0.002, help="routing client, seconds")
    args = parser.parse_args()
    load = load_average()
    lines = list(HEADER)
    results = {}
    for count in args.endpoints:
        for variant in args.variants:
            got = asyncio.run(measure(count, variant, args.rounds, args.coalesce, args.period))
            results[(count, variant)] = got
            lines.append(row(count, variant, got, args.rounds))
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    goals = "\n".join(targets(results, args.coalesce * 1000))
    print(goals)
    name = f"push_latency_coalesce_{args.coalesce * 1000:g}ms"
    RESULTS.mkdir(exist_ok=True)
    plot(results, RESULTS / f"{name}.png")
    command = "python bench/push_latency.py " + " ".join(sys.argv[1:])
    body = (
        f"State change -> Envoy ACK -> first request routed by the new state; one cluster, "
        f"coalesce {args.coalesce * 1000:g} ms, {args.rounds} rounds, routing client every "
        f"{args.period * 1000:g} ms (its resolution). 'stale answers after ACK': requests "
        f"sent after the ACK arrived that were still answered by the old state (Envoy applies "
        f"the update on its main thread, then posts it to the worker). Load average before: "
        f"{load}.\n\n{table}\n\n{goals}\n\n![push latency]({name}.png)"
    )
    write_result(name, body, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
