"""Probe client cost: the CPU one micro-probe exchange costs the prober, by HTTP stack.

The scale target (2,000 endpoints at 1 probe/s on 2 cores) is a CPU budget: 2,000
exchanges a second must fit in what the cores have left after the engines (here: the
simulators) and the rest of the plugin. This measures the exchange alone, against one
``llm-health sim`` process (TTFT ``--ttft``, default 10 ms), with ``--concurrency``
probes in flight, for each of:

- ``aiohttp bare``: the POST through a plain aiohttp session, reading until the first
  ``data:`` line, no plugin code: what aiohttp itself costs (the prober used aiohttp
  until docs/design.md §16.10): the baseline;
- ``MicroProbe``: the shipped prober (its own llhttp exchange, ``probe.http1``; the
  plugin's request body, SSE decoding, the verdict, timings, kept connections);
- ``asyncio protocol``: no HTTP library at all: ``loop.create_connection``, one write of
  the request, ``data_received`` until the first ``data:``, close. The floor of an
  asyncio exchange (not a client: no parsing, no errors handled).

CPU is this process's (``getrusage``: user + system) over ``--probes`` exchanges per
variant, in rounds that alternate the variants (ABCABC...), so all see the same machine;
the simulator runs in its own process and is not counted. Printed per variant: CPU per
probe (median of the rounds), the ratio to ``aiohttp bare``, exchanges per second one core
could sustain, and the cores 2,000 probes/s would take. ``--uvloop`` runs everything on
uvloop's event loop instead.

    .venv/bin/python bench/probe_client_cost.py --probes 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from procs import Sim, load_average  # noqa: E402

from common import write_result  # noqa: E402
from llm_health.config import ProbeSettings  # noqa: E402
from llm_health.model.outcome import Outcome  # noqa: E402
from llm_health.probe.client import MicroProbe, new_connections, probe_body  # noqa: E402
from llm_health.probe.http1 import Connections  # noqa: E402
from llm_health.probe.signals import await_started  # noqa: E402
from llm_health.probe.target import ProbeTarget  # noqa: E402
from tests.ports import free_port  # noqa: E402

SCALE_RATE = 2000  # probes/s of the scale target
Exchange = Callable[[], Awaitable[bool]]  # one probe; True when a first token was read


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def micro_probe(target: ProbeTarget, connections: Connections) -> Exchange:
    prober = MicroProbe(connections)

    async def exchange() -> bool:
        result = await await_started(partial(prober.start_probe, target))
        return result.outcome in (Outcome.FAST, Outcome.SLOW)

    return exchange


def aiohttp_bare(target: ProbeTarget, session: aiohttp.ClientSession) -> Exchange:
    async def exchange() -> bool:
        body = probe_body(target, "vllm")
        headers = {"Accept": "text/event-stream"}
        async with session.post(target.url, json=body, headers=headers) as response:
            async for chunk in response.content.iter_any():
                if b"data:" in chunk:
                    response.close()
                    return True
        return False

    return exchange


class _FirstData(asyncio.Protocol):
    """Resolves ``done`` on the first ``data:`` bytes (False if the connection ends first)."""

    def __init__(self, done: asyncio.Future[bool]) -> None:
        self.done, self.seen = done, b""
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.seen = self.seen[-8:] + data
        if b"data:" in self.seen and not self.done.done():
            self.done.set_result(True)
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(False)


def asyncio_protocol(target: ProbeTarget, port: int) -> Exchange:
    async def exchange() -> bool:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        transport, _ = await loop.create_connection(lambda: _FirstData(done), "127.0.0.1", port)
        transport.write(_request(target, port))  # type: ignore[attr-defined]
        return await done

    return exchange


def _request(target: ProbeTarget, port: int) -> bytes:
    body = json.dumps(probe_body(target, "vllm")).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def run_round(exchange: Exchange, probes: int, concurrency: int) -> tuple[float, int]:
    """CPU seconds per exchange over ``probes`` exchanges, and how many read a token."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> bool:
        async with gate:
            return await exchange()

    started = cpu_s()
    tokens = sum(await asyncio.gather(*(one() for _ in range(probes))))
    return (cpu_s() - started) / probes, tokens


async def measure(args: argparse.Namespace) -> list[str]:
    port = free_port()
    sim = Sim(port, 1, ("--ttft", args.ttft)).spawn()
    connections = new_connections()
    bare = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, trust_env=False
    )
    try:
        await sim.up()
        settings = ProbeSettings.model_validate({"model": "sim-model", "cache_bust": "salt"})
        target = settings.to_target("cost", f"127.0.0.1:{port}")
        variants = {
            "aiohttp bare": aiohttp_bare(target, bare),
            "MicroProbe (shipped: llhttp, kept connections)": micro_probe(target, connections),
            "asyncio protocol (no HTTP library)": asyncio_protocol(target, port),
        }
        await run_round(variants["aiohttp bare"], 100, args.concurrency)
        per: dict[str, list[float]] = {name: [] for name in variants}
        missed: dict[str, int] = {name: 0 for name in variants}
        for _ in range(args.rounds):
            for name, exchange in variants.items():
                cost, tokens = await run_round(exchange, args.probes, args.concurrency)
                per[name].append(cost)
                missed[name] += args.probes - tokens
    finally:
        connections.close()
        await bare.close()
        sim.stop()
    total = args.rounds * args.probes
    return [
        *table(per, missed),
        "",
        f"Connections MicroProbe opened for {total} exchanges: {connections.opened}"
        f" (kept ones reused {connections.reused} times).",
    ]


def table(per: dict[str, list[float]], missed: dict[str, int]) -> list[str]:
    base = statistics.median(next(iter(per.values())))
    lines = [
        "| exchange | CPU per probe (median of rounds) | ratio to aiohttp bare | probes/s per core | cores for 2,000 probes/s | no token read |",
        "|---|---|---|---|---|---|",
    ]
    for name, costs in per.items():
        cost = statistics.median(costs)
        lines.append(
            f"| {name} | {cost * 1e6:.0f} µs | {cost / base:.2f} | {1 / cost:.0f}"
            f" | {cost * SCALE_RATE:.2f} | {missed[name]} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probes", type=int, default=2000, help="exchanges per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--ttft", default="10ms", help="the simulator's TTFT")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (if installed)")
    args = parser.parse_args()
    load = load_average()
    loop_name = "asyncio"
    if args.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        loop_name = f"uvloop {uvloop.__version__}"
    started = time.monotonic()
    lines = asyncio.run(measure(args))
    for line in lines:
        print(line)
    intro = (
        f"{args.probes} exchanges per variant per round, {args.rounds} rounds alternating the"
        f" variants, {args.concurrency} in flight, one simulator process (TTFT {args.ttft}),"
        f" event loop: {loop_name}. CPU = this process (user + system); the simulator is not"
        f" counted. Load average before: {load}. {time.monotonic() - started:.0f} s in all."
    )
    reading = (
        "Reading it: each probe opens a new connection (the stream is cut after the first"
        " token, so the engine stops decoding: docs/design.md §2), which every variant but"
        " the reused one pays. The 2,000-endpoint target needs the cores in the last column for the"
        " exchange alone, before the scheduler, verdicts and the engines themselves"
        " (docs/design.md §16)."
    )
    suffix = "_uvloop" if args.uvloop else ""
    body = "\n".join([intro, "", *lines, "", reading])
    command = "python bench/probe_client_cost.py " + " ".join(sys.argv[1:])
    print(write_result(f"probe_client_cost{suffix}", body, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
