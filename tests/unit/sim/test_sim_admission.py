"""The simulator's admission (sim.admission, docs/simulator.md "A queue"): ``slots`` make
probes wait behind users in arrival order while the prompt-token counter advances at each
admission; "deadlock" admits nothing new while running requests decode and finish;
"frozen" stops everything and freezes /metrics at the moment of the freeze."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from tests.polling import wait_until_async
from tests.unit.sim.test_sim import HANG_TIMEOUT, PROBE_HEADERS, completion, set_fault

USER = {"prompt": "x" * 40, "stream": False}  # 10 prompt tokens as the simulator counts


async def user(session: aiohttp.ClientSession, sim: SimHandle, max_tokens: int) -> int:
    url = f"{sim.base_url}/v1/completions"
    async with session.post(url, json=completion(max_tokens=max_tokens, **USER)) as resp:
        await resp.read()
        return resp.status


def metric(text: str, name: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(name + "{")]
    return float(line.rsplit(" ", 1)[1])


async def metrics(session: aiohttp.ClientSession, sim: SimHandle) -> str:
    async with session.get(f"{sim.base_url}/metrics") as resp:
        return await resp.text()


@pytest.mark.parametrize("slots", [0, -1, True, "4"])
def test_slots_must_be_a_positive_integer(slots: Any) -> None:
    with pytest.raises(ValueError, match='"slots"'):
        FaultSpec.from_json({"slots": slots})


async def test_a_probe_waits_behind_users_while_the_admission_counter_moves(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(ttft=0.0, tpot=0.02, slots=2)
    async with running_sim(SimSettings(fault=spec)) as sim:
        users = [asyncio.create_task(user(session, sim, 10)) for _ in range(6)]  # 0.2 s each
        await wait_until_async(lambda: sim.state.in_flight == 6, 5, "6 users in flight")
        assert sim.state.admitted == 2
        text = await metrics(session, sim)
        assert metric(text, "vllm:num_requests_running") == 2
        assert metric(text, "vllm:num_requests_waiting") == 4
        before = metric(text, "vllm:prompt_tokens_total")
        started = time.monotonic()
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(max_tokens=1), headers=PROBE_HEADERS) as r:
            await r.read()
        waited = time.monotonic() - started
        assert waited >= 0.5  # behind 6 users of 0.2 s on 2 slots: 0.6 s
        assert all(status == 200 for status in await asyncio.gather(*users))
        after = metric(await metrics(session, sim), "vllm:prompt_tokens_total")
        assert after == before + 4 * 10 + 1  # the 4 waiting users, then the probe ("hi")
        assert sim.state.admitted == 0 and not sim.state.admission_queue


async def test_a_deadlock_admits_nothing_while_running_requests_finish(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(ttft=0.0, tpot=0.02, slots=2)
    async with running_sim(SimSettings(fault=spec)) as sim:
        running = [asyncio.create_task(user(session, sim, 15)) for _ in range(2)]  # 0.3 s
        await wait_until_async(lambda: sim.state.admitted == 2, 5, "2 admitted")
        await set_fault(session, sim, fault="deadlock")
        text = await metrics(session, sim)
        prompt, generated = (
            metric(text, "vllm:prompt_tokens_total"),
            metric(text, "vllm:generation_tokens_total"),
        )
        url = f"{sim.base_url}/v1/completions"
        with pytest.raises(asyncio.TimeoutError):  # headers, then never admitted
            async with session.post(url, json=completion(), timeout=HANG_TIMEOUT) as resp:
                assert resp.status == 200
                await resp.read()
        assert await asyncio.gather(*running) == [200, 200]  # decode went on, and finished
        text = await metrics(session, sim)
        assert metric(text, "vllm:prompt_tokens_total") == prompt
        assert metric(text, "vllm:generation_tokens_total") > generated
        assert metric(text, "vllm:request_success_total") == 2


async def test_frozen_stops_everything_and_metrics_keep_the_moment_of_the_freeze(
    session: aiohttp.ClientSession,
) -> None:
    spec = FaultSpec(ttft=0.0, tpot=0.02, slots=1)
    async with running_sim(SimSettings(fault=spec)) as sim:
        users = [asyncio.create_task(user(session, sim, 50)) for _ in range(4)]
        await wait_until_async(lambda: sim.state.in_flight == 4, 5, "4 users in flight")
        await set_fault(session, sim, fault="frozen")
        frozen = await metrics(session, sim)
        assert metric(frozen, "vllm:num_requests_waiting") == 3  # busy, and stays so
        generated = sim.state.generation_tokens
        await asyncio.sleep(0.3)
        assert sim.state.generation_tokens <= generated + 1  # the running one stopped
        for task in users:
            task.cancel()
        await asyncio.gather(*users, return_exceptions=True)
        await wait_until_async(lambda: sim.state.in_flight == 0, 5, "users gone")
        assert await metrics(session, sim) == frozen  # the API process answers, stale
        await set_fault(session, sim, fault="none")
        assert metric(await metrics(session, sim), "vllm:num_requests_waiting") == 0
