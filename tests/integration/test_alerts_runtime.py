"""Alerts inside the real runtime: a hanging webhook and an unreachable one must never
delay probing. A flapping simulator (half its answers are CUDA errors) makes the runtime
raise an alert every few probes while the prober's schedule is measured from the
probe start times it reports."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from llm_health.alerts.component import AlertsComponent
from llm_health.model.outcome import ProbeResult
from tests.alerts_receiver import Receiver
from tests.configs import plugin_yaml
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.processes import SimProcess
from tests.runtime import Running

# timed: the gaps between probe starts are measured against 0.4 s.
pytestmark = pytest.mark.timed
INTERVAL_S = 0.1
RUN_S = 4.0
# A probe may start late by scheduling noise on a busy 2-core machine, never by a
# webhook: a blocked prober would show gaps of the webhook timeout (10 s) or more.
MAX_GAP_S = INTERVAL_S + 0.3

PROBE = {
    "model": "sim-model",
    "interval": "100ms",
    "timeout": "500ms",
    "healthy_ttft": "300ms",
    "healthy_after": 1,
    "unhealthy_after": 1,
}


async def test_slow_and_unreachable_webhooks_never_delay_probing(tmp_path: Path) -> None:
    hanging = await Receiver(hang=True).start()
    sim = SimProcess(
        tmp_path, "flaky", "--fault", "cuda_error", "--fault-rate", "0.5", "--seed", "7",
        "--ttft", "10ms", "--tpot", "0ms",
    )  # fmt: skip
    try:
        await asyncio.to_thread(sim.wait_up)
        webhooks = [
            {"url": hanging.url, "timeout": "10s"},
            {"url": f"http://127.0.0.1:{free_port()}/hook", "timeout": "1s"},  # nobody listens
        ]
        text = plugin_yaml(
            [sim],
            cluster="llama-70b",
            probe=PROBE,
            xds={"warm_start_timeout": "1s"},
            alerts={"retry_backoff": "50ms", "webhooks": webhooks},
        )
        running = Running.from_config(text, "alerts.yaml")
        runtime = running.runtime
        starts: list[float] = []

        def on_probe(_cluster: str, _address: str, result: ProbeResult) -> None:
            starts.append(result.started_at)

        runtime.control.on_probe(on_probe)
        async with running:
            await asyncio.sleep(RUN_S)  # let the webhooks hang, fail and retry meanwhile
            # the probe count is about events, not about how fast this machine ran RUN_S
            await wait_until_async(
                lambda: len(starts) >= 0.8 * RUN_S / INTERVAL_S, RUN_S, "the probes of RUN_S"
            )
            alerts = next(c for c in runtime.components if isinstance(c, AlertsComponent))
            status = alerts.status()
            stopping = time.monotonic()  # the block's end stops the runtime
        stop_s = time.monotonic() - stopping
    finally:
        sim.stop()
        await hanging.stop()

    # the webhooks were really exercised: many alerts, one POST hanging, retries failing
    assert status["events"] >= 6, status
    assert len(hanging.requests) == 1
    hooks = status["webhooks"]
    assert hooks[0]["queued"] + hooks[0]["rate_limited"] >= 4, hooks[0]
    assert hooks[1]["retried"] >= 2, hooks[1]
    assert hooks[0]["sent"] == hooks[1]["sent"] == 0
    # ... and the prober kept its schedule
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 0.8 * RUN_S / INTERVAL_S, len(starts)
    assert max(gaps) <= MAX_GAP_S, sorted(gaps)[-5:]
    # shutdown does not wait for the hanging delivery
    assert stop_s < 2.0, stop_s
