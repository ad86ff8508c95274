"""The pipe between the runtime and its probe workers (docs/design.md §16.2).

Both ends are this program: a worker is a child process the runtime started itself, over
its own stdin/stdout pipes, so the frames are trusted pickles. A frame is a 4-byte
big-endian length and one pickled list of messages: each side collects what it has to say
during one turn of its event loop and writes it as one frame, so a thousand probes a
second cost a few hundred writes, not thousands.

Messages, runtime -> worker:
  ("target", key, ProbeTarget)          the settings for an endpoint (sent on change)
  ("probe", id, key, engine, question)  probe it now (question: a known-answer probe's
                                        ``client.Asked``, or None)
  ("cancel", id)                        the runtime gave up on that probe
Worker -> runtime:
  ("ready", 0)                          its loop and HTTP session are up
  ("lag", ms)                           its heartbeat: how late its loop runs
  ("token", id)                         the probe has its first token (silence check)
  ("result", id, ProbeResult, resends)  the outcome; resends: the worker's stale-connection
                                        resends so far
  ("failed", id, error)                 no result (a bug in the worker): not a verdict
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a frame larger than this is a bug on the other side

Message = tuple[Any, ...]


class FrameError(Exception):
    """The other end wrote something that is not a frame: the pipe is unusable."""


class FrameReader:
    """Splits a byte stream into frames, across reads of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[list[Message]]:
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME:
                raise FrameError(f"frame of {size} bytes")
            end = HEADER.size + size
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[HEADER.size : end])
            del self._buffer[:end]
            messages = pickle.loads(payload)
            if not isinstance(messages, list):
                raise FrameError("a frame that is not a list of messages")
            yield messages


def frame(messages: list[Message]) -> bytes:
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


class Outbox:
    """Messages queued during one loop turn, written as one frame at its end."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._queued: list[Message] = []

    def put(self, message: Message) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self.flush)
        self._queued.append(message)

    def flush(self) -> None:
        if self._queued:
            queued, self._queued = self._queued, []
            self._write(frame(queued))


async def open_pipes(
    read_fd: int, write_fd: int, limit: int
) -> tuple[asyncio.StreamReader, asyncio.WriteTransport]:
    """A child's ends of its pipes to the runtime, on the running loop: a reader of what
    the runtime writes and the transport to write frames to (an ``Outbox``'s)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    transport, _ = await loop.connect_write_pipe(
        asyncio.Protocol, os.fdopen(write_fd, "wb", buffering=0)
    )
    return reader, transport


async def read_messages(stream: asyncio.StreamReader, chunk: int) -> AsyncIterator[Message]:
    """Every message the other end writes to ``stream``, in order, until it closes
    (FrameError when it writes something that is not a frame)."""
    frames = FrameReader()
    while data := await stream.read(chunk):
        for messages in frames.feed(data):
            for message in messages:
                yield message
