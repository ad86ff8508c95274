"""A raw HTTP/1.1 server on loopback whose every byte the test writes (``Script``), for
the prober's own exchange (``probe.http1``) and the side reads over it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TypeVar

from llm_health.probe.http1 import Connection

T = TypeVar("T")


@dataclasses.dataclass
class Script:
    """What the server does for the n-th request on each connection: the bytes to send,
    then "keep" (wait for the next request), "close", or "hold" (send nothing more)."""

    replies: list[tuple[bytes | list[bytes], str]]
    pause_s: float = 0.01  # between the segments of a reply given as a list

    def reply(self, index: int) -> tuple[bytes | list[bytes], str]:
        return self.replies[min(index, len(self.replies) - 1)]


class RawServer:
    """A TCP server on loopback that reads each request (head + Content-Length body)
    and answers by ``script``. Counts connections and requests; ``eofs``: connections
    the client closed."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = self.requests = self.eofs = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.stop()
        assert self.server is not None
        await self.server.wait_closed()

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(AttributeError):
            self.server.close_clients()  # type: ignore[attr-defined]  # Python 3.13

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for index in range(100):
                if not await self._read_request(reader):
                    self.eofs += 1
                    return
                self.requests += 1
                data, then = self.script.reply(index)
                await self._send(writer, data)
                if then == "close":
                    return
                if then == "hold":
                    await reader.read()  # until the client goes
                    self.eofs += 1
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.eofs += 1
        except asyncio.CancelledError:
            return  # the test's loop ends: not the server's error
        finally:
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        self.heads.append(head)
        length = next(  # none: a GET's empty body
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        return True

    async def _send(self, writer: asyncio.StreamWriter, data: bytes | list[bytes]) -> None:
        for index, segment in enumerate([data] if isinstance(data, bytes) else data):
            if index:
                await asyncio.sleep(self.script.pause_s)
            writer.write(segment)
            await writer.drain()


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def heard(connection: Connection, step: Callable[[], T | None]) -> T:
    """What ``step`` gives at the first news it gives something for (not None), as an
    exchange reads its answer: through the connection's ``listener``."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def listen() -> None:
        if future.done():
            return
        try:
            found = step()
        except Exception as exc:  # what broke the answer: the awaiter's
            future.set_exception(exc)
            return
        if found is not None:
            future.set_result(found)

    connection.listener = listen
    listen()  # it may be here already
    try:
        return await future
    finally:
        connection.listener = None
