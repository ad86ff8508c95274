"""Probe workers (``server.probe_workers``, docs/design.md §16.2): the micro-probe in child
processes, verdicts in the runtime. Three simulators in their own processes; the runtime
with two workers must give the same verdicts as in-process probing: a hang after headers
is silent (DEGRADED at the silence point, the overlapping confirmation, UNHEALTHY), a
garbage answer of a known-answer probe is caught, a healthy endpoint stays HEALTHY; a
killed worker is replaced without a false verdict; no worker outlives the runtime."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from llm_health.app.runtime import Runtime
from llm_health.config import ProbeSettings
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import State
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.pool import WorkerPool
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running, runtime_for

pytestmark = pytest.mark.sims(3, "--ttft", "20ms", prefix="w")
PROBE = {
    "interval": "300ms",
    "timeout": "800ms",
    "healthy_ttft": "200ms",
    "healthy_after": 2,
    "verify": {"every": "2s"},
}


WORKERS: dict[str, Any] = {
    "cluster_keys": {"model": "sim-model"},
    "server": {"probe_workers": 2},
    "probe": PROBE,
}


def state_of(runtime: Runtime, sim: SimProcess) -> Any:
    return runtime.control.snapshot().endpoint("llama", sim.address)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is not alive
        return handle.read().split(") ")[1][0] != "Z"


async def until(runtime: Runtime, sim: SimProcess, state: State, within: float) -> Any:
    await wait_until_async(
        lambda: state_of(runtime, sim).state is state, within, f"{sim.address} {state.value}"
    )
    return state_of(runtime, sim)


@pytest.mark.timed  # a hang out within interval + two timeouts: timed
async def test_workers_give_the_same_verdicts(sims: list[SimProcess]) -> None:
    runtime = runtime_for(sims, "workers.yaml", **WORKERS)
    changes: list[tuple[str, str, str]] = []
    runtime.control.on_transition(
        lambda _c, a, t, _r: (
            changes.append((a, t.after.state.value, t.cause.value)) if t.changed else None
        )
    )
    pids: list[int] = []
    async with Running(runtime):
        for sim in sims:
            await until(runtime, sim, State.HEALTHY, 10)
        changes.clear()
        assert runtime.workers is not None
        pids = runtime.workers.pids
        assert len(pids) == 2 and os.getpid() not in pids and all(alive(p) for p in pids)
        hang, garbage, fine = sims
        await asyncio.to_thread(hang.set_fault, fault="hang_after_headers")
        await asyncio.to_thread(garbage.set_fault, fault="garbage_tokens")
        started = time.monotonic()
        out = await until(runtime, hang, State.UNHEALTHY, 5)
        took = time.monotonic() - started
        assert took < 0.3 + 2 * 0.8 + 0.5, took  # interval + about two timeouts at most
        bad = await until(runtime, garbage, State.UNHEALTHY, 2 + 3)
        assert bad.cause is Cause.GARBAGE, bad
        assert out.last is not None and out.last.ttft_ms is None
        # The hang was seen in flight (the worker's first-token notice never came).
        hung = [c for c in changes if c[0] == hang.address]
        assert hung[0][1:] == ("degraded", Cause.SILENT.value), hung
        assert runtime.stats.overlapping_confirms >= 1
        assert state_of(runtime, fine).state is State.HEALTHY
        assert all(c[0] != fine.address for c in changes)
    assert pids and not any(alive(p) for p in pids), "a worker outlived the runtime"


async def test_a_killed_worker_is_replaced_without_a_verdict(sims: list[SimProcess]) -> None:
    runtime = runtime_for(sims, "workers.yaml", **WORKERS)
    changes: list[str] = []
    runtime.control.on_transition(
        lambda _c, a, t, _r: (
            changes.append(f"{a} {t.after.state.value} {t.cause.value} {t.after.reason}")
            if t.changed
            else None
        )
    )
    async with Running(runtime):
        for sim in sims:
            await until(runtime, sim, State.HEALTHY, 10)
        changes.clear()
        assert runtime.workers is not None
        victim = runtime.workers.pids[0]
        probes_before = runtime.stats.probes_total
        os.kill(victim, signal.SIGKILL)
        await wait_until_async(
            lambda: runtime.workers is not None and runtime.workers.restarts_total == 1,
            5,
            "the worker to be started again",
        )
        # Probing goes on (12 probes: 3 endpoints for 4 intervals of 300 ms, longer than a
        # lost probe's timeout) and no probe lost with the worker became a verdict.
        await wait_until_async(
            lambda: runtime.stats.probes_total - probes_before >= 12, 10, "12 more probes"
        )
        assert runtime.workers.pids[0] != victim and alive(runtime.workers.pids[0])
        assert changes == [], changes


class Told:
    """A started probe's receiver (``probe.signals.ProbeReceiver``): what it was told."""

    def __init__(self) -> None:
        self.news: list[object] = []

    def set(self) -> None:
        self.news.append("token")

    def done(self, result: ProbeResult) -> None:
        self.news.append(result.outcome)

    def failed(self, error: Exception) -> None:
        self.news.append(error)


async def test_a_probe_started_in_a_worker_tells_its_receiver(sims: list[SimProcess]) -> None:
    """The pool's started contract: the worker's first token, then its result, to the
    receiver; a probe cancelled at once tells it nothing, in the worker's time or ever."""
    settings = ProbeSettings.model_validate({"model": "sim-model", "timeout": "800ms"})
    target = settings.to_target("c", sims[0].address)
    async with new_connections() as connections:
        pool = WorkerPool(1, fallback=MicroProbe(connections))
        await pool.start()
        try:
            told = Told()
            pool.start_probe(target, told)
            await wait_until_async(lambda: len(told.news) == 2, 5, "the probe's result")
            assert told.news == ["token", Outcome.FAST]
            cancelled = Told()
            pool.start_probe(target, cancelled).cancel()
            finished = Told()
            pool.start_probe(target, finished)  # after the cancel, on the same worker
            await wait_until_async(lambda: len(finished.news) == 2, 5, "the next result")
            await asyncio.sleep(2 * target.timeout_s)
            assert cancelled.news == []
        finally:
            await pool.close()
