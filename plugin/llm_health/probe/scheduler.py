"""Probe scheduling (docs/design.md §2): one probe in flight per endpoint; stable phases
spread evenly over the interval; a quick confirm-probe after a new failure.

In-flight silence (docs/design.md §3.2): a probe still without its first token at the
silence point (``ProbeTarget.silence_after_s``) is reported at once (``on_silence``), and
if the board asks for it, the confirming probe starts right then, beside the silent one.
That is the only case with two probes of one endpoint in flight, never more.

The first round after a start re-checks a SLOW result once before handing it on (the
start-up burst is the prober's own load, docs/design.md §16); every other result is handed
on as measured.

``phases`` and ``next_slot`` are pure; ``Scheduler`` keeps every endpoint's next round on
one set of alarms and starts its probes without a task (docs/design.md §16.10); it is
cancelled as a whole on shutdown (in-flight probes are cancelled too, which closes their
connections).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol

from llm_health.model.outcome import FAILURES, Outcome, ProbeResult
from llm_health.probe._round import SETTLE_TURNS as SETTLE_TURNS
from llm_health.probe._round import Endpoint, Round, RoundPhase, Watch, forget_task, settles
from llm_health.probe.alarms import Alarms
from llm_health.probe.signals import Starter, await_started
from llm_health.probe.slots import (
    FIRST_ROUND_SPACING_S,
    first_round,
    next_slot,
    on_tick,
    phases,
    tick_for,
)
from llm_health.probe.target import ProbeTarget

# A result handed on, folded in at once (a publish it needs goes out on its own).
ResultFn = Callable[[ProbeTarget, ProbeResult], None]
SilenceFn = Callable[[ProbeTarget, float], Awaitable[bool]]  # (target, silent ms) -> overlap?
RECENT_TTFTS = 8  # successful probes an endpoint's "recent TTFT" is the median of
# The probe's own clock starts a little after the scheduler's (task switch, the slot
# lock, the request being written): without this margin a token at 199 ms by the probe's
# clock could come after a 200 ms silence point by the scheduler's, and a FAST probe
# would degrade and restore its endpoint for nothing.
SILENCE_MARGIN_S = 0.01
# Timers are kept to the millisecond (uvloop's resolution): a wake-up less than this
# before its deadline is on time.
TIMER_SLACK_S = 0.001


def _median(values: list[float]) -> float:
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


def _only_slow(results: Sequence[ProbeResult]) -> bool:
    return len(results) == 1 and results[0].outcome is Outcome.SLOW


class LagReader(Protocol):
    @property
    def current_ms(self) -> float: ...


class Scheduler:
    """Runs probes for every target until cancelled; hands results to ``on_result``.

    No task per endpoint: every endpoint's next round is an alarm (``probe.alarms``), and
    its probe is started through ``start`` (``probe.signals.Starter``), so a round that
    ends in time costs no task, no coroutine and no wait of its own (docs/design.md
    §16.10). Only the rare part is a task: a silent probe's watch and its confirming
    probe. ``on_result`` folds each result in at once, an endpoint's in order.

    ``update`` replaces the target set while running (hot reload): new endpoints start
    probing, removed ones stop (an in-flight probe is cancelled), changed settings apply
    from the next probe. Clock: ``time.monotonic``. A bug in a callback ends ``run`` with
    its exception. Task safety: call ``update`` from the loop that runs ``run``.
    """

    def __init__(
        self,
        targets: Sequence[ProbeTarget],
        start: Starter,
        on_result: ResultFn,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_silence: SilenceFn | None = None,
        confirm: Starter | None = None,
        lag: LagReader | None = None,
        skip: Callable[[ProbeTarget], bool] | None = None,
    ) -> None:
        self._targets = {t.key: t for t in targets}
        self._skip = skip
        self._start = start
        self._on_result = on_result
        self._clock = clock
        self._phases = phases(targets)
        self._tick = tick_for(targets)
        self._origin = clock()
        self._alarms = Alarms(clock)  # slots and silence points: one loop timer for all
        self._endpoints: dict[str, Endpoint] = {}
        self._running: asyncio.Future[None] | None = None
        # Tasks cancelled and not done yet: awaited when ``run`` ends, forgotten once done
        # (a reload's removed endpoints would otherwise pile up here for the process's life).
        self._stopping: set[asyncio.Task[Any]] = set()
        self.in_flight: dict[str, int] = dict.fromkeys(self._targets, 0)
        self._on_silence = on_silence
        self._confirm = confirm
        self._lag = lag
        self._recent: dict[str, list[float]] = {}
        self.first_slow_rechecks = 0  # first-round SLOW results re-checked before use
        self._slot_due_call = self._slot_due  # made once: an alarm's callback per round
        self._silence_call = self._silence_point_reached
        self._first_done_call = self._first_done
        self._crash_call = self._crash

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
        self._running = self._alarms.loop().create_future()
        try:
            for key in self._targets:
                self._add(key, first=True)
            await self._running  # ends only with a callback's bug, or cancelled
        finally:
            self._running = None
            for endpoint in self._endpoints.values():
                self._drop(endpoint)
            self._endpoints.clear()
            stopping, self._stopping = self._stopping, set()
            await asyncio.gather(*stopping, return_exceptions=True)

    def update(self, targets: Sequence[ProbeTarget]) -> None:
        """Replace the target set (see class docstring)."""
        wanted = {t.key: t for t in targets}
        for key in set(self._targets) - set(wanted):
            endpoint = self._endpoints.pop(key, None)
            if endpoint is not None:
                self._drop(endpoint)
            self.in_flight.pop(key, None)
            self._recent.pop(key, None)
        added = set(wanted) - set(self._targets)
        self._targets = wanted
        self._phases = phases(targets)
        self._tick = tick_for(targets)
        for key in added:
            self.in_flight[key] = 0
            if self._running is not None:
                self._add(key, first=False)

    # --- an endpoint's rounds --------------------------------------------------------------

    def _add(self, key: str, *, first: bool) -> None:
        target = self._targets[key]
        if first:
            offset = first_round(self._phases[key], target.interval_s, len(self._targets))
            due = self._origin + offset
        else:
            due = self._clock()
        endpoint = self._endpoints[key] = Endpoint(key, due, first=first)
        self._arm(endpoint)

    def _arm(self, endpoint: Endpoint) -> None:
        """The endpoint's next round at ``endpoint.due`` (on a start tick unless spaced)."""
        if not endpoint.spaced:
            endpoint.due = on_tick(endpoint.due, self._origin, self._tick)
        endpoint.spaced = False
        endpoint.alarm = self._alarms.at(endpoint.due, self._slot_due_call, endpoint)

    def _slot_due(self, endpoint: Endpoint) -> None:
        endpoint.alarm = None
        if self._endpoints.get(endpoint.key) is not endpoint:
            return
        try:
            target = self._targets[endpoint.key]  # settings may have been reloaded
            if endpoint.failures == 0 and self._skip is not None and self._skip(target):
                # Real traffic proves this endpoint (backoff_when_busy): this slot is left
                # out; never while a failure awaits its confirmation.
                phase = self._phases[endpoint.key]
                endpoint.due = next_slot(self._clock(), self._origin, phase, target.interval_s)
                self._arm(endpoint)
                return
            self._begin_round(endpoint, target)
        except Exception as exc:
            self._crash(exc)

    def _begin_round(self, endpoint: Endpoint, target: ProbeTarget) -> None:
        """The scheduled probe, started; its silence point is one alarm, which starts a
        watcher task only if it comes before the first token (docs/design.md §3.2)."""
        round_ = Round(endpoint, target, self._first_done_call, self._crash_call)
        endpoint.round = round_
        after = self._silence_point(target)
        if after is not None:
            round_.started, round_.after = self._clock(), after
            round_.silence = self._alarms.at(round_.started + after, self._silence_call, round_)
        key = endpoint.key
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        probe = self._start(target, round_)
        if round_.probe is None and not round_.ended:  # not already over (told at once)
            round_.probe = probe

    def _silence_point_reached(self, round_: Round) -> None:
        round_.silence = None
        if round_.answered or round_.endpoint.round is not round_:
            return
        watcher = self._on_silent(round_.target, round_, round_.started, round_.after)
        round_.watcher = self._alarms.loop().create_task(watcher)
        round_.phase = RoundPhase.SILENT

    def _first_done(self, round_: Round, result: ProbeResult) -> None:
        """The scheduled probe's result: the round is over, unless a confirming probe
        runs beside it (then both results are handed on, in start order, once it ends)."""
        endpoint = round_.endpoint
        try:
            if endpoint.key in self.in_flight:
                self.in_flight[endpoint.key] -= 1
            round_.probe = None
            round_.end()
            if round_.silence is not None:
                round_.silence.cancel()
                round_.silence = None
            if endpoint.round is not round_:
                return
            if round_.phase is RoundPhase.PROBING:
                self._round_over(endpoint, round_, (result,))
            else:  # silent: the watch (and its confirming probe) runs on
                round_.phase = RoundPhase.CONFIRMING
                loop = self._alarms.loop()
                endpoint.task = loop.create_task(self._after_confirm(endpoint, round_, result))
        except Exception as exc:
            self._crash(exc)

    async def _after_confirm(self, endpoint: Endpoint, round_: Round, first: ProbeResult) -> None:
        try:
            assert round_.watcher is not None
            confirm = await round_.watcher
            round_.watcher = None  # done: not kept with its frame until the next round
            forget_task(endpoint)
            if self._endpoints.get(endpoint.key) is endpoint:
                results = (first,) if confirm is None else (first, confirm)
                self._round_over(endpoint, round_, results)
        except Exception as exc:
            self._crash(exc)

    def _round_over(
        self, endpoint: Endpoint, round_: Round, results: tuple[ProbeResult, ...]
    ) -> None:
        endpoint.round = None
        round_.phase = RoundPhase.OVER
        if endpoint.recheck and _only_slow(results):
            endpoint.due = self._recheck_due(endpoint.key, round_.target)
            endpoint.recheck, endpoint.spaced = False, True
            self.first_slow_rechecks += 1
            self._arm(endpoint)
            return
        endpoint.recheck = False
        self._hand_on(endpoint, round_.target, results)

    def _hand_on(
        self, endpoint: Endpoint, target: ProbeTarget, results: tuple[ProbeResult, ...]
    ) -> None:
        """``results`` to ``on_result`` in order, then the next round."""
        for result in results:
            self._on_result(target, result)
            self._remember(endpoint.key, result)
            endpoint.failures = endpoint.failures + 1 if result.outcome in FAILURES else 0
        # Confirm a failure at once while it could still change the verdict; otherwise back
        # to the endpoint's own slot. A confirming probe keeps its own time: failures are
        # rare, so a tick would gather nothing and only delay the verdict (docs/design.md
        # §2).
        now = self._clock()
        if _confirms(target, endpoint.failures):
            endpoint.due, endpoint.spaced = now + target.confirm_delay_s, True
        else:
            phase = self._phases[endpoint.key]
            endpoint.due = next_slot(now, self._origin, phase, target.interval_s)
        self._arm(endpoint)

    def _drop(self, endpoint: Endpoint) -> None:
        """Stop the endpoint: its alarm, its probe in flight (its connection closed), its
        round's tasks (awaited when ``run`` ends)."""
        if endpoint.alarm is not None:
            endpoint.alarm.cancel()
            endpoint.alarm = None
        round_, endpoint.round = endpoint.round, None
        if round_ is not None:
            round_.phase = RoundPhase.OVER
            if round_.probe is not None:
                probe, round_.probe = round_.probe, None
                probe.cancel()
            if round_.silence is not None:
                round_.silence.cancel()
            if round_.watcher is not None:
                self._cancel(round_.watcher)
        if endpoint.task is not None:
            self._cancel(endpoint.task)
            endpoint.task = None

    def _cancel(self, task: asyncio.Task[Any]) -> None:
        if not task.done():
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def _crash(self, exc: Exception) -> None:
        """A bug in a callback: ``run`` ends with it (as a task of its own would have)."""
        running = self._running
        if running is not None and not running.done():
            running.set_exception(exc)
            return
        context = {"message": "probe scheduler callback failed", "exception": exc}
        self._alarms.loop().call_exception_handler(context)

    # --- silence ---------------------------------------------------------------------------

    def _silence_point(self, target: ProbeTarget) -> float | None:
        """Seconds after the start at which a probe without its first token is silent
        (with the margin); None when silence is not watched."""
        if self._on_silence is None:
            return None
        # The recent TTFT (a median) only where the silence point follows it.
        recent = self._recent_ttft(target.key) if target.silence_degrade is not None else None
        after = target.silence_after_s(recent)
        return None if after is None else after + SILENCE_MARGIN_S

    async def _on_silent(
        self, target: ProbeTarget, watch: Watch, started: float, after: float
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

    async def _still_silent(self, target: ProbeTarget, watch: Watch, started: float) -> bool:
        """Wait for the confirm point (``ProbeTarget.confirm_after_s``): a second probe
        only helps while the first is still silent then, and while one failure does not
        already decide (``unhealthy_after`` 1). A jittery-but-fine engine has answered by
        then, so it is never probed twice at once."""
        if self._confirm is None or target.unhealthy_after < 2:
            return False
        return await self._wait_silent(watch, started + target.confirm_after_s())

    def _confirm_fn(self) -> Starter:
        assert self._confirm is not None
        return self._confirm

    async def _report_silence(self, target: ProbeTarget, silent_ms: float) -> bool:
        return self._on_silence is not None and await self._on_silence(target, silent_ms)

    async def _wait_silent(self, watch: Watch, until: float) -> bool:
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
            if watch.answered or await settles(watch):
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
        """The endpoint's last RECENT_TTFTS TTFTs: a list (184 bytes full, where a deque
        is 760 however short), made once."""
        if result.ttft_ms is not None:
            recent = self._recent.get(key)
            if recent is None:
                recent = self._recent[key] = []
            recent.append(result.ttft_ms)
            if len(recent) > RECENT_TTFTS:
                del recent[0]

    def _recent_ttft(self, key: str) -> float | None:
        """Median TTFT (s) of the endpoint's last successful probes; None below 3."""
        recent = self._recent.get(key)
        if not recent or len(recent) < 3:
            return None
        return _median(recent) / 1000

    async def _probe_once(self, target: ProbeTarget, start: Starter) -> ProbeResult:
        self.in_flight[target.key] = self.in_flight.get(target.key, 0) + 1
        try:
            return await await_started(partial(start, target))
        finally:
            if target.key in self.in_flight:
                self.in_flight[target.key] -= 1
