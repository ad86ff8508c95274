"""Push latency: an endpoint's state changes in the plugin -> Envoy ACKs the new EDS.

One cluster of N endpoints is served from an in-process Board over the plugin's real xDS
server to a real Envoy (shipped sidecar-ads.yaml / delta-ads.yaml). Each round drains or
un-drains one endpoint, publishes, and times until Envoy's ACK for that push arrives.
The default 20 ms coalescing window is part of the measured path (it is what users run);
`--coalesce 0` shows the protocol cost alone.

    .venv/bin/python bench/push_latency.py --endpoints 1 100 1000 --rounds 40
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402
from llm_health.hub import SnapshotHub  # noqa: E402
from llm_health.model.board import Board, ClusterSpec, EndpointSpec  # noqa: E402
from llm_health.model.outcome import Outcome, ProbeResult  # noqa: E402
from llm_health.model.policy import Policy  # noqa: E402
from llm_health.servers.xds import add_xds_servicers, start_grpc_server  # noqa: E402
from llm_health.xds.stream import XdsCounters, XdsStats  # noqa: E402
from tests.envoy_harness import EnvoyProcess, free_port, render_config  # noqa: E402

CLUSTER = "llama-70b"
CONFIGS = {"sotw": "sidecar-ads.yaml", "delta": "delta-ads.yaml"}


def make_board(count: int) -> Board:
    endpoints = tuple(
        EndpointSpec(
            f"127.0.{i // 250}.{i % 250 + 1}:8000", f"127.0.{i // 250}.{i % 250 + 1}", 8000
        )
        for i in range(count)
    )
    board = Board([ClusterSpec(CLUSTER, Policy(), endpoints)], now=0.0, wall_offset=0.0)
    for endpoint in endpoints:
        board.record(CLUSTER, endpoint.address, ProbeResult(Outcome.FAST, 0.0, ttft_ms=5), 1.0)
    return board


async def wait_acks(counters: XdsCounters, above: int, limit_s: float = 10.0) -> float:
    deadline = time.perf_counter() + limit_s
    while counters.acks <= above:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no ACK (nacks={counters.nacks}, last={counters.last_nack})")
        await asyncio.sleep(0.0005)
    return time.perf_counter()


async def measure(count: int, variant: str, rounds: int, coalesce_s: float) -> list[float]:
    board = make_board(count)
    hub = SnapshotHub(board.snapshot())
    stats = XdsStats()
    counters = stats.ads_sotw if variant == "sotw" else stats.ads_delta
    server, port = await start_grpc_server("127.0.0.1:0")
    add_xds_servicers(server, hub, stats, coalesce_s=coalesce_s)
    await server.start()
    workdir = Path(tempfile.mkdtemp(prefix="push-latency-"))
    config = render_config(
        ROOT / "envoy-configs" / CONFIGS[variant],
        workdir / "envoy.yaml",
        xds_port=port,
        listener_port=free_port(),
        admin_port=0,
    )
    envoy = EnvoyProcess(config, workdir=workdir / "envoy")
    try:
        await envoy.astart()
        await wait_acks(counters, 0, limit_s=30)
        return await _rounds(board, hub, counters, rounds)
    finally:
        await envoy.astop()
        await server.stop(0)


async def _rounds(
    board: Board, hub: SnapshotHub, counters: XdsCounters, rounds: int
) -> list[float]:
    latencies = []
    addresses = [e.spec.address for e in board.snapshot().clusters[CLUSTER].endpoints]
    for i in range(rounds):
        address = addresses[(i // 2) % len(addresses)]
        acks = counters.acks
        started = time.perf_counter()
        if i % 2 == 0:
            board.drain(CLUSTER, address, 2.0 + i, "bench")
        else:
            board.undrain(CLUSTER, address, 2.0 + i)
        await hub.publish(board.snapshot())
        latencies.append((await wait_acks(counters, acks) - started) * 1000)
        await asyncio.sleep(0.05)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--variants", nargs="+", default=["sotw", "delta"], choices=sorted(CONFIGS))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--coalesce", type=float, default=0.02, help="seconds")
    args = parser.parse_args()
    lines = ["| endpoints | variant | p50 | p99 | max |", "|---|---|---|---|---|"]
    for count in args.endpoints:
        for variant in args.variants:
            got = asyncio.run(measure(count, variant, args.rounds, args.coalesce))
            row = f"| {count} | {variant} | {statistics.median(got):.1f} ms | {percentile(got, 0.99):.1f} ms | {max(got):.1f} ms |"
            print(row, flush=True)
            lines.append(row)
    table = "\n".join(lines)
    print(table)
    command = "python bench/push_latency.py " + " ".join(sys.argv[1:])
    body = f"State change -> Envoy ACK, one cluster, coalesce {args.coalesce * 1000:g} ms, {args.rounds} rounds.\n\n{table}"
    write_result(f"push_latency_coalesce_{args.coalesce * 1000:g}ms", body, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
