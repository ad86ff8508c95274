"""The scheduler that starts probes without a task against the one it replaced
(``scheduler_before.SchedulerBefore``, one task per endpoint): on virtual time, with the
same scripted probes (fast, slow, silent, hung, failing), silences the board may or may
not confirm, slots real traffic lets go, and a reload half-way, every endpoint sees the
same probes start, the same silences reported and the same results handed on, at the
same instants, in the same order."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Any

import pytest

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.target import ProbeTarget
from tests.integration.test_scheduler_run import VirtualTimeLoop
from tests.started import started, token_seen
from tests.unit.probe.scheduler_before import SchedulerBefore

RUN_S = 14.0
RELOAD_AT_S = 6.3

# A probe's behaviour: (seconds to the first token or None, seconds after it, outcome).
BEHAVIOURS: list[tuple[float | None, float, Outcome]] = [
    (0.02, 0.003, Outcome.FAST),
    (0.02, 0.003, Outcome.FAST),
    (0.02, 0.003, Outcome.FAST),
    (0.30, 0.01, Outcome.SLOW),
    (0.45, 0.01, Outcome.SLOW),  # silent at the silence point, then a token
    (None, 0.8, Outcome.TIMEOUT),  # hung
    (None, 0.004, Outcome.ERROR),  # refused
]


def targets(**probe: Any) -> list[ProbeTarget]:
    plain = ProbeSettings.model_validate({"interval": "1s", "model": "m", **probe})
    varied = ProbeSettings.model_validate(
        {"interval": "500ms", "unhealthy_after": 3, "silence_degrade": 3, "model": "m", **probe}
    )
    quiet = ProbeSettings.model_validate({"interval": "1s", "act_on_silence": False, "model": "m"})
    made = [plain.to_target("a", f"10.0.0.{i}:8000") for i in range(1, 9)]
    made += [varied.to_target("b", f"10.0.1.{i}:8000") for i in range(1, 5)]
    made += [quiet.to_target("c", f"10.0.2.{i}:8000") for i in range(1, 3)]
    return made


def run(kind: type[Any], seed: int) -> dict[str, list[tuple[Any, ...]]]:
    """What every endpoint saw under scheduler ``kind``, with the script of ``seed``."""
    seen: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    calls: dict[str, int] = defaultdict(int)
    asked: dict[str, int] = defaultdict(int)

    def chance(key: str, what: str, count: int) -> random.Random:
        return random.Random(f"{seed}/{key}/{what}/{count}")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time

        def note(key: str, *event: Any) -> None:
            seen[key].append((round(clock(), 6), *event))

        async def probe(target: ProbeTarget) -> ProbeResult:
            count = calls[target.key]
            calls[target.key] += 1
            note(target.key, "start", count)
            first, after, outcome = chance(target.key, "probe", count).choice(BEHAVIOURS)
            ttft = None
            if first is not None:
                await asyncio.sleep(first)
                token_seen()
                ttft = first * 1000
            await asyncio.sleep(after)
            return ProbeResult(outcome, time.time(), ttft_ms=ttft)

        def on_result(target: ProbeTarget, result: ProbeResult) -> None:
            note(target.key, "result", result.outcome.value)

        async def on_result_awaited(target: ProbeTarget, result: ProbeResult) -> None:
            on_result(target, result)  # the scheduler before awaited every result

        async def on_silence(target: ProbeTarget, silent_ms: float) -> bool:
            note(target.key, "silent", round(silent_ms, 3))
            return chance(target.key, "confirm", len(seen[target.key])).random() < 0.7

        def skip(target: ProbeTarget) -> bool:
            count = asked[target.key]
            asked[target.key] += 1
            skipped = chance(target.key, "skip", count).random() < 0.1
            if skipped:
                note(target.key, "skipped")
            return skipped

        class NoLag:
            current_ms = 0.0

        first = targets()
        fake = started(probe) if kind is Scheduler else probe
        scheduler = kind(
            first,
            fake,
            on_result if kind is Scheduler else on_result_awaited,
            clock,
            on_silence=on_silence,
            confirm=fake,
            lag=NoLag(),
            skip=skip,
        )
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(RELOAD_AT_S)
        # A reload: one endpoint gone, one with other settings, one new.
        changed = ProbeSettings.model_validate({"interval": "1s", "healthy_ttft": "350ms"})
        kept = [t for t in first if t.address not in ("10.0.0.1:8000", "10.0.0.7:8000")]
        added = [changed.to_target("a", "10.0.0.1:8000"), changed.to_target("a", "10.0.3.1:8000")]
        scheduler.update(kept + added)
        await asyncio.sleep(RUN_S - RELOAD_AT_S)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(main())
    # Up to the instant of the cancel: what lands on that instant itself (a result
    # handed on as the run is cancelled) depends on which callback the loop ran first.
    return {key: [e for e in events if e[0] < RUN_S] for key, events in seen.items()}


@pytest.mark.parametrize("seed", range(6))
def test_every_endpoint_sees_what_the_task_per_endpoint_scheduler_gave(seed: int) -> None:
    before, now = run(SchedulerBefore, seed), run(Scheduler, seed)
    assert sum(len(events) for events in now.values()) > 200  # the script ran
    kinds = {event[1] for events in now.values() for event in events}
    assert {"start", "result", "silent", "skipped"} <= kinds  # ... and met every case
    assert now.keys() == before.keys()
    for key in before:
        assert now[key] == before[key], key
