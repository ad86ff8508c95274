"""Passive health from real traffic through a real Envoy (docs/design.md §15): Envoy
streams every request's outcome to the plugin's access-log service (the shipped
``sidecar-ads.yaml`` wiring); the engines' TTFT histograms add real traffic's TTFT.

- 20 req/s, one backend failing 5 % of user requests with 500 while every probe is
  clean: DEGRADED by quality with the error rate in the reason; HEALTHY again once the
  failures stop and the window has cleared.
- One backend whose users' TTFT p95 is over a second while probes see 150 ms
  (``slow_under_load`` for users only): DEGRADED by quality (p95 TTFT).
- Probe requests never count; an access-log stream that floods or breaks never stops
  probing or xDS pushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import grpc
import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from tests.e2e.test_gateway import FAST, Load, envoy_view, stack  # noqa: F401 (fixture)
from tests.polling import wait_until

CLUSTER = "llama-70b"
QUALITY = {"window": "20s", "min_requests": 40}


def endpoint_status(plugin: Any, address: str) -> dict[str, Any]:
    (cluster,) = [c for c in plugin.status()["clusters"] if c["name"] == CLUSTER]
    (found,) = [e for e in cluster["endpoints"] if e["address"] == address]
    return found


def window_of(plugin: Any, address: str) -> dict[str, Any]:
    entries: dict[str, Any] = plugin.status()["traffic"]["endpoints"]
    return entries[f"{CLUSTER}/{address}"]


@pytest.mark.envoy
def test_five_percent_errors_degrade_by_quality_and_clear(stack: Any) -> None:  # noqa: F811
    failing, fine_a, fine_b = (stack.sim(n, *FAST) for n in ("failing", "fine-a", "fine-b"))
    for sim in (failing, fine_a, fine_b):
        sim.wait_up()
    plugin = stack.plugin([failing, fine_a, fine_b], quality=QUALITY).start()
    plugin.wait_ready()
    envoy = stack.envoy(plugin).start()
    everyone = {s.address: ("HEALTHY", 100) for s in (failing, fine_a, fine_b)}
    wait_until(lambda: envoy_view(envoy) == everyone, 15, "Envoy routing to all three")
    failing.set_fault(fault="http_500", fault_rate=0.05, affects="users")
    with Load(envoy.url, 20, 20 * 90):

        def degraded() -> bool:
            return endpoint_status(plugin, failing.address)["cause"] == "quality"

        wait_until(degraded, 45, "the failing backend DEGRADED by quality")
        found = endpoint_status(plugin, failing.address)
        assert found["state"] == "degraded" and found["reason"].startswith("error rate ")
        assert "over 20 s (" in found["reason"], found["reason"]
        assert found["limits"] == {"quality": found["reason"]}
        wait_until(lambda: envoy_view(envoy)[failing.address] == ("HEALTHY", 30), 5, "30 %")
        # Every probe of the failing backend stayed clean: only users saw the 500s.
        assert found["last_probe"]["outcome"] == "fast"
        for sim in (fine_a, fine_b):
            assert endpoint_status(plugin, sim.address)["state"] == "healthy"
        failing.set_fault(fault="none")
        wait_until(
            lambda: endpoint_status(plugin, failing.address)["state"] == "healthy",
            20 + 10,
            "healthy again once the window cleared",
        )
    window = window_of(plugin, fine_a.address)
    assert window["requests"] > 0 and window["errors"] == 0
    traffic = plugin.status()["traffic"]
    assert traffic["counted_total"] > 100 and traffic["unknown_endpoint_total"] == 0


@pytest.mark.envoy
def test_slow_real_traffic_with_fast_probes_degrades_by_ttft(stack: Any) -> None:  # noqa: F811
    slow = stack.sim("slow", "--ttft", "150ms", "--tpot", "10ms")
    fine = [stack.sim(n, *FAST) for n in ("fine-a", "fine-b")]
    for sim in (slow, *fine):
        sim.wait_up()
    plugin = stack.plugin(
        [slow, *fine],
        healthy_ttft="300ms",
        quality={**QUALITY, "min_requests": 20},
        # The users' queue would also saturate the engine (5 waiting): this test is about
        # the quality window alone.
        engine_metrics={"queue_threshold": 1000},
    ).start()
    plugin.wait_ready()
    envoy = stack.envoy(plugin, lb_policy="ROUND_ROBIN").start()
    everyone = {s.address: ("HEALTHY", 100) for s in (slow, *fine)}
    wait_until(lambda: envoy_view(envoy) == everyone, 15, "Envoy routing to all three")
    slow.set_fault(fault="slow_under_load", load_ttft_per_request="150ms", affects="users")
    with Load(envoy.url, 20, 20 * 60, timeout=10):
        wait_until(
            lambda: endpoint_status(plugin, slow.address)["cause"] == "quality",
            40,
            lambda: f"DEGRADED by quality (p95 TTFT): {window_of(plugin, slow.address)}",
        )
    found = endpoint_status(plugin, slow.address)
    assert found["reason"].startswith("p95 TTFT "), found["reason"]
    assert found["last_probe"]["outcome"] == "fast"  # the probes never saw it
    window = window_of(plugin, slow.address)
    assert window["p95_ttft_s"] > 0.8, window


async def _flood(port: int, rate_per_s: float, seconds: float, address: str) -> int:
    """One access-log stream sending ``rate_per_s`` entries for ``seconds`` (batches of
    50), then breaking off mid-stream (cancelled). Returns the entries sent."""
    sent = 0
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.common_properties.upstream_cluster = CLUSTER
    host, port_text = address.rsplit(":", 1)
    entry.common_properties.upstream_remote_address.socket_address.address = host
    entry.common_properties.upstream_remote_address.socket_address.port_value = int(port_text)
    entry.common_properties.duration.FromMilliseconds(20)
    entry.response.response_code.value = 200
    batch = als_pb2.StreamAccessLogsMessage()
    batch.identifier.node.id = "gateway-1"  # the running Envoy's: it holds an xDS stream
    batch.identifier.log_name = "flood"
    batch.http_logs.log_entry.extend([entry] * 50)
    deadline = time.monotonic() + seconds

    async def messages() -> Any:
        nonlocal sent
        while time.monotonic() < deadline:
            yield batch
            sent += 50
            await asyncio.sleep(50 / rate_per_s)
        await asyncio.sleep(3600)  # hold the stream open: it is broken off from outside

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = als_pb2_grpc.AccessLogServiceStub(channel).StreamAccessLogs(messages())
        await asyncio.sleep(seconds + 0.5)
        call.cancel()  # the stream breaks mid-way (an Envoy killed, a network cut)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            await call
    return sent


@pytest.mark.envoy
def test_a_flooding_or_broken_stream_never_stops_probing_or_pushes(stack: Any) -> None:  # noqa: F811
    sims = [stack.sim(n, *FAST) for n in ("a", "b")]
    for sim in sims:
        sim.wait_up()
    plugin = stack.plugin(sims).start()
    plugin.wait_ready()
    envoy = stack.envoy(plugin).start()
    wait_until(lambda: len(envoy_view(envoy)) == 2, 15, "Envoy routing to both")
    probes_before = plugin.status()["prober"]["probes_total"]
    lags: list[float] = []
    sampling = threading.Event()

    def sample() -> None:  # the plugin's own loop-lag gauge, 10 times a second
        while not sampling.wait(0.1):
            lags.append(plugin.status()["prober"]["loop_lag_ms"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        # 10x a 1,000 req/s gateway's rate, for 5 s, then the stream breaks off.
        sent = asyncio.run(_flood(plugin.grpc_port, 10_000, 5.0, sims[0].address))
    finally:
        sampling.set()
        sampler.join(5)
    # The stream broke off on the client's side; the server hears of it a moment later.
    wait_until(lambda: plugin.status()["traffic"]["streams_open"] == 0, 5, "the stream closed")
    status = plugin.status()
    probes = status["prober"]["probes_total"] - probes_before
    worst = max(lags, default=0.0)
    # 2 endpoints, ~1/s each
    assert probes >= 2 * 4, f"{probes} probes while flooded; loop lag max {worst} ms"
    assert status["prober"]["probes_ignored_loop_lag"] == 0
    traffic = status["traffic"]
    assert traffic["entries_total"] >= sent * 0.9
    assert traffic["without_xds_total"] == 0  # decoded, under the budget: not ignored
    # A push still goes through at once: drain an endpoint, Envoy sees it.
    sims[1].set_fault(fault="cuda_error")
    wait_until(lambda: envoy_view(envoy)[sims[1].address][0] == "UNHEALTHY", 5, "pushed")
