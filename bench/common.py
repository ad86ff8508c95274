"""Shared helpers of the benchmarks: ports, machine description, result files."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def free_port_block(count: int, start: int = 61000, end: int = 65536) -> int:
    """First port of ``count`` consecutive free loopback ports.

    Searched above both the kernel's ephemeral range (32768-60999 here) and the range
    ``free_port()`` picks from (20000-32000), so no other port the benchmark (or a test
    running meanwhile) picks can land inside a block before the simulators bind it."""
    port = start
    while port + count < end:
        if all(_free(p) for p in range(port, port + count)):
            return port
        port += count + 7
    raise RuntimeError(f"no block of {count} free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        # As a server binds (aiohttp sets SO_REUSEADDR): connections in TIME_WAIT left by
        # the previous run on these ports do not make them unusable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise TimeoutError(f"port {port} not listening after {timeout_s} s")


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {system}"


def write_result(name: str, body: str, command: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(
        f"# {name}\n\n{body}\n\nMachine: {machine_line()}\nCommand: `{command}`\nRun: {stamp}\n"
    )
    return path


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1] (the value at round(q x (n - 1)))."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stats_row(label: str, values: list[float]) -> str:
    """A markdown row: label, n, p50, p99, max, mean (ms, rounded); dashes when empty."""
    if not values:
        return f"| {label} | 0 | — | — | — | — |"
    return (
        f"| {label} | {len(values)} | {statistics.median(values):.0f} | "
        f"{percentile(values, 0.99):.0f} | {max(values):.0f} | {statistics.mean(values):.0f} |"
    )


def add_workers_argument(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--workers N|auto``: ``server.probe_workers`` for the plugin it runs
    (None when not given: the config's default)."""
    parser.add_argument(
        "--workers",
        type=probe_workers_arg,
        default=None,
        metavar="N",
        help="server.probe_workers: N probe worker processes, or 'auto' (default: the "
        "config's default)",
    )


def probe_workers_arg(text: str) -> int | str:
    """argparse type of a benchmark's ``--workers`` (``server.probe_workers``): a count
    >= 0 or "auto"."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count or 'auto'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value
