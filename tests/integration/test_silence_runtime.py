"""In-flight silence through the real runtime, against a simulator in its own process
(docs/design.md §3.2): a hang degrades an endpoint when its probe passes healthy_ttft and
takes it out about one timeout later (the confirming probe overlaps the silent one); a
late token that still counts FAST restores it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from llm_health.app.runtime import Runtime
from llm_health.model.causes import Cause
from llm_health.model.machine import Transition
from llm_health.model.outcome import ProbeResult
from llm_health.model.states import State
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running, runtime_for

# timed: the silent endpoint must be out 0.8-1.3 s after it went silent.
pytestmark = [pytest.mark.sim_args("--ttft", "30ms"), pytest.mark.timed]
PROBE = {"interval": "1s", "timeout": "800ms", "healthy_ttft": "200ms", "model": "sim-model"}


class Recorder:
    """State changes (with when) and probe results as the board control reports them."""

    def __init__(self, runtime: Runtime) -> None:
        self.changes: list[tuple[float, Transition]] = []
        self.results: list[ProbeResult] = []
        self.most_in_flight = 0
        runtime.control.on_transition(self.on_transition)
        runtime.control.on_probe(lambda _c, _a, result: self.results.append(result))

    def on_transition(self, _c: str, _a: str, t: Transition, _r: ProbeResult | None) -> None:
        if t.changed:
            self.changes.append((time.monotonic(), t))

    def states(self) -> list[tuple[State, Cause]]:
        return [(t.to_state, t.cause) for _, t in self.changes]


async def run_until(
    runtime: Runtime, recorder: Recorder, done: Callable[[], Awaitable[bool]], what: str
) -> None:
    """Run the runtime until ``done()``; watch how many probes are ever in flight."""

    async def watch_in_flight() -> None:
        while True:
            if runtime.scheduler is not None:
                most = max(runtime.scheduler.in_flight.values(), default=0)
                recorder.most_in_flight = max(recorder.most_in_flight, most)
            await asyncio.sleep(0.005)

    async with Running(runtime):
        watcher = asyncio.create_task(watch_in_flight())
        try:
            await wait_until_async(done, 20, what)
        finally:
            watcher.cancel()


class Once:
    """Inject a fault once, when ``ready()`` first holds (off the loop: it is HTTP)."""

    def __init__(self, sim: SimProcess, **fault: str) -> None:
        self.sim, self.fault, self.done = sim, fault, False

    async def __call__(self, ready: bool) -> None:
        if ready and not self.done:
            self.done = True
            await asyncio.to_thread(self.sim.set_fault, **self.fault)


async def test_a_hang_degrades_at_silence_and_is_out_one_timeout_later(
    sim_process: SimProcess,
) -> None:
    runtime = runtime_for([sim_process], "silence.yaml", probe=PROBE)
    recorder = Recorder(runtime)
    hang = Once(sim_process, fault="hang_after_headers")

    async def out() -> bool:
        await hang(bool(recorder.states()) and recorder.states()[-1][0] is State.HEALTHY)
        return any(state is State.UNHEALTHY for state, _ in recorder.states())

    await run_until(runtime, recorder, out, "the hung endpoint to be taken out")
    states = recorder.states()
    assert states[:3] == [
        (State.HEALTHY, Cause.STARTUP),
        (State.DEGRADED, Cause.SILENT),
        (State.UNHEALTHY, Cause.TIMEOUT),
    ], states
    (silent_at, silent), (out_at, _) = recorder.changes[1], recorder.changes[2]
    assert silent.after.reason.startswith("silent for 2"), silent.after.reason
    # The confirming probe started beside the silent one at the confirm point (0.4 s)
    # and timed out one timeout (0.8 s) later: 1.0 s after the silence. The old way, a
    # confirm after the first timeout, took 0.8 - 0.2 + 0.05 + 0.8 = 1.45 s from there.
    assert runtime.stats.overlapping_confirms == 1
    assert 0.8 <= out_at - silent_at <= 1.3, out_at - silent_at
    assert recorder.most_in_flight == 2


async def test_a_late_token_that_counts_fast_restores_the_endpoint(sim_process: SimProcess) -> None:
    """silence_degrade 2: silent at twice the recent TTFT (30 ms -> 60 ms); a token at
    150 ms is late for that but FAST by healthy_ttft: the early verdict is undone."""
    runtime = runtime_for([sim_process], "silence.yaml", probe={**PROBE, "silence_degrade": 2})
    recorder = Recorder(runtime)
    slower = Once(sim_process, fault="none", ttft="150ms")

    async def restored() -> bool:
        await slower(len(recorder.results) >= 4)  # a recent TTFT of ~30 ms is known
        return (State.HEALTHY, Cause.RECOVERED) in recorder.states()

    await run_until(runtime, recorder, restored, "a silenced endpoint restored by its token")
    states = recorder.states()
    silent = states.index((State.DEGRADED, Cause.SILENT))
    assert states[silent + 1] == (State.HEALTHY, Cause.RECOVERED), states
    assert recorder.most_in_flight <= 2
