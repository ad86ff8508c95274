"""The kubelet's port (``agent``'s and ``serve``'s, the one guarded HTTP server) against
connections that send only empty lines, as real processes on loopback: a cap's worth
(256) that send "\r\n\r\n" and 60 more queued by the kernel behind them, every one
reopened as soon as the server closes it; and a mix of those with empty lines sent one
every 300 ms or after an answered keep-alive request, idle and half-sent connections.
Empty lines before a request line are no request (RFC 9112 §2.2), so these connections
stay idle and owe a request head: the guard closes them (header timeout, eviction at
the cap) and the kubelet's /readyz and /livez, polled with its own 1 s timeout, are
answered: never so many failures in a row that the kubelet would fail the pod (its
failureThreshold), and at least 95 % answered in time."""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_health.ops.http_server import MAX_CONNECTIONS
from tests.hostile_http import FAILURE_THRESHOLD, Attack, attacked, longest_failing_run
from tests.polling import wait_until
from tests.processes import START_WITHIN_S, AgentProcess, PluginProcess, SimProcess

# alone: the attack loads the machine while the kubelet's answers are timed against 1 s
pytestmark = [pytest.mark.timeout(180), pytest.mark.alone]

WAITING = 60  # beyond the cap: in the kernel's queue, ahead of the kubelet
ATTACKS = {
    "crlf": {"crlf": MAX_CONNECTIONS + WAITING},
    "mix": {"crlf": 100, "slow_crlf": 70, "after_get": 70, "idle": 38, "partial": 38},
}
SETTLE_S = 5.0  # the attack fills the port before the kubelet's first poll
ATTACK_S = 13.0  # the polls (settle + 6 s), and a third round of header timeouts (5 s)
MAX_CONNECTS = 60_000  # the attacker's whole budget of connection attempts
POLLS, POLL_EVERY_S = 24, 0.25  # 6 s of polls, each of /readyz and /livez
PATHS = ["/readyz", "/livez"]
ANSWERED_MIN = 0.95


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    process = SimProcess(tmp_path_factory.mktemp("engine"), "engine", "--ttft", "20ms")
    try:
        yield process.wait_up()
    finally:
        process.stop()


def status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def unstarted(command: str, engine: SimProcess, workdir: Path) -> AgentProcess | PluginProcess:
    probe = {"interval": "500ms"}
    if command == "agent":
        return AgentProcess(workdir, f"http://{engine.address}", {"probe": probe})
    cluster = {"name": "llama", "endpoints": [{"address": engine.address}]}
    return PluginProcess(workdir, {"probe": probe, "clusters": [cluster]})


@pytest.mark.parametrize(
    ("command", "attack_name"), [("agent", "crlf"), ("serve", "crlf"), ("agent", "mix")]
)
def test_probes_answer_while_empty_line_connections_fill_the_port(
    command: str, attack_name: str, engine: SimProcess, tmp_path: Path
) -> None:
    clients = ATTACKS[attack_name]
    process = unstarted(command, engine, tmp_path)
    port = process.http_port
    try:
        if isinstance(process, AgentProcess):
            process.start().wait_up()
        else:
            process.start().wait_ready()
        wait_until(
            lambda: status(port, "/readyz") == 200,
            START_WITHIN_S,
            f"{command} ready",
            ignore=(OSError, http.client.HTTPException),
        )
        attack = Attack(port, clients, ATTACK_S, MAX_CONNECTS)
        answers, stats = asyncio.run(attacked(attack, SETTLE_S, POLLS, POLL_EVERY_S, PATHS))
        assert process.process is not None and process.process.poll() is None
    finally:
        code, _took = process.stop()
    assert code == 0
    for path in PATHS:
        statuses = answers[path]
        answered = sum(status == 200 for status in statuses)
        said = f"{command} {attack_name} {path}: {answered}/{len(statuses)} in time; {stats}"
        assert len(statuses) == POLLS, said
        assert longest_failing_run(statuses, 200) < FAILURE_THRESHOLD, (said, statuses)
        assert answered >= ANSWERED_MIN * POLLS, (said, statuses)
    # The guard closed the connections (they reconnected): none held its slot.
    assert stats["connects"] > 2 * sum(clients.values()), stats
