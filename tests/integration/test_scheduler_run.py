"""The scheduler running for real: one probe in flight per endpoint, even phases, confirm
probes after a new failure, clean cancellation.

No assertion depends on how long a fixed sleep really took. With real probes (a sim on
loopback) the test waits for events and checks each probe's recorded start against the
scheduler's own plan (its phase and interval). With fake probes the scheduler runs on an
event loop whose clock jumps from timer to timer (``VirtualTimeLoop``), so every probe
lands exactly where the scheduler put it, however loaded the machine is."""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import selectors
import time
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.inflight import ProbeSlots
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.slots import STARTS_PER_TICK, start_tick
from llm_health.probe.target import ProbeTarget
from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimSettings, running_sim
from tests.polling import wait_until_async
from tests.processes import running_sims
from tests.started import probe_once, started, token_seen


def targets_for(ports: list[int], **probe: object) -> list[ProbeTarget]:
    settings = ProbeSettings.model_validate({"interval": "1s", "model": "sim-model", **probe})
    return [settings.to_target("c", f"127.0.0.1:{port}") for port in ports]


INTERVAL_S = 1.0  # targets_for's interval
EARLY_S = 1e-3  # a timer may fire a hair early; a probe may never start earlier than that
#: How late a real probe may start after its slot: the old fixed 2.5 s window expected a
#: first round plus two slots (the last at most 2.0 s in), i.e. tolerated 0.5 s.
LATE_S = 0.5
#: The scheduler reads its clock a moment after the first result was recorded (and set
#: its origin a moment after ``begun``): that close to a slot, either slot is right.
BOUNDARY_S = 0.05


class _JumpSelector(selectors.DefaultSelector):
    """Never waits for a timer: when nothing is ready, the virtual clock jumps ahead by
    the timeout the loop asked for (the time to its next timer)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0 if timeout is not None else None)
        if not ready and timeout is not None and timeout > 0:
            self.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``asyncio.sleep`` takes no real time and every timer
    fires at exactly its due time. Only for code that sleeps, never for real I/O."""

    def __init__(self) -> None:
        self._jumps = _JumpSelector()
        super().__init__(self._jumps)

    def time(self) -> float:
        return self._jumps.now


def on_virtual_time(main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(main)


@pytest.mark.timed  # real probes may start at most 0.5 s late
async def test_fifty_endpoints_never_overlap_and_are_spread_evenly() -> None:
    fault = FaultSpec.from_json({"fault": "none", "ttft": "30ms", "ttft_jitter": "20ms"})
    async with running_sim(SimSettings(fault=fault, seed=1), port_count=50) as sim:
        # 50 first-round probes at once share one loaded CPU: lenient thresholds keep a
        # 30 ms TTFT "fast" however slowly this process runs (this test is about timing)
        targets = targets_for(list(sim.ports), healthy_ttft="800ms", timeout="900ms")
        in_flight: dict[str, int] = defaultdict(int)
        worst: dict[str, int] = defaultdict(int)
        starts: dict[str, list[float]] = defaultdict(list)  # time.monotonic() of each probe
        first_done: dict[str, float] = {}  # ... when the first result was handed over
        results: dict[str, list[ProbeResult]] = defaultdict(list)
        async with new_connections() as connections:
            prober = MicroProbe(connections)

            async def probe(target: ProbeTarget) -> ProbeResult:
                starts[target.key].append(time.monotonic())
                in_flight[target.key] += 1
                worst[target.key] = max(worst[target.key], in_flight[target.key])
                try:
                    return await probe_once(prober, target)
                finally:
                    in_flight[target.key] -= 1

            def on_result(target: ProbeTarget, result: ProbeResult) -> None:
                first_done.setdefault(target.key, time.monotonic())
                results[target.key].append(result)

            scheduler = Scheduler(targets, started(probe), on_result)
            phase_of = {t.key: scheduler.phase_of(t.key) for t in targets}
            phases = sorted(phase_of.values())
            begun = time.monotonic()  # the scheduler's origin is this or a hair later
            task = asyncio.create_task(scheduler.run())
            # the first round and two slots of every endpoint, however long that takes
            await wait_until_async(
                lambda: len(results) == 50 and all(len(r) >= 3 for r in results.values()),
                30,
                "three results from each of the 50 endpoints",
            )
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in itertools.pairwise(phases)]
    assert len(set(phases)) == 50
    assert all(abs(gap - 1.0 / 50) < 1e-9 for gap in gaps)
    assert max(worst.values()) == 1
    # A compressed first round (warm start) at ~0-50 ms, then the endpoint's own slots
    # begun + phase + k * interval: the first one after its first result, then every
    # slot, one probe each, never early. (This is the old "3 or 4 probes in 2.5 s" as the
    # plan says it, so a first probe slowed down by a loaded machine cannot fail it.)
    for key, times in starts.items():
        phase = phase_of[key]
        _first, *later = (t - begun for t in times)
        slots = [round((t - phase) / INTERVAL_S) for t in later]
        assert slots == list(range(slots[0], slots[0] + len(slots))), (key, later)
        done = first_done[key] - begun
        if abs(done - phase) > BOUNDARY_S:  # else the scheduler's clock read decides
            assert slots[0] == (0 if done < phase else 1), (key, phase, done, later)
        for t, k in zip(later, slots, strict=True):
            assert -EARLY_S <= t - (phase + k * INTERVAL_S) <= LATE_S, (key, phase, later)
    firsts = sorted(r[0].started_at for r in results.values())
    assert firsts[-1] - firsts[0] < 0.3, "first round must not take a whole interval"
    assert all(r.outcome is Outcome.FAST for rs in results.values() for r in rs)
    assert sum(in_flight.values()) == 0  # cancellation left nothing running


def test_failure_is_confirmed_at_once_then_back_to_the_interval() -> None:
    calls: list[float] = []
    (target,) = targets_for([9], confirm_delay="50ms", unhealthy_after=2)

    async def main() -> None:
        clock = asyncio.get_running_loop().time

        async def failing(_target: ProbeTarget) -> ProbeResult:
            calls.append(clock())
            return ProbeResult(Outcome.TIMEOUT, time.time(), detail="fake")

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        task = asyncio.create_task(Scheduler([target], started(failing), ignore, clock=clock).run())
        await asyncio.sleep(2.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # pattern: probe, confirm (~50 ms), next slot (~1 s after the first), no second confirm
    # while the failure streak already reached unhealthy_after.
    assert 0.04 <= gaps[0] <= 0.2, gaps
    assert all(0.7 <= gap <= 1.1 for gap in gaps[1:]), gaps
    assert len(calls) in (3, 4)
    # on virtual time the plan is exact: slot 0, confirm at +50 ms, then slots 1 and 2
    assert [c - calls[0] for c in calls] == pytest.approx([0.0, 0.05, 1.0, 2.0], abs=1e-9)


def test_a_confirming_probe_is_not_moved_to_a_start_tick() -> None:
    """Starts are gathered on ticks (100 ms at 200 endpoints), but a failure's confirmation
    goes out confirm_delay after it, not on the next tick: a tick would only delay it."""
    targets = targets_for(list(range(1, 201)), confirm_delay="50ms", unhealthy_after=3)
    failing_key = targets[7].key
    calls: list[float] = []

    async def main() -> None:
        clock = asyncio.get_running_loop().time

        async def probe(target: ProbeTarget) -> ProbeResult:
            if target.key != failing_key:
                return ProbeResult(Outcome.FAST, time.time(), ttft_ms=20.0)
            calls.append(clock())
            return ProbeResult(Outcome.ERROR, time.time(), detail="fake")

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        task = asyncio.create_task(Scheduler(targets, started(probe), ignore, clock=clock).run())
        await asyncio.sleep(2.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    assert start_tick(len(targets), INTERVAL_S) == pytest.approx(0.1)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # failure, confirm at +50 ms, confirm at +50 ms (unhealthy_after 3), then its slot
    assert gaps[:2] == pytest.approx([0.05, 0.05], abs=1e-9), gaps


def test_update_adds_and_removes_endpoints_while_running() -> None:
    calls: dict[str, int] = defaultdict(int)
    a, b, c = targets_for([1, 2, 3], interval="200ms")
    removed_at = -1
    keys: frozenset[str] = frozenset()

    async def main() -> None:
        nonlocal removed_at, keys

        async def probe(target: ProbeTarget) -> ProbeResult:
            calls[target.key] += 1
            await asyncio.sleep(0.01)
            return ProbeResult(Outcome.FAST, time.time(), ttft_ms=10)

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        clock = asyncio.get_running_loop().time
        scheduler = Scheduler([a, b], started(probe), ignore, clock=clock)
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(0.5)
        scheduler.update([a, c])  # b removed, c added
        removed_at = calls[b.key]
        await asyncio.sleep(0.6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        keys = scheduler.keys

    on_virtual_time(main())
    assert calls[b.key] == removed_at, "a removed endpoint must not be probed again"
    assert calls[c.key] >= 3, "a new endpoint starts probing at once, then every interval"
    assert calls[a.key] >= 5
    assert keys == {a.key, c.key}


def _silence_run(
    probe_s: list[float], overlap: bool, **settings: object
) -> tuple[list[tuple[str, float]], list[tuple[float, float]], int]:
    """Run one endpoint on virtual time for 2.5 s. The i-th probe takes ``probe_s[i]``
    seconds (then TIMEOUT if it is longer than the timeout, else FAST). Returns the probe
    starts (kind, at), the silences reported (at, silent ms) and the most probes that
    were ever in flight at once."""
    (target,) = targets_for([9], timeout="800ms", healthy_ttft="200ms", **settings)
    starts: list[tuple[str, float]] = []
    silences: list[tuple[float, float]] = []
    in_flight, worst = 0, 0

    async def main() -> None:
        clock = asyncio.get_running_loop().time
        durations = iter(probe_s)

        def probing(kind: str) -> Any:
            async def probe(_target: ProbeTarget) -> ProbeResult:
                nonlocal in_flight, worst
                starts.append((kind, clock()))
                in_flight += 1
                worst = max(worst, in_flight)
                took = next(durations, 0.05)
                try:
                    await asyncio.sleep(min(took, 0.8))
                finally:
                    in_flight -= 1
                if took > 0.8:
                    return ProbeResult(Outcome.TIMEOUT, time.time())
                return ProbeResult(Outcome.FAST, time.time(), ttft_ms=took * 1000)

            return probe

        async def on_silence(_target: ProbeTarget, silent_ms: float) -> bool:
            silences.append((clock(), silent_ms))
            return overlap

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        scheduler = Scheduler(
            [target],
            started(probing("probe")),
            ignore,
            clock=clock,
            on_silence=on_silence,
            confirm=started(probing("confirm")),
        )
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(2.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    return starts, silences, worst


def test_a_silent_probe_is_reported_at_healthy_ttft_and_confirmed_beside_it() -> None:
    # probe 0 hangs (TIMEOUT at 0.8 s): silent at healthy_ttft (0.2 s + 10 ms), still silent at
    # the confirm point (2 x healthy_ttft), so the confirm starts then and hangs too
    starts, silences, worst = _silence_run([5.0, 5.0], overlap=True)
    first = starts[0][1]
    assert silences[0] == pytest.approx((first + 0.21, 210.0))  # healthy_ttft + margin
    assert starts[1] == ("confirm", pytest.approx(first + 0.4))
    assert worst == 2  # the silent probe and its confirm: never more
    # both failed: unhealthy_after reached, so no confirm_delay probe; back to the
    # endpoint's own slots, the first one after the confirm ended (at 1.2 s)
    assert starts[2] == ("probe", pytest.approx(first + 2.0))


def test_a_jittery_answer_after_the_silence_point_gets_no_second_probe() -> None:
    """Silent at 0.2 s (reported: the endpoint is degraded) but answered at 0.3 s, before
    the confirm point: a slow-but-fine engine is never probed twice at once."""
    starts, silences, worst = _silence_run([0.3, 0.3, 0.3], overlap=True)
    assert len(silences) == 3 and worst == 1
    assert all(kind == "probe" for kind, _ in starts)


def test_fast_probes_are_never_silent_and_never_overlap() -> None:
    starts, silences, worst = _silence_run([0.05] * 10, overlap=True)
    assert silences == [] and worst == 1
    assert [kind for kind, _ in starts] == ["probe"] * len(starts)


def test_a_probe_that_ends_without_a_token_does_not_wait_for_the_silence_point() -> None:
    """An error answered at once (no first token ever comes) ends the silence wait: the
    next probe keeps its slot (100 ms apart here, less than healthy_ttft)."""
    starts, silences, _ = _silence_run([0.01] * 40, overlap=True, interval="100ms")
    assert silences == []
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(starts)]
    assert len(starts) >= 20 and gaps == pytest.approx([0.1] * len(gaps), abs=1e-6), gaps


def test_no_confirm_unless_the_board_asks_for_one() -> None:
    starts, silences, worst = _silence_run([0.45, 0.05, 0.05], overlap=False)
    assert len(silences) == 1 and worst == 1
    assert all(kind == "probe" for kind, _ in starts)


def test_silence_can_be_switched_off() -> None:
    starts, silences, worst = _silence_run([5.0, 5.0], overlap=True, act_on_silence=False)
    assert silences == [] and worst == 1
    # the old way: TIMEOUT at 0.8 s, then the confirm 50 ms after it
    assert starts[1] == ("probe", pytest.approx(starts[0][1] + 0.85))


@pytest.mark.parametrize(
    "outcomes,delivered",
    [
        # A SLOW first probe is taken again, and only the second result counts.
        ([Outcome.SLOW, Outcome.FAST, Outcome.FAST], [Outcome.FAST, Outcome.FAST]),
        # Slow again: that one is handed on (a really slow engine is DEGRADED at once).
        ([Outcome.SLOW, Outcome.SLOW, Outcome.FAST], [Outcome.SLOW, Outcome.FAST]),
        # Only the first round, and only SLOW: a later SLOW or a first failure counts.
        ([Outcome.FAST, Outcome.SLOW, Outcome.SLOW], [Outcome.FAST, Outcome.SLOW, Outcome.SLOW]),
        ([Outcome.TIMEOUT, Outcome.FAST], [Outcome.TIMEOUT, Outcome.FAST]),
    ],
)
def test_a_slow_first_probe_is_rechecked_once_before_it_counts(
    outcomes: list[Outcome], delivered: list[Outcome]
) -> None:
    (target,) = targets_for([9], interval="1s", unhealthy_after=3)
    calls: list[float] = []
    seen: list[Outcome] = []
    rechecks: list[int] = []

    async def main() -> None:
        clock = asyncio.get_running_loop().time
        queue = iter(outcomes)

        async def scripted(_target: ProbeTarget) -> ProbeResult:
            calls.append(clock())
            outcome = next(queue, None)
            if outcome is None:
                await asyncio.sleep(3600)  # the script is over: stay in flight
            assert outcome is not None
            ttft = 10.0 if outcome in (Outcome.FAST, Outcome.SLOW) else None
            return ProbeResult(outcome, time.time(), ttft_ms=ttft)

        def record(_target: ProbeTarget, result: ProbeResult) -> None:
            seen.append(result.outcome)

        scheduler = Scheduler([target], started(scripted), record, clock=clock)
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(len(outcomes) + 1.5)
        rechecks.append(scheduler.first_slow_rechecks)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    assert seen == delivered
    assert rechecks == [len(outcomes) - len(delivered)]
    assert len(calls) == len(outcomes) + 1  # every scripted probe ran, then one in flight


@pytest.mark.parametrize("turns,silent", [(2, False), (12, True)])
def test_a_token_already_in_the_loop_at_the_silence_point_is_not_silence(
    turns: int, silent: bool
) -> None:
    """On a busy loop the silence timer can fire while the first token is on its way
    through the loop (socket, read, parse: a few turns). A token that lands within
    SETTLE_TURNS turns of the silence point is no silence; one that needs many more is."""

    (target,) = targets_for([9], timeout="800ms", healthy_ttft="200ms")
    silences: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time

        async def probe(_target: ProbeTarget) -> ProbeResult:
            await asyncio.sleep(0.21)  # the silence point: healthy_ttft + the margin
            for _ in range(turns):  # the token's way through the loop
                await asyncio.sleep(0)
            token_seen()
            await asyncio.sleep(0.05)
            return ProbeResult(Outcome.FAST, time.time(), ttft_ms=210.0)

        async def on_silence(_target: ProbeTarget, silent_ms: float) -> bool:
            silences.append(silent_ms)
            return False

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        scheduler = Scheduler([target], started(probe), ignore, clock=clock, on_silence=on_silence)
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    assert bool(silences) is silent, silences


def test_starts_are_gathered_on_ticks_each_within_a_tick_of_its_slot() -> None:
    """200 endpoints every second: probes 5 ms apart would wake the prober 200 times a
    second just to start them; gathered on 100 ms ticks (start_tick: at its bound), each
    starts at most one tick after its own slot, never before it, and the first round keeps
    its spacing."""
    targets = targets_for(list(range(1, 201)))
    tick = start_tick(len(targets), INTERVAL_S)
    assert tick == pytest.approx(0.1)
    starts: dict[str, list[float]] = defaultdict(list)
    plan: dict[str, float] = {}

    async def main() -> None:
        clock = asyncio.get_running_loop().time

        async def probe(target: ProbeTarget) -> ProbeResult:
            starts[target.key].append(clock())
            await asyncio.sleep(0.02)
            return ProbeResult(Outcome.FAST, time.time(), ttft_ms=20.0)

        def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        scheduler = Scheduler(targets, started(probe), ignore, clock=clock)
        plan.update({t.key: scheduler.phase_of(t.key) for t in targets})
        plan["origin"] = clock()
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(3.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    origin = plan["origin"]
    firsts = sorted(times[0] - origin for times in starts.values())
    assert len(set(firsts)) == len(targets)  # the first round: each at its own instant
    later = [(key, t - origin) for key, times in starts.items() for t in times[1:]]
    assert len(later) >= 2 * len(targets)
    for key, at in later:
        slot = plan[key] + math.floor(at - plan[key] + 1e-9)  # the slot it belongs to
        assert -1e-9 <= at - slot < tick + 1e-9, (key, at, slot)
        assert abs(at / tick - round(at / tick)) < 1e-6, (key, at)  # on a tick
    instants = {round(at, 6) for _, at in later}
    assert len(instants) <= len(later) / (STARTS_PER_TICK / 2)  # gathered, not one each


class EarlySilenceTimerLoop(VirtualTimeLoop):
    """Fires the scheduler's alarms' loop timer (``Alarms._fire``: its slots and silence
    points share it) 30 ms early by the scheduler's clock, as a timer kept to the loop's
    own resolution or another clock can: the watch must not take the timer's word for
    the silence point."""

    early = 0

    def call_later(self, delay: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(callback, "__name__", "") == "_fire" and delay > 0.03:
            delay -= 0.03
            self.early += 1
        return super().call_later(delay, callback, *args, **kwargs)


def test_a_silence_timer_that_fires_early_still_waits_for_the_silence_point() -> None:
    """The token comes at 200 ms, before the 210 ms silence point; the timer fires at
    180 ms. The watch waits out the rest instead of calling the probe silent then."""
    (target,) = targets_for([9], timeout="800ms", healthy_ttft="200ms")
    silences: list[float] = []
    results: list[ProbeResult] = []

    async def main() -> None:
        clock = asyncio.get_running_loop().time

        async def probe(_target: ProbeTarget) -> ProbeResult:
            await asyncio.sleep(0.2)
            token_seen()
            return ProbeResult(Outcome.FAST, time.time(), ttft_ms=200.0)

        async def on_silence(_target: ProbeTarget, silent_ms: float) -> bool:
            silences.append(silent_ms)
            return False

        def record(_target: ProbeTarget, result: ProbeResult) -> None:
            results.append(result)

        scheduler = Scheduler([target], started(probe), record, clock=clock, on_silence=on_silence)
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with asyncio.Runner(loop_factory=EarlySilenceTimerLoop) as runner:
        runner.run(main())
        fired_early = runner.get_loop().early  # type: ignore[attr-defined]
    assert fired_early > 0  # the silence point's timer among them
    assert results and silences == [], silences


async def test_scheduled_probes_leave_nothing_for_the_collector(tmp_path: Path) -> None:
    """A scheduled probe is a round, its slot and its exchange, each referring to the
    next: once it is over, no cycle may be left among them, or every probe would leave
    garbage for the collector (whose pauses are the prober's lateness: docs/design.md
    §16.4). The simulators run in processes of their own: the collector counts only the
    prober's garbage (an in-process server leaves some of its own when a client goes).
    A lenient ``healthy_ttft`` keeps a 5 ms TTFT FAST on a loaded machine; a window in
    which a probe was not FAST all the same (a stall of the test's host) measured another
    path, and the next window is taken, three at most."""
    windows, per_window = 3, 50
    with running_sims(tmp_path, "collector-", 3, "--ttft", "5ms") as sims:
        ports = [sim.port for sim in sims]
        targets = targets_for(ports, interval="100ms", healthy_ttft="800ms", timeout="900ms")
        results: list[ProbeResult] = []
        measured: list[tuple[int, list[str]]] = []  # per window: objects left, outcomes
        async with new_connections() as connections:
            prober = MicroProbe(connections)
            slots = ProbeSlots(prober.start_probe)

            def on_result(_target: ProbeTarget, result: ProbeResult) -> None:
                results.append(result)

            scheduler = Scheduler(targets, slots.start, on_result)
            task = asyncio.create_task(scheduler.run())
            try:
                await wait_until_async(lambda: len(results) >= 20, 10, "the first probes")
                while len(measured) < windows and not clean(measured):
                    gc.collect()
                    gc.disable()
                    before = len(results)
                    await results_reach(results, before + per_window)
                    left = gc.collect()
                    gc.enable()
                    outcomes = {r.outcome.value for r in results[before:]}
                    measured.append((left, sorted(outcomes)))
            finally:
                gc.enable()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert clean(measured), f"no window of {per_window} FAST probes: {measured}"
    left = measured[-1][0]
    assert left == 0, f"{left} objects in cycles after {per_window} probes"


async def results_reach(results: list[ProbeResult], count: int) -> None:
    await wait_until_async(lambda: len(results) >= count, 10, f"{count} probe results")


def clean(measured: list[tuple[int, list[str]]]) -> bool:
    """The last window's probes were all FAST."""
    return bool(measured) and measured[-1][1] == [Outcome.FAST.value]


def test_a_round_keeps_no_finished_task_until_the_next_one() -> None:
    """What a round awaited in a task of its own (a silent probe's watch and its
    confirmation) is let go once done: kept until the endpoint's next one, a finished
    task with its coroutine and context cost 1-2 KiB an endpoint (found at 2,000)."""
    targets = targets_for([9, 10, 11], healthy_ttft="100ms")
    held: list[int] = []

    async def main() -> None:
        clock = asyncio.get_running_loop().time
        slow = itertools.cycle([0.3, 0.05, 0.05])  # every third probe falls silent

        async def probe(_target: ProbeTarget) -> ProbeResult:
            took = next(slow)
            await asyncio.sleep(took)
            return ProbeResult(Outcome.FAST, time.time(), ttft_ms=took * 1000)

        def publish(_target: ProbeTarget, _result: ProbeResult) -> None:
            return None

        async def on_silence(_target: ProbeTarget, _silent_ms: float) -> bool:
            return True

        scheduler = Scheduler(
            targets,
            started(probe),
            publish,
            clock=clock,
            on_silence=on_silence,
            confirm=started(probe),
        )
        task = asyncio.create_task(scheduler.run())
        for _ in range(12):
            await asyncio.sleep(0.45)
            endpoints = scheduler._endpoints.values()
            tasks = [e.task for e in endpoints] + [
                e.round.watcher for e in endpoints if e.round is not None
            ]
            held.append(sum(1 for t in tasks if t is not None and t.done()))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    on_virtual_time(main())
    assert held == [0] * 12
