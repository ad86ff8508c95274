"""``llm-health agent`` as a real process against a real ``llm-health sim`` on loopback
(docs/agent.md): for every fault the gateway side knows, /readyz and /startupz follow the
engine within the gateway side's bounds and /livez turns 503 only by its rules; the
engine's process coming and going drives /startupz; every answer comes from memory
while the engine hangs; bad files, bad arguments and hostile HTTP get clear answers.

Timings are the test config's (interval 500 ms, timeout 500 ms, healthy_ttft 150 ms,
agent.restart_after 2 s). A hung backend is out within about interval + 2 × healthy_ttft
+ timeout (docs/design.md §2.7); SLACK_S is added for a loaded test machine.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.polling import seconds_until
from tests.ports import free_port
from tests.processes import ROOT, AgentProcess, SimProcess, _env, http_json, running_sims

pytestmark = pytest.mark.timeout(300)
# The tests that time the agent's answers (bounds of interval + slack, answers from memory
# in milliseconds) are timed (tests/alone.py); the fault tables run their cases side by
# side, one engine and agent each (``pairs``), since each case mostly waits.
timed = pytest.mark.timed

INTERVAL_S, TIMEOUT_S, HEALTHY_TTFT_S = 0.5, 0.5, 0.15
RESTART_AFTER_S = 2.0
VERIFY_S, METRICS_S = 1.0, 0.5  # probe.verify.every, probe.engine_metrics.interval
HANG_BOUND_S = INTERVAL_S + 2 * HEALTHY_TTFT_S + TIMEOUT_S
SLACK_S = 1.5
PATHS = ("/startupz", "/readyz", "/livez", "/healthz", "/metrics", "/status")
BASELINE = {
    "fault": "none",
    "ttft": "20ms",
    "served_model": None,
    "metrics_waiting": None,
    "overload_status": 429,
}


def settings(api: str = "openai-chat", model: str | None = "sim-model") -> dict[str, Any]:
    probe: dict[str, Any] = {
        "api": api,
        "interval": "500ms",
        "timeout": "500ms",
        "healthy_ttft": "150ms",
        "verify": {"every": "1s"},
        "engine_metrics": {"interval": "500ms"},
    }
    if model is not None:
        probe["model"] = model
    return {"probe": probe, "agent": {"restart_after": "2s"}}


# Seconds until ``check()`` held (polled every 20 ms); a refused connection is "not yet".
wait_for = partial(seconds_until, interval=0.02, ignore=(OSError,))


def status_of(agent: AgentProcess, path: str) -> int:
    return agent.get(path)[0]


def hold(agent: AgentProcess, seconds: float, expected: dict[str, int]) -> None:
    """For ``seconds``, every answer of the paths in ``expected`` is as expected."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for path, status in expected.items():
            got, body = agent.get(path)
            assert got == status, f"{path}: {got} {body!r}, expected {status}"
        time.sleep(0.05)


PAIRS = 6  # the widest fault table (the no-restart cases, busy among them)


@pytest.fixture(scope="module")
def pairs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[tuple[SimProcess, AgentProcess]]]:
    """PAIRS sims, each with an agent probing it over the chat API (its role chunk can
    hang); all started before any is waited on."""
    workdir = tmp_path_factory.mktemp("agent-pairs")
    agents: list[AgentProcess] = []
    stopped: list[tuple[int | None, float]] = []
    with running_sims(workdir, "engine", PAIRS, "--ttft", "20ms") as sims:
        try:
            agents = [
                AgentProcess(workdir / f"agent{n}", f"http://{sim.address}", settings())
                for n, sim in enumerate(sims)
            ]
            for agent in agents:
                agent.start()
            for agent in agents:
                agent.wait_up()
            yield list(zip(sims, agents, strict=True))
        finally:
            stopped = [agent.stop() for agent in agents]
    for code, took in stopped:
        assert code == 0 and took < 2.0, f"SIGTERM: exit {code} after {took:.2f} s"


@pytest.fixture
def pair(pairs: list[tuple[SimProcess, AgentProcess]]) -> tuple[SimProcess, AgentProcess]:
    return pairs[0]


def side_by_side(
    pairs: list[tuple[SimProcess, AgentProcess]],
    cases: dict[str, Callable[[SimProcess, AgentProcess], None]],
) -> None:
    """Run each case on a pair of its own, all at once; every case's failure reported."""
    assert len(cases) <= len(pairs)
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {
            name: pool.submit(case, *both)
            for (name, case), both in zip(cases.items(), pairs, strict=False)
        }
    failed = {name: future.exception() for name, future in futures.items() if future.exception()}
    assert not failed, "; ".join(f"{name}: {exc}" for name, exc in failed.items())


def healthy(sim: SimProcess, agent: AgentProcess) -> None:
    """Back to normal service and HEALTHY (recovery takes healthy_after fast probes, and a
    passing known-answer probe after garbage)."""
    sim.set_fault(**BASELINE)

    def back() -> bool:
        code, body = agent.get("/readyz")
        return code == 200 and body.startswith("healthy")

    wait_for(back, 15.0, "the engine HEALTHY again")
    assert status_of(agent, "/livez") == 200 and status_of(agent, "/startupz") == 200


HANGS = ["hang_before_headers", "hang_after_headers", "hang_after_role_chunk"]


@timed
def test_a_hang_or_a_fatal_error_is_out_in_time_and_restarted_after_restart_after(
    pairs: list[tuple[SimProcess, AgentProcess]],
) -> None:
    side_by_side(
        pairs, {fault: partial(hang_or_fatal_error, fault) for fault in [*HANGS, "cuda_error"]}
    )


def hang_or_fatal_error(fault: str, sim: SimProcess, agent: AgentProcess) -> None:
    healthy(sim, agent)
    sim.set_fault(fault=fault)
    out_s = wait_for(lambda: status_of(agent, "/readyz") == 503, 10.0, f"{fault}: /readyz 503")
    ready_body = agent.get("/readyz")[1]
    bound = (0.5 if fault == "cuda_error" else HANG_BOUND_S) + INTERVAL_S + SLACK_S
    assert out_s <= bound, f"{fault}: out after {out_s:.2f} s, bound {bound:.2f} s"
    cause = "fatal engine error" if fault == "cuda_error" else "consecutive timeouts"
    assert ready_body.startswith("unhealthy: ") and cause in ready_body
    # Not before restart_after (a fresh hang is not yet a restart) ...
    assert status_of(agent, "/livez") == 200
    assert status_of(agent, "/startupz") == 200  # still accepting connections: not gone
    # ... and then: no request completes on a hung or dead engine.
    restart_s = wait_for(
        lambda: status_of(agent, "/livez") == 503, RESTART_AFTER_S + 6.0, f"{fault}: /livez 503"
    )
    live_body = agent.get("/livez")[1]
    assert restart_s >= RESTART_AFTER_S - 0.5 - INTERVAL_S, "restarted before restart_after"
    assert live_body.startswith("restart: unhealthy")
    metrics = agent.get("/metrics")[1]
    assert 'llm_health_agent_signal_ok{signal="live"} 0.0' in metrics
    healthy(sim, agent)  # the fault clears: /livez withdraws the restart


NO_RESTART_CASES = {
    name: case
    for name, case in zip(
        ["garbage_tokens", "wrong_model", "saturation", "slow", "overloaded"],
        [
            # the next known-answer probe (verify.every), then its slot
            ({"fault": "garbage_tokens"}, 503, "unhealthy: garbage output", VERIFY_S + INTERVAL_S),
            # the next /v1/models check (every verify.every)
            ({"served_model": "org/other-weights"}, 503, "unhealthy: wrong model", VERIFY_S),
            # the next /metrics read
            ({"metrics_waiting": 12}, 200, "degraded: 12 waiting ≥ 5", METRICS_S),
            ({"ttft": "300ms"}, 200, "degraded: ", INTERVAL_S),  # the next probe: slow, or silent
            ({"fault": "overloaded"}, 200, "degraded: overloaded", INTERVAL_S),
        ],
        strict=True,
    )
}


@timed
def test_faults_a_restart_would_not_cure_never_restart(
    pairs: list[tuple[SimProcess, AgentProcess]],
) -> None:
    """Each fault on a pair of its own, all at once; timeouts behind real work (busy, not
    hung) among them."""
    cases = {name: partial(no_restart, *case) for name, case in NO_RESTART_CASES.items()}
    side_by_side(pairs, {**cases, "busy": timeouts_while_requests_complete_are_busy_not_hung})


def no_restart(
    knobs: dict[str, Any],
    ready: int,
    says: str,
    within: float,
    sim: SimProcess,
    agent: AgentProcess,
) -> None:
    healthy(sim, agent)
    sim.set_fault(**knobs)

    def settled() -> bool:
        code, body = agent.get("/readyz")
        return code == ready and body.startswith(says)

    took = wait_for(settled, 10.0, f"{knobs}: /readyz {ready} {says!r}")
    assert took <= within + SLACK_S, f"{knobs}: after {took:.2f} s, bound {within:.2f} s"
    signalled = agent.status()["agent"]["restarts_signalled"]
    # Held well past restart_after: the kubelet is never asked to restart this engine.
    hold(agent, RESTART_AFTER_S + 1.5, {"/livez": 200, "/startupz": 200, "/readyz": ready})
    assert agent.status()["agent"]["restarts_signalled"] == signalled
    healthy(sim, agent)


def timeouts_while_requests_complete_are_busy_not_hung(
    sim: SimProcess, agent: AgentProcess
) -> None:
    """Probes time out behind real work (each in-flight request adds 400 ms of TTFT: six
    users make it ~2.4 s), but the engine admits new requests (its prompt-token counter
    moves: a user request starts every ~0.4 s): load, not health (docs/design.md §3.5),
    so OVERLOADED: Ready (DEGRADED keeps its share), never UNHEALTHY, never restarted."""
    healthy(sim, agent)
    sim.set_fault(fault="slow_under_load", load_ttft_per_request="400ms", ttft="20ms")
    stop = threading.Event()

    def user() -> None:
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 2, "stream": False}
        while not stop.is_set():
            with contextlib.suppress(OSError):
                http_json(f"http://{sim.address}/v1/completions", body, timeout=10)

    def overloaded() -> bool:
        code, body = agent.get("/readyz")
        return code == 200 and "behind a queue" in body

    users = [threading.Thread(target=user, daemon=True) for _ in range(6)]
    for thread in users:
        thread.start()
    try:
        wait_for(overloaded, 15.0, "busy engine: /readyz 200, overloaded behind a queue")
        hold(agent, RESTART_AFTER_S + 2.0, {"/livez": 200, "/readyz": 200})
        progress = agent.status()["agent"]["progress"]
        assert progress["moved_s_ago"] is not None and progress["moved_s_ago"] < RESTART_AFTER_S
    finally:
        stop.set()
        for thread in users:
            thread.join(15)
    healthy(sim, agent)


@timed
def test_every_answer_comes_from_memory_while_the_engine_hangs(
    pair: tuple[SimProcess, AgentProcess],
) -> None:
    sim, agent = pair
    healthy(sim, agent)
    sim.set_fault(fault="hang_before_headers")
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        for path in PATHS:
            started = time.perf_counter()
            code, _body = agent.get(path, timeout=2.0)
            times[path].append((time.perf_counter() - started) * 1000)
            assert code in (200, 503)
    every = [m for ms in times.values() for m in ms]
    seen = {path: (len(ms), statistics.median(ms), max(ms)) for path, ms in times.items()}
    assert statistics.median(every) < 10.0, f"(requests, p50 ms, max ms) while hung: {seen}"
    assert sum(m > 50.0 for m in every) <= len(every) // 100, (
        f"answers waited on the engine: {seen}"
    )
    assert max(every) < 500.0, f"(requests, p50 ms, max ms) while hung: {seen}"
    healthy(sim, agent)


# --- the engine's process -----------------------------------------------------------------


@timed
def test_startup_follows_the_engine_process(tmp_path: Path) -> None:
    """The agent starts before the engine; the engine is killed and a new one (serving
    another model) starts on the same port."""
    port = free_port()
    agent = AgentProcess(tmp_path, f"http://127.0.0.1:{port}", settings("openai-completions", None))
    sims: list[SimProcess] = []
    try:
        agent.start().wait_up()
        hold(agent, 1.5, {"/startupz": 503, "/readyz": 503, "/livez": 200, "/healthz": 200})
        sims.append(SimProcess(tmp_path, "first", "--ttft", "20ms", port=port).wait_up())
        wait_for(lambda: status_of(agent, "/startupz") == 200, 10.0, "/startupz 200")
        wait_for(lambda: status_of(agent, "/readyz") == 200, 10.0, "/readyz 200")
        assert agent.status()["agent"]["model"] == "sim-model"  # found in /v1/models
        sims[0].kill()
        gone_s = wait_for(lambda: status_of(agent, "/startupz") == 503, 5.0, "/startupz 503")
        assert gone_s <= INTERVAL_S + SLACK_S, f"/startupz 503 after {gone_s:.2f} s"
        hold(agent, 1.0, {"/startupz": 503, "/readyz": 503, "/livez": 200})
        sims.append(SimProcess(tmp_path, "second", "--model", "other-model", port=port).wait_up())
        wait_for(lambda: status_of(agent, "/startupz") == 200, 10.0, "/startupz 200 again")
        wait_for(lambda: status_of(agent, "/readyz") == 200, 10.0, "/readyz 200 again")
        state = agent.status()["agent"]
        assert state["model"] == "other-model"  # found again for the new process
        assert state["startup"]["engine_restarts"] == 1
        assert "llm_health_agent_engine_restarts_total 1.0" in agent.get("/metrics")[1]
    finally:
        agent.stop()
        for sim in sims:
            sim.stop()


# --- bad input ----------------------------------------------------------------------------


def run_agent(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_health.cli", "agent", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            (),
            "--engine URL is required: the engine in this pod, e.g. --engine http://127.0.0.1:8000",
        ),
        (
            ("--engine", "127.0.0.1:8000"),
            "write the scheme too, e.g. --engine http://127.0.0.1:8000",
        ),
        (("--engine", "https://127.0.0.1:8443"), "https is not supported"),
        (("--engine", "http://localhost:8000"), "'localhost' is a host name; write the IP address"),
        (("--engine", "http://127.0.0.1"), "give the engine's port"),
        (("--engine", "http://127.0.0.1:8000", "--http", "nowhere"), "write --http HOST:PORT"),
    ],
    ids=["no-engine", "no-scheme", "https", "hostname", "no-port", "bad-http"],
)
def test_bad_arguments_say_what_to_write(args: tuple[str, ...], says: str) -> None:
    done = run_agent(*args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("probe: {}\nalerts: {}\n", "agent.yaml:2 alerts: not used by the agent"),
        (
            "agent:\n  restart_after: soon\n",
            'agent.yaml:2 agent.restart_after: "soon" is not a duration',
        ),
        (
            "clusters:\n  - name: a\n    endpoints: [{address: 10.0.0.1:8000}]\n",
            "agent.yaml:1 clusters: not used by the agent; it probes --engine",
        ),
        ("probe: [\n", "agent.yaml:2 invalid YAML"),
        ("prbe: {}\n", 'agent.yaml:1 prbe: unknown key (did you mean "probe"?)'),
    ],
    ids=["serve-section", "bad-duration", "clusters", "bad-yaml", "unknown-key"],
)
def test_a_bad_file_is_refused_with_its_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    done = run_agent("--engine", "http://127.0.0.1:8000", "--config", str(path))
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_agent("--engine", "http://127.0.0.1:8000", "--http", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "Traceback" not in done.stderr


# --- hostile HTTP -------------------------------------------------------------------------


@pytest.fixture
def lone_agent(tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent whose engine is not there (its answers: 503, 503, 200, 200)."""
    agent = AgentProcess(tmp_path, f"http://127.0.0.1:{free_port()}", settings())
    try:
        yield agent.start().wait_up()
    finally:
        code, took = agent.stop()
        assert code == 0 and took < 2.0


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def refused(answer: bytes) -> bool:
    """An HTTP 400 or 431 (aiohttp answers HTTP/1.0 to what is not HTTP/1.1)."""
    return answer.startswith(b"HTTP/1.") and answer[8:12] in (b" 400", b" 431")


def test_garbage_and_huge_requests_get_an_answer(lone_agent: AgentProcess) -> None:
    port = lone_agent.http_port
    for junk in (
        b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n",
        b"GET\r\n\r\n",
        b"\x00" * 100 + b"\r\n\r\n",
    ):
        assert refused(raw(port, junk)), junk
    huge = b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    assert refused(raw(port, huge))
    many = b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n"
    assert refused(raw(port, many))
    assert lone_agent.get("/healthz") == (200, "ok\n")
    assert lone_agent.process is not None and lone_agent.process.poll() is None


@timed
def test_idle_connections_do_not_starve_the_kubelet(lone_agent: AgentProcess) -> None:
    port = lone_agent.http_port
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        answered, failed = 0, []
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            try:
                code, body = lone_agent.get("/readyz", timeout=2.0)
                # No engine: STARTING until its first failures count, then UNHEALTHY.
                assert code == 503 and body.startswith(("starting: ", "unhealthy: ")), body
                answered += 1
            except OSError as exc:
                failed.append(repr(exc))
            time.sleep(0.05)
        assert not failed, f"{len(failed)} failed, {answered} answered: {failed[:3]}"
    finally:
        for sock in idle:
            sock.close()
    assert lone_agent.get("/healthz")[0] == 200
