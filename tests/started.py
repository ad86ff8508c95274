"""Probes in tests: fakes written as coroutines, started as every probe is
(``probe.signals.Starter``: each in a task of its own, its receiver told its result; a
fake tells its first token with ``token_seen()``), and ``probe_once``, a real prober's
probe awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial

from llm_health.model.outcome import ProbeResult
from llm_health.probe.client import Prober
from llm_health.probe.signals import (
    ProbeReceiver,
    Started,
    Starter,
    TokenListener,
    await_started,
)
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


async def probe_once(prober: Prober, target: ProbeTarget) -> ProbeResult:
    """One probe of ``prober``'s, awaited (``probe.signals.await_started``)."""
    return await await_started(partial(prober.start_probe, target))
