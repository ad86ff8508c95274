"""Hot reload through a real plugin process and a real Envoy (docs/design.md §6.4)."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import yaml

from tests.e2e.test_gateway import CLUSTER, FAST, envoy_view, stack  # noqa: F401
from tests.polling import wait_until

pytestmark = pytest.mark.envoy


def rewrite(plugin: Any, mutate: Any) -> None:
    settings = yaml.safe_load(plugin.config_path.read_text())
    mutate(settings)
    plugin.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))


def test_reload_add_remove_retune_then_reject_invalid(stack: Any) -> None:  # noqa: F811
    a, b = stack.sim("a", *FAST), stack.sim("b", *FAST)
    slowish = stack.sim("slowish", "--ttft", "400ms", "--tpot", "2ms")
    newcomer = stack.sim("new", *FAST)
    for sim in (a, b, slowish, newcomer):
        sim.wait_up()
    # Engine metrics off: this test is about reload. With them, slowish's timeouts after
    # its own prefill read as admission (docs/design.md §3.5, "Known gap").
    no_metrics = {"path": None}
    plugin = (
        stack.plugin([a, b, slowish], drain_time="2s", healthy_after=2, engine_metrics=no_metrics)
        .start()
        .wait_ready()
    )
    envoy = stack.envoy(plugin).start()
    wait_until(
        lambda: (
            plugin.states()
            == {a.address: "healthy", b.address: "healthy", slowish.address: "degraded"}
        ),
        10,
        "initial states",
    )
    wait_until(lambda: len(envoy_view(envoy)) == 3, 10, "3 hosts in Envoy")

    def change(settings: dict[str, Any]) -> None:
        endpoints = settings["clusters"][0]["endpoints"]
        endpoints[:] = [e for e in endpoints if e["address"] != b.address]
        endpoints.append({"address": newcomer.address})
        settings["probe"]["timeout"] = "300ms"  # slowish (TTFT 400 ms) now times out
        settings["probe"]["healthy_ttft"] = "100ms"

    rewrite(plugin, change)  # picked up by the file watcher, no signal needed
    wait_until(lambda: plugin.states().get(newcomer.address) == "healthy", 15, "newcomer healthy")
    wait_until(lambda: plugin.states().get(slowish.address) == "unhealthy", 10, "slowish unhealthy")
    assert plugin.states()[a.address] == "healthy"  # unchanged endpoint kept its state
    wait_until(
        lambda: b.address not in plugin.states(), 10, "removed endpoint gone after drain_time"
    )
    want = {
        a.address: ("HEALTHY", 100),
        slowish.address: ("UNHEALTHY", 100),
        newcomer.address: ("HEALTHY", 100),
    }
    wait_until(lambda: envoy_view(envoy) == want, 10, f"Envoy to show {want}")
    assert plugin.status()["reloads"]["applied"] >= 1

    before = plugin.status()
    plugin.config_path.write_text("clusters:\n  - name: x\n    endpoints: [{address: nope}]\n")
    assert plugin.process is not None
    plugin.process.send_signal(signal.SIGHUP)
    wait_until(lambda: plugin.status()["reloads"]["rejected"] > 0, 5, "the reload to be rejected")
    after = plugin.status()
    assert after["reloads"]["rejected"] >= 1
    assert [c["name"] for c in after["clusters"]] == [c["name"] for c in before["clusters"]]
    assert plugin.states() == {
        a.address: "healthy",
        slowish.address: "unhealthy",
        newcomer.address: "healthy",
    }
    assert envoy_view(envoy) == want
    errors = [
        r for r in plugin.log_records() if r.get("msg", "").startswith("config reload rejected")
    ]
    assert errors and any("endpoints[0].address" in e for e in errors[0]["errors"])
