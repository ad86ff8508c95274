"""The scheduler running for real: one probe in flight per endpoint, even phases, confirm
probes after a new failure, clean cancellation."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.client import MicroProbe, new_session
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.target import ProbeTarget, target_for
from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimSettings, running_sim


def targets_for(ports: list[int], **probe: object) -> list[ProbeTarget]:
    settings = ProbeSettings.model_validate({"interval": "1s", "model": "sim-model", **probe})
    return [target_for("c", f"127.0.0.1:{port}", settings) for port in ports]


async def test_fifty_endpoints_never_overlap_and_are_spread_evenly() -> None:
    fault = FaultSpec.from_json({"fault": "none", "ttft": "30ms", "ttft_jitter": "20ms"})
    async with running_sim(SimSettings(fault=fault, seed=1), port_count=50) as sim:
        targets = targets_for(list(sim.ports))
        in_flight: dict[str, int] = defaultdict(int)
        worst: dict[str, int] = defaultdict(int)
        results: dict[str, list[ProbeResult]] = defaultdict(list)
        async with new_session() as session:
            prober = MicroProbe(session)

            async def probe(target: ProbeTarget) -> ProbeResult:
                in_flight[target.key] += 1
                worst[target.key] = max(worst[target.key], in_flight[target.key])
                try:
                    return await prober.probe(target)
                finally:
                    in_flight[target.key] -= 1

            async def on_result(target: ProbeTarget, result: ProbeResult) -> None:
                results[target.key].append(result)

            scheduler = Scheduler(targets, probe, on_result)
            phases = sorted(scheduler.phase_of(t.key) for t in targets)
            task = asyncio.create_task(scheduler.run())
            await asyncio.sleep(2.5)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in itertools.pairwise(phases)]
    assert len(set(phases)) == 50
    assert all(abs(gap - 1.0 / 50) < 1e-9 for gap in gaps)
    assert max(worst.values()) == 1
    # a compressed first round (warm start) at ~0-50 ms, then the endpoint's own slots
    counts = {k: len(v) for k, v in results.items()}
    assert all(3 <= n <= 4 for n in counts.values()), counts
    firsts = sorted(r[0].started_at for r in results.values())
    assert firsts[-1] - firsts[0] < 0.3, "first round must not take a whole interval"
    assert all(r.outcome is Outcome.FAST for rs in results.values() for r in rs)
    assert sum(in_flight.values()) == 0  # cancellation left nothing running


async def test_failure_is_confirmed_at_once_then_back_to_the_interval() -> None:
    calls: list[float] = []
    (target,) = targets_for([9], confirm_delay="50ms", unhealthy_after=2)

    async def failing(_target: ProbeTarget) -> ProbeResult:
        calls.append(time.monotonic())
        return ProbeResult(Outcome.TIMEOUT, time.time(), detail="fake")

    async def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
        return None

    task = asyncio.create_task(Scheduler([target], failing, ignore).run())
    await asyncio.sleep(2.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # pattern: probe, confirm (~50 ms), next slot (~1 s after the first), no second confirm
    # while the failure streak already reached unhealthy_after.
    assert 0.04 <= gaps[0] <= 0.2, gaps
    assert all(0.7 <= gap <= 1.1 for gap in gaps[1:]), gaps
    assert len(calls) in (3, 4)


async def test_update_adds_and_removes_endpoints_while_running() -> None:
    calls: dict[str, int] = defaultdict(int)
    a, b, c = targets_for([1, 2, 3], interval="200ms")

    async def probe(target: ProbeTarget) -> ProbeResult:
        calls[target.key] += 1
        await asyncio.sleep(0.01)
        return ProbeResult(Outcome.FAST, time.time(), ttft_ms=10)

    async def ignore(_target: ProbeTarget, _result: ProbeResult) -> None:
        return None

    scheduler = Scheduler([a, b], probe, ignore)
    task = asyncio.create_task(scheduler.run())
    await asyncio.sleep(0.5)
    scheduler.update([a, c])  # b removed, c added
    removed_at = calls[b.key]
    await asyncio.sleep(0.6)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls[b.key] == removed_at, "a removed endpoint must not be probed again"
    assert calls[c.key] >= 3, "a new endpoint starts probing at once, then every interval"
    assert calls[a.key] >= 5
    assert scheduler.keys == {a.key, c.key}
