"""Signals from a probe in flight to whoever started it.

A probe is started in one of two ways:

- awaited (``await prober.probe(target)``): the first token is told to ``FIRST_TOKEN``'s
  listener, set by the scheduler in the task that runs the probe. The micro-probe calls it
  the moment it reads the first token (before it closes the stream and builds its result),
  so a token that arrived a hair before the silence point is never mistaken for silence. A
  context variable, not a parameter: probe functions keep their one-argument shape, and a
  probe that does not know of it (a test's fake) simply ends, which the scheduler sees too.
- started (``Starter``: ``start(target, receiver)``): no task of its own; the probe tells
  its ``ProbeReceiver`` of the first token, its result, or a failure of the prober's own
  (a bug, never the endpoint's doing), from the callbacks that drive it, and can be
  cancelled through what ``start`` returned (docs/design.md §16.10). ``start_coroutine``
  runs an awaited probe that way, in a task; ``await_started`` awaits a started one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
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
ProbeCall = Callable[["ProbeTarget"], Awaitable["ProbeResult"]]

FIRST_TOKEN: ContextVar[TokenListener | None] = ContextVar("first_token", default=None)


def first_token_seen() -> None:
    """Tell the scheduler (if it is listening) that the first token has arrived."""
    listener = FIRST_TOKEN.get()
    if listener is not None:
        listener.set()


def start_coroutine(probe: ProbeCall, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
    """Run an awaited probe as a started one: in a task of its own, its first token told
    through ``FIRST_TOKEN``."""
    return asyncio.get_running_loop().create_task(_run(probe, target, receiver))


async def _run(probe: ProbeCall, target: ProbeTarget, receiver: ProbeReceiver) -> None:
    FIRST_TOKEN.set(receiver)  # the task's own context: no reset needed
    try:
        result = await probe(target)
    except Exception as error:  # handed to the receiver, as the awaiter got it
        receiver.failed(error)
        return
    receiver.done(result)


async def await_started(start: Callable[[ProbeReceiver], Started]) -> ProbeResult:
    """Start a probe with ``start(receiver)`` and await its result; its first token is
    told to the awaiting task's ``FIRST_TOKEN`` listener, and cancelling the wait ends it
    (nothing once its result is out)."""
    awaited = _Awaited(asyncio.get_running_loop().create_future(), FIRST_TOKEN.get())
    started = start(awaited)
    try:
        return await awaited.future
    finally:
        started.cancel()


class _Awaited:
    """The receiver of an awaited probe: its result (or the prober's own failure) into
    ``future``, its first token to the ``FIRST_TOKEN`` listener of the awaiting task."""

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
