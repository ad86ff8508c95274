"""A scripted client side of a bidirectional gRPC stream, for in-process server tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any


class ScriptedStream:
    """One client stream: ``send`` requests, ``recv`` responses, ``silent`` = nothing came.

    ``open_call`` is the stub method (e.g. ``stub.StreamAggregatedResources``); ``last`` is
    the latest response, i.e. what a real client (Envoy) would hold now. Subclasses set
    ``silence_s``: how long ``silent()`` waits to be sure nothing more is coming.
    """

    silence_s = 0.2

    def __init__(self, open_call: Callable[[AsyncIterator[Any]], Any]) -> None:
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self.last: Any = None
        self.call = open_call(self._outgoing())
        self._reader = asyncio.create_task(self._read())

    async def _outgoing(self) -> AsyncIterator[Any]:
        while (request := await self._requests.get()) is not None:
            yield request

    async def _read(self) -> None:
        async for response in self.call:
            self.last = response
            await self.responses.put(response)

    def send(self, request: Any) -> None:
        self._requests.put_nowait(request)

    async def recv(self, within_s: float = 3.0) -> Any:
        return await asyncio.wait_for(self.responses.get(), within_s)

    async def silent(self, window: float | None = None) -> None:
        await asyncio.sleep(self.silence_s if window is None else window)
        assert self.responses.empty(), f"unexpected response: {self.responses.get_nowait()}"

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.wait([self._reader])
