"""Signals from a probe in flight to whoever started it: the probe contract.

A probe is started (``Starter``: ``start(target, receiver)``), with no task of its own:
it tells its ``ProbeReceiver`` of the first token, then once its result, or a failure of
the prober's own (a bug, never the endpoint's doing), from the callbacks that drive it,
and can be cancelled through what ``start`` returned (docs/design.md §16.10). The
micro-probe tells the first token the moment it reads it (before it closes the stream
and builds its result), so a token that arrived a hair before the silence point is
never mistaken for silence. ``await_started`` is the one adapter for a caller that
awaits a probe (the CLI, probe-now, a confirming probe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llm_health.model.outcome import ProbeResult
    from llm_health.probe.target import ProbeTarget


class TokenListener(Protocol):
    """Told once a probe's first token has arrived (an ``asyncio.Event`` is one)."""

    def set(self) -> None: ...


class ProbeReceiver(TokenListener, Protocol):
    """What a started probe tells: ``set`` at its first token, then once either ``done``
    with its result or ``failed`` with an exception the prober did not expect (a bug).
    Neither after the probe was cancelled."""

    def done(self, result: ProbeResult) -> None: ...

    def failed(self, error: Exception) -> None: ...


class Started(Protocol):
    """A started probe: ``cancel`` ends it (its connection closed), its receiver not told."""

    def cancel(self) -> object: ...


Starter = Callable[["ProbeTarget", ProbeReceiver], Started]


async def await_started(
    start: Callable[[ProbeReceiver], Started], listener: TokenListener | None = None
) -> ProbeResult:
    """Start a probe with ``start(receiver)`` and await its result; its first token is
    told to ``listener``, and cancelling the wait ends it (nothing once its result is
    out)."""
    awaited = _Awaited(asyncio.get_running_loop().create_future(), listener)
    started = start(awaited)
    try:
        return await awaited.future
    finally:
        started.cancel()


class _Awaited:
    """The receiver of an awaited probe: its result (or the prober's own failure) into
    ``future``, its first token to the awaiting caller's ``listener``."""

    __slots__ = ("_listener", "future")

    def __init__(self, future: asyncio.Future[ProbeResult], listener: TokenListener | None) -> None:
        self.future = future
        self._listener = listener

    def set(self) -> None:
        if self._listener is not None:
            self._listener.set()

    def done(self, result: ProbeResult) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def failed(self, error: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(error)
