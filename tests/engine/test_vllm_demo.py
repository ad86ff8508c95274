"""``make demo-vllm`` on real vLLM (docs/engines/vllm.md, "The demo"), a short run: three
servers behind ``serve`` and a real Envoy, vllm-b's EngineCore frozen for the middle third,
vllm-c saturated by streamed users for the whole run. From what the demo prints: the
frozen server was UNHEALTHY while frozen, the saturated one judged busy (DEGRADED), and
every process the demo started (the servers with their EngineCore and worker, the users,
serve, Envoy) is gone once it has ended. That the saturated one is never UNHEALTHY is
tests/engine/test_vllm_busy.py's to prove: three engines share these two cores here, and
one run in three showed it UNHEALTHY for 6 s at the load's onset (docs/engines/vllm.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_health.demo.engine import children
from tests.engine.vllm import is_alive, process_name
from tests.processes import ROOT

DURATION_S = 40.0
RUN_WITHIN_S = (
    480.0  # three servers' start (about a minute here, 3 minutes on a busy CI), then the run
)
pytestmark = [pytest.mark.timeout(600)]


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, with its command line."""
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            found[child] = process_name(child)
            todo.append(child)
    return found


def run_demo(venv: Path, model: Path, out: Path) -> tuple[int, str, dict[int, str]]:
    """Runs the demo to its end: (exit code, what it printed, every process it started,
    sampled every half second while it ran)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "plugin"),
        "PYTHONUNBUFFERED": "1",
        "LLM_HEALTH_VLLM": str(venv),
        "LLM_HEALTH_VLLM_MODEL": str(model),
    }
    command = [sys.executable, "-m", "llm_health.demo", "--engine", "vllm",
               "--duration", str(DURATION_S)]  # fmt: skip
    started: dict[int, str] = {}
    with out.open("wb") as log:
        demo = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + RUN_WITHIN_S
            while demo.poll() is None and time.monotonic() < deadline:
                # A process that has exited but is not yet reaped reads as "": keep its name.
                started.update((pid, c) for pid, c in descendants(demo.pid).items() if c)
                time.sleep(0.5)
        finally:
            if demo.poll() is None:
                demo.terminate()  # the demo's own stop runs on SIGTERM too
            code = demo.wait(60)
    return code, out.read_text(errors="replace"), started


def summary(text: str, name: str) -> str:
    """The demo's summary line for ``name`` ("  vllm-c: DEGRADED 38 s, HEALTHY 2 s")."""
    (line,) = re.findall(rf"^  {re.escape(name)}: (.*)$", text, flags=re.MULTILINE)
    return str(line)


def test_the_demo_shows_frozen_out_and_saturated_in_and_stops_everything(
    vllm_venv: Path, vllm_model: Path, tmp_path: Path
) -> None:
    code, text, started = run_demo(vllm_venv, vllm_model, tmp_path / "demo.out")
    assert code == 0, text[-3000:]
    assert "EngineCore" in " ".join(started.values()), started  # sampled while it ran
    assert any("llm_health.demo.users" in c for c in started.values()), started
    left = {pid: c for pid, c in started.items() if is_alive(pid) and process_name(pid) == c}
    assert not left, f"still running after the demo: {left}"
    frozen = summary(text, "vllm-b while frozen")
    assert "UNHEALTHY" in frozen, text[-3000:]
    assert "UNHEALTHY after the freeze: never" not in text, text[-3000:]
    saturated = summary(text, "vllm-c")
    assert "DEGRADED" in saturated, text[-3000:]  # it was busy, and said so
