"""The scheduler as it was before it started probes without a task (the oracle of
``test_scheduler_oracle.py``): one task per endpoint sleeping on its slot, the round's
probe awaited, ``on_result`` awaited. Kept as it was, but for its name and imports."""

# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

from llm_health.model.outcome import FAILURES, Outcome, ProbeResult
from llm_health.probe.alarms import Alarms
from llm_health.probe.slots import FIRST_ROUND_SPACING_S, tick_for as _tick_for
from llm_health.probe.scheduler import (
    SETTLE_TURNS,
    SILENCE_MARGIN_S,
    TIMER_SLACK_S,
    RECENT_TTFTS,
    LagReader,
    SilenceFn,
)
from llm_health.probe.slots import first_round, next_slot, on_tick, phases
from tests.started import TOKEN as FIRST_TOKEN
from tests.started import FakeProbe as ProbeFn
from llm_health.probe.target import ProbeTarget

ResultFn = Callable[[ProbeTarget, ProbeResult], "asyncio.Future[None]"]


async def _sleep_until(alarms: Alarms, clock: Callable[[], float], when: float) -> None:
    """``Alarms.sleep_until`` as it was (the scheduler below slept on it; no probe sleeps
    on an alarm any more): until ``when`` by ``clock`` (the alarms'), one loop turn if it
    is past."""
    loop = alarms.loop()
    if when <= clock():
        await asyncio.sleep(0)
        return
    future = loop.create_future()
    alarm = alarms.at(when, _resolve, future)
    try:
        await future
    finally:
        alarm.cancel()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Watch:
    """One probe round's first token and end, for its silence timer: ``set`` is the
    ``FIRST_TOKEN`` listener the micro-probe calls, ``end`` the round's own notice. Cheap
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
        self._wake()

    def end(self) -> None:
        self.ended = True
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


async def _settles(watch: _Watch) -> bool:
    """Whether the first token was in fact already here: on a busy loop the silence timer
    can fire while the token's bytes wait in the socket or the ready queue. Giving the
    loop a few turns lets them through before silence is declared."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if watch.answered:
            return True
    return False


def _median(values: deque[float]) -> float:
    """``statistics.median``, for the few numbers of every probe's silence point at a
    fraction of its cost."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _confirms(target: ProbeTarget, failures: int) -> bool:
    """Whether the next probe confirms a failure: one that could still change the verdict
    (fewer than ``unhealthy_after`` in a row)."""
    return 0 < failures < target.unhealthy_after


def _only_slow(results: list[ProbeResult]) -> bool:
    return len(results) == 1 and results[0].outcome is Outcome.SLOW


class SchedulerBefore:
    """Runs ``probe`` for every target until cancelled; hands results to ``on_result``.

    ``on_result`` is awaited before the endpoint's next probe is scheduled, so results of
    one endpoint are delivered in order. ``update`` replaces the target set while running
    (hot reload): new endpoints start probing, removed ones stop (an in-flight probe is
    cancelled), changed settings apply from the next probe. Clock: ``time.monotonic``.
    Task safety: call ``update`` from the loop that runs ``run``.
    """

    def __init__(
        self,
        targets: Sequence[ProbeTarget],
        probe: ProbeFn,
        on_result: ResultFn,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_silence: SilenceFn | None = None,
        confirm: ProbeFn | None = None,
        lag: LagReader | None = None,
        skip: Callable[[ProbeTarget], bool] | None = None,
    ) -> None:
        self._targets = {t.key: t for t in targets}
        self._skip = skip
        self._probe = probe
        self._on_result = on_result
        self._clock = clock
        self._phases = phases(targets)
        self._tick = _tick_for(targets)
        self._origin = clock()
        self._alarms = Alarms(clock)  # slots and silence points: one loop timer for all
        self._group: asyncio.TaskGroup | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.in_flight: dict[str, int] = dict.fromkeys(self._targets, 0)
        self._on_silence = on_silence
        self._confirm = confirm
        self._lag = lag
        self._recent: dict[str, deque[float]] = {}
        self.first_slow_rechecks = 0  # first-round SLOW results re-checked before use

    def phase_of(self, key: str) -> float:
        return self._phases[key]

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self._targets)

    def target(self, key: str) -> ProbeTarget:
        return self._targets[key]

    async def run(self) -> None:
        """Probe until cancelled."""
        self._origin = self._clock()
        async with asyncio.TaskGroup() as group:
            self._group = group
            for key in self._targets:
                self._start(key, first=True)
            await asyncio.Future()  # keep the group open for `update` until cancelled

    def update(self, targets: Sequence[ProbeTarget]) -> None:
        """Replace the target set (see class docstring)."""
        wanted = {t.key: t for t in targets}
        for key in set(self._targets) - set(wanted):
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
            self.in_flight.pop(key, None)
            self._recent.pop(key, None)
        added = set(wanted) - set(self._targets)
        self._targets = wanted
        self._phases = phases(targets)
        self._tick = _tick_for(targets)
        for key in added:
            self.in_flight[key] = 0
            if self._group is not None:
                self._start(key, first=False)

    def _start(self, key: str, *, first: bool) -> None:
        assert self._group is not None
        self._tasks[key] = self._group.create_task(self._run_endpoint(key, first=first))

    async def _run_endpoint(self, key: str, *, first: bool) -> None:
        target = self._targets[key]
        offset = first_round(self._phases[key], target.interval_s, len(self._targets))
        due = self._origin + offset if first else self._clock()
        # spaced: the compressed first round (and its re-check) keeps its own spacing
        failures, recheck, spaced = 0, first, first
        while True:
            if not spaced:
                due = on_tick(due, self._origin, self._tick)
            spaced = False
            await _sleep_until(self._alarms, self._clock, due)
            target = self._targets[key]  # settings may have been reloaded
            if failures == 0 and self._skip is not None and self._skip(target):
                # Real traffic proves this endpoint (backoff_when_busy): this slot is left
                # out; never while a failure awaits its confirmation.
                due = next_slot(self._clock(), self._origin, self._phases[key], target.interval_s)
                continue
            results = await self._probe_round(target)
            if recheck and _only_slow(results):
                due = self._recheck_due(key, target)
                recheck, spaced = False, True
                self.first_slow_rechecks += 1
                continue
            recheck = False
            for result in results:
                await self._on_result(target, result)
                self._remember(key, result)
                failures = failures + 1 if result.outcome in FAILURES else 0
            due = self._next_due(target, self._phases[key], failures)
            # A confirming probe keeps its own time: failures are rare, so a tick would
            # gather nothing and only delay the verdict (docs/design.md §2).
            spaced = _confirms(target, failures)

    async def _probe_round(self, target: ProbeTarget) -> list[ProbeResult]:
        """The scheduled probe; if it falls silent and the board asks for it, the
        confirming probe, started beside it once it has been silent for the confirm point
        too. Results in start order.

        The probe runs in the endpoint's own task; its silence point is one timer, which
        starts a watcher task only if it fires before the first token (docs/design.md
        §3.2): the common round costs no task and no wait of its own."""
        after = self._silence_point(target)
        if after is None:
            return [await self._probe_once(target, self._probe)]
        started, watch = self._clock(), _Watch()
        watcher: asyncio.Task[ProbeResult | None] | None = None
        loop = self._alarms.loop()

        def silence_point(_: None) -> None:
            nonlocal watcher
            if not watch.answered:
                watcher = loop.create_task(self._on_silent(target, watch, started, after))

        timer = self._alarms.at(started + after, silence_point)
        reset = FIRST_TOKEN.set(watch)
        try:
            first = await self._probe_once(target, self._probe)
            watch.end()
            confirm = None if watcher is None else await watcher
            return [first] if confirm is None else [first, confirm]
        finally:
            FIRST_TOKEN.reset(reset)
            timer.cancel()
            if watcher is not None and not watcher.done():
                watcher.cancel()

    def _silence_point(self, target: ProbeTarget) -> float | None:
        """Seconds after the start at which a probe without its first token is silent
        (with the margin); None when silence is not watched."""
        if self._on_silence is None:
            return None
        after = target.silence_after_s(self._recent_ttft(target.key))
        return None if after is None else after + SILENCE_MARGIN_S

    async def _on_silent(
        self, target: ProbeTarget, watch: _Watch, started: float, after: float
    ) -> ProbeResult | None:
        """The silence timer fired with no token yet: once the loop has settled (and
        waited out its own lag), report the silence; if the board asks for a confirm and
        the probe is still silent at the confirm point, run it beside the first. Its
        result, or None."""
        # From the silence point itself, not from the timer's firing: a timer can fire
        # before it by the scheduler's clock (uvloop keeps timers to the millisecond; a
        # clock other than the loop's), and then the rest of the wait is still owed.
        if not await self._wait_silent(watch, started + after):
            return None
        silent_ms = (self._clock() - started) * 1000
        if not await self._report_silence(target, silent_ms):
            return None
        if not await self._still_silent(target, watch, started):
            return None
        return await self._probe_once(target, self._confirm_fn())

    async def _still_silent(self, target: ProbeTarget, watch: _Watch, started: float) -> bool:
        """Wait for the confirm point (``ProbeTarget.confirm_after_s``): a second probe
        only helps while the first is still silent then, and while one failure does not
        already decide (``unhealthy_after`` 1). A jittery-but-fine engine has answered by
        then, so it is never probed twice at once."""
        if self._confirm is None or target.unhealthy_after < 2:
            return False
        return await self._wait_silent(watch, started + target.confirm_after_s())

    def _confirm_fn(self) -> ProbeFn:
        assert self._confirm is not None
        return self._confirm

    async def _report_silence(self, target: ProbeTarget, silent_ms: float) -> bool:
        return self._on_silence is not None and await self._on_silence(target, silent_ms)

    async def _wait_silent(self, watch: _Watch, until: float) -> bool:
        """True if, at ``until`` (scheduler clock), the probe still has neither a first
        token nor an end. The wait is extended once by the loop lag seen then: a late
        wake-up is ours, not the engine's silence."""
        deadline, extended = until, False
        while True:
            remaining = deadline - self._clock()
            if remaining > TIMER_SLACK_S:
                await watch.wait(remaining)
                if not watch.answered and deadline - self._clock() > TIMER_SLACK_S:
                    continue  # woke early (see _on_silent): wait out the rest
            if watch.answered or await _settles(watch):
                return False
            lag_s = self._lag.current_ms / 1000 if self._lag is not None else 0.0
            if extended or lag_s <= 0:
                return True
            deadline, extended = deadline + lag_s, True

    def _recheck_due(self, key: str, target: ProbeTarget) -> float:
        """When a SLOW first probe is taken again: at the endpoint's place in a second
        compressed round, after the first round's burst of starts has passed. The first
        round starts every endpoint within a second and lands them on a prober (and
        servers) busy with all the others' first probes; a SLOW read then is as likely the
        start-up's as the engine's, and publishing it would push a healthy fleet to Envoy
        at reduced weight after every restart (docs/design.md §16)."""
        spread = min(target.interval_s, len(self._targets) * FIRST_ROUND_SPACING_S)
        offset = first_round(self._phases[key], target.interval_s, len(self._targets))
        return max(self._clock(), self._origin + spread + offset)

    def _remember(self, key: str, result: ProbeResult) -> None:
        if result.ttft_ms is not None:
            self._recent.setdefault(key, deque(maxlen=RECENT_TTFTS)).append(result.ttft_ms)

    def _recent_ttft(self, key: str) -> float | None:
        """Median TTFT (s) of the endpoint's last successful probes; None below 3."""
        recent = self._recent.get(key)
        if not recent or len(recent) < 3:
            return None
        return _median(recent) / 1000

    def _next_due(self, target: ProbeTarget, phase: float, failures: int) -> float:
        """Confirm a failure at once while it could still change the verdict (fewer than
        ``unhealthy_after`` in a row); otherwise back to the endpoint's own slot."""
        now = self._clock()
        if _confirms(target, failures):
            return now + target.confirm_delay_s
        return next_slot(now, self._origin, phase, target.interval_s)

    async def _probe_once(self, target: ProbeTarget, probe: ProbeFn) -> ProbeResult:
        self.in_flight[target.key] = self.in_flight.get(target.key, 0) + 1
        try:
            return await probe(target)
        finally:
            if target.key in self.in_flight:
                self.in_flight[target.key] -= 1
