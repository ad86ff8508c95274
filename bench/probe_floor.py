"""The floor of a probe in Python: the least CPU a prober on this stack could spend, beside
Envoy's own C++ checker on the same backends in the same run (docs/benchmarks.md, "CPU
per probe beside Envoy's own checker").

For each size N, simulator processes serve N ports (``--ttft``, the stream ends right
after its one token) and Envoy (``--concurrency 1``) health-checks every port exactly as
in ``probe_vs_envoy.py``. Beside it, a child process runs the *floor prober* on uvloop:
one timer per endpoint (``loop.call_at``, no task per probe), a kept connection, the
request written once per probe, the answer through llhttp (``httptools``), the first
``data:`` line's JSON decoded, a timeout; no verdict, no state machine, no board, no
metrics, no side reads. It is not a product (it handles nothing an engine can do wrong)
but the bound under what the shipped prober does: the event loop, the socket, the parser
and one JSON decode per probe. It runs twice: each start at its own instant, and starts
gathered on ticks as ``scheduler.start_tick`` gathers them. Printed per run: the child's
CPU per probe, Envoy's per check over the same window, and the ratio.

    .venv/bin/python bench/probe_floor.py --endpoints 200 1000 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httptools
import uvloop
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin"), str(Path(__file__).resolve().parent)]

from probe_client_cost import cpu_s  # noqa: E402
from probe_scale import port_block, raise_fd_limit  # noqa: E402
from probe_vs_envoy import CHECK_BODY, PORTS_PER_SIM, envoy_checks, envoy_config  # noqa: E402
from procs import Sim, child_env, cpu_split, load_average  # noqa: E402

from common import write_result  # noqa: E402
from llm_health.probe.http1 import request_head, route_of  # noqa: E402
from llm_health.probe.slots import next_slot, on_tick, start_tick  # noqa: E402
from tests.envoy_harness import EnvoyProcess  # noqa: E402

INTERVAL_S = 1.0
TIMEOUT_S = 0.8


# --- the child: the floor prober ------------------------------------------------------


class _Answer(asyncio.Protocol):
    """One endpoint's kept connection: each answer parsed by llhttp; the probe ends at the
    answer's end (the first data line read on the way)."""

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None
        self.body = b""

    def begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:  # the floor counts a bad answer, it does not judge
            self.endpoint.finish(ok=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.lost(self)

    def on_body(self, body: bytes) -> None:
        self.body += body
        if not self.endpoint.token and b"\n\n" in self.body:
            line = self.body.split(b"\n", 1)[0]
            if line.startswith(b"data:") and json.loads(line[5:]).get("choices"):
                self.endpoint.token = True

    def on_message_complete(self) -> None:
        self.endpoint.finish(ok=self.endpoint.token)


class _Endpoint:
    def __init__(self, loop: asyncio.AbstractEventLoop, port: int, request: bytes) -> None:
        self.loop, self.port, self.request = loop, port, request
        self.answer: _Answer | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.token = False
        self.busy = False
        self.done = self.failed = 0
        self.origin = self.phase = self.tick = 0.0

    def start(self) -> None:
        self.schedule_next()
        if self.busy:
            return  # the last probe is still out: this slot is skipped
        self.busy, self.token = True, False
        self.timer = self.loop.call_later(TIMEOUT_S, self.finish, False)
        answer = self.answer
        if answer is None or answer.transport is None or answer.transport.is_closing():
            self.loop.create_task(self.connect())
        else:
            self.send(answer)

    async def connect(self) -> None:
        answer = _Answer(self)
        try:
            await self.loop.create_connection(lambda: answer, "127.0.0.1", self.port)
        except OSError:
            self.finish(ok=False)
            return
        self.answer = answer
        self.send(answer)

    def send(self, answer: _Answer) -> None:
        answer.begin()
        assert answer.transport is not None
        answer.transport.write(self.request)

    def finish(self, ok: bool) -> None:
        if not self.busy:
            return
        self.busy = False
        if self.timer is not None:
            self.timer.cancel()
        if ok:
            self.done += 1
        else:
            self.failed += 1
            self.close()

    def lost(self, answer: _Answer) -> None:
        if answer is self.answer:
            self.answer = None
            self.finish(ok=False)

    def close(self) -> None:
        if self.answer is not None and self.answer.transport is not None:
            self.answer.transport.abort()
        self.answer = None

    def schedule_next(self) -> None:
        """The next slot after now, moved to its start tick: the scheduler's own rules
        (``next_slot``, ``on_tick``; no catch-up)."""
        due = next_slot(self.loop.time(), self.origin, self.phase, INTERVAL_S)
        self.loop.call_at(on_tick(due, self.origin, self.tick), self.start)


def _request(port: int) -> bytes:
    body = json.dumps({**CHECK_BODY, "temperature": 0}).encode()
    route = route_of(f"http://127.0.0.1:{port}/v1/completions")
    return request_head(route, {"Accept": "text/event-stream"}, len(body)) + body


async def _floor(ports: list[int], gather: bool, warmup: float, duration: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    tick = start_tick(len(ports), INTERVAL_S) if gather else 0.0
    endpoints = [_Endpoint(loop, port, _request(port)) for port in ports]
    origin = loop.time() + 0.1
    for index, endpoint in enumerate(endpoints):
        endpoint.origin, endpoint.tick = origin, tick
        endpoint.phase = index / len(endpoints) * INTERVAL_S
        loop.call_at(on_tick(origin + endpoint.phase, origin, tick), endpoint.start)
    try:
        await asyncio.sleep(warmup)
        cpu0, done0 = cpu_s(), sum(e.done + e.failed for e in endpoints)
        await asyncio.sleep(duration)
        cpu, probes = cpu_s() - cpu0, sum(e.done + e.failed for e in endpoints) - done0
        return {
            "cpu": cpu,
            "probes": probes,
            "failed": sum(e.failed for e in endpoints),
            "tick": tick,
        }
    finally:
        for endpoint in endpoints:
            endpoint.close()


def child(args: argparse.Namespace) -> int:
    ports = list(range(args.base, args.base + args.count))
    raise_fd_limit(2 * args.count)
    result = uvloop.run(_floor(ports, args.gather, args.warmup, args.duration))
    print(json.dumps(result))
    return 0


# --- the parent: simulators, Envoy, the two runs ---------------------------------------


def run_floor(base: int, count: int, gather: bool, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--base", str(base), "--count", str(count)]
    command += ["--warmup", str(args.warmup), "--duration", str(args.duration)]
    if gather:
        command.append("--gather")
    limit = args.warmup + args.duration + 30
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=limit, env=child_env(), check=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def measure(count: int, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    base = port_block(count)
    ports = list(range(base, base + count))
    timing = ("--ttft", args.ttft, "--tpot", "0ms")
    sims = [
        Sim(base + i, min(PORTS_PER_SIM, count - i), timing) for i in range(0, count, PORTS_PER_SIM)
    ]
    envoy: EnvoyProcess | None = None
    rows = []
    for sim in sims:
        sim.spawn()
    try:
        await asyncio.gather(*(s.up(60) for s in sims))
        config = work / f"envoy-{count}.yaml"
        config.write_text(yaml.safe_dump(envoy_config(ports)))
        envoy = EnvoyProcess(config, workdir=work / f"envoy-{count}")
        await envoy.astart()
        assert envoy.pid is not None
        for gather in (False, True):
            await asyncio.sleep(args.warmup)  # Envoy's checks spread; the simulators settle
            checks0, split0, wall0 = envoy_checks(envoy), cpu_split(envoy.pid), time.monotonic()
            floor = await asyncio.to_thread(run_floor, base, count, gather, args)
            split, checks = cpu_split(envoy.pid), envoy_checks(envoy)
            envoy_cpu = split[0] - split0[0] + split[1] - split0[1]
            rows.append(
                {
                    "endpoints": count,
                    "gather": gather,
                    "wall": time.monotonic() - wall0,
                    **floor,
                    "envoy_cpu": envoy_cpu,
                    "checks": checks[0] - checks0[0],
                }
            )
    finally:
        if envoy is not None:
            await envoy.astop()
        for sim in sims:
            sim.stop()
    return rows


def render(rows: list[dict[str, Any]], duration: float) -> list[str]:
    lines = [
        "| endpoints | starts | floor probes/s | floor CPU per probe | Envoy CPU per check"
        " | ratio | floor failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_probe = r["cpu"] / max(r["probes"], 1)
        # Envoy's window is the child's whole life (start-up and warm-up included), so
        # its CPU is taken per check over the same span, not over the floor's window.
        per_check = r["envoy_cpu"] / max(r["checks"], 1)
        starts = f"gathered ({r['tick'] * 1000:.0f} ms ticks)" if r["gather"] else "each its own"
        lines.append(
            f"| {r['endpoints']} | {starts} | {r['probes'] / duration:.0f}"
            f" | {per_probe * 1e6:.0f} µs | {per_check * 1e6:.0f} µs"
            f" | {per_probe / per_check:.2f}× | {r['failed']} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--ttft", default="20ms", help="the simulators' TTFT")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gather", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    warning = raise_fd_limit(2 * max(args.endpoints))
    load = load_average()
    started = time.monotonic()

    async def run() -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="probe-floor-") as work:
            rows = []
            for count in args.endpoints:
                rows += await measure(count, args, Path(work))
            return rows

    rows = asyncio.run(run())
    lines = render(rows, args.duration)
    print("\n".join(lines))
    intro = (
        f"The floor prober (no task per probe, no verdict, board, metrics or side reads; uvloop)"
        f" beside Envoy --concurrency 1 on the same simulators (TTFT {args.ttft}), interval 1 s,"
        f" {args.warmup:g} s warm-up, {args.duration:g} s measured per run. Envoy's CPU per"
        f" check over each run's span. Load average before: {load}."
        f" {time.monotonic() - started:.0f} s in all. {warning}"
    )
    command = "python bench/probe_floor.py " + " ".join(sys.argv[1:])
    print(write_result("probe_floor", "\n".join([intro, "", *lines]), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
