"""``llm-health sim`` as a real process: start-up line, HTTP, clean exit on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.ports import free_port, free_port_block
from tests.processes import START_WITHIN_S

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugin"
START_TIMEOUT_S = START_WITHIN_S


@contextmanager
def sim_process(*args: str) -> Iterator[subprocess.Popen[str]]:
    """Start ``python -m llm_health.cli sim ARGS``; always killed on exit."""
    env = {**os.environ, "PYTHONPATH": str(PLUGIN_DIR), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_health.cli", "sim", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=5)


def wait_for_line(process: subprocess.Popen[str]) -> str:
    """The first stdout line (the start-up announcement), waited for at most START_TIMEOUT_S."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    assert readable, "sim printed nothing in time"
    line = process.stdout.readline()
    assert line, f"sim exited early: rc={process.poll()}"
    return line.strip()


def get(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read()


@pytest.mark.timed  # a Python process exiting within 2 s of the signal
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sim_serves_and_exits_cleanly_on_signal(signum: signal.Signals) -> None:
    port = free_port()
    with sim_process("--port", str(port), "--model", "m1", "--fault", "hang_after_headers") as sim:
        line = wait_for_line(sim)
        url = f"http://127.0.0.1:{port}"
        assert line == f"llm-health sim listening on {url} (model m1, fault hang_after_headers)"
        status, body = get(f"http://127.0.0.1:{port}/health")
        assert status == 200
        status, body = get(f"http://127.0.0.1:{port}/sim/fault")
        assert json.loads(body)["fault"] == "hang_after_headers"
        sim.send_signal(signum)
        assert sim.wait(timeout=2) == 0


def test_sim_serves_a_block_of_ports_with_one_state() -> None:
    port = free_port_block(3)
    with sim_process("--port", str(port), "--port-count", "3", "--ttft", "1ms") as sim:
        line = wait_for_line(sim)
        assert line.endswith(f"(model sim-model, fault none, ports {port}-{port + 2})")
        body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
        for offset in range(3):
            status, _ = get(f"http://127.0.0.1:{port + offset}/v1/completions", body)
            assert status == 200
        _, stats = get(f"http://127.0.0.1:{port + 1}/sim/stats")
        assert json.loads(stats)["completed"] == 3
        sim.send_signal(signal.SIGTERM)
        assert sim.wait(timeout=2) == 0


def test_bad_duration_is_a_usage_error() -> None:
    with sim_process("--port", "9", "--ttft", "soon") as sim:
        _, err = sim.communicate(timeout=START_TIMEOUT_S)
    assert sim.returncode == 2
    assert '--ttft: "soon" is not a duration' in err


def test_busy_port_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with sim_process("--port", str(port)) as sim:
            _, err = sim.communicate(timeout=START_TIMEOUT_S)
    assert sim.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err
