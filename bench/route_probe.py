"""Helper process of push_latency.py: two tiny backends and a paced client through Envoy.

Runs in its own process so its CPU never delays the xDS server being measured. It serves
backends A and B (any request: 200, empty body, header ``x-backend``), prints ``ready``,
waits for ``go`` on stdin, then sends ``GET /`` through Envoy's listener every
``--period`` seconds on one keep-alive connection until ``stop`` arrives on stdin (or
``--max-seconds`` / ``--max-requests``), and finally prints one line per request:
``sent received status backend`` (times from ``time.monotonic()``, the system-wide
CLOCK_MONOTONIC that the parent process reads too; backend ``-`` for Envoy's own answers
such as 503 "no healthy upstream").

    python bench/route_probe.py --backends 31000 31001 --target 31002
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

Record = tuple[float, float, int, str]


async def serve_backend(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = _content_length(head)
            if length:
                await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-backend: " + name.encode() + b"\r\n\r\n"
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        writer.close()
    except asyncio.CancelledError:  # the helper is exiting: nothing left to serve
        writer.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _header(head: bytes, wanted: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wanted:
            return value.strip().decode()
    return "-"


async def client(
    port: int, period: float, limit_s: float, limit_n: int, stop: asyncio.Event
) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + limit_s
    reader = writer = None
    next_at = time.monotonic()
    while not stop.is_set() and time.monotonic() < deadline and len(records) < limit_n:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += period
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert reader is not None
        sent = time.monotonic()
        try:
            writer.write(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = _content_length(head)
            if length:
                await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            reader = writer = None
            continue
        status = int(head.split(b" ", 2)[1])
        records.append((sent, time.monotonic(), status, _header(head, b"x-backend")))
        if _header(head, b"connection").lower() == "close":
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()
    return records


async def main_async(args: argparse.Namespace) -> None:
    servers = []
    for name, port in zip("AB", args.backends, strict=False):
        servers.append(
            await asyncio.start_server(
                lambda r, w, n=name: serve_backend(r, w, n), "127.0.0.1", port
            )
        )
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    stop = asyncio.Event()
    while (await reader.readline()).strip() not in (b"go", b""):
        pass

    async def wait_stop() -> None:
        while (await reader.readline()).strip() not in (b"stop", b""):
            pass
        stop.set()

    watcher = asyncio.create_task(wait_stop())
    records = await client(args.target, args.period, args.max_seconds, args.max_requests, stop)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    sys.stdout.write("".join(f"{s:.6f} {r:.6f} {c} {b}\n" for s, r, c, b in records))
    sys.stdout.write("end\n")
    sys.stdout.flush()
    for server in servers:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", type=int, nargs="+", required=True)
    parser.add_argument("--target", type=int, required=True, help="Envoy listener port")
    parser.add_argument("--period", type=float, default=0.002)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--max-requests", type=int, default=200_000)
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
