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
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

from llm_health.model.outcome import FAILURES, Outcome, ProbeResult
from llm_health.probe.alarms import Alarm, Alarms
from llm_health.probe.signals import Started, Starter, start_coroutine
from llm_health.probe.target import ProbeTarget

FIRST_ROUND_SPACING_S = 0.001  # first round: at most 1,000 probe starts per second
# Probe starts are gathered on ticks (``start_tick``): a wake-up of the prober costs more
# than the probe it starts when probes are a few milliseconds apart (docs/design.md §2).
STARTS_PER_TICK = 32  # what a tick gathers on average
MAX_START_TICK_S = 0.1  # a probe starts at most this long after its slot
MIN_START_TICK_S = 0.001  # below this, probes are not gathered
ProbeFn = Callable[[ProbeTarget], Awaitable[ProbeResult]]
# A result handed on: None when it is folded in at once, else what to await before the
# endpoint's next round (the publish a state change needs).
ResultFn = Callable[[ProbeTarget, ProbeResult], Awaitable[None] | None]
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


SETTLE_TURNS = 3  # loop turns a token needs from the socket to the event: I/O, read, parse


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


async def _settles(watch: _Watch) -> bool:
    """Whether the first token was in fact already here: on a busy loop the silence timer
    can fire while the token's bytes wait in the socket or the ready queue. Giving the
    loop a few turns lets them through before silence is declared."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if watch.answered:
            return True
    return False


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


def stable_rank_key(key: str) -> bytes:
    """Order endpoints by a hash of their key: stable across restarts and processes."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


def phases(targets: Iterable[ProbeTarget]) -> dict[str, float]:
    """Offset (s) of each endpoint inside its interval: endpoint i of N gets i/N of it.

    Even spacing, not random hashing: N probes per interval land N evenly spaced instants,
    so the prober's load (and a backend's) is flat, never a burst.
    """
    ordered = sorted(targets, key=lambda t: stable_rank_key(t.key))
    count = len(ordered)
    return {t.key: (i / count) * t.interval_s for i, t in enumerate(ordered)}


def first_round(phase: float, interval: float, count: int) -> float:
    """Offset of an endpoint's first probe after start: its phase, compressed.

    The first round decides when the plugin may push to Envoy (warm start, docs/design.md §7), so
    it runs as fast as the prober can keep measuring (FIRST_ROUND_SPACING_S apart, still
    in phase order, still one probe per endpoint) instead of taking a whole interval.
    """
    spread = min(interval, count * FIRST_ROUND_SPACING_S)
    return phase * spread / interval


def start_tick(count: int, interval: float) -> float:
    """The tick probe starts are gathered on, for ``count`` endpoints probed every
    ``interval`` (the shortest): STARTS_PER_TICK of them a tick, the tick at most
    MAX_START_TICK_S; 0 (each at its own instant) below MIN_START_TICK_S or when a tick
    would not gather two. Each wake-up of the prober (timer, connection, answer) then
    serves several probes: measured, half the CPU per probe at 200 endpoints
    (docs/benchmarks.md, "CPU per probe beside Envoy's own checker"). The bound keeps a gathered start within its slot's
    neighbourhood and the burst of starts a tick brings (STARTS_PER_TICK) small beside
    the TTFTs read meanwhile."""
    if count <= 0 or interval <= 0:
        return 0.0
    tick = min(MAX_START_TICK_S, STARTS_PER_TICK * interval / count)
    if tick < MIN_START_TICK_S or count * tick / interval < 2:
        return 0.0
    return tick


def on_tick(due: float, origin: float, tick: float) -> float:
    """``due``, moved to the first start tick at or after it (ticks from ``origin``).
    Never before ``due``: a slot a rounding error past a tick stays where it is (moved
    back to that tick, it could be the tick that is now, and the probe would start again
    at once, a second time in its slot)."""
    if tick <= 0:
        return due
    return max(due, origin + math.ceil((due - origin) / tick - 1e-9) * tick)


def next_slot(now: float, origin: float, phase: float, interval: float) -> float:
    """The first time ``origin + phase + k*interval`` strictly after ``now`` (k >= 0).

    Missed slots are skipped, so a slow probe never causes a catch-up burst.
    """
    first = origin + phase
    if now < first:
        return first
    slot = first + (math.floor((now - first) / interval) + 1) * interval
    while slot <= now:  # float rounding can land exactly on `now`
        slot += interval
    return slot


def _forget_task(endpoint: _Endpoint) -> None:
    """The endpoint's task has done its work (it runs this): not kept, with its
    coroutine and context, until the endpoint's next one (1-2 KiB an endpoint)."""
    if endpoint.task is asyncio.current_task():
        endpoint.task = None


def _tick_for(targets: Iterable[ProbeTarget]) -> float:
    intervals = [t.interval_s for t in targets]
    return start_tick(len(intervals), min(intervals)) if intervals else 0.0


class _Endpoint:
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
        self.round: _Round | None = None  # the round in flight
        self.task: asyncio.Task[None] | None = None  # a round's rare awaited part


class _Round(_Watch):
    """One probe round: the scheduled probe (its receiver: ``probe.signals``), its silence
    watch, and the confirming probe started beside it if it fell silent."""

    __slots__ = (
        "after",
        "endpoint",
        "probe",
        "scheduler",
        "silence",
        "started",
        "target",
        "watcher",
    )

    def __init__(self, scheduler: Scheduler, endpoint: _Endpoint, target: ProbeTarget) -> None:
        _Watch.__init__(self)
        self.scheduler = scheduler
        self.endpoint = endpoint
        self.target = target
        self.started = 0.0
        self.after = 0.0
        self.probe: Started | None = None
        self.silence: Alarm | None = None
        self.watcher: asyncio.Task[ProbeResult | None] | None = None

    def done(self, result: ProbeResult) -> None:
        self.scheduler._first_done(self, result)

    def failed(self, error: Exception) -> None:
        self.scheduler._crash(error)


class Scheduler:
    """Runs probes for every target until cancelled; hands results to ``on_result``.

    No task per endpoint: every endpoint's next round is an alarm (``probe.alarms``), and
    its probe is started through ``start`` (``probe.signals.Starter``; without one,
    ``probe`` is run in a task of its own), so a round that ends in time costs no task,
    no coroutine and no wait of its own (docs/design.md §16.10). Only the rare parts are
    tasks: a silent probe's watch and its confirming probe, and an ``on_result`` that
    returns an awaitable (awaited before the endpoint's next round, so results of one
    endpoint are delivered in order, and what they publish is out before the next probe).

    ``update`` replaces the target set while running (hot reload): new endpoints start
    probing, removed ones stop (an in-flight probe is cancelled), changed settings apply
    from the next probe. Clock: ``time.monotonic``. A bug in a callback ends ``run`` with
    its exception. Task safety: call ``update`` from the loop that runs ``run``.
    """

    def __init__(
        self,
        targets: Sequence[ProbeTarget],
        probe: ProbeFn,
        on_result: ResultFn,
        clock: Callable[[], float] = time.monotonic,
        *,
        start: Starter | None = None,
        on_silence: SilenceFn | None = None,
        confirm: ProbeFn | None = None,
        lag: LagReader | None = None,
        skip: Callable[[ProbeTarget], bool] | None = None,
    ) -> None:
        self._targets = {t.key: t for t in targets}
        self._skip = skip
        self._probe = probe
        self._start: Starter = start if start is not None else partial(start_coroutine, probe)
        self._on_result = on_result
        self._clock = clock
        self._phases = phases(targets)
        self._tick = _tick_for(targets)
        self._origin = clock()
        self._alarms = Alarms(clock)  # slots and silence points: one loop timer for all
        self._endpoints: dict[str, _Endpoint] = {}
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
        self._tick = _tick_for(targets)
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
        endpoint = self._endpoints[key] = _Endpoint(key, due, first=first)
        self._arm(endpoint)

    def _arm(self, endpoint: _Endpoint) -> None:
        """The endpoint's next round at ``endpoint.due`` (on a start tick unless spaced)."""
        if not endpoint.spaced:
            endpoint.due = on_tick(endpoint.due, self._origin, self._tick)
        endpoint.spaced = False
        endpoint.alarm = self._alarms.at(endpoint.due, self._slot_due_call, endpoint)

    def _slot_due(self, endpoint: _Endpoint) -> None:
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

    def _begin_round(self, endpoint: _Endpoint, target: ProbeTarget) -> None:
        """The scheduled probe, started; its silence point is one alarm, which starts a
        watcher task only if it comes before the first token (docs/design.md §3.2)."""
        round_ = endpoint.round = _Round(self, endpoint, target)
        after = self._silence_point(target)
        if after is not None:
            round_.started, round_.after = self._clock(), after
            round_.silence = self._alarms.at(round_.started + after, self._silence_call, round_)
        key = endpoint.key
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        probe = self._start(target, round_)
        if round_.probe is None and not round_.ended:  # not already over (told at once)
            round_.probe = probe

    def _silence_point_reached(self, round_: _Round) -> None:
        round_.silence = None
        if round_.answered or round_.endpoint.round is not round_:
            return
        watcher = self._on_silent(round_.target, round_, round_.started, round_.after)
        round_.watcher = self._alarms.loop().create_task(watcher)

    def _first_done(self, round_: _Round, result: ProbeResult) -> None:
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
            if round_.watcher is None:
                self._round_over(endpoint, round_, (result,))
            else:
                loop = self._alarms.loop()
                endpoint.task = loop.create_task(self._after_confirm(endpoint, round_, result))
        except Exception as exc:
            self._crash(exc)

    async def _after_confirm(self, endpoint: _Endpoint, round_: _Round, first: ProbeResult) -> None:
        try:
            assert round_.watcher is not None
            confirm = await round_.watcher
            round_.watcher = None  # done: not kept with its frame until the next round
            _forget_task(endpoint)
            if self._endpoints.get(endpoint.key) is endpoint:
                results = (first,) if confirm is None else (first, confirm)
                self._round_over(endpoint, round_, results)
        except Exception as exc:
            self._crash(exc)

    def _round_over(
        self, endpoint: _Endpoint, round_: _Round, results: tuple[ProbeResult, ...]
    ) -> None:
        endpoint.round = None
        if endpoint.recheck and _only_slow(results):
            endpoint.due = self._recheck_due(endpoint.key, round_.target)
            endpoint.recheck, endpoint.spaced = False, True
            self.first_slow_rechecks += 1
            self._arm(endpoint)
            return
        endpoint.recheck = False
        self._hand_on(endpoint, round_.target, results, 0)

    def _hand_on(
        self,
        endpoint: _Endpoint,
        target: ProbeTarget,
        results: tuple[ProbeResult, ...],
        first: int,
    ) -> None:
        """``results[first:]`` to ``on_result`` in order, then the next round. An
        awaitable ``on_result`` returns is awaited (in a task) before the next result."""
        for index in range(first, len(results)):
            result = results[index]
            pending = self._on_result(target, result)
            self._remember(endpoint.key, result)
            endpoint.failures = endpoint.failures + 1 if result.outcome in FAILURES else 0
            if pending is not None:
                # Its own task: it runs whole even if the endpoint stops meanwhile (the
                # board changed already: what it publishes must go out).
                published = asyncio.ensure_future(pending, loop=self._alarms.loop())
                awaited = self._await_then(endpoint, target, results, index + 1, published)
                endpoint.task = self._alarms.loop().create_task(awaited)
                return
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

    async def _await_then(
        self,
        endpoint: _Endpoint,
        target: ProbeTarget,
        results: tuple[ProbeResult, ...],
        first: int,
        pending: Awaitable[None],
    ) -> None:
        try:
            await pending
            _forget_task(endpoint)
            if self._endpoints.get(endpoint.key) is endpoint:
                self._hand_on(endpoint, target, results, first)
        except Exception as exc:
            self._crash(exc)

    def _drop(self, endpoint: _Endpoint) -> None:
        """Stop the endpoint: its alarm, its probe in flight (its connection closed), its
        round's tasks (awaited when ``run`` ends)."""
        if endpoint.alarm is not None:
            endpoint.alarm.cancel()
            endpoint.alarm = None
        round_, endpoint.round = endpoint.round, None
        if round_ is not None:
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

    async def _probe_once(self, target: ProbeTarget, probe: ProbeFn) -> ProbeResult:
        self.in_flight[target.key] = self.in_flight.get(target.key, 0) + 1
        try:
            return await probe(target)
        finally:
            if target.key in self.in_flight:
                self.in_flight[target.key] -= 1
