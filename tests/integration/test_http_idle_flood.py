"""The service's HTTP port (``server.http`` of the real runtime) under a flood of idle
connections, on loopback: 300 TCP connections that never send a byte, each reopened as
soon as the server closes it, while /livez is polled as the kubelet does (its own
process, a fresh connection every 50 ms, 1 s timeout). Every poll is answered 200 within
100 ms, the server never holds more connections than its cap, the healthy endpoint stays
HEALTHY, what the service logs stays bounded and the probe's secret appears in none of
it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.app.assemble import build_runtime
from llm_health.config import parse_config
from llm_health.model.states import State
from llm_health.ops.http_server import MAX_CONNECTIONS
from tests.hostile_http import Attack, script, start_attack, stop
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.processes import SimProcess
from tests.runtime import Running

# alone: the flood loads the machine while /livez is timed against tight bounds
pytestmark = [pytest.mark.timeout(90), pytest.mark.alone]

IDLE_CLIENTS = 300  # above the cap of 256
ATTACK_S = 8.0
MAX_CONNECTS = 160_000  # the attacker's whole budget of connection attempts
POLLS = 100  # 5 s of polls, inside the attack
POLL_EVERY_S = 0.05
POLL_TIMEOUT_S = 1.0  # the kubelet's default probe timeout
ANSWER_WITHIN_S = 0.1
LOG_BYTES_MAX = 4_096  # what the service may log (INFO and above) during the whole flood

# The kubelet: a fresh connection per probe, GET /livez, the whole answer read.
POLLER = r"""
import asyncio, json, sys, time

port, polls, every, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

async def poll():
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /livez HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
        writer.close()
        ok = answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok\n")
    except (OSError, TimeoutError):
        ok = False
    return ok, time.monotonic() - started

async def main():
    results = []
    for _ in range(polls):
        tick = time.monotonic()
        results.append(await poll())
        await asyncio.sleep(max(0.0, every - (time.monotonic() - tick)))
    print(json.dumps(results), flush=True)

asyncio.run(main())
"""


SECRET = "SECRET-flood-7f3a"
CONFIG = """
server: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}
probe:
  interval: 300ms
  timeout: 800ms
  headers: {{Authorization: "Bearer ${{VLLM_API_KEY}}"}}
clusters:
  - name: llama
    endpoints: [{{address: "{sim}"}}]
"""


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProcess]:
    process = SimProcess(tmp_path, "flood", "--ttft", "20ms")
    try:
        yield process.wait_up()
    finally:
        process.stop()


def state(running: Running) -> State:
    (endpoint,) = running.runtime.control.snapshot().clusters["llama"].endpoints
    return endpoint.state


OWN_SOCKETS = 4  # the plugin's own outbound sockets that may be open at a poll


def socket_fds() -> int:
    """This process's open sockets (cheap enough to count every 50 ms without delaying
    the server; /proc/net/tcp, which would tell the port, lists every socket of the
    host). Less those open before the flood: the server's side of its connections."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
    return count


async def watch(
    running: Running, baseline: int, until: asyncio.Task[bytes]
) -> tuple[list[int], set[State]]:
    """Every 50 ms until ``until`` is done: the server's open connections and the
    endpoint's state."""
    held, states = [], set()
    while not until.done():
        held.append(socket_fds() - baseline)
        states.add(state(running))
        await asyncio.sleep(POLL_EVERY_S)
    return held, states


async def test_livez_answers_while_idle_connections_flood_the_port(
    sim: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    grpc, port = free_port(), free_port()
    text = CONFIG.format(grpc=grpc, http=port, sim=sim.address)
    caplog.set_level(logging.DEBUG)
    running = Running(build_runtime(parse_config(text, "flood.yaml", {"VLLM_API_KEY": SECRET})))
    async with running:
        await wait_until_async(lambda: state(running) is State.HEALTHY, 15, "a healthy sim")
        baseline = socket_fds()  # listening sockets, the probes' connection, gRPC
        before = len(caplog.records)
        attacker = await start_attack(Attack(port, {"idle": IDLE_CLIENTS}, ATTACK_S, MAX_CONNECTS))
        poller = None
        assert attacker.stdout is not None
        try:
            async with asyncio.timeout(15):
                assert await attacker.stdout.readline() == b"opened\n"
            poller = await script(POLLER, port, POLLS, POLL_EVERY_S, POLL_TIMEOUT_S)
            assert poller.stdout is not None
            answers = asyncio.create_task(poller.stdout.read())
            held, states = await watch(running, baseline, answers)
            polls = json.loads(answers.result())
            async with asyncio.timeout(ATTACK_S + 15):
                stats = json.loads(await attacker.stdout.readline())
                await attacker.wait()
            assert attacker.returncode == 0
        finally:
            await stop(attacker)
            await stop(poller)
        states.add(state(running))
    records = caplog.records[before:]
    logged = sum(len(r.getMessage()) + 1 for r in records if r.levelno >= logging.INFO)
    everything = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)

    latencies = sorted(latency for _, latency in polls)
    answered = sum(1 for ok, _ in polls if ok)
    seen = (
        f"{answered}/{len(polls)} polls answered; median "
        f"{statistics.median(latencies) * 1000:.1f} ms, slowest "
        f"{latencies[-1] * 1000:.0f} ms; server connections at most {max(held)} "
        f"(cap {MAX_CONNECTIONS}); attacker: {stats}; logged {logged} bytes; "
        f"states {sorted(s.value for s in states)}"
    )
    assert len(polls) == POLLS and stats["connects"] > 2 * IDLE_CLIENTS, seen  # it did churn
    assert answered == len(polls), seen
    assert latencies[-1] < ANSWER_WITHIN_S, seen
    # The count is of every socket the process holds beyond the baseline: the plugin's own
    # outbound connections (a probe, an engine-metrics or known-answer read) come and go
    # beside the server's. The overshoot this guards against was over 100 (362 of 256).
    assert max(held) <= MAX_CONNECTIONS + OWN_SOCKETS, seen
    assert states == {State.HEALTHY}, seen
    assert logged <= LOG_BYTES_MAX, seen
    assert SECRET not in everything
