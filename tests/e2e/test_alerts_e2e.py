"""End to end: `llm-health serve` (a subprocess) alerts a real webhook receiver when a
simulated backend dies with a CUDA error and when it recovers.

The receiver fails every event twice (500) before accepting it: each event must be
delivered exactly once. The webhook's bearer token comes from the environment
(``${ALERT_TOKEN}``) and must appear neither in the plugin's log nor in /status.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.alerts_receiver import Receiver
from tests.polling import wait_until_async
from tests.processes import PluginProcess, SimProcess

TOKEN = "e2e-alert-token-0123456789"
CLUSTER = "llama-70b"


async def test_fatal_and_recovery_alerts_reach_a_flaky_receiver_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALERT_TOKEN", TOKEN)
    receiver = await Receiver(fail_first=2, fail_status=500).start()
    sim = SimProcess(tmp_path, "gpu", "--ttft", "20ms", "--tpot", "2ms")
    plugin: PluginProcess | None = None
    try:
        await asyncio.to_thread(sim.wait_up)
        settings = {
            "probe": {"model": "sim-model", "interval": "200ms", "healthy_after": 2},
            "xds": {"warm_start_timeout": "2s"},
            "alerts": {
                "retry_backoff": "100ms",
                "webhooks": [
                    {
                        "url": receiver.url,
                        "on": ["unhealthy", "recovered", "fatal"],
                        "headers": {"Authorization": "Bearer ${ALERT_TOKEN}"},
                        "timeout": "2s",
                    }
                ],
            },
            "clusters": [{"name": CLUSTER, "endpoints": [{"address": sim.address}]}],
        }
        plugin = PluginProcess(tmp_path / "plugin", settings).start()
        await asyncio.to_thread(plugin.wait_ready)
        await wait_state(plugin, sim.address, "healthy")

        await asyncio.to_thread(sim.set_fault, fault="cuda_error")
        [fatal] = await receiver.wait_accepted(1, within_s=10.0)
        await wait_state(plugin, sim.address, "unhealthy")
        await asyncio.to_thread(sim.set_fault, fault="none")
        delivered = await receiver.wait_accepted(2, within_s=10.0)
        await asyncio.sleep(1.0)  # more probes, unhealthy nowhere: nothing else may come
        status = await asyncio.to_thread(plugin.status)
        log_text = plugin.log_path.read_text(errors="replace")
    finally:
        if plugin is not None:
            plugin.stop()
        sim.stop()
        await receiver.stop()

    assert [d["event"] for d in receiver.accepted()] == ["fatal", "recovered"]
    recovered = delivered[1]
    for body in delivered:
        assert receiver.attempts(body["id"]) == 3
    assert fatal["events"] == ["fatal", "unhealthy"]
    assert (fatal["cluster"], fatal["endpoint"], fatal["state"]) == (
        CLUSTER,
        sim.address,
        "unhealthy",
    )
    assert "CUDA error" in fatal["reason"]
    assert fatal["timings"]["outcome"] == "fatal"
    assert fatal["timings"]["status"] == 500
    assert (recovered["previous"], recovered["state"]) == ("unhealthy", "healthy")
    assert recovered["timings"]["ttft_ms"] > 0
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in receiver.requests)

    alerts = status["alerts"]
    assert (alerts["sent"], alerts["retried"], alerts["failed"]) == (2, 4, 0)
    assert TOKEN not in str(status)
    assert TOKEN not in log_text
    assert "alert delivery failed, retrying" in log_text


async def wait_state(plugin: PluginProcess, address: str, state: str) -> None:
    async def reached() -> bool:
        return (await asyncio.to_thread(plugin.states)).get(address) == state

    await wait_until_async(reached, 10, f"{address} to become {state}", interval=0.05)
