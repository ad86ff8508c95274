"""Busy is not broken, on real vLLM (docs/design.md §3.5, docs/engines/vllm.md): a server
with ``--max-num-seqs 4`` and 24 streamed users forms a queue of about 20; a probe waits in
it past its timeout while vLLM admits and completes every user request. With the product's
probe defaults (interval 1 s, timeout 800 ms, /metrics every 1 s):

- saturated: ``serve`` never says UNHEALTHY, Envoy's weight for it never drops below the
  degraded share, the agent's ``/readyz`` (polled with the kubelet's 1 s timeout) is 200
  in at least 99 % of samples, and every user request is served;
- load over: ``serve`` and the agent agree on HEALTHY within 10 s;
- frozen while saturated (the EngineCore stopped: vLLM's ``/metrics`` go on answering,
  its admission counter stands still): UNHEALTHY and ``/readyz`` 503 within 5 s;
- a fleet-wide peak: three saturated servers behind ``serve`` and a real Envoy, users
  through Envoy: none ejected, every user request served.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from tests.configs import plugin_settings
from tests.engine.load import Load, LoadResult
from tests.engine.vllm import SERVED_NAME, StartVllm, VllmServer
from tests.envoy_harness import EnvoyProcess, render_config
from tests.hostile_http import KUBELET, KUBELET_TIMEOUT_S
from tests.ports import free_port
from tests.processes import AgentProcess, PluginProcess, stop_all

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "llama-70b"  # the EDS cluster of envoy-configs/sidecar-ads.yaml
SLOTS, USERS, TOKENS = 4, 24, 16
PEAK_S = 30.0
SAMPLE_EVERY_S = 0.25
DEGRADED_SHARE = 30  # of the base weight 100 (probe.degraded_weight 0.3)
READY_MIN = 0.99
AGREE_WITHIN_S = 10.0
FROZEN_OUT_WITHIN_S = 5.0
# The product's probe defaults but for the known-answer check: random weights have no
# known answer (docs/engines/vllm.md).
PROBE = {"api": "openai-chat", "model": SERVED_NAME, "verify": {"enabled": False}}
pytestmark = [pytest.mark.timeout(1200), pytest.mark.envoy]


@pytest.fixture(scope="module")
def servers(vllm_server: StartVllm) -> list[VllmServer]:
    """Three servers of SLOTS slots each, started side by side (the first serves the
    one-engine tests)."""
    spawned = [vllm_server(wait=False, max_num_seqs=SLOTS) for _ in range(3)]
    for server in spawned:
        server.wait_healthy()
    return spawned


@pytest.fixture(scope="module")
def watched(
    servers: list[VllmServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VllmServer, PluginProcess, AgentProcess]]:
    """The first server, with ``serve`` and the agent watching it."""
    server = servers[0]
    workdir = tmp_path_factory.mktemp("watched")
    settings = plugin_settings([server.address], listen=False, probe=PROBE)
    plugin = PluginProcess(workdir / "plugin", settings)
    agent = AgentProcess(workdir / "agent", server.base_url, {"probe": PROBE})
    try:
        plugin.start().wait_ready()
        agent.start().wait_up()
        wait_for(lambda: both_healthy(plugin, agent), 60.0, "serve and the agent HEALTHY")
        yield server, plugin, agent
    finally:
        stop_all([agent, plugin])


def endpoint_of(plugin: PluginProcess) -> dict[str, Any]:
    (endpoint,) = (e for c in plugin.status()["clusters"] for e in c["endpoints"])
    return endpoint


def agent_state(agent: AgentProcess) -> str:
    (endpoint,) = (e for c in agent.status()["clusters"] for e in c["endpoints"])
    return str(endpoint["state"])


def both_healthy(plugin: PluginProcess, agent: AgentProcess) -> bool:
    return endpoint_of(plugin)["state"] == "healthy" and agent_state(agent) == "healthy"


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def kubelet(agent: AgentProcess, seconds: float) -> subprocess.Popen[bytes]:
    """The kubelet's readiness probe in a process of its own (this one runs the users):
    ``GET /readyz`` every SAMPLE_EVERY_S with its 1 s timeout; prints {path: [status or
    None]} when done."""
    polls = int(seconds / SAMPLE_EVERY_S)
    args = [agent.http_port, polls, SAMPLE_EVERY_S, KUBELET_TIMEOUT_S, "/readyz"]
    return subprocess.Popen([sys.executable, "-c", KUBELET, *map(str, args)], stdout=PIPE)


def answers_of(poller: subprocess.Popen[bytes], seconds: float) -> list[int | None]:
    out, _ = poller.communicate(timeout=seconds * (1 + KUBELET_TIMEOUT_S / SAMPLE_EVERY_S) + 15)
    codes: list[int | None] = json.loads(out)["/readyz"]
    return codes


def ready_code(agent: AgentProcess) -> int:
    try:
        return agent.get("/readyz", timeout=1.0)[0]
    except OSError:  # no answer within the kubelet's timeout
        return 0


def states_while(load: Load, seconds: float, plugin: PluginProcess) -> list[tuple[str, int, str]]:
    """``serve``'s (state, Envoy weight, reason) every SAMPLE_EVERY_S for ``seconds``."""
    states = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        endpoint = endpoint_of(plugin)
        states.append((endpoint["state"], endpoint["envoy"]["weight"], endpoint["reason"]))
        time.sleep(SAMPLE_EVERY_S)
    assert load.result.errors == 0, load.result.error_kinds
    return states


def saturate(server: VllmServer, seconds: float) -> Load:
    return Load(server.port, users=USERS, seconds=seconds, model=SERVED_NAME, max_tokens=TOKENS)


def queue_formed(server: VllmServer, waiting: int = USERS - 2 * SLOTS) -> bool:
    return server.metric("vllm:num_requests_waiting") >= waiting


def test_a_saturated_engine_is_never_unhealthy_and_the_agent_stays_ready(
    watched: tuple[VllmServer, PluginProcess, AgentProcess],
) -> None:
    server, plugin, agent = watched
    with saturate(server, PEAK_S + 15.0) as load:
        wait_for(lambda: queue_formed(server), 10.0, "a queue in vLLM")
        poller = kubelet(agent, PEAK_S)
        states = states_while(load, PEAK_S, plugin)
        codes = answers_of(poller, PEAK_S)
    result = load.result
    assert result.completed > 0 and result.errors == 0, result
    broken = [s for s in states if s[0] == "unhealthy"]
    assert not broken, f"UNHEALTHY while vLLM served {result.completed}: {broken[:3]}"
    light = [s for s in states if s[1] < DEGRADED_SHARE]
    assert not light, light[:3]
    loaded = [s for s in states if s[0] != "healthy"]
    assert loaded, "the probes never waited behind the queue: no saturation to judge"
    ready = codes.count(200) / len(codes)
    assert ready >= READY_MIN, (ready, codes.count(503), codes.count(None), len(codes))
    # When the load ends both sides come back, and together.
    took = wait_for(lambda: both_healthy(plugin, agent), AGREE_WITHIN_S, "both HEALTHY")
    assert took <= AGREE_WITHIN_S


def test_a_frozen_engine_under_load_is_out_within_seconds(
    watched: tuple[VllmServer, PluginProcess, AgentProcess],
) -> None:
    """Its /metrics still answer with the busy gauges of the moment it froze; only
    counters that move excuse a timeout, and these stop."""
    server, plugin, agent = watched
    with saturate(server, 60.0):
        wait_for(lambda: queue_formed(server), 10.0, "a queue in vLLM")
        time.sleep(3.0)  # a verdict about load, first
        server.freeze_engine()
        try:
            admitted = server.metric("vllm:prompt_tokens_total")
            out = wait_for(
                lambda: endpoint_of(plugin)["state"] == "unhealthy" and ready_code(agent) == 503,
                FROZEN_OUT_WITHIN_S,
                "UNHEALTHY and /readyz 503",
            )
            # What excused the queue has stopped: the admission counter stands still.
            assert server.metric("vllm:prompt_tokens_total") == admitted
        finally:
            server.thaw_engine()
    assert out <= FROZEN_OUT_WITHIN_S
    wait_for(lambda: both_healthy(plugin, agent), 60.0, "both HEALTHY after the thaw")


@pytest.fixture
def gateway(servers: list[VllmServer], tmp_path: Path) -> Iterator[tuple[EnvoyProcess, int]]:
    """``serve`` over all three servers and a real Envoy fed by it; its listener port."""
    started: list[Any] = []
    settings = plugin_settings(
        [s.address for s in servers],
        cluster=CLUSTER,
        listen=False,
        probe=PROBE,
        xds={"warm_start_timeout": "5s"},
    )
    plugin = PluginProcess(tmp_path / "plugin", settings)
    started.append(plugin)
    try:
        plugin.start().wait_ready()
        listener = free_port()
        rendered = render_config(
            ROOT / "envoy-configs/sidecar-ads.yaml",
            tmp_path / "envoy.yaml",
            xds_port=plugin.grpc_port,
            listener_port=listener,
            admin_port=0,
        )
        envoy = EnvoyProcess(rendered, workdir=tmp_path / "envoy")
        started.append(envoy)
        envoy.start()
        yield envoy, listener
    finally:
        stop_all(reversed(started))


def test_a_fleet_wide_peak_ejects_no_engine_and_serves_every_user(
    servers: list[VllmServer], gateway: tuple[EnvoyProcess, int]
) -> None:
    envoy, listener = gateway
    addresses = [s.address for s in servers]
    wait_for(
        lambda: all(envoy.view(CLUSTER).get(a, ("",))[0] == "HEALTHY" for a in addresses),
        60.0,
        "every server HEALTHY in Envoy",
    )
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(envoy.view(CLUSTER))
            stop.wait(SAMPLE_EVERY_S)

    watcher = threading.Thread(target=watch, daemon=True)
    users = Load(listener, users=len(servers) * USERS, seconds=PEAK_S, model=SERVED_NAME,
                 max_tokens=TOKENS)  # fmt: skip
    watcher.start()
    try:
        with users:
            everywhere = lambda: all(queue_formed(s, SLOTS) for s in servers)  # noqa: E731
            wait_for(everywhere, 30.0, "a queue in every server")
            time.sleep(PEAK_S / 2)
    finally:
        stop.set()
        watcher.join(5.0)
    result: LoadResult = users.result
    assert result.completed > 0 and result.errors == 0, result
    ejected = [(a, v[a]) for v in seen for a in addresses if v.get(a, ("",))[0] != "HEALTHY"]
    assert not ejected, ejected[:5]
