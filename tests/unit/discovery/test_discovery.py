"""DNS discovery, the pure parts (docs/design.md §11): answer rules, config, the board's
handling of discovered sets, alert kinds and metrics. The real DNS server is in
tests/integration/test_discovery_dns.py and tests/e2e/test_discovery.py."""

from __future__ import annotations

from typing import Any

import pytest

from llm_health.alerts import AlertKind, classify, payload
from llm_health.alerts.events import notice_event
from llm_health.config import parse_config
from llm_health.discovery.answers import (
    MAX_TTL_WAIT_S,
    DnsFault,
    FaultKind,
    Record,
    backoff_cap,
    endpoint_address,
    endpoints_from,
    next_refresh,
    unusable,
)
from llm_health.errors import ConfigError
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.ops.metrics import component_families, discovery_families

POLICY = Policy(healthy_after=3, unhealthy_after=2, drain_time_s=30.0)


# --- answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "problem"),
    [
        ("10.1.2.3", None),
        ("127.0.0.2", None),
        ("2001:db8::1", None),
        ("::1", None),
        ("0.0.0.0", "unspecified address"),
        ("::", "unspecified address"),
        ("224.0.0.1", "multicast address"),
        ("ff02::1", "multicast address"),
        ("255.255.255.255", "broadcast address"),
        ("fe80::1", "IPv6 link-local address (no zone)"),
        ("not-an-ip", "not an IP address"),
        ("10.0.0.1\x1b[31m", "not an IP address"),
    ],
)
def test_unusable(ip: str, problem: str | None) -> None:
    assert unusable(ip) == problem


@pytest.mark.parametrize(
    ("ip", "port", "text"),
    [("10.0.0.1", 8000, "10.0.0.1:8000"), ("2001:db8::1", 80, "[2001:db8::1]:80")],
)
def test_endpoint_address(ip: str, port: int, text: str) -> None:
    assert endpoint_address(ip, port) == text


def test_endpoints_sorted_unique_and_canonical() -> None:
    records = [
        Record("10.0.0.10", 8000, 30),
        Record("10.0.0.9", 8000, 5),
        Record("2001:0db8:0000::1", 8000, 60),
        Record("10.0.0.9", 8000, 30),  # the same address twice is one endpoint
        Record("0.0.0.0", 8000, 1),  # dropped; its TTL does not count
    ]
    found = endpoints_from(records, weight=7, limit=100)
    assert [e.address for e in found.endpoints] == [
        "10.0.0.9:8000",
        "10.0.0.10:8000",  # numeric order, not text order
        "[2001:db8::1]:8000",
    ]
    assert all(e.weight == 7 for e in found.endpoints)
    assert found.ttl == 5
    assert found.dropped == ("0.0.0.0: unspecified address",)


def test_endpoints_over_the_limit_are_cut_and_said() -> None:
    records = [Record(f"10.0.{i // 250}.{i % 250 + 1}", 80, 0) for i in range(600)]
    found = endpoints_from(records, weight=100, limit=500)
    assert len(found.endpoints) == 500
    assert found.dropped == ("100 addresses over max_endpoints 500",)


def test_no_usable_record_is_a_fault_never_an_empty_set() -> None:
    with pytest.raises(DnsFault) as info:
        endpoints_from([Record("224.0.0.1", 80, 0)], weight=100, limit=10)
    assert info.value.kind is FaultKind.EMPTY
    assert "multicast" in info.value.reason
    with pytest.raises(DnsFault):
        endpoints_from([], weight=100, limit=10)


def test_fault_text_is_bounded_and_printable() -> None:
    fault = DnsFault(FaultKind.BAD_ANSWER, "x\x1b[2J\n" * 500)
    assert len(fault.reason) <= 200 and fault.reason.isprintable()


@pytest.mark.parametrize(
    ("refresh", "ttl", "wait"),
    [
        (5.0, 0, 5.0),  # TTL 0 (Kubernetes headless default is 5 s; tests use 0): the floor
        (5.0, 3, 5.0),  # never faster than refresh
        (5.0, 20, 20.0),  # the TTL slows it down
        (5.0, 86_400, MAX_TTL_WAIT_S),  # but a day-long TTL does not hide a scale-out
        (120.0, 86_400, 120.0),  # refresh above the ceiling: refresh
        (1.0, -5, 1.0),
    ],
)
def test_next_refresh(refresh: float, ttl: int, wait: float) -> None:
    assert next_refresh(refresh, ttl) == wait


@pytest.mark.parametrize(("refresh", "cap"), [(0.5, 5.0), (1.0, 5.0), (5.0, 20.0), (60.0, 30.0)])
def test_backoff_cap(refresh: float, cap: float) -> None:
    assert backoff_cap(refresh) == cap


# --- config -----------------------------------------------------------------------------


def config(cluster: str, extra: str = "") -> Any:
    text = f"{extra}clusters:\n  - name: c\n{cluster}"
    return parse_config(text, "x.yaml", {})


def messages(cluster: str, extra: str = "") -> list[str]:
    with pytest.raises(ConfigError) as info:
        config(cluster, extra)
    return info.value.messages


def test_discovery_config_by_cluster() -> None:
    loaded = config(
        "    discovery: {dns: vllm.llm.svc.cluster.local, port: 8000, refresh: 2s}\n",
        'dns: {nameservers: ["10.96.0.10", "127.0.0.1:5353", "[::1]:53"], timeout: 1s}\n',
    )
    ((cluster, settings),) = loaded.discoveries().items()
    assert (cluster, settings.name, settings.kind, settings.port) == (
        "c",
        "vllm.llm.svc.cluster.local",
        "dns",
        8000,
    )
    assert settings.refresh == 2.0 and settings.max_endpoints == 1000
    assert loaded.dns.servers() == (("10.96.0.10", 53), ("127.0.0.1", 5353), ("::1", 53))
    assert loaded.dns.timeout == 1.0
    srv = config("    discovery: {srv: _http._tcp.vllm.llm.svc.cluster.local}\n").discoveries()
    assert srv["c"].kind == "srv" and srv["c"].port is None and srv["c"].refresh == 5.0


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ("    discovery: {port: 80}\n", "set exactly one of dns (with port) and srv"),
        ("    discovery: {dns: a.b, srv: _x._tcp.a.b, port: 80}\n", "set exactly one"),
        ("    discovery: {dns: a.b}\n", "dns discovery needs a port"),
        ("    discovery: {srv: _x._tcp.a.b, port: 80}\n", "takes each target's port"),
        ("    discovery: {dns: 'a..b', port: 80}\n", "is not a DNS name"),
        ("    discovery: {dns: _x.a.b, port: 80}\n", "is not a DNS name"),
        ("    discovery: {srv: 'a b', port: 80}\n", "is not an SRV name"),
        ("    discovery: {dns: a.b, port: 0}\n", "greater than or equal to 1"),
        ("    discovery: {dns: a.b, port: 80, refresh: 100ms}\n", "greater than or equal to 0.5"),
        ("    discovery: {dns: a.b, port: 80, max_endpoints: 0}\n", "greater than or equal to 1"),
        ("    discovery: {dns: a.b, port: 80, what: 1}\n", "what"),
    ],
)
def test_bad_discovery_is_named(cluster: str, expected: str) -> None:
    (message,) = messages(cluster)
    assert "clusters[0].discovery" in message and expected in message, message


@pytest.mark.parametrize(
    "nameserver", ["dns.example", "10.0.0.1:99999", "10.0.0.1:x", "[fe80::1", "10.0.0"]
)
def test_bad_nameserver_is_named(nameserver: str) -> None:
    (message,) = messages(
        "    discovery: {dns: a.b, port: 80}\n", f'dns: {{nameservers: ["{nameserver}"]}}\n'
    )
    assert message.startswith("x.yaml:1 dns.nameservers"), message


def test_static_and_discovered_endpoints_merge_once() -> None:
    loaded = config(
        "    endpoints: [{address: '10.0.0.1:80', weight: 5}]\n"
        "    discovery: {dns: a.b, port: 80}\n"
    )
    found = (
        EndpointSpec("10.0.0.1:80", "10.0.0.1", 80),
        EndpointSpec("10.0.0.2:80", "10.0.0.2", 80),
    )
    (spec,) = loaded.cluster_specs({"c": found})
    assert [(e.address, e.weight) for e in spec.endpoints] == [
        ("10.0.0.1:80", 5),
        ("10.0.0.2:80", 100),
    ]
    targets = loaded.probe_targets({"c": found})
    assert [t.address for t in targets] == ["10.0.0.1:80", "10.0.0.2:80"]
    # A set found for a cluster without discovery (removed by a reload) is not used.
    plain = config("    endpoints: [{address: '10.0.0.1:80'}]\n")
    assert [e.address for e in plain.cluster_specs({"c": found})[0].endpoints] == ["10.0.0.1:80"]


def test_new_alert_kinds_are_subscribable() -> None:
    loaded = config(
        "    endpoints: [{address: '10.0.0.1:80'}]\n",
        "alerts:\n  webhooks:\n    - url: http://127.0.0.1:9/x\n"
        "      on: [added, removed, discovery_failed, discovery_recovered]\n",
    )
    assert loaded.alerts.webhooks[0].on == (
        "added",
        "removed",
        "discovery_failed",
        "discovery_recovered",
    )


# --- board --------------------------------------------------------------------------------


def spec(*addresses: str) -> ClusterSpec:
    return ClusterSpec(
        "c",
        POLICY,
        tuple(EndpointSpec(a, a.split(":")[0], int(a.split(":")[1])) for a in addresses),
    )


def test_discovery_only_cluster_stays_cold_until_found() -> None:
    board = Board([spec()], 0.0, 0.0)
    board.mark_warm()  # warm_start_timeout with nothing found: an empty push would empty Envoy
    assert not board.is_warm("c")
    (change,) = board.apply_specs([spec("10.0.0.1:80")], 1.0, source="DNS")
    health = board.health("c", "10.0.0.1:80")
    # Found before the first round ended: as "known at boot" as a configured endpoint.
    assert health.known_at_boot and health.state is State.STARTING
    assert change.transition is not None and change.transition.cause is Cause.ADDED
    board.mark_warm()
    assert board.is_warm("c")


def test_dns_changes_name_their_source() -> None:
    board = Board([spec("10.0.0.1:80")], 0.0, 0.0)
    board.mark_warm()
    changes = board.apply_specs([spec("10.0.0.2:80")], 1.0, source="DNS")
    by_address = {c.address: c for c in changes}
    gone, added = by_address["10.0.0.1:80"], by_address["10.0.0.2:80"]
    assert gone.what == "endpoint gone from DNS"
    assert gone.transition is not None and gone.transition.after.reason == "gone from DNS"
    assert gone.transition.to_state is State.DRAINING and gone.transition.cause is Cause.REMOVED
    assert added.what == "endpoint added from DNS"
    assert added.transition is not None and not added.transition.after.known_at_boot
    assert added.transition.after.reason == "new endpoint (from DNS)"
    # Back in DNS while draining: a new endpoint again, STARTING.
    board.apply_specs([spec("10.0.0.1:80", "10.0.0.2:80")], 2.0, source="DNS")
    assert board.health("c", "10.0.0.1:80").state is State.STARTING


# --- alerts and metrics --------------------------------------------------------------------


def test_added_and_removed_are_alert_kinds() -> None:
    board = Board([spec("10.0.0.1:80")], 0.0, 0.0)
    board.mark_warm()
    changes = board.apply_specs([spec("10.0.0.2:80")], 1.0, source="DNS")
    kinds = {c.address: classify(c.transition, None) for c in changes if c.transition}
    assert kinds == {
        "10.0.0.1:80": frozenset({AlertKind.REMOVED}),
        "10.0.0.2:80": frozenset({AlertKind.ADDED}),
    }


def test_notice_event_payload() -> None:
    event = notice_event("id1", "discovery_failed", "c", "DNS servfail: x", 0.0)
    assert event is not None
    body = payload(event)
    assert body["event"] == "discovery_failed" and body["endpoint"] == "*"
    assert body["state"] is None and body["previous"] is None
    assert body["reason"] == "DNS servfail: x" and body["cluster"] == "c"
    assert notice_event("id2", "no-such-kind", "c", "x", 0.0) is None


def test_discovery_metrics_label_clusters() -> None:
    status = {
        "clusters_failing": 1,
        "resolutions_total": 12,
        "clusters": {
            "llama-70b": {"endpoints": 4, "failing": True, "resolutions": 10, "failures": 3},
            "mixtral": {"endpoints": 2, "failing": False, "resolutions": 2, "failures": 0},
        },
    }
    families = {f.name: f for f in discovery_families(status)}
    failing = {
        s.labels["cluster"]: s.value
        for s in families["llm_health_discovery_cluster_failing"].samples
    }
    assert failing == {"llama-70b": 1, "mixtral": 0}
    endpoints = families["llm_health_discovery_cluster_endpoints"].samples
    assert {s.labels["cluster"]: s.value for s in endpoints} == {"llama-70b": 4, "mixtral": 2}
    generic = {f.name for f in component_families({"discovery": status})}
    # Cluster names never become parts of metric names (even "mixtral", an identifier).
    assert generic == {"llm_health_discovery_clusters_failing", "llm_health_discovery_resolutions"}
