"""A hostile config file written under a running `llm-health serve` (no Envoy needed): the
reload is rejected, the process keeps serving and probing, and stops cleanly
(docs/design.md §6.4, §7.11). Once, a self-referencing anchor crashed it (RecursionError).
"""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_until
from tests.processes import PluginProcess, SimProcess

HOSTILE = {
    "recursive-anchor": "x: &x [*x]\nclusters: [{name: a, endpoints: [{address: 10.0.0.1:80}]}]\n",
    "deep-nesting": "x: " + "[" * 600 + "]" * 600 + "\n",
    "billion-laughs": "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    ),
}


def livez(plugin: PluginProcess) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{plugin.http_port}/livez", timeout=5) as response:
        return int(response.status)


def last_probe_at(plugin: PluginProcess) -> str | None:
    endpoint = plugin.status()["clusters"][0]["endpoints"][0]
    last: dict[str, Any] | None = endpoint["last_probe"]
    return None if last is None else str(last["at"])


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_reload_is_rejected_and_serving_goes_on(tmp_path: Path, name: str) -> None:
    sim = SimProcess(tmp_path, "gpu", "--ttft", "20ms", "--tpot", "2ms")
    plugin = PluginProcess(
        tmp_path / "plugin",
        {
            "probe": {"model": "sim-model", "interval": "200ms"},
            "clusters": [{"name": "llm", "endpoints": [{"address": sim.address}]}],
        },
    )
    try:
        sim.wait_up()
        plugin.start().wait_ready()
        wait_until(lambda: plugin.states() == {sim.address: "healthy"}, 15, "a healthy endpoint")

        plugin.config_path.write_text(HOSTILE[name], encoding="utf-8")
        assert plugin.process is not None
        plugin.process.send_signal(signal.SIGHUP)  # (the file watcher would also see it)
        wait_until(lambda: plugin.status()["reloads"]["rejected"] >= 1, 10, "a rejected reload")

        # Still alive, still serving, still probing.
        assert plugin.process.poll() is None, plugin.log_tail()
        assert livez(plugin) == 200
        status = plugin.status()
        assert status["reloads"]["applied"] == 0
        assert [c["name"] for c in status["clusters"]] == ["llm"]
        before = last_probe_at(plugin)
        wait_until(lambda: last_probe_at(plugin) != before, 10, "a probe after the reload")
        assert plugin.states() == {sim.address: "healthy"}

        records = [
            r
            for r in plugin.log_records()
            if str(r.get("msg", "")).startswith("config reload rejected")
        ]
        assert records, plugin.log_tail()
        assert all("Traceback" not in str(r) for r in plugin.log_records())
    finally:
        code, _seconds = plugin.stop()
        sim.stop()
    assert code == 0, plugin.log_tail()
