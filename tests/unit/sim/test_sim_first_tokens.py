"""``--record-first-tokens N``: the simulator's wall-clock times of probe first-token writes."""

from __future__ import annotations

import argparse
import time
from typing import Any

import aiohttp
import pytest

from llm_health.cli.sim import register, settings_from_args
from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, running_sim

PROBE_HEADERS = {"X-LLM-Probe": "true"}
# The first token 20 ms after arrival, the next ones 50 ms apart: a write time taken at a
# later token would land after the first chunk the client saw.
TIMING = FaultSpec(ttft=0.02, tpot=0.05)


def completion() -> dict[str, Any]:
    return {"model": "sim-model", "prompt": "hi", "max_tokens": 3, "stream": True}


async def timed_request(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]
) -> tuple[float, float]:
    """(wall time before sending, wall time the first ``data:`` chunk was read)."""
    sent = time.time()
    async with session.post(f"{base_url}/v1/completions", json=completion(), headers=headers) as r:
        assert r.status == 200
        first = None
        async for raw in r.content:
            if first is None and raw.startswith(b"data: "):
                first = time.time()
    assert first is not None
    return sent, first


async def stats_of(session: aiohttp.ClientSession, sim: SimHandle) -> dict[str, Any]:
    async with session.get(f"{sim.base_url}/sim/stats") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_probe_first_token_writes_are_recorded_per_port(
    session: aiohttp.ClientSession,
) -> None:
    settings = SimSettings(fault=TIMING, record_first_tokens=64)
    async with running_sim(settings, port_count=2) as sim:
        first, second = sim.base_urls
        windows: dict[int, list[tuple[float, float]]] = {port: [] for port in sim.ports}
        for port, url in ((sim.ports[0], first), (sim.ports[1], second), (sim.ports[0], first)):
            windows[port].append(await timed_request(session, url, PROBE_HEADERS))
        await timed_request(session, first, {})  # not a probe: not recorded
        stats = await stats_of(session, sim)
    writes = stats["first_token_writes"]
    assert sum(len(times) for times in writes.values()) == 3
    assert set(writes) == {str(sim.ports[0]), str(sim.ports[1])}
    for port, seen in windows.items():
        recorded = writes[str(port)]
        assert len(recorded) == len(seen)
        for written, (sent, read) in zip(recorded, seen, strict=True):
            assert sent <= written <= read
    assert (stats["probe_requests"], stats["requests"]) == (3, 4)


async def test_ring_is_bounded_and_reset_empties_it(session: aiohttp.ClientSession) -> None:
    async with running_sim(SimSettings(fault=TIMING, record_first_tokens=2)) as sim:
        seen = [await timed_request(session, sim.base_url, PROBE_HEADERS) for _ in range(3)]
        recorded = (await stats_of(session, sim))["first_token_writes"][str(sim.port)]
        assert len(recorded) == 2
        assert all(sent <= t <= read for t, (sent, read) in zip(recorded, seen[1:], strict=True))
        async with session.post(f"{sim.base_url}/sim/stats/reset") as resp:
            assert (await resp.json())["first_token_writes"] == {}


async def test_off_by_default_stats_unchanged(session: aiohttp.ClientSession) -> None:
    async with running_sim(SimSettings(fault=TIMING)) as sim:
        await timed_request(session, sim.base_url, PROBE_HEADERS)
        stats = await stats_of(session, sim)
        assert "first_token_writes" not in stats
        assert sim.state.first_token_writes == {}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_cli_flag() -> None:
    assert settings_from_args(parse(["sim", "--port", "9000"])).record_first_tokens == 0
    args = parse(["sim", "--port", "9000", "--record-first-tokens", "64"])
    assert settings_from_args(args).record_first_tokens == 64
    with pytest.raises(SystemExit):
        parse(["sim", "--port", "9000", "--record-first-tokens", "-1"])
    with pytest.raises(ValueError, match="record_first_tokens"):
        SimSettings(record_first_tokens=-1)
