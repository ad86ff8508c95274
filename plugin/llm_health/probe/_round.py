"""One endpoint's place in the schedule and one probe round of it (``probe.scheduler``):
the round's first token and end (its silence watch), its probe, and the confirming probe
started beside it if it fell silent (docs/design.md §3.2)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from llm_health.model.outcome import ProbeResult
from llm_health.probe.alarms import Alarm
from llm_health.probe.signals import Started
from llm_health.probe.target import ProbeTarget

SETTLE_TURNS = 3  # loop turns a token needs from the socket to the event: I/O, read, parse


class Watch:
    """One probe round's first token and end, for its silence timer: ``set`` is the
    probe's first-token notice (``ProbeReceiver.set``), ``end`` the round's own. Cheap
    on purpose: it is made for every probe, and only a silence (rare) ever waits on it."""

    __slots__ = ("_waiter", "ended", "token")

    def __init__(self) -> None:
        self.token = False
        self.ended = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def answered(self) -> bool:
        return self.token or self.ended

    def set(self) -> None:
        self.token = True
        if self._waiter is not None:  # only a silence waits: rare
            self._wake()

    def end(self) -> None:
        self.ended = True
        if self._waiter is not None:
            self._wake()

    async def wait(self, timeout_s: float) -> None:
        """Until the token or the end, or ``timeout_s``, whichever comes first."""
        if self.answered:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        except TimeoutError:
            pass
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


async def settles(watch: Watch) -> bool:
    """Whether the first token was in fact already here: on a busy loop the silence timer
    can fire while the token's bytes wait in the socket or the ready queue. Giving the
    loop a few turns lets them through before silence is declared."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if watch.answered:
            return True
    return False


class Endpoint:
    """One endpoint's place in the schedule: when its next round is due and what the
    rounds before it left (failures to confirm, the first round's re-check)."""

    __slots__ = ("alarm", "due", "failures", "key", "recheck", "round", "spaced", "task")

    def __init__(self, key: str, due: float, *, first: bool) -> None:
        self.key = key
        self.due = due
        self.failures = 0
        self.recheck = first  # the first round re-checks a SLOW first result
        self.spaced = first  # the compressed first round (and its re-check) keeps its spacing
        self.alarm: Alarm | None = None  # the next round's start
        self.round: Round | None = None  # the round in flight
        self.task: asyncio.Task[None] | None = None  # a round's rare awaited part


def forget_task(endpoint: Endpoint) -> None:
    """The endpoint's task has done its work (it runs this): not kept, with its
    coroutine and context, until the endpoint's next one (1-2 KiB an endpoint)."""
    if endpoint.task is asyncio.current_task():
        endpoint.task = None


class RoundPhase(enum.Enum):
    """The steps of a round, in order (compared by identity)."""

    PROBING = enum.auto()  # the scheduled probe in flight, not silent (yet)
    SILENT = enum.auto()  # past its silence point without a token: watched in a task
    CONFIRMING = enum.auto()  # its result in; the silent watch (and confirm) still runs
    OVER = enum.auto()  # its results handed on, or the endpoint dropped


class Round(Watch):
    """One probe round: the scheduled probe (its receiver: ``probe.signals``), its silence
    watch, and the confirming probe started beside it if it fell silent. ``on_done``:
    its owner's, with the scheduled probe's result; ``on_failed``: a bug of the prober's."""

    __slots__ = (
        "after",
        "endpoint",
        "on_done",
        "on_failed",
        "phase",
        "probe",
        "silence",
        "started",
        "target",
        "watcher",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        target: ProbeTarget,
        on_done: Callable[[Round, ProbeResult], None],
        on_failed: Callable[[Exception], None],
    ) -> None:
        Watch.__init__(self)
        self.endpoint = endpoint
        self.target = target
        self.on_done = on_done
        self.on_failed = on_failed
        self.phase = RoundPhase.PROBING
        self.started = 0.0  # when it started, and its silence point after that (s)
        self.after = 0.0
        self.probe: Started | None = None
        self.silence: Alarm | None = None
        self.watcher: asyncio.Task[ProbeResult | None] | None = None

    def done(self, result: ProbeResult) -> None:
        self.on_done(self, result)

    def failed(self, error: Exception) -> None:
        self.on_failed(error)
