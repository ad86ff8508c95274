"""Hostile backends and a starved prober (docs/design.md §7.4, §7.10, §10).

- A backend that echoes the request headers in its 500 body must not put the probe's
  bearer token into /status, the admin snapshot, a state-change reason or a log line.
- A prober whose event loop is blocked while the first token arrives must not call a
  healthy endpoint SLOW: its TTFT is corrected by the lag measured around the probe.
The simulators run in their own processes here, so blocking this test's loop delays only
the prober, as a CPU-starved plugin would be.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from llm_health.config import ProbeSettings
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.redact import REDACTED, printable_line, redact_secrets, secret_forms
from llm_health.model.states import State
from llm_health.probe.client import MicroProbe
from llm_health.probe.http1 import STAMPS, Connections
from llm_health.probe.lag import LoopLagMonitor
from tests.configs import plugin_yaml
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running
from tests.started import probe_once

SECRET = "SECRET123"
PROBE = {
    "interval": "300ms",
    "timeout": "800ms",
    "headers": {"Authorization": "Bearer ${VLLM_API_KEY}"},
}


def test_redaction_rules() -> None:
    secrets = secret_forms(["Bearer SECRET123", "abc"])
    assert secrets == {"Bearer SECRET123", "SECRET123"}  # too short a value is not a secret
    text = "headers Authorization: Bearer SECRET123; X-Key: SECRET123SECRET123"
    assert SECRET not in redact_secrets(text, secrets)
    assert redact_secrets(text, secrets).count(REDACTED) == 3
    assert printable_line("drain\x1b[31m now\n\u202eok", 100) == "drain [31m now ok"


@pytest.mark.sim_args("--ttft", "20ms")
async def test_echoed_token_never_leaves_the_plugin(
    sim_process: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    sim_process.set_fault(fault="http_500_echo")
    text = plugin_yaml([sim_process], probe=PROBE)
    running = Running.from_config(text, "secrets.yaml", {"VLLM_API_KEY": SECRET})
    runtime = running.runtime
    caplog.set_level(logging.DEBUG)
    async with running:

        def unhealthy() -> bool:
            (endpoint,) = runtime.control.snapshot().clusters["llama"].endpoints
            return endpoint.state is State.UNHEALTHY

        await wait_until_async(unhealthy, 10, "the echoing backend to be taken out")
    (endpoint,) = runtime.control.snapshot().clusters["llama"].endpoints
    assert endpoint.last is not None and "upstream rejected" in endpoint.last.detail
    assert REDACTED in endpoint.last.detail  # the echo was there, and was scrubbed
    status = json.dumps(runtime.status())
    assert "upstream rejected" in status
    assert SECRET not in status
    assert SECRET not in endpoint.last.detail and SECRET not in endpoint.reason
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "upstream rejected" in logged  # the state change was logged with its detail
    assert SECRET not in logged


CARRIERS = [
    pytest.param(False, id="transport"),
    pytest.param(
        True, id="kernel-stamps", marks=pytest.mark.skipif(not STAMPS, reason="no SO_TIMESTAMPNS")
    ),
]


async def _probe_with_blocked_loop(
    ttft: str, healthy_ttft: str, tmp_path: Path, *, stamped: bool
) -> ProbeResult:
    """One probe of a simulator with ``ttft`` while this loop is blocked 100 ms from
    50 ms after the request: the token arrives during the block. ``stamped``: its bytes
    timed by the kernel (``http1.stamped.StampedSocket``), else by the loop's transport read."""
    process = SimProcess(tmp_path, f"lag-{ttft}", "--ttft", ttft)
    try:
        process.wait_up()
        settings = ProbeSettings.model_validate(
            {"timeout": "2s", "healthy_ttft": healthy_ttft, "model": "sim-model"}
        )
        target = settings.to_target("c", process.address)
        lag = LoopLagMonitor(tick_s=0.005)
        ticker = asyncio.create_task(lag.run())
        try:
            async with Connections(stamped=stamped) as connections:
                prober = MicroProbe(connections, lag)
                await probe_once(prober, target)  # connection and engine warm
                await asyncio.sleep(0.05)
                loop = asyncio.get_running_loop()
                loop.call_later(0.05, time.sleep, 0.1)  # the starved prober
                return await probe_once(prober, target)
        finally:
            ticker.cancel()
    finally:
        process.stop()


@pytest.mark.timed  # it blocks its own loop for 100 ms and times the probe around it
@pytest.mark.parametrize("stamped", CARRIERS)
async def test_lag_during_the_read_does_not_make_a_fast_endpoint_slow(
    tmp_path: Path, stamped: bool
) -> None:
    result = await _probe_with_blocked_loop("60ms", "120ms", tmp_path, stamped=stamped)
    assert result.ttft_ms is not None
    if stamped:  # timed by the kernel: the block is not in it at all
        assert result.ttft_ms < 120, result
    else:  # timed when read: the block is in it (raw: SLOW), and taken off again
        assert result.ttft_ms > 120, result
    assert result.loop_lag_ms >= 60, result
    assert result.outcome is Outcome.FAST, result


@pytest.mark.timed  # as above
@pytest.mark.parametrize("stamped", CARRIERS)
async def test_a_really_slow_endpoint_stays_slow_under_lag(tmp_path: Path, stamped: bool) -> None:
    result = await _probe_with_blocked_loop("350ms", "120ms", tmp_path, stamped=stamped)
    assert result.loop_lag_ms >= 60, result
    assert result.outcome is Outcome.SLOW, result
