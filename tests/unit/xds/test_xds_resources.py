"""EDS mapping (docs/design.md §4) and the built-resource cache (llm_health.xds.resources)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from llm_health.model.board import Board, ClusterSnapshot, ClusterSpec, EndpointSpec
from llm_health.model.envoy_view import EnvoyHealth, EnvoyView
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.xds import resources
from llm_health.xds.resources import TYPE_URL, ResourceCache, cluster_load_assignment, lb_endpoint
from tests.boards import DEGRADED, DRAINING, HEALTHY, STARTING, TINY, UNHEALTHY, every_state_board


def probe(outcome: Outcome, ttft_ms: float | None = None) -> ProbeResult:
    return ProbeResult(outcome, 0.0, ttft_ms=ttft_ms)


def assignment() -> endpoint_pb2.ClusterLoadAssignment:
    return cluster_load_assignment(
        every_state_board("llama-70b", TINY).snapshot().clusters["llama-70b"]
    )


def by_port(cla: endpoint_pb2.ClusterLoadAssignment) -> dict[int, Any]:
    (locality,) = cla.endpoints
    return {lb.endpoint.address.socket_address.port_value: lb for lb in locality.lb_endpoints}


@pytest.mark.parametrize(
    ("spec", "status", "weight", "label"),
    [
        (HEALTHY, health_check_pb2.HEALTHY, 100, "healthy"),
        (DEGRADED, health_check_pb2.HEALTHY, 30, "degraded"),
        (UNHEALTHY, health_check_pb2.UNHEALTHY, 100, None),
        (DRAINING, health_check_pb2.DRAINING, 80, None),
        (STARTING, health_check_pb2.UNHEALTHY, 50, None),
        (TINY, health_check_pb2.HEALTHY, 1, "degraded"),  # max(1, round(0.3)): never 0
    ],
)
def test_design_table(spec: EndpointSpec, status: int, weight: int, label: str | None) -> None:
    lb = by_port(assignment())[spec.port]
    assert lb.health_status == status
    assert lb.load_balancing_weight.value == weight
    metadata = lb.metadata.filter_metadata
    if label is None:
        assert "envoy.lb" not in metadata
    else:
        assert dict(metadata["envoy.lb"]) == {"llm_health": label}


def test_every_endpoint_kept_in_one_locality_with_its_address() -> None:
    cla = assignment()
    assert cla.cluster_name == "llama-70b"
    assert len(cla.endpoints) == 1
    addresses = [
        (lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value)
        for lb in cla.endpoints[0].lb_endpoints
    ]
    assert addresses == [("127.0.0.1", p) for p in range(9001, 9007)]


def test_weight_zero_is_clamped_to_one() -> None:
    """LbEndpoint.load_balancing_weight: validate rule gte 1; 0 would be NACKed."""
    endpoint = every_state_board("llama-70b", TINY).snapshot().clusters["llama-70b"].endpoints[0]
    zero = replace(endpoint, view=EnvoyView(EnvoyHealth.UNHEALTHY, 0, None))
    assert lb_endpoint(zero).load_balancing_weight.value == 1


def test_packed_resources_have_the_eds_type_url() -> None:
    cluster = every_state_board("llama-70b", TINY).snapshot().clusters["llama-70b"]
    built = ResourceCache().get(cluster)
    assert built.packed.type_url == TYPE_URL
    unpacked = endpoint_pb2.ClusterLoadAssignment()
    assert built.packed.Unpack(unpacked)
    assert unpacked == cluster_load_assignment(cluster)
    assert isinstance(built.delta, discovery_pb2.Resource)
    assert (built.delta.name, built.delta.version) == ("llama-70b", cluster.envoy_version)
    assert built.delta.resource == built.packed


def big_cluster(version: str) -> ClusterSnapshot:
    specs = tuple(EndpointSpec(f"10.0.{i // 250}.{i % 250}:8000", "x", 8000) for i in range(1000))
    board = Board([ClusterSpec("big", Policy(), specs)], now=0.0, wall_offset=0.0)
    return replace(board.snapshot().clusters["big"], envoy_version=version)


def test_cache_builds_once_per_name_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    real_build = resources.build

    def counting_build(
        cluster: ClusterSnapshot, framed: list[bytes] | None = None
    ) -> resources.BuiltResource:
        builds.append(cluster.envoy_version)
        return real_build(cluster, framed)

    monkeypatch.setattr(resources, "build", counting_build)
    cache = ResourceCache()
    v1 = big_cluster("v1")
    first = cache.get(v1)
    assert all(cache.get(v1) is first for _ in range(50))  # 50 streams, one build
    assert cache.get(big_cluster("v2")) is not first
    assert builds == ["v1", "v2"]


def test_cache_is_bounded() -> None:
    cache = ResourceCache(max_entries=2)
    for version in ("v1", "v2", "v3"):
        cache.get(
            replace(
                every_state_board("llama-70b", TINY).snapshot().clusters["llama-70b"],
                envoy_version=version,
            )
        )
    assert len(cache) == 2


def random_cluster(seed: int, count: int) -> ClusterSnapshot:
    """A cluster of ``count`` endpoints in random states, ports up to 65535 (multi-byte
    varints), names of several lengths."""
    import random

    rng = random.Random(seed)
    specs = tuple(
        EndpointSpec(
            f"127.0.0.{i % 250}:{p}", f"127.0.0.{i % 250}", p, rng.choice([1, 7, 100, 5000])
        )
        for i, p in enumerate(rng.sample(range(1, 65536), count))
    )
    name = "c" * rng.choice([1, 20, 200])
    board = Board([ClusterSpec(name, Policy(), specs)], now=0.0, wall_offset=0.0)
    for endpoint in specs:
        outcome = rng.choice([Outcome.FAST, Outcome.SLOW, Outcome.FATAL, None])
        if outcome is not None:
            board.record(name, endpoint.address, probe(outcome, 10), 1.0)
    return board.snapshot().clusters[name]


@pytest.mark.parametrize("seed,count", [(1, 0), (2, 1), (3, 7), (4, 300), (5, 2000)])
def test_assembled_bytes_are_what_protobuf_serialises(seed: int, count: int) -> None:
    cluster = random_cluster(seed, count)
    built = resources.build(cluster)
    expected = cluster_load_assignment(cluster)
    assert built.packed.type_url == TYPE_URL
    assert built.packed.value == expected.SerializeToString(deterministic=True)
    assert endpoint_pb2.ClusterLoadAssignment.FromString(built.packed.value) == expected


def test_endpoint_bytes_are_reused_and_bounded() -> None:
    cluster = random_cluster(6, 10)
    parts = resources.EndpointBytes(max_entries=4)
    first = [parts.get(e) for e in cluster.endpoints[:3]]
    assert [parts.get(e) for e in cluster.endpoints[:3]] == first
    assert all(parts.get(e) is f for e, f in zip(cluster.endpoints[:3], first, strict=True))
    framed = [parts.get(e) for e in cluster.endpoints]
    assert resources.build(cluster, framed).packed.value == resources.build(cluster).packed.value


def test_the_cache_rebuilds_only_changed_endpoints_and_stays_exact() -> None:
    specs = tuple(EndpointSpec(f"127.0.0.1:{p}", "127.0.0.1", p) for p in range(9000, 9050))
    board = Board([ClusterSpec("c", Policy(), specs)], now=0.0, wall_offset=0.0)
    cache = ResourceCache()
    for i, spec in enumerate(specs):
        board.record("c", spec.address, probe(Outcome.FAST, 10), 1.0)
        if i % 7 == 0:
            board.record("c", spec.address, probe(Outcome.SLOW, 900), 2.0)
        cluster = board.snapshot().clusters["c"]
        expected = cluster_load_assignment(cluster).SerializeToString(deterministic=True)
        assert cache.get(cluster).packed.value == expected
