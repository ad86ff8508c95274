"""Hostile clients of the HTTP port, and the kubelet beside them, as child processes on
loopback (each bounded in connections and seconds): ``attack`` holds connections that
send only empty lines (RFC 9112 §2.2 lets a client send them before a request line),
in the three ways a guard can mistake for a request, beside idle and half-sent ones;
``kubelet`` polls probe paths as the kubelet does. Both report as JSON on stdout."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

# One hostile client per coroutine, reconnecting as soon as the server closes it:
#   crlf       "\r\n\r\n" at once, then nothing
#   slow_crlf  one "\r\n" every 300 ms, for as long as the connection stays open
#   after_get  a whole keep-alive GET answered, then "\r\n\r\n"
#   idle       not a byte
#   partial    a request line and a header, never finished
# The attacker stands in for another host: niced, so that on a small shared test machine
# its CPU is not taken from the server under test.
ATTACKER = r"""
import asyncio, json, os, sys, time

os.nice(19)
port, seconds, budget = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
counts = {kind: int(count) for kind, count in (arg.split(":") for arg in sys.argv[4:])}
stats = {"connects": 0, "failed": 0}
deadline = time.monotonic() + seconds
opened = asyncio.Event()
clients = sum(counts.values())

async def until_closed(reader):
    try:
        await asyncio.wait_for(reader.read(), max(0.0, deadline - time.monotonic()))
    except (OSError, asyncio.TimeoutError):
        pass

async def slow_crlf(reader, writer):
    closed = asyncio.ensure_future(until_closed(reader))
    while not closed.done():
        writer.write(b"\r\n")
        await asyncio.wait({closed}, timeout=0.3)

async def after_get(reader, writer):
    writer.write(b"GET /livez HTTP/1.1\r\nHost: pod\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), max(0.01, deadline - time.monotonic()))
    writer.write(b"\r\n\r\n")
    await until_closed(reader)

async def crlf(reader, writer):
    writer.write(b"\r\n\r\n")
    await until_closed(reader)

async def partial(reader, writer):
    writer.write(b"GET /livez HTTP/1.1\r\nHost: pod\r\n")
    await until_closed(reader)

async def idle(reader, writer):
    await until_closed(reader)

async def hold(kind):
    while time.monotonic() < deadline and stats["connects"] + stats["failed"] < budget:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["failed"] += 1
            await asyncio.sleep(0.01)
            continue
        stats["connects"] += 1
        if stats["connects"] >= clients:
            opened.set()
        try:
            await kind(reader, writer)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

async def main():
    kinds = [globals()[kind] for kind, count in counts.items() for _ in range(count)]
    tasks = [asyncio.create_task(hold(kind)) for kind in kinds]
    await asyncio.wait_for(opened.wait(), 20)
    print("opened", flush=True)
    await asyncio.gather(*tasks)
    stats["cpu_s"] = round(time.process_time(), 2)
    print(json.dumps(stats), flush=True)

asyncio.run(main())
"""

# The kubelet: every tick each path once, a fresh connection per probe, the whole answer
# read within the timeout (the kubelet's timeoutSeconds); the status, or null.
KUBELET = r"""
import asyncio, json, sys, time

port, polls, every, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
paths = sys.argv[5:]

async def poll(path):
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n".encode())
            answer = await reader.read()
        writer.close()
        return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    except (OSError, TimeoutError, ValueError, IndexError):
        return None

async def main():
    results = {path: [] for path in paths}
    for _ in range(polls):
        tick = time.monotonic()
        for path in paths:
            results[path].append(await poll(path))
        await asyncio.sleep(max(0.0, every - (time.monotonic() - tick)))
    print(json.dumps(results), flush=True)

asyncio.run(main())
"""

KUBELET_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds
FAILURE_THRESHOLD = 3  # the kubelet's default failureThreshold: so many in a row fail a pod


@dataclass
class Attack:
    """``clients``: how many connections of each kind (ATTACKER's functions: ``crlf``,
    ``slow_crlf``, ``after_get``, ``idle``, ``partial``) are held at once, for
    ``seconds``, with at most ``budget`` connection attempts in all."""

    port: int
    clients: dict[str, int]
    seconds: float
    budget: int


async def start_attack(attack: Attack) -> asyncio.subprocess.Process:
    """The attacker's process: it prints ``opened`` once every client has connected, then
    its counts ({"connects", "failed", "cpu_s"}) as JSON when the attack is over."""
    kinds = [f"{kind}:{count}" for kind, count in attack.clients.items()]
    return await script(ATTACKER, attack.port, attack.seconds, attack.budget, *kinds)


async def script(code: str, *args: object) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *map(str, args), stdout=asyncio.subprocess.PIPE
    )


async def stop(process: asyncio.subprocess.Process | None) -> None:
    if process is not None and process.returncode is None:
        process.kill()
        await process.wait()


async def attacked(
    attack: Attack, settle_s: float, polls: int, every_s: float, paths: list[str]
) -> Any:
    """The kubelet's answers ({path: [status or None]}) while ``attack`` runs (its first
    poll ``settle_s`` after the attacker has opened all its connections), and the
    attacker's counts."""
    attacker = await start_attack(attack)
    kubelet = None
    assert attacker.stdout is not None
    try:
        async with asyncio.timeout(25):
            assert await attacker.stdout.readline() == b"opened\n"
        await asyncio.sleep(settle_s)
        kubelet = await script(KUBELET, attack.port, polls, every_s, KUBELET_TIMEOUT_S, *paths)
        assert kubelet.stdout is not None
        async with asyncio.timeout(polls * (every_s + len(paths) * KUBELET_TIMEOUT_S) + 15):
            answers = json.loads(await kubelet.stdout.readline())
        async with asyncio.timeout(attack.seconds + 15):
            stats = json.loads(await attacker.stdout.readline())
            await attacker.wait()
        assert attacker.returncode == 0
        return answers, stats
    finally:
        await stop(attacker)
        await stop(kubelet)


def longest_failing_run(statuses: list[int | None], expected: int) -> int:
    """The most consecutive polls not answered ``expected`` in time."""
    longest = run = 0
    for status in statuses:
        run = run + 1 if status != expected else 0
        longest = max(longest, run)
    return longest
