"""Engine checks seen by a real Envoy (docs/design.md §14): a saturated engine (its own
/metrics says 12 waiting) keeps 30 % of its weight within 3 × engine_metrics.interval; a
garbage-producing one is UNHEALTHY; both come back when the engine does."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.test_gateway import FAST, envoy_view, stack  # noqa: F401 (fixture)
from tests.polling import wait_until


@pytest.mark.envoy
def test_saturation_and_garbage_reach_envoy(stack: Any) -> None:  # noqa: F811
    busy, broken, fine = (stack.sim(name, *FAST) for name in ("busy", "broken", "fine"))
    for sim in (busy, broken, fine):
        sim.wait_up()
    plugin = stack.plugin(
        [busy, broken, fine],
        healthy_after=2,
        verify={"every": "2s"},
        engine_metrics={"interval": "500ms"},
    ).start()
    plugin.wait_ready()
    envoy = stack.envoy(plugin).start()
    everyone = {s.address: ("HEALTHY", 100) for s in (busy, broken, fine)}
    wait_until(lambda: envoy_view(envoy) == everyone, 15, "Envoy to route to all three")

    busy.set_fault(metrics_waiting=12)
    broken.set_fault(fault="garbage_tokens")
    started = time.monotonic()
    wait_until(lambda: envoy_view(envoy)[busy.address] == ("HEALTHY", 30), 5, "busy at 30")
    saturated_after = time.monotonic() - started
    wait_until(lambda: envoy_view(envoy)[broken.address][0] == "UNHEALTHY", 2 + 3, "broken out")
    assert saturated_after <= 3 * 0.5 + 1.0, saturated_after  # 3 intervals + push
    status = plugin.status()
    (cluster,) = [c for c in status["clusters"] if c["name"] == "llama-70b"]
    endpoints = {e["address"]: e for e in cluster["endpoints"]}
    assert endpoints[busy.address]["cause"] == "saturated"
    assert endpoints[busy.address]["reason"] == "12 waiting ≥ 5"
    assert endpoints[broken.address]["cause"] == "garbage_output"
    assert envoy_view(envoy)[fine.address] == ("HEALTHY", 100)

    busy.set_fault(metrics_waiting=None)
    broken.set_fault(fault="none")
    wait_until(lambda: envoy_view(envoy) == everyone, 10, "Envoy to route to all three again")
    assert envoy.stat("cluster.llama-70b.update_rejected", 0) == 0
