"""The overload rule (docs/design.md §3.5) end to end: ``llm-health sim`` in its own
process playing vLLM with a queue (``slots``: 4, as ``--max-num-seqs 4``) and 24 users,
``serve``'s runtime in this process and ``llm-health agent`` in its own, both probing it.

- saturated: probes wait behind the queue and time out while the engine admits new
  requests: never UNHEALTHY, never under the degraded share, the agent Ready even with
  ``agent.ready_when_degraded: false``; once the load is over both say HEALTHY within
  10 s, together;
- frozen under load (stale busy gauges, counters that no longer move) and a scheduler
  deadlock (running requests decode and finish, none starts): UNHEALTHY, the agent not
  Ready, within a hang's bound on an idle engine (docs/design.md §3.5): two probe
  intervals, the timeout, the second read of the last wait, and SLACK_S for a loaded
  machine.

Timings: interval 500 ms, timeout 500 ms, healthy_ttft 150 ms, /metrics every 500 ms, no
``admission_window``: only admission during a probe's wait counts. The users' requests
take 0.4 to 0.9 s of decode: 4 slots admit several a second. (With requests of seconds
a wait can see no admission: docs/design.md §3.5 says when to set the window.)
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llm_health.engines.bracket import CONFIRM_WITHIN_S
from llm_health.model.outcome import Outcome
from llm_health.model.states import State
from tests.configs import plugin_yaml
from tests.processes import AgentProcess, SimProcess, http_json, running_sims
from tests.runtime import Running

pytestmark = [pytest.mark.timeout(240), pytest.mark.timed]

INTERVAL_S, TIMEOUT_S = 0.5, 0.5
SLACK_S = 1.3
# Two timeouts an interval apart (a DEGRADED endpoint gets no confirming probe beside a
# silent one: docs/design.md §2.7), the last told after its second read.
OUT_WITHIN_S = 2 * INTERVAL_S + TIMEOUT_S + CONFIRM_WITHIN_S + SLACK_S
AGREE_WITHIN_S = 10.0
USERS, SLOTS = 24, 4
# A user's request waits at most this: the queue's wait (24 behind 4 slots, under a second
# each) with room, and what a frozen engine's hung requests cost the test at its end.
REQUEST_TIMEOUT_S = 8.0
SHORT = (16, 18, 20, 22, 24)  # tokens a request: 0.4-0.6 s of decode
LONGER = (20, 24, 28, 32, 36)  # 0.5-0.9 s: still decoding a moment after a deadlock
DEGRADED_SHARE = 30  # of the base weight 100: probe.degraded_weight 0.3
PROBE = {
    "interval": "500ms",
    "timeout": "500ms",
    "healthy_ttft": "150ms",
    "verify": {"every": "30s"},
    "engine_metrics": {"interval": "500ms"},
}
QUEUE = {"fault": "none", "slots": SLOTS, "ttft": "20ms", "tpot": "25ms"}
NORMAL = {"fault": "none", "slots": None, "ttft": "20ms", "tpot": "10ms"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimProcess, AgentProcess]]:
    workdir = tmp_path_factory.mktemp("overload")
    settings = {
        "probe": {**PROBE, "model": "sim-model", "api": "openai-chat"},
        "agent": {"ready_when_degraded": False, "restart_after": "10m"},
    }
    with running_sims(workdir, "engine", 1, "--ttft", "20ms") as (sim,):
        agent = AgentProcess(workdir / "agent", f"http://{sim.address}", settings)
        try:
            agent.start().wait_up()
            yield sim, agent
        finally:
            code, _took = agent.stop()
            assert code == 0


class Users:
    """USERS threads, the n-th asking for a completion of ``lengths[n % len(lengths)]``
    tokens (at 25 ms a token) again and again until ``stop``; bounded by ``seconds``
    whatever happens. Lengths that differ spread the admissions out, as real traffic's."""

    def __init__(self, sim: SimProcess, seconds: float, lengths: tuple[int, ...]) -> None:
        self.lengths = lengths
        self.url = f"http://{sim.address}/v1/completions"
        self.until = time.monotonic() + seconds
        self.done = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(USERS)
        ]

    def _run(self, n: int) -> None:
        body = {
            "model": "sim-model",
            "prompt": "x" * 400,
            "max_tokens": self.lengths[n % len(self.lengths)],
        }
        while not self.done.is_set() and time.monotonic() < self.until:
            with contextlib.suppress(OSError):
                http_json(self.url, body, timeout=REQUEST_TIMEOUT_S)

    def __enter__(self) -> Users:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.done.set()

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(REQUEST_TIMEOUT_S + 5.0)


def serve_config(sim: SimProcess) -> str:
    return plugin_yaml([sim], cluster_keys={"model": "sim-model"}, probe=PROBE)


def view(running: Running, sim: SimProcess) -> Any:
    (found,) = [
        e
        for e in running.runtime.control.snapshot().clusters["llama"].endpoints
        if e.spec.address == sim.address
    ]
    return found


async def readyz(agent: AgentProcess) -> tuple[int, str]:
    return await asyncio.to_thread(agent.get, "/readyz")


async def both_healthy(
    running: Running, sim: SimProcess, agent: AgentProcess, within: float
) -> float:
    """Seconds until serve's runtime and the agent both say HEALTHY (and stay so for a
    moment); AssertionError after ``within``."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        code, body = await readyz(agent)
        if view(running, sim).state is State.HEALTHY and code == 200 and body.startswith("healthy"):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    code, body = await readyz(agent)
    raise AssertionError(
        f"not both HEALTHY within {within:.1f} s: serve {view(running, sim).state.value} "
        f"({view(running, sim).reason}), agent {code} {body.strip()!r}"
    )


async def overloaded(running: Running, sim: SimProcess, within: float) -> None:
    """Until serve has judged a probe that waited behind the queue (the rule at work)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        found = running.runtime.control.endpoint_health("llama", sim.address)
        last = found[1] if found is not None else None
        if last is not None and last.outcome is Outcome.OVERLOADED and "queue" in last.detail:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no probe overloaded behind the queue within {within:.1f} s")


async def ready_for_load(
    running: Running, sim: SimProcess, agent: AgentProcess, within: float
) -> None:
    """Until serve says DEGRADED and the agent Ready (an endpoint out at the very onset,
    before any admission was seen, comes back after healthy_after excused probes)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if view(running, sim).state is State.DEGRADED and (await readyz(agent))[0] == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not DEGRADED and Ready under load: {view(running, sim).reason}")


async def test_a_saturated_engine_stays_routed_and_ready_then_both_agree_on_healthy(
    engine: tuple[SimProcess, AgentProcess],
) -> None:
    sim, agent = engine
    sim.set_fault(**NORMAL)
    async with Running.from_config(serve_config(sim)) as running:
        await both_healthy(running, sim, agent, 20.0)
        sim.set_fault(**QUEUE)
        with Users(sim, seconds=40.0, lengths=SHORT) as users:
            await overloaded(running, sim, 10.0)
            seen: set[tuple[str, str]] = set()
            until = time.monotonic() + 8.0
            while time.monotonic() < until:
                found = view(running, sim)
                seen.add((found.state.value, found.cause.value))
                assert found.state is not State.UNHEALTHY, found.reason
                assert found.view.weight >= DEGRADED_SHARE, (found.view.weight, found.reason)
                code, body = await readyz(agent)
                assert code == 200, f"agent /readyz {code} {body.strip()!r} under load"
                assert not body.startswith("unhealthy"), body
                await asyncio.sleep(0.05)
            stats = await asyncio.to_thread(sim.stats)
            assert stats["waiting"] >= 10, stats["waiting"]  # the queue was there
            # DEGRADED (overloaded, or saturated: the engine's queue over its threshold)
            assert {state for state, _cause in seen} == {"degraded"}, seen
            users.stop()
            ended = time.monotonic()
        # Users' requests in flight when the load ended finished above (joined).
        sim.set_fault(**NORMAL)
        await both_healthy(running, sim, agent, AGREE_WITHIN_S)
        took = time.monotonic() - ended
        assert took <= AGREE_WITHIN_S, f"both HEALTHY {took:.2f} s after the load ended"


async def frozen_or_deadlocked(
    fault: str, engine: tuple[SimProcess, AgentProcess], *, frozen_metrics: bool = False
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """Load with a queue, the rule at work, then ``fault``: seconds until serve says
    UNHEALTHY and the agent answers 503, and the sim's stats at the fault and after.
    ``frozen_metrics``: check that /metrics answered the moment of the freeze meanwhile
    (busy gauges, counters that stay put)."""
    sim, agent = engine
    sim.set_fault(**NORMAL)
    async with Running.from_config(serve_config(sim)) as running:
        await both_healthy(running, sim, agent, 20.0)
        sim.set_fault(**QUEUE)
        with Users(sim, seconds=40.0, lengths=LONGER):
            await overloaded(running, sim, 10.0)
            await ready_for_load(running, sim, agent, 10.0)
            until = time.monotonic() + 2.0
            while time.monotonic() < until:  # the rule holds first: load, not health
                assert view(running, sim).state is not State.UNHEALTHY, view(running, sim).reason
                assert (await readyz(agent))[0] == 200
                await asyncio.sleep(0.05)
            sim.set_fault(fault=fault)
            started = time.monotonic()
            at_fault = await asyncio.to_thread(sim.stats)
            while True:
                code, body = await readyz(agent)
                if view(running, sim).state is State.UNHEALTHY and code == 503:
                    break
                assert time.monotonic() - started < 15.0, (view(running, sim).reason, body)
                await asyncio.sleep(0.02)
            took = time.monotonic() - started
            reason, after = view(running, sim).reason, await asyncio.to_thread(sim.stats)
            if frozen_metrics:
                metrics = await asyncio.to_thread(_metrics, sim)
                assert metrics["vllm:num_requests_waiting"] >= 10, metrics  # stale, busy
                assert metrics["vllm:prompt_tokens_total"] < after["prompt_tokens"] + 1
                assert metrics == await asyncio.to_thread(_metrics, sim)
            assert "consecutive timeouts" in reason, reason
            assert body.startswith("unhealthy: "), body
            if fault == "deadlock":  # running requests finish meanwhile: still out
                while after["completed"] <= at_fault["completed"]:
                    assert time.monotonic() - started < 15.0, "no request finished"
                    await asyncio.sleep(0.1)
                    after = await asyncio.to_thread(sim.stats)
                assert view(running, sim).state is State.UNHEALTHY
                assert (await readyz(agent))[0] == 503
            sim.set_fault(**NORMAL)  # the users' waiting requests go on, and end
    return took, at_fault, after


async def test_a_frozen_engine_with_stale_busy_gauges_is_out(
    engine: tuple[SimProcess, AgentProcess],
) -> None:
    took, at_fault, after = await frozen_or_deadlocked("frozen", engine, frozen_metrics=True)
    assert took <= OUT_WITHIN_S, f"out after {took:.2f} s, bound {OUT_WITHIN_S:.2f} s"
    assert after["prompt_tokens"] == at_fault["prompt_tokens"]


async def test_a_deadlocked_scheduler_is_out_while_running_requests_finish(
    engine: tuple[SimProcess, AgentProcess],
) -> None:
    took, at_fault, after = await frozen_or_deadlocked("deadlock", engine)
    assert took <= OUT_WITHIN_S, f"out after {took:.2f} s, bound {OUT_WITHIN_S:.2f} s"
    # Decode and completions went on meanwhile: counters that would have excused it.
    assert after["generation_tokens"] > at_fault["generation_tokens"]
    assert after["completed"] > at_fault["completed"]
    assert after["prompt_tokens"] == at_fault["prompt_tokens"]


def _metrics(sim: SimProcess) -> dict[str, float]:
    """The engine's /metrics, each name's samples added up (the histograms' too)."""
    connection = http.client.HTTPConnection(sim.host, sim.port, timeout=5.0)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found
