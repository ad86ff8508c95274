"""Engine checks through the real runtime against three simulators in their own processes
(docs/design.md §14): known-answer probes (garbage, expect, consensus), the served-model
check, saturation from the engine's /metrics, engine detection for the request body."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from llm_health.app.runtime import Runtime
from llm_health.model.causes import Cause
from llm_health.model.states import State
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running as RunningRuntime
from tests.runtime import runtime_for

# The module's three simulators, each as it came up before every test (faults undone).
SIM_ARGS = ("--ttft", "20ms")
SHARED: dict[str, Any] = {"prefix": "engine", "per_module": True, "reset": True}
pytestmark = pytest.mark.sims(3, *SIM_ARGS, **SHARED)


def engine_settings(every: str = "3s", expect: str | None = None) -> dict[str, Any]:
    """The module's settings: the engine checks every ``every``, known answer ``expect``."""
    probe = {
        "interval": "500ms",
        "timeout": "800ms",
        "healthy_ttft": "200ms",
        "healthy_after": 2,
        "verify": {"every": every, "expect": expect},
        "engine_metrics": {"interval": "300ms"},
    }
    return {"cluster_keys": {"model": "sim-model"}, "probe": probe}


def endpoint(runtime: Runtime, sim: SimProcess) -> Any:
    return runtime.control.snapshot().endpoint("llama", sim.address)


class Running(RunningRuntime):
    """The runtime running in a task for the length of a ``with`` block."""

    async def wait_state(
        self, sim: SimProcess, state: State, within: float, cause: Cause | None = None
    ) -> Any:
        def reached() -> bool:
            found = endpoint(self.runtime, sim)
            return found.state is state and (cause is None or found.cause is cause)

        await wait_until_async(reached, within, f"{sim.address} {state.value} ({cause})")
        return endpoint(self.runtime, sim)

    async def all_healthy(self, sims: list[SimProcess]) -> None:
        for sim in sims:
            await self.wait_state(sim, State.HEALTHY, 10)


async def set_fault(sim: SimProcess, **knobs: Any) -> None:
    await asyncio.to_thread(sim.set_fault, **knobs)


def is_known_answer(request: dict[str, Any]) -> bool:
    return "capital of France" in str(request["prompt"])  # the default verify prompt


async def wait_probes(
    sim: SimProcess, count: int, since: float, kind: Callable[[dict[str, Any]], bool]
) -> None:
    """Until ``sim`` has had ``count`` probes of ``kind`` since ``since`` (wall time)."""

    async def seen() -> bool:
        recent = (await asyncio.to_thread(sim.stats))["recent"]
        return sum(1 for r in recent if r["probe"] and r["time"] >= since and kind(r)) >= count

    await wait_until_async(seen, 15, f"{count} more probes of {sim.address}")


async def test_garbage_output_takes_one_endpoint_out_within_every_plus_2s(
    sims: list[SimProcess],
) -> None:
    async with Running(runtime_for(sims, "engines.yaml", **engine_settings(every="3s"))) as running:
        await running.all_healthy(sims)
        await set_fault(sims[0], fault="garbage_tokens")
        started = time.monotonic()
        out = await running.wait_state(sims[0], State.UNHEALTHY, 5 + 1, Cause.GARBAGE)
        took = time.monotonic() - started
        assert took <= 3 + 2, took
        assert out.reason.startswith("garbage output: '!!!'"), out.reason
        assert out.signals == {"verify": out.reason}
        for sim in sims[1:]:
            assert endpoint(running.runtime, sim).state is State.HEALTHY
        # The plain probes stay FAST (a TTFT-only prober sees nothing): after three of
        # them (healthy_after is 2) it is still held.
        await wait_probes(sims[0], 3, time.time(), lambda r: not is_known_answer(r))
        assert endpoint(running.runtime, sims[0]).state is State.UNHEALTHY
        # Fixed: the next known-answer probe passes, the usual hysteresis brings it back.
        await set_fault(sims[0], fault="none")
        await running.wait_state(sims[0], State.HEALTHY, 3 + 4)


async def test_expect_misses_take_it_out_after_the_confirming_check(
    sims: list[SimProcess],
) -> None:
    async with Running(
        runtime_for(sims, "engines.yaml", **engine_settings(every="3s", expect="Paris"))
    ) as running:
        await running.all_healthy(sims)
        await set_fault(sims[1], answer=" London is big")
        out = await running.wait_state(sims[1], State.UNHEALTHY, 3 + 3, Cause.WRONG_ANSWER)
        assert "'London is big'" in out.reason and "/Paris/" in out.reason, out.reason
        assert "(2 checks)" in out.reason, out.reason
        checks = running.runtime.component_status()["engines"]
        assert checks["misses_total"] >= 2
        assert endpoint(running.runtime, sims[0]).state is State.HEALTHY


async def test_the_odd_answer_out_of_three_is_a_wrong_answer(sims: list[SimProcess]) -> None:
    async with Running(runtime_for(sims, "engines.yaml", **engine_settings(every="3s"))) as running:
        await running.all_healthy(sims)
        # Another model: a different answer, and " Paris" not among its alternatives.
        await set_fault(sims[2], answer=" Rome is old", top_alternatives=[" Milan", " the"])
        out = await running.wait_state(sims[2], State.UNHEALTHY, 3 + 3, Cause.WRONG_ANSWER)
        assert "majority says 'Paris is a'" in out.reason, out.reason
        consensus = running.runtime.component_status()["engines"]["consensus"]["llama"]
        assert consensus["majority"] == "Paris is a"
        for sim in sims[:2]:
            assert endpoint(running.runtime, sim).state is State.HEALTHY


async def test_a_different_answer_whose_alternatives_hold_the_majority_is_no_miss(
    sims: list[SimProcess],
) -> None:
    async with Running(runtime_for(sims, "engines.yaml", **engine_settings(every="1s"))) as running:
        await running.all_healthy(sims)
        faulted = time.time()
        await set_fault(sims[2], answer=" Lyon is near", top_alternatives=[" Paris", " the"])
        await wait_probes(sims[2], 3, faulted, is_known_answer)  # three known-answer rounds
        status = running.runtime.component_status()["engines"]
        assert status["endpoints"][f"llama/{sims[2].address}"]["last_answer"] == "Lyon is near"
        assert endpoint(running.runtime, sims[2]).state is State.HEALTHY
        assert status["misses_total"] == 0


async def test_wrong_served_model_is_unhealthy_with_both_names(sims: list[SimProcess]) -> None:
    async with Running(runtime_for(sims, "engines.yaml", **engine_settings(every="2s"))) as running:
        await running.all_healthy(sims)
        await set_fault(sims[0], served_model="llama-3-8b-base")
        out = await running.wait_state(sims[0], State.UNHEALTHY, 2 + 3, Cause.WRONG_MODEL)
        assert out.reason == "wrong model: serves llama-3-8b-base, expected sim-model"
        await set_fault(sims[0], served_model=None)
        await running.wait_state(sims[0], State.HEALTHY, 2 + 4)


async def test_saturated_metrics_degrade_and_normal_metrics_restore(
    sims: list[SimProcess],
) -> None:
    async with Running(
        runtime_for(sims, "engines.yaml", **engine_settings(every="30s"))
    ) as running:
        await running.all_healthy(sims)
        await set_fault(sims[0], metrics_waiting=12)
        started = time.monotonic()
        out = await running.wait_state(sims[0], State.DEGRADED, 3, Cause.SATURATED)
        assert time.monotonic() - started <= 3 * 0.3 + 0.5
        assert out.reason == "12 waiting ≥ 5" and out.view.weight == 30
        load = running.runtime.component_status()["engines"]["endpoints"]
        assert load[f"llama/{sims[0].address}"]["load"]["waiting"] == 12
        await set_fault(sims[0], metrics_waiting=None)
        await running.wait_state(sims[0], State.HEALTHY, 4)


@pytest.mark.parametrize("mode", ["404", "garbage"])
async def test_unreadable_metrics_change_nothing(sims: list[SimProcess], mode: str) -> None:
    async with Running(
        runtime_for(sims, "engines.yaml", **engine_settings(every="30s"))
    ) as running:
        await running.all_healthy(sims)
        await set_fault(sims[0], metrics=mode)

        def failures() -> int:
            status = running.runtime.component_status()["engines"]["endpoints"]
            return int(status[f"llama/{sims[0].address}"]["metrics_failures"])

        await wait_until_async(lambda: failures() >= 3, 10, "three failed /metrics reads")
        found = endpoint(running.runtime, sims[0])
        assert found.state is State.HEALTHY and found.limits == {}


@pytest.mark.sims(3, *SIM_ARGS, "--engine", "llamacpp", **SHARED)
async def test_detected_llamacpp_gets_cache_prompt_false(sims: list[SimProcess]) -> None:
    async with Running(
        runtime_for(sims, "engines.yaml", **engine_settings(every="30s"))
    ) as running:
        await running.all_healthy(sims)
        checks = running.runtime.component_status()["engines"]["endpoints"]
        assert checks[f"llama/{sims[0].address}"]["engine"] == "llamacpp", checks
        await wait_probes(sims[0], 2, time.time(), lambda _: True)  # sent after the detection
        last = await asyncio.to_thread(sims[0].stats)
        request = last["last_request"]
        assert request.get("cache_prompt") is False and request.get("cache_salt") is None


def test_metrics_reads_are_stretched_to_the_budget() -> None:
    """1,000 endpoints read every 300 ms would be 3,333 /metrics reads a second: the
    budget (MAX_METRICS_READS_PER_S) stretches each endpoint's interval instead."""
    from llm_health.engines.component import EngineChecks
    from llm_health.engines.schedule import MAX_METRICS_READS_PER_S

    many = [SimProcess.__new__(SimProcess) for _ in range(1000)]
    for index, sim in enumerate(many):
        sim.host, sim.port = "127.0.0.1", 10_000 + index
    runtime = runtime_for(many, "engines.yaml", **engine_settings())
    (checks,) = [c for c in runtime.components if isinstance(c, EngineChecks)]
    stretched = checks.status()["metrics_min_interval_s"]
    assert stretched == pytest.approx(1000 / MAX_METRICS_READS_PER_S)
    few = runtime_for(many[:3], "engines.yaml", **engine_settings())
    (checks,) = [c for c in few.components if isinstance(c, EngineChecks)]
    assert checks.status()["metrics_min_interval_s"] < 0.3  # the configured 300 ms holds
