"""``AgentSurface`` (agent.component) on the keeper's board, a fake clock and probe
results folded as the scheduler folds them: the answers follow the board and the
engine's /metrics reads, /livez turning 503 is counted once, /metrics and /status carry
the signals, and the HTTP routes answer from memory."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from llm_health.agent.component import AgentSurface
from llm_health.agent.settings import AgentSettings
from llm_health.app.keeper import BoardKeeper
from llm_health.config.agent import ENGINE_CLUSTER, AgentFile
from llm_health.core.control import ProberStats
from llm_health.model.board import Board
from llm_health.model.engine_load import EngineLoad
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.ops.http_server import start_http
from llm_health.ops.secret_scrubbing import Secrets
from llm_health.probe.lag import LoopLagMonitor
from tests.fakes import Clock

ADDRESS = "127.0.0.1:8000"
SECRET = "tok-0123456789-secret"


class Agent:
    """A keeper with the engine's board, and the surface on it."""

    def __init__(self, restart_after: str | None = "2s", when_degraded: bool = True) -> None:
        self.clock = Clock()
        file = AgentFile()
        board = Board((file.cluster(ADDRESS),), self.clock(), 0.0)
        self.stats = ProberStats(LoopLagMonitor())
        self.keeper = BoardKeeper(board, self.clock, self.stats)
        settings = AgentSettings.model_validate(
            {"ready_when_degraded": when_degraded, "restart_after": restart_after}
        )
        self.target = file.target(ADDRESS)
        self.surface = AgentSurface(
            self.keeper,
            settings,
            (ENGINE_CLUSTER, ADDRESS),
            self.stats,
            stall_s=10.0,
            secrets=Secrets(frozenset({SECRET})),
            clock=self.clock,
        )

    async def probe(self, outcome: Outcome, *, after: float = 1.0, **fields: object) -> None:
        self.clock.now += after
        defaults: dict[str, object] = {"connect_ms": 0.3}
        if outcome in (Outcome.FAST, Outcome.SLOW):
            defaults["ttft_ms"] = 40.0 if outcome is Outcome.FAST else 450.0
        result = ProbeResult(outcome, time.time(), **{**defaults, **fields})  # type: ignore[arg-type]
        await self.keeper.fold_probe(ENGINE_CLUSTER, ADDRESS, result)

    def read(
        self,
        admitted: float | None = None,
        started: float | None = None,
        completed: float | None = None,
    ) -> None:
        load = EngineLoad(
            "vllm", 0.0, 0.0, 0.0, completed=completed, process_started=started, admitted=admitted
        )
        self.surface.on_engine_load(self.target, load)

    def answers(self) -> tuple[int, int, int]:
        surface = self.surface
        return surface.startup().status, surface.ready().status, surface.live().status


async def test_the_answers_follow_the_engine() -> None:
    agent = Agent()
    assert agent.answers() == (503, 503, 200)  # nothing yet: starting, not ready, alive
    await agent.probe(Outcome.ERROR, connect_ms=None, detail="connect failed")
    assert agent.answers() == (503, 503, 200)
    await agent.probe(Outcome.FAST)
    assert agent.answers() == (200, 200, 200)
    assert agent.surface.ready().text == "healthy: ready: first probe fast"
    await agent.probe(Outcome.TIMEOUT, detail="no response headers within 800 ms")
    await agent.probe(Outcome.TIMEOUT, after=0.05)
    assert agent.answers() == (200, 503, 200)  # hung: out, not yet restarted
    assert agent.surface.ready().text == "unhealthy: 2 consecutive timeouts (>800 ms)"
    agent.clock.now += 2.0
    assert agent.answers() == (200, 503, 503)
    assert agent.surface.live().text.startswith("restart: unhealthy (timeout) for 2.0 s")
    await agent.probe(Outcome.ERROR, connect_ms=None)  # the kubelet killed it
    assert agent.answers() == (503, 503, 200)
    assert agent.surface.engine_generation == 1


async def test_admissions_hold_the_restart_off() -> None:
    agent = Agent()
    await agent.probe(Outcome.FAST)
    agent.read(admitted=10.0)
    await agent.probe(Outcome.TIMEOUT)
    await agent.probe(Outcome.TIMEOUT, after=0.05)
    for _ in range(5):  # new requests keep being admitted: busy, not hung
        agent.clock.now += 1.0
        agent.read(admitted=10.0 + agent.clock.now)
        assert agent.surface.live().ok
    agent.clock.now += 2.0  # the counter stops
    agent.read(admitted=10.0 + agent.clock.now - 2.0)
    assert not agent.surface.live().ok


async def test_completions_alone_do_not_hold_the_restart_off() -> None:
    """A scheduler deadlock: running requests finish, none starts (docs/design.md §3.5)."""
    agent = Agent()
    await agent.probe(Outcome.FAST)
    agent.read(admitted=10.0, completed=1.0)
    await agent.probe(Outcome.TIMEOUT)
    await agent.probe(Outcome.TIMEOUT, after=0.05)
    agent.clock.now += 2.5
    agent.read(admitted=10.0, completed=1.0 + agent.clock.now)
    assert not agent.surface.live().ok


async def test_a_new_process_start_time_starts_over() -> None:
    agent = Agent()
    agent.read(started=100.0)
    await agent.probe(Outcome.FAST)
    agent.read(started=100.0)
    assert agent.surface.startup().ok
    agent.read(started=200.0)
    assert not agent.surface.startup().ok and agent.surface.engine_generation == 1
    await agent.probe(Outcome.FAST)
    assert agent.surface.startup().ok


async def test_degraded_is_ready_unless_told_otherwise() -> None:
    for when_degraded, status in ((True, 200), (False, 503)):
        agent = Agent(when_degraded=when_degraded)
        await agent.probe(Outcome.FAST)
        await agent.probe(Outcome.SLOW)
        assert agent.surface.ready().text.startswith("degraded: slow first token")
        assert agent.answers() == (200, status, 200)


async def test_a_restart_signal_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent()
    await agent.probe(Outcome.FAST)
    await agent.probe(Outcome.FATAL, status=500, detail="CUDA error")
    for _ in range(6):
        agent.clock.now += 1.0
        agent.surface.watch_once()
        agent.surface.live()
    assert not agent.surface.live().ok
    assert agent.surface.status()["restarts_signalled"] == 1
    lines = [r for r in caplog.records if "engine restart signalled" in r.getMessage()]
    assert len(lines) == 1
    body, _type = agent.surface.exposition()
    text = body.decode()
    assert "llm_health_agent_restarts_signalled_total 1.0" in text
    assert 'llm_health_agent_signal_ok{signal="live"} 0.0' in text
    assert 'llm_health_agent_engine_state{state="unhealthy"} 1.0' in text
    assert (
        'llm_health_probes_total{cluster="engine",endpoint="127.0.0.1:8000",outcome="fatal"} 1'
        in text
    )
    assert "llm_health_probe_ttft_seconds_count" in text
    assert "process_resident_memory_bytes" in text


async def test_healthz_follows_the_prober() -> None:
    agent = Agent()
    assert agent.surface.healthz().ok
    agent.clock.now += 11.0
    agent.surface.watch_once()
    assert not agent.surface.healthz().ok  # no result in 11 s: stalled
    await agent.probe(Outcome.TIMEOUT, after=0.0)
    agent.surface.watch_once()
    assert agent.surface.healthz().ok


@pytest.fixture
async def served() -> AsyncIterator[tuple[Agent, str]]:
    agent = Agent()
    runner = await start_http(agent.surface.http_app(), "127.0.0.1:0")
    try:
        yield agent, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_the_routes(served: tuple[Agent, str], session: aiohttp.ClientSession) -> None:
    agent, base = served
    await agent.probe(Outcome.FAST)
    await agent.probe(Outcome.ERROR, status=500, detail=f"boom {SECRET}", connect_ms=0.2)
    expected = {
        "/startupz": 200,
        "/readyz": 200,  # one error: DEGRADED, ready
        "/livez": 200,
        "/healthz": 200,
    }
    for path, status in expected.items():
        async with session.get(base + path) as response:
            assert response.status == status, path
            text = await response.text()
            assert text.endswith("\n") and text.count("\n") == 1
            assert response.headers["Cache-Control"] == "no-store"
    async with session.get(base + "/readyz") as response:
        body = await response.text()
        assert SECRET not in body and body.startswith("degraded: error: boom")
    async with session.get(base + "/status") as response:
        document = await response.json()
    assert SECRET not in str(document)
    assert document["agent"]["answers"]["startup"]["status"] == 200
    assert document["clusters"][0]["endpoints"][0]["address"] == ADDRESS
    async with session.get(base + "/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        assert "llm_health_agent_signal_ok" in await response.text()
    async with session.get(base + "/") as response:
        assert response.status == 404  # no status page: the agent serves the kubelet
