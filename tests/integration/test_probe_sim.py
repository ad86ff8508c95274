"""The micro-probe against the simulator over real loopback sockets (docs/design.md §2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.target import ProbeTarget
from llm_health.sim.faults import FaultSpec
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.started import probe_once

TIMEOUT_S = 0.8
HANG_SLACK_S = 0.05  # acceptance: every hang is reported within timeout + 50 ms
# timed: every hang reported within the timeout + 50 ms, TTFTs timed to tens of ms.
pytestmark = [pytest.mark.sim_settings(seed=7), pytest.mark.timed]


def make_target(sim: SimHandle | str, **probe: object) -> ProbeTarget:
    address = sim if isinstance(sim, str) else f"127.0.0.1:{sim.port}"
    settings = ProbeSettings.model_validate(
        {"model": "sim-model", "timeout": "800ms", "healthy_ttft": "200ms", **probe}
    )
    return settings.to_target("c", address)


@pytest.fixture
async def prober() -> AsyncIterator[MicroProbe]:
    async with new_connections() as connections:
        yield MicroProbe(connections)


def set_fault(sim: SimHandle, **knobs: object) -> None:
    sim.state.set_fault(FaultSpec.from_json({"ttft": "20ms", **knobs}))


CASES = [
    # (fault knobs, api, expected outcome)
    ({"fault": "none", "ttft": "100ms"}, "openai-completions", Outcome.FAST),
    ({"fault": "none", "ttft": "100ms"}, "openai-chat", Outcome.FAST),
    ({"fault": "none", "ttft": "400ms"}, "openai-completions", Outcome.SLOW),
    ({"fault": "none", "ttft": "400ms"}, "openai-chat", Outcome.SLOW),
    ({"fault": "hang_before_headers"}, "openai-completions", Outcome.TIMEOUT),
    ({"fault": "hang_after_headers"}, "openai-completions", Outcome.TIMEOUT),
    ({"fault": "hang_after_headers"}, "openai-chat", Outcome.TIMEOUT),
    ({"fault": "hang_after_role_chunk"}, "openai-chat", Outcome.TIMEOUT),
    ({"fault": "http_500"}, "openai-completions", Outcome.ERROR),
    ({"fault": "cuda_error"}, "openai-completions", Outcome.FATAL),
    ({"fault": "cuda_error"}, "openai-chat", Outcome.FATAL),
    ({"fault": "error_mid_stream"}, "openai-completions", Outcome.FATAL),
    ({"fault": "error_mid_stream"}, "openai-chat", Outcome.FATAL),
    ({"fault": "overloaded", "overload_status": 429}, "openai-completions", Outcome.OVERLOADED),
    ({"fault": "overloaded", "overload_status": 503}, "openai-chat", Outcome.OVERLOADED),
    ({"fault": "garbage_stream"}, "openai-completions", Outcome.ERROR),
    ({"fault": "close_after_headers"}, "openai-completions", Outcome.ERROR),
    ({"fault": "startup_delay", "startup_delay": "30s"}, "openai-completions", Outcome.ERROR),
]


@pytest.mark.parametrize(
    ("knobs", "api", "expected"),
    CASES,
    ids=[f"{c[0]['fault']}-{c[0].get('ttft', '')}-{c[1]}-{c[2].value}" for c in CASES],
)
async def test_fault_gives_outcome(
    sim: SimHandle, prober: MicroProbe, knobs: dict[str, object], api: str, expected: Outcome
) -> None:
    set_fault(sim, **knobs)
    started = time.perf_counter()
    result = await probe_once(prober, make_target(sim, api=api))
    elapsed = time.perf_counter() - started
    assert result.outcome is expected, result
    assert elapsed <= TIMEOUT_S + HANG_SLACK_S, f"took {elapsed * 1000:.0f} ms"
    if expected is Outcome.TIMEOUT:
        assert result.ttft_ms is None
        assert "within 800 ms" in result.detail


async def test_role_chunk_alone_is_never_a_token(sim: SimHandle, prober: MicroProbe) -> None:
    """The chat role delta arrives at once; a prober that counted it would say FAST."""
    set_fault(sim, fault="hang_after_role_chunk")
    result = await probe_once(prober, make_target(sim, api="openai-chat"))
    assert result.outcome is Outcome.TIMEOUT
    assert result.headers_ms is not None and result.headers_ms < 200


async def test_closed_port_is_error(prober: MicroProbe) -> None:
    result = await probe_once(prober, make_target(f"127.0.0.1:{free_port()}"))  # nobody listens
    assert result.outcome is Outcome.ERROR
    assert "connect" in result.detail


async def test_slow_under_load_grows_ttft(sim: SimHandle, prober: MicroProbe) -> None:
    set_fault(sim, fault="slow_under_load", ttft="20ms", load_ttft_per_request="30ms")
    target = make_target(sim)
    results = await asyncio.gather(*(probe_once(prober, target) for _ in range(12)))
    outcomes = {r.outcome for r in results}
    assert Outcome.SLOW in outcomes or Outcome.TIMEOUT in outcomes, outcomes


async def test_timings_are_ordered(sim: SimHandle, prober: MicroProbe) -> None:
    set_fault(sim, fault="none", ttft="60ms")
    result = await probe_once(prober, make_target(sim))
    assert result.outcome is Outcome.FAST
    assert result.connect_ms is not None and result.headers_ms is not None
    assert result.ttft_ms is not None
    assert 0 <= result.connect_ms <= result.headers_ms <= result.ttft_ms
    assert 55 <= result.ttft_ms < 200


async def test_fast_probe_aborts_generation(sim: SimHandle, prober: MicroProbe) -> None:
    """The rest of the stream does not follow the first token within the grace: the
    probe closes the stream, the engine sees an abort and never a completed request."""
    set_fault(sim, fault="none", ttft="20ms", tpot="300ms")
    before = sim.state.stats()
    result = await probe_once(prober, make_target(sim))
    assert result.outcome is Outcome.FAST
    await wait_until_async(
        lambda: sim.state.stats()["aborted"] != before["aborted"], 5, "the sim to see the abort"
    )
    after = sim.state.stats()
    assert after["aborted"] == before["aborted"] + 1
    assert after["completed"] == before["completed"]
    assert after["probe_requests"] == before["probe_requests"] + 1


async def test_a_one_token_stream_ending_at_once_is_read_whole_and_its_connection_kept(
    sim: SimHandle,
) -> None:
    """``max_tokens`` 1 and the end right after the token: the engine completes the
    request (nothing decoded past the token), and the next probe reuses the connection."""
    set_fault(sim, fault="none", ttft="20ms", tpot="0ms")
    before = sim.state.stats()
    async with new_connections() as connections:
        prober = MicroProbe(connections)
        results = [await probe_once(prober, make_target(sim)) for _ in range(3)]
    assert [r.outcome for r in results] == [Outcome.FAST] * 3
    after = sim.state.stats()
    assert after["completed"] == before["completed"] + 3
    assert after["aborted"] == before["aborted"]
    assert connections.opened == 1 and connections.reused == 2


@pytest.mark.parametrize("mode", ["salt", "prefix"])
async def test_every_probe_busts_the_cache_differently(
    sim: SimHandle, prober: MicroProbe, mode: str
) -> None:
    set_fault(sim, fault="none", ttft="1ms", tpot="1ms")
    target = make_target(sim, cache_bust=mode)
    for _ in range(20):
        assert (await probe_once(prober, target)).outcome is Outcome.FAST
    recent = sim.state.stats()["recent"][-20:]
    if mode == "salt":
        salts = [r["cache_salt"] for r in recent]
        assert all(salts) and len(set(salts)) == 20
        assert {r["prompt"] for r in recent} == {"hi"}
    else:
        prompts = [r["prompt"] for r in recent]
        assert len(set(prompts)) == 20 and all(p.endswith(" hi") for p in prompts)
        assert all(r.get("cache_salt") is None for r in recent)


async def test_no_cache_bust_sends_plain_prompt(sim: SimHandle, prober: MicroProbe) -> None:
    set_fault(sim, fault="none", ttft="1ms")
    await probe_once(prober, make_target(sim, cache_bust="none"))
    last = sim.state.stats()["recent"][-1]
    assert last["prompt"] == "hi" and last.get("cache_salt") is None


async def test_configured_headers_reach_the_engine_but_not_repr(prober: MicroProbe) -> None:
    secret = "sk-very-secret-123"
    async with running_sim(SimSettings(api_key=secret)) as sim:
        target = make_target(sim, headers={"Authorization": f"Bearer {secret}"})
        assert (await probe_once(prober, target)).outcome is Outcome.FAST
        denied = await probe_once(prober, make_target(sim))
        assert denied.outcome is Outcome.ERROR and denied.status == 401
    assert secret not in repr(target)
    assert secret not in repr(denied)
