"""The plugin's xDS server against a real Envoy 1.40, in all four variants.

For each of ADS SotW (sidecar-ads.yaml), ADS delta (delta-ads.yaml), standalone EDS SotW
(eds-standalone.yaml) and standalone EDS delta (eds-standalone.yaml with
``api_type: DELTA_GRPC``): the plugin's own gRPC server (in this test's event loop) serves
a Board with a HEALTHY, a DEGRADED, an UNHEALTHY, a DRAINING and a STARTING endpoint, and
Envoy's admin API must show the docs/design.md §4 health and weights, accept every update
(``update_rejected`` 0), follow state changes, and NACK-proof: an update Envoy rejects is
counted by the plugin with Envoy's message and never resent in a loop. Plus: Envoy's
HTTP/2 keepalive pings never make the plugin's gRPC server drop an idle xDS stream.

Endpoint addresses are on 127.0.0.1; nothing listens there (no traffic is sent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from llm_health.core.hub import SnapshotHub
from llm_health.model.board import Board, HealthSnapshot
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.xds import add_xds_servicers
from llm_health.xds.stream import XdsCounters, XdsStats
from tests.boards import DEGRADED, DRAINING, HEALTHY, STARTING, UNHEALTHY, every_state_board
from tests.envoy_harness import (
    ENVOY_CONFIGS_DIR,
    XDS_CLUSTER,
    EnvoyProcess,
    eds_clusters,
    render_config,
)
from tests.ports import free_port

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(90)]

CLUSTER = "llama-70b"
#: docs/design.md §4, as Envoy's /clusters reports it: address -> (eds_health_status, weight).
EXPECTED = {
    HEALTHY.address: ("HEALTHY", 100),
    DEGRADED.address: ("HEALTHY", 30),  # max(1, round(100 x 0.3))
    UNHEALTHY.address: ("UNHEALTHY", 100),  # kept in the assignment, not omitted
    DRAINING.address: ("DRAINING", 80),
    STARTING.address: ("UNHEALTHY", 50),
}


def _delta_standalone(config: dict[str, Any]) -> None:
    for cluster in eds_clusters(config):
        cluster["eds_cluster_config"]["eds_config"]["api_config_source"]["api_type"] = "DELTA_GRPC"


@dataclass(frozen=True)
class Variant:
    config: str
    stats: str  # XdsStats field the plugin counts this variant in
    extra: Callable[[dict[str, Any]], None] | None = None


VARIANTS = {
    "ads-sotw": Variant("sidecar-ads.yaml", "ads_sotw"),
    "ads-delta": Variant("delta-ads.yaml", "ads_delta"),
    "eds-sotw": Variant("eds-standalone.yaml", "eds_sotw"),
    "eds-delta": Variant("eds-standalone.yaml", "eds_delta", _delta_standalone),
}


def probe(outcome: Outcome) -> ProbeResult:
    return ProbeResult(outcome, 0.0, ttft_ms=10 if outcome is Outcome.FAST else 500)


@dataclass
class Rig:
    board: Board
    hub: SnapshotHub
    counters: XdsCounters
    envoy: EnvoyProcess

    async def publish(self) -> None:
        self.hub.put(self.board.snapshot())

    async def hosts(self) -> dict[str, tuple[str, int]]:
        return await asyncio.to_thread(self.envoy.view, CLUSTER)

    async def stat(self, name: str) -> int:
        return await asyncio.to_thread(self.envoy.stat, f"cluster.{CLUSTER}.{name}", 0)

    async def labels(self) -> dict[int, str | None]:
        """port -> filter_metadata["envoy.lb"]["llm_health"] as Envoy holds it."""
        dump = await asyncio.to_thread(self.envoy.config_dump, include_eds="")
        for config in dump["configs"]:
            for key in ("static_endpoint_configs", "dynamic_endpoint_configs"):
                for entry in config.get(key, []):
                    if entry["endpoint_config"]["cluster_name"] == CLUSTER:
                        return _labels(entry["endpoint_config"])
        raise AssertionError(f"no EDS config for {CLUSTER} in /config_dump")

    async def wait_hosts(self, expected: dict[str, tuple[str, int]]) -> None:
        async def matches() -> bool:
            return await self.hosts() == expected

        await self.envoy.wait_until_async(matches, 10.0, f"Envoy hosts == {expected}")


def _labels(assignment: dict[str, Any]) -> dict[int, str | None]:
    (locality,) = assignment["endpoints"]
    return {
        lb["endpoint"]["address"]["socket_address"]["port_value"]: lb.get("metadata", {})
        .get("filter_metadata", {})
        .get("envoy.lb", {})
        .get("llm_health")
        for lb in locality["lb_endpoints"]
    }


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    variant = VARIANTS[request.param]
    board = every_state_board(CLUSTER, warm=True)  # STARTING never gets a probe
    hub, stats = SnapshotHub(board.snapshot()), XdsStats()
    server, port = await start_grpc_server("127.0.0.1:0")
    add_xds_servicers(server, hub, stats)
    await server.start()
    config = render_config(
        ENVOY_CONFIGS_DIR / variant.config,
        tmp_path / "envoy.yaml",
        xds_port=port,
        listener_port=free_port(),
        admin_port=0,
        extra=variant.extra,
    )
    envoy = EnvoyProcess(config, workdir=tmp_path / "envoy")
    try:
        await envoy.astart()  # LIVE only once the first EDS answer was accepted
        yield Rig(board, hub, getattr(stats, variant.stats), envoy)
    finally:
        await envoy.astop()
        await server.stop(0)


async def test_envoy_shows_design_health_and_weights(rig: Rig) -> None:
    await rig.wait_hosts(EXPECTED)
    assert await rig.stat("update_rejected") == 0
    assert await rig.stat("update_success") > 0
    assert await rig.labels() == {
        9001: "healthy",
        9002: "degraded",
        9003: None,
        9004: None,
        9005: None,
    }
    assert rig.counters.acks >= 1 and rig.counters.nacks == 0
    assert rig.counters.streams_open == 1


async def test_envoy_follows_state_changes(rig: Rig) -> None:
    await rig.wait_hosts(EXPECTED)
    successes = await rig.stat("update_success")
    rig.board.record(CLUSTER, HEALTHY.address, probe(Outcome.SLOW), 3.0)  # -> DEGRADED
    rig.board.record(CLUSTER, DEGRADED.address, probe(Outcome.FATAL), 3.0)  # -> UNHEALTHY
    rig.board.undrain(CLUSTER, DRAINING.address, 3.0)  # -> STARTING
    await rig.publish()
    await rig.wait_hosts(
        {
            **EXPECTED,
            HEALTHY.address: ("HEALTHY", 30),
            DEGRADED.address: ("UNHEALTHY", 100),
            DRAINING.address: ("UNHEALTHY", 80),
        }
    )
    assert await rig.stat("update_rejected") == 0
    assert await rig.stat("update_success") > successes
    assert rig.counters.nacks == 0


def _with_hostname(snapshot: HealthSnapshot) -> HealthSnapshot:
    """The cluster with one endpoint whose host is a name, not an IP: Envoy's EDS rejects
    it (a non-IP socket address needs a resolver); as a config mistake would produce."""
    cluster = snapshot.clusters[CLUSTER]
    first = cluster.endpoints[0]
    named = replace(first, spec=replace(first.spec, host="vllm-0.invalid"))
    bad = replace(cluster, endpoints=(named, *cluster.endpoints[1:]), envoy_version="bad")
    return HealthSnapshot(snapshot.revision + 1000, {CLUSTER: bad})


async def test_rejected_update_is_counted_and_not_resent(rig: Rig) -> None:
    await rig.wait_hosts(EXPECTED)
    rig.hub.put(_with_hostname(rig.hub.current()))

    async def nacked() -> bool:
        return rig.counters.nacks == 1 and await rig.stat("update_rejected") == 1

    await rig.envoy.wait_until_async(nacked, 10.0, "plugin and Envoy saw one NACK")
    assert rig.counters.last_nack and "vllm-0.invalid" in rig.counters.last_nack
    pushes = rig.counters.pushes
    # Nothing may be sent: a resend loop would answer each NACK at once (pushes are
    # coalesced for 20 ms), so half a second would show a dozen resends.
    await asyncio.sleep(0.5)
    assert (rig.counters.pushes, rig.counters.nacks) == (pushes, 1)
    assert await rig.stat("update_rejected") == 1
    assert await rig.hosts() == EXPECTED  # Envoy kept its last accepted assignment
    rig.board.record(CLUSTER, HEALTHY.address, probe(Outcome.SLOW), 3.0)  # the state changes
    await rig.publish()
    await rig.wait_hosts({**EXPECTED, HEALTHY.address: ("HEALTHY", 30)})
    assert await rig.stat("update_rejected") == 1


def _fast_keepalive(config: dict[str, Any]) -> None:
    """Envoy pings the plugin 5 times a second (the shipped configs: every 30 s)."""
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == XDS_CLUSTER:
            options = cluster["typed_extension_protocol_options"]
            http2 = next(iter(options.values()))["explicit_http_config"]["http2_protocol_options"]
            http2["connection_keepalive"] = {"interval": "0.2s", "timeout": "5s"}


async def test_envoy_keepalive_pings_do_not_drop_an_idle_stream(tmp_path: Path) -> None:
    """gRPC's default server policy answers frequent pings on an idle connection with
    GOAWAY "too_many_pings"; GRPC_SERVER_OPTIONS must accept Envoy's keepalive pings."""
    board = every_state_board(CLUSTER, warm=True)
    hub, stats = SnapshotHub(board.snapshot()), XdsStats()
    server, port = await start_grpc_server("127.0.0.1:0")
    add_xds_servicers(server, hub, stats)
    await server.start()
    config = render_config(
        ENVOY_CONFIGS_DIR / "sidecar-ads.yaml",
        tmp_path / "envoy.yaml",
        xds_port=port,
        listener_port=free_port(),
        admin_port=0,
        extra=_fast_keepalive,
    )
    envoy = EnvoyProcess(config, workdir=tmp_path / "envoy")
    try:
        await envoy.astart()
        # Idle, only pings: gRPC's default server policy sends GOAWAY at the third ping
        # within its minimum interval (about 0.6 s here); 1.5 s gives it 7 pings.
        await asyncio.sleep(1.5)
        assert (stats.ads_sotw.streams_total, stats.ads_sotw.streams_open) == (1, 1)
        failures = await asyncio.to_thread(envoy.stat, f"cluster.{CLUSTER}.update_failure", 0)
        assert failures == 0
    finally:
        await envoy.astop()
        await server.stop(0)
