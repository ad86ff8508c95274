"""A fleet-wide peak on real vLLM (docs/design.md §3.5, the readiness snowball): three
servers of SLOTS slots behind ``serve`` and a real Envoy, and USERS streamed users
through Envoy's listener, more than the three can run at once, so that every server
queues at the same time. With the product's probe defaults: no server is ever UNHEALTHY,
in ``serve`` or in Envoy, none gets less than the degraded share, and every user request
is served. (Without the overload rule the probes that queue time out on every server at
once, and the fleet leaves together.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.configs import plugin_settings
from tests.engine.load import LoadProcess
from tests.engine.vllm import SERVED_NAME, StartVllm, VllmServer
from tests.envoy_harness import EnvoyProcess, render_config
from tests.polling import seconds_until
from tests.ports import free_port
from tests.processes import PluginProcess, stop_all

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "llama-70b"  # the EDS cluster of envoy-configs/sidecar-ads.yaml
SERVERS, SLOTS, USERS, TOKENS = 3, 4, 72, 16
PEAK_S = 30.0
SAMPLE_EVERY_S = 0.25
DEGRADED_SHARE = 30  # of the base weight 100 (probe.degraded_weight 0.3)
# The product's probe defaults but for the known-answer check: random weights have no
# known answer (docs/engines/vllm.md).
PROBE = {"api": "openai-chat", "model": SERVED_NAME, "verify": {"enabled": False}}
pytestmark = [pytest.mark.timeout(900), pytest.mark.envoy]

wait_for = partial(seconds_until, interval=0.1, ignore=(OSError,))


@pytest.fixture(scope="module")
def fleet(
    vllm_server: StartVllm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[VllmServer], PluginProcess, EnvoyProcess, int]]:
    """SERVERS vLLM servers (spawned together, their model threads on one core), ``serve``
    probing them and Envoy routing to them; Envoy's listener port."""
    servers = [vllm_server(max_num_seqs=SLOTS, wait=False) for _ in range(SERVERS)]
    for server in servers:
        server.wait_healthy()
    workdir = tmp_path_factory.mktemp("fleet")
    settings = plugin_settings(
        [s.address for s in servers],
        cluster=CLUSTER,
        listen=False,
        probe=PROBE,
        xds={"warm_start_timeout": "5s"},
    )
    plugin = PluginProcess(workdir / "plugin", settings)
    started: list[Any] = [plugin]
    try:
        plugin.start().wait_ready()
        listener = free_port()
        rendered = render_config(
            ROOT / "envoy-configs/sidecar-ads.yaml",
            workdir / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=listener,
            admin_port=0,
        )
        envoy = EnvoyProcess(rendered, workdir=workdir / "envoy")
        started.append(envoy)
        envoy.start()
        wait_for(lambda: all_healthy(envoy, servers), 60.0, "every server HEALTHY in Envoy")
        yield servers, plugin, envoy, listener
    finally:
        stop_all(reversed(started))


def all_healthy(envoy: EnvoyProcess, servers: list[VllmServer]) -> bool:
    view = envoy.view(CLUSTER)
    return all(view.get(s.address, ("", 0))[0] == "HEALTHY" for s in servers)


def serve_view(plugin: PluginProcess) -> dict[str, tuple[str, int, str]]:
    """``serve``'s (state, Envoy weight, reason) per endpoint."""
    return {
        e["address"]: (e["state"], e["envoy"]["weight"], e["reason"])
        for c in plugin.status()["clusters"]
        for e in c["endpoints"]
    }


def test_a_peak_on_every_server_at_once_ejects_none(
    fleet: tuple[list[VllmServer], PluginProcess, EnvoyProcess, int],
) -> None:
    servers, plugin, envoy, listener = fleet
    seen: list[tuple[float, str, str, int, str]] = []  # (t, where, state, weight, reason)
    with LoadProcess(
        listener, users=USERS, seconds=PEAK_S, model=SERVED_NAME, max_tokens=TOKENS
    ) as load:
        started = time.monotonic()
        while time.monotonic() - started < PEAK_S:
            now = time.monotonic() - started
            for address, (state, weight, reason) in serve_view(plugin).items():
                seen.append((now, f"serve {address}", state, weight, reason))
            for address, (health, weight) in envoy.view(CLUSTER).items():
                seen.append((now, f"envoy {address}", health, weight, ""))
            time.sleep(SAMPLE_EVERY_S)
    result = load.result
    assert result.completed > 0 and result.errors == 0, result
    out = [s for s in seen if s[2].upper() == "UNHEALTHY"]
    assert not out, f"ejected while vLLM served {result.completed}: {out[:4]}"
    light = [s for s in seen if s[3] < DEGRADED_SHARE]
    assert not light, light[:4]
    # The peak was one: every server's probes waited behind its queue at some point.
    loaded = {s[1] for s in seen if s[1].startswith("serve") and s[2] != "healthy"}
    assert loaded == {f"serve {s.address}" for s in servers}, (loaded, seen[-6:])
