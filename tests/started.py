"""Test fakes of a probe written as coroutines, started as every probe is
(``probe.signals.Starter``): each in a task of its own, its receiver told its result.
A fake tells its first token with ``token_seen()``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

from llm_health.model.outcome import ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started, Starter, TokenListener
from llm_health.probe.target import ProbeTarget

FakeProbe = Callable[[ProbeTarget], Awaitable[ProbeResult]]
TOKEN: ContextVar[TokenListener | None] = ContextVar("fake_probe_token", default=None)


def token_seen() -> None:
    """A fake probe's first token, told to its receiver."""
    listener = TOKEN.get()
    if listener is not None:
        listener.set()


def started(probe: FakeProbe) -> Starter:
    """``probe`` as a ``Starter``."""

    def start(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        return asyncio.get_running_loop().create_task(_run(probe, target, receiver))

    return start


async def _run(probe: FakeProbe, target: ProbeTarget, receiver: ProbeReceiver) -> None:
    TOKEN.set(receiver)  # the task's own context
    try:
        result = await probe(target)
    except Exception as error:  # handed to the receiver, as an awaiting caller got it
        receiver.failed(error)
        return
    receiver.done(result)
