"""Bounds on the stop of ``serve`` and ``llm-health agent`` (docs/design.md §7.9): what a
stop waits for (a server's open connections, a worker process, a task's own clean-up) is
partly outside the process, and a stop that waits on it without end keeps the process
alive until it is killed, saying nothing of why."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection
from typing import Any

log = logging.getLogger("llm_health")


class StopTimeout(TimeoutError):
    """A part of the service did not stop within its bound."""


async def stop_within(seconds: float, what: str, stopping: Awaitable[object]) -> None:
    """Await ``stopping`` for at most ``seconds``; past that it is cancelled and
    ``StopTimeout`` names ``what``."""
    try:
        async with asyncio.timeout(seconds) as bound:
            await stopping
    except TimeoutError:
        if not bound.expired():
            raise  # a TimeoutError of its own, not our bound
        raise StopTimeout(f"{what} did not stop within {seconds:g} s") from None


async def cancel_within(tasks: Collection[asyncio.Task[Any]], seconds: float) -> None:
    """Cancel ``tasks`` and give them ``seconds`` to end. Those still running then are
    named in an error line; their TaskGroup still waits for them (a TaskGroup cannot be
    left before its tasks end), and the line says what a hung stop is waiting for."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _ended, running = await asyncio.wait(tasks, timeout=seconds)
    if running:
        names = sorted(
            f"{t.get_name()} {getattr(t.get_coro(), '__qualname__', '')}" for t in running
        )
        log.error("tasks did not stop", extra={"within_s": seconds, "tasks": names})
