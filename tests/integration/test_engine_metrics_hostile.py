"""One backend's hostile /metrics blinds the prober for nobody (docs/engines.md, "Bounds
of a /metrics read"): through the real runtime, beside a simulator whose /metrics is
4 MiB of line breaks and then more samples of one series than any engine writes (its
probes answered normally), another simulator that hangs is out within interval +
timeout + 1.3 s, as it is alone (tests/integration/test_silence_runtime.py). The
hostile document is refused every read, counted, and logged once."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from llm_health.app.runtime import Runtime
from llm_health.engines.metrics import MAX_LINES
from llm_health.model.states import State
from tests.configs import plugin_yaml
from tests.polling import wait_until_async
from tests.processes import SimProcess
from tests.runtime import Running, runtime_from

# alone: a 4 MiB document read again and again loads the machine while the hung endpoint
# must be out within interval + timeout + 1.3 s.
pytestmark = pytest.mark.alone
INTERVAL_S, TIMEOUT_S = 1.0, 0.8
OUT_WITHIN_S = INTERVAL_S + TIMEOUT_S + 1.3
PROBE = {
    "interval": "1s",
    "timeout": "800ms",
    "healthy_ttft": "200ms",
    "model": "sim-model",
    "engine_metrics": {"interval": "1s"},
}
REFUSED = f"over {MAX_LINES} lines of the series read"
LOGGED = "engine /metrics past a read's bounds, ignored"


def state(runtime: Runtime, sim: SimProcess) -> State:
    (found,) = [
        e.state
        for e in runtime.control.snapshot().clusters["llama"].endpoints
        if e.spec.address == sim.address
    ]
    return found


def checks(runtime: Runtime) -> dict[str, Any]:
    found: dict[str, Any] = runtime.component_status()["engines"]
    return found


@pytest.mark.sims(2, "--ttft", "30ms", prefix="hostile-metrics")
async def test_a_hung_backend_is_out_in_time_beside_a_hostile_metrics_document(
    sims: list[SimProcess], caplog: pytest.LogCaptureFixture
) -> None:
    hostile, hung = sims
    await asyncio.to_thread(hostile.set_fault, metrics="hostile")
    caplog.set_level(logging.WARNING, logger="llm_health")
    runtime = runtime_from(plugin_yaml(sims, probe=PROBE), "hostile-metrics.yaml")
    async with Running(runtime):
        await wait_until_async(
            lambda: {state(runtime, s) for s in sims} == {State.HEALTHY}, 20, "both HEALTHY"
        )
        await wait_until_async(
            lambda: checks(runtime)["metrics_reads_total"] >= 6, 15, "three reads of each"
        )
        await asyncio.to_thread(hung.set_fault, fault="hang_after_headers")
        started = time.monotonic()
        await wait_until_async(
            lambda: state(runtime, hung) is State.UNHEALTHY,
            OUT_WITHIN_S + 5,
            "the hung backend to be taken out",
        )
        took = time.monotonic() - started
        found = checks(runtime)
        hostile_state = state(runtime, hostile)
    assert took <= OUT_WITHIN_S, took
    assert hostile_state is State.HEALTHY  # its probes are answered: no verdict on /metrics
    endpoint = found["endpoints"][f"llama/{hostile.address}"]
    assert endpoint["metrics_error"] == REFUSED
    assert found["metrics_overruns_total"] >= 3
    logged = [r for r in caplog.records if r.getMessage() == LOGGED]
    assert [getattr(r, "endpoint", None) for r in logged] == [hostile.address]
