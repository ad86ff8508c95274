"""End to end with a token: simulators -> `llm-health serve` with ``server.token`` -> a
real Envoy from the shipped envoy-configs/remote-token.yaml (ADS + HDS + ext_authz,
``initial_metadata: authorization: Bearer ...``), rendered for test ports on 127.0.0.1.

- the right token: Envoy's EDS push is accepted, its HDS stream is served (the node joins
  the plugin's HDS fleet), ext_authz answers, and user requests are routed;
- a wrong token: every stream is refused (UNAUTHENTICATED, counted in /status) and Envoy
  is left without endpoints: users get 503.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_health.bootstrap import render_bootstrap, walk
from tests.e2e.test_gateway import send
from tests.envoy_harness import EnvoyProcess
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import PluginProcess, SimProcess

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "envoy-configs" / "remote-token.yaml"
CLUSTER = "llama-70b"
TOKEN = "e2e-token-0123456789abcdef"
FAST = ("--ttft", "20ms", "--tpot", "2ms")


def set_token(config: dict[str, Any], token: str) -> int:
    """Replace the value of every ``authorization`` initial_metadata entry; returns how many
    grpc_services carry one (ADS, HDS, ext_authz and access logs: 4)."""
    count = 0
    for node in walk(config):
        for entry in node.get("initial_metadata", []):
            if entry.get("key") == "authorization":
                entry["value"] = f"Bearer {token}"
                count += 1
    return count


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Callable[[str], tuple[PluginProcess, EnvoyProcess, str]]]:
    """``start(envoy_token)``: two sims, the plugin with ``server.token = TOKEN``, and an
    Envoy sending ``envoy_token``. Every process is stopped at teardown."""
    started: list[Any] = []

    def start(envoy_token: str) -> tuple[PluginProcess, EnvoyProcess, str]:
        sims = [SimProcess(tmp_path, f"s{i}", *FAST) for i in range(2)]
        started.extend(sims)
        for sim in sims:
            sim.wait_up()
        plugin = PluginProcess(
            tmp_path / "plugin",
            {
                "probe": {"model": "sim-model"},
                "xds": {"warm_start_timeout": "5s"},
                "clusters": [
                    {"name": CLUSTER, "endpoints": [{"address": s.address} for s in sims]}
                ],
            },
        )
        started.append(plugin)
        settings = yaml.safe_load(plugin.config_path.read_text())
        settings["server"]["token"] = "${LLM_HEALTH_TEST_TOKEN}"
        plugin.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
        with _env(LLM_HEALTH_TEST_TOKEN=TOKEN):
            plugin.start()
        plugin.wait_ready()

        listener = free_port()
        carried: list[int] = []
        rendered = render_bootstrap(
            SHIPPED,
            tmp_path / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=listener,
            admin_port=0,
            initial_fetch_timeout="2s",
            extra=lambda c: carried.append(set_token(c, envoy_token)),
        )
        assert carried == [4]  # xDS, HDS, ext_authz and the access-log service
        envoy = EnvoyProcess(rendered, workdir=tmp_path / "envoy")
        started.append(envoy)
        envoy.start()
        return plugin, envoy, f"http://127.0.0.1:{listener}/v1/completions"

    yield start
    for process in reversed(started):
        with contextlib.suppress(Exception):
            process.stop()


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def envoy_view(envoy: EnvoyProcess) -> dict[str, str]:
    return {a: h["eds_health_status"] for a, h in envoy.host_statuses(CLUSTER).items()}


def test_envoy_with_the_token_gets_endpoints_hds_and_routes(stack: Any) -> None:
    plugin, envoy, url = stack(TOKEN)
    addresses = set(plugin.states())
    wait_until(lambda: envoy_view(envoy) == dict.fromkeys(addresses, "HEALTHY"), 10, "EDS in Envoy")
    assert envoy.stat(f"cluster.{CLUSTER}.update_rejected", 0) == 0
    statuses = send(url, 20)
    assert statuses.count(200) == 20, statuses
    status = plugin.status()
    assert status["grpc_auth"] == {"mode": "bearer token", "rejected_total": 0, "tls": False}
    assert sum(v["acks"] for v in status["xds"].values()) >= 1
    wait_until(
        lambda: [n["node"] for n in plugin.status()["hds"]["nodes"]] == ["gateway-1"],
        10,
        "Envoy's HDS stream in the plugin's fleet",
    )
    wait_until(lambda: plugin.status()["authz"]["checks"] >= 20, 5, "ext_authz checks")
    assert TOKEN not in plugin.log_path.read_text()


def test_envoy_with_a_wrong_token_gets_no_endpoints(stack: Any) -> None:
    plugin, envoy, url = stack("not-the-token-0123456789abcdef")
    wait_until(lambda: plugin.status()["grpc_auth"]["rejected_total"] >= 2, 10, "refusals")
    assert envoy.host_statuses(CLUSTER) == {}
    assert envoy.stat(f"cluster.{CLUSTER}.update_success", 0) == 0
    assert send(url, 5) == [503] * 5
    status = plugin.status()
    assert sum(v["acks"] for v in status["xds"].values()) == 0
    assert status["hds"]["nodes"] == []
    assert TOKEN not in plugin.log_path.read_text()
