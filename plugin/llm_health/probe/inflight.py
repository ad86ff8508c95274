"""At most one probe in flight per endpoint (plus one confirming probe beside a silent
one): the slots every probe of ``serve`` and ``llm-health agent`` is started through
(docs/design.md §2.7)."""

from __future__ import annotations

import asyncio
from functools import partial

from llm_health.model.outcome import ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started, Starter, await_started
from llm_health.probe.target import ProbeTarget


class ProbeSlots:
    """At most one probe in flight per endpoint through ``start`` or ``probe`` (scheduled
    probes and probe-now share it), plus at most one through ``confirm``: the confirming
    probe started beside a silent one. Never more than two (docs/design.md §2.7).

    Every probe is started through ``starter`` (``probe.signals``): at once when its slot
    is free, with no task; a busy one (a probe-now in flight) is waited for in a task."""

    def __init__(self, starter: Starter) -> None:
        self._starter = starter
        self._main: dict[str, _Slot] = {}
        self._extra: dict[str, _Slot] = {}

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        """Probe-now: the endpoint's probe, awaited."""
        async with _slot(self._main, target.key):
            return await await_started(partial(self._starter, target))

    def start(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """The scheduled probe (``probe.signals.Starter``)."""
        return self._start_in(self._main, target, receiver)

    def confirm(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """The confirming probe beside a silent one (``probe.signals.Starter``)."""
        return self._start_in(self._extra, target, receiver)

    def _start_in(
        self, slots: dict[str, _Slot], target: ProbeTarget, receiver: ProbeReceiver
    ) -> Started:
        slot = _slot(slots, target.key)
        if not slot.take_now():
            loop = asyncio.get_running_loop()
            return loop.create_task(self._when_free(slot, target, receiver))
        holding = _Holding(receiver, slot)
        started = self._starter(target, holding)
        if holding.held:  # not over already (a probe can be told at once: a bad URL)
            holding.started = started
        return holding

    async def _when_free(self, slot: _Slot, target: ProbeTarget, receiver: ProbeReceiver) -> None:
        """A probe whose slot is busy: started once it is free, in this task (cancelling
        the task ends it)."""
        try:
            async with slot:
                result = await await_started(partial(self._starter, target), receiver)
        except Exception as error:  # handed to the receiver, as an awaiting caller got it
            receiver.failed(error)
            return
        receiver.done(result)


class _Slot:
    """One endpoint's slot: held by one probe at a time, handed on in the order asked
    (``asyncio.Lock``'s rules, plus ``take_now`` for a start that cannot wait)."""

    __slots__ = ("_waiters", "held")

    def __init__(self) -> None:
        self.held = False
        # Rare (a probe-now beside a round): a list, 56 bytes empty where a deque is 760
        # (one slot per endpoint).
        self._waiters: list[asyncio.Future[None]] = []

    def take_now(self) -> bool:
        if self.held or self._waiters:
            return False
        self.held = True
        return True

    def release(self) -> None:
        """Hand the slot to the first waiter still waiting, or free it."""
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self.held = False

    async def __aenter__(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # resolved: the slot was handed to us (still held)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed to us as we were cancelled: hand it on
            raise

    async def __aexit__(self, *_exc: object) -> None:
        self.release()


class _Holding:
    """A started probe holding its endpoint's slot: the slot is freed once, when the
    probe ends (before its receiver hears of it, as ``probe`` frees it before returning)
    or is cancelled."""

    __slots__ = ("_receiver", "_slot", "started")

    def __init__(self, receiver: ProbeReceiver, slot: _Slot) -> None:
        self._receiver = receiver
        self._slot: _Slot | None = slot
        self.started: Started | None = None

    def set(self) -> None:
        self._receiver.set()

    def done(self, result: ProbeResult) -> None:
        self._free()
        self.started = None  # it refers back here: no cycle left for the collector
        self._receiver.done(result)

    def failed(self, error: Exception) -> None:
        self._free()
        self.started = None
        self._receiver.failed(error)

    def cancel(self) -> None:
        self._free()
        if self.started is not None:
            self.started.cancel()

    @property
    def held(self) -> bool:
        return self._slot is not None

    def _free(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()


def _slot(slots: dict[str, _Slot], key: str) -> _Slot:
    """The endpoint's slot, made at its first probe."""
    slot = slots.get(key)
    if slot is None:
        slot = slots[key] = _Slot()
    return slot
