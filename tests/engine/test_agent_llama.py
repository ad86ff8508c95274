"""``llm-health agent`` beside a real llama.cpp ``llama-server`` (docs/agent.md): the
kubelet's three signals follow the real engine through its start, a freeze (SIGSTOP: the
process is alive, its port accepts, no token ever comes: the wedged engine this project
exists for) and its restart as a new process.

Bounds from the agent's contract: ``/readyz`` 503 within interval + timeout + 0.5 s of the
freeze; ``/livez`` stays 200 unless the engine has been UNHEALTHY for ``restart_after``
(short here) with a curable cause; a new engine process clears it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.engine.llama import StartServer
from tests.polling import seconds_until
from tests.ports import free_port
from tests.processes import AgentProcess

INTERVAL_S, TIMEOUT_S = 0.5, 0.8
RESTART_AFTER_S = 3.0
SETTINGS = {
    "probe": {
        "api": "openai-completions",
        "interval": f"{int(INTERVAL_S * 1000)}ms",
        "timeout": f"{int(TIMEOUT_S * 1000)}ms",
        # A tiny model on one thread of a loaded 2-core machine: a first token within
        # 300 ms is FAST, so HEALTHY is reachable; SLOW would still be Ready.
        "healthy_ttft": "300ms",
        "verify": {"enabled": False},  # random weights: no known answer to check
    },
    "agent": {"restart_after": f"{int(RESTART_AFTER_S * 1000)}ms"},
}


# Seconds until ``check()`` held (polled every 20 ms); a refused connection is "not yet".
within = partial(seconds_until, interval=0.02, ignore=(OSError,))


def code(agent: AgentProcess, path: str) -> int:
    return agent.get(path, timeout=1.0)[0]


@pytest.fixture
def agent_for(tmp_path: Path) -> Iterator[Callable[[int], AgentProcess]]:
    started: list[AgentProcess] = []

    def start(port: int) -> AgentProcess:
        agent = AgentProcess(
            tmp_path / f"agent-{len(started)}", f"http://127.0.0.1:{port}", SETTINGS
        )
        started.append(agent)
        return agent.start().wait_up()

    try:
        yield start
    finally:
        for agent in started:
            exit_code, took = agent.stop()
            assert exit_code == 0 and took < 2.0, (
                f"agent SIGTERM: exit {exit_code} after {took:.2f} s"
            )


def test_startup_then_a_freeze_is_not_ready_but_alive_and_a_thaw_is_ready(
    llama_server: StartServer, agent_for: Callable[[int], AgentProcess]
) -> None:
    port = free_port()
    agent = agent_for(port)
    # No engine yet (connection refused): not started, not ready, alive.
    assert code(agent, "/startupz") == 503
    assert code(agent, "/readyz") == 503
    assert code(agent, "/livez") == 200
    server = llama_server(seed=1, port=port)
    within(lambda: code(agent, "/startupz") == 200, 30.0, "/startupz 200 after the model loaded")
    within(lambda: code(agent, "/readyz") == 200, 30.0, "/readyz 200 once HEALTHY")

    server.pause()
    try:
        within(
            lambda: code(agent, "/readyz") == 503,
            INTERVAL_S + TIMEOUT_S + 0.5 + 2.0,  # + scheduling slack on a loaded CI machine
            "/readyz 503 after SIGSTOP",
        )
        _, body = agent.get("/readyz")
        assert body.startswith(("unhealthy", "degraded")), body
        # Frozen, not gone: the startup signal holds, and liveness only after restart_after.
        assert code(agent, "/startupz") == 200
        assert code(agent, "/livez") == 200
    finally:
        server.resume()
    within(lambda: code(agent, "/readyz") == 200, 30.0, "/readyz 200 again after SIGCONT")
    assert code(agent, "/livez") == 200


def test_a_frozen_engine_is_restarted_and_the_new_process_clears_it(
    llama_server: StartServer, agent_for: Callable[[int], AgentProcess]
) -> None:
    server = llama_server(seed=1)
    agent = agent_for(server.port)
    within(lambda: code(agent, "/readyz") == 200, 30.0, "/readyz 200 once HEALTHY")
    server.pause()
    took = within(
        lambda: code(agent, "/livez") == 503,
        RESTART_AFTER_S + 15.0,
        "/livez 503 after restart_after of a frozen engine",
    )
    assert took >= RESTART_AFTER_S, f"/livez 503 {took:.2f} s after SIGSTOP: before restart_after"
    # What the kubelet does on /livez 503: the container is restarted (a new process).
    port = server.port
    server.stop()
    within(lambda: code(agent, "/livez") == 200, 10.0, "/livez 200 once the engine is gone")
    assert code(agent, "/startupz") == 503  # the restarted container starts over
    llama_server(seed=1, port=port)
    within(lambda: code(agent, "/startupz") == 200, 30.0, "/startupz 200 for the new process")
    within(lambda: code(agent, "/readyz") == 200, 30.0, "/readyz 200 for the new process")
    assert code(agent, "/livez") == 200
