"""HDS protobuf translation (llm_health.hds.wire) and the ``hds:`` config section."""

from __future__ import annotations

import re
import textwrap

import pytest
from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.service.health.v3 import hds_pb2

from llm_health.config import parse_config
from llm_health.errors import ConfigError
from llm_health.hds import wire
from llm_health.hds.fleet import NodePlan, ReportEntry
from llm_health.hds.ledger import Said
from llm_health.hds.settings import HdsConfig

PLAN = NodePlan((("llama", (("10.0.0.1", 8000), ("10.0.0.2", 8000))), ("qwen", (("::1", 9000),))))


def test_specifier_names_clusters_and_endpoints_and_sets_the_report_interval() -> None:
    spec = wire.specifier(PLAN, HdsConfig(report_interval="2500ms"))
    assert spec.interval.ToMilliseconds() == 2500
    assert [c.cluster_name for c in spec.cluster_health_checks] == ["hds_llama", "hds_qwen"]
    llama = spec.cluster_health_checks[0]
    (locality,) = llama.locality_endpoints
    assert [
        (e.address.socket_address.address, e.address.socket_address.port_value)
        for e in locality.endpoints
    ] == [("10.0.0.1", 8000), ("10.0.0.2", 8000)]
    assert len(llama.health_checks) == 1


def test_nothing_assigned_is_an_empty_specifier_not_an_error() -> None:
    spec = wire.specifier(NodePlan(), HdsConfig())
    assert list(spec.cluster_health_checks) == []
    assert spec.interval.ToMilliseconds() == 1000


def test_tcp_check_is_connect_only_and_checks_without_traffic() -> None:
    check = wire.health_check(HdsConfig(interval="500ms", timeout="250ms", unhealthy_threshold=3))
    assert check.HasField("tcp_health_check")
    assert not check.tcp_health_check.HasField("send")
    assert check.timeout.ToMilliseconds() == 250
    assert check.interval.ToMilliseconds() == 500
    # HDS clusters carry no traffic: without these Envoy checks every 60 s.
    assert check.no_traffic_interval.ToMilliseconds() == 500
    assert check.no_traffic_healthy_interval.ToMilliseconds() == 500
    assert (check.unhealthy_threshold.value, check.healthy_threshold.value) == (3, 2)


def test_http_check_path_statuses_and_post_body() -> None:
    check = wire.health_check(
        HdsConfig(check="http", path="/ping", expected_statuses=(204, 200, 201), body="{}")
    )
    http = check.http_health_check
    assert http.path == "/ping"
    assert [(r.start, r.end) for r in http.expected_statuses] == [(200, 202), (204, 205)]
    assert http.method == base_pb2.POST
    assert http.send.binary == b"{}"
    plain = wire.health_check(HdsConfig(check="http")).http_health_check
    assert plain.method == base_pb2.METHOD_UNSPECIFIED  # Envoy's default: GET
    assert not plain.HasField("send")


def _endpoint(address: str, port: int, status: int) -> hds_pb2.EndpointHealth:
    health = hds_pb2.EndpointHealth(health_status=status)  # type: ignore[arg-type]
    health.endpoint.address.socket_address.address = address
    health.endpoint.address.socket_address.port_value = port
    return health


def test_report_prefers_the_per_cluster_form() -> None:
    response = hds_pb2.EndpointHealthResponse()
    cluster = response.cluster_endpoints_health.add(cluster_name="hds_llama")
    cluster.locality_endpoints_health.add().endpoints_health.append(
        _endpoint("10.0.0.1", 8000, health_check_pb2.TIMEOUT)
    )
    response.endpoints_health.append(_endpoint("10.0.0.1", 8000, health_check_pb2.TIMEOUT))
    report = wire.read_report(response)
    assert report.form == "clusters"
    assert report.entries == (ReportEntry("llama", "10.0.0.1", 8000, Said.TIMEOUT),)
    assert report.malformed == 0


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (health_check_pb2.HEALTHY, Said.HEALTHY),
        (health_check_pb2.DEGRADED, Said.HEALTHY),
        (health_check_pb2.UNHEALTHY, Said.UNHEALTHY),
        (health_check_pb2.TIMEOUT, Said.TIMEOUT),
        (health_check_pb2.DRAINING, Said.UNKNOWN),
        (health_check_pb2.UNKNOWN, Said.UNKNOWN),
        (99, Said.UNKNOWN),  # a future enum value
    ],
)
def test_flat_form_and_status_mapping(status: int, said: Said) -> None:
    response = hds_pb2.EndpointHealthResponse(endpoints_health=[_endpoint("::1", 9, status)])
    report = wire.read_report(response)
    assert report.form == "flat"
    assert report.entries == (ReportEntry(None, "::1", 9, said),)


def test_malformed_entries_are_counted_and_dropped() -> None:
    response = hds_pb2.EndpointHealthResponse()
    foreign = response.cluster_endpoints_health.add(cluster_name="llama")  # not ours
    foreign.locality_endpoints_health.add().endpoints_health.append(
        _endpoint("10.0.0.1", 8000, health_check_pb2.HEALTHY)
    )
    ours = response.cluster_endpoints_health.add(cluster_name="hds_llama")
    locality = ours.locality_endpoints_health.add()
    locality.endpoints_health.add()  # no address at all
    pipe = locality.endpoints_health.add()
    pipe.endpoint.address.pipe.path = "/tmp/socket"
    locality.endpoints_health.append(_endpoint("10.0.0.1", 0, health_check_pb2.HEALTHY))
    locality.endpoints_health.append(_endpoint("", 80, health_check_pb2.HEALTHY))
    locality.endpoints_health.append(_endpoint("10.0.0.2", 8000, health_check_pb2.HEALTHY))
    report = wire.read_report(response)
    assert report.malformed == 5
    assert report.entries == (ReportEntry("llama", "10.0.0.2", 8000, Said.HEALTHY),)
    assert wire.read_report(hds_pb2.EndpointHealthResponse()).form == "empty"


def test_identity_reads_node_and_capability() -> None:
    request = hds_pb2.HealthCheckRequest()
    request.node.id, request.node.cluster = "gw-1", "edge"
    request.capability.health_check_protocols.extend([hds_pb2.Capability.TCP, 7])  # type: ignore[list-item]
    assert wire.identity(request) == wire.Identity("gw-1", "edge", frozenset({"TCP", "7"}))


# --------------------------------------------------------------------------- config

BASE = "clusters:\n  - name: llama\n    endpoints: [{address: 10.0.0.1:8000}]\n"


def config(hds: str) -> HdsConfig:
    return parse_config(textwrap.dedent(hds) + BASE, "x.yaml", {}).hds


def test_defaults_leave_users_without_hds_unaffected() -> None:
    settings = parse_config(BASE, "x.yaml", {}).hds
    assert settings == HdsConfig()
    assert settings.enabled and settings.check == "tcp"
    assert (settings.checkers_per_endpoint, settings.quorum) == (2, None)
    assert (settings.report_interval, settings.report_ttl) == (1.0, 5.0)


def test_every_key_is_read() -> None:
    settings = config(
        """\
        hds:
          enabled: false
          check: http
          path: /ping
          expected_statuses: [200, 204]
          body: '{"prompt": "hi"}'
          interval: 2s
          timeout: 300ms
          unhealthy_threshold: 3
          healthy_threshold: 4
          report_interval: 500ms
          checkers_per_endpoint: 3
          quorum: 1
          report_ttl: 4s
        """
    )
    assert settings == HdsConfig(
        enabled=False,
        check="http",
        path="/ping",
        expected_statuses=(200, 204),
        body='{"prompt": "hi"}',
        interval="2s",
        timeout="300ms",
        unhealthy_threshold=3,
        healthy_threshold=4,
        report_interval="500ms",
        checkers_per_endpoint=3,
        quorum=1,
        report_ttl="4s",
    )
    assert (settings.interval, settings.timeout, settings.report_interval) == (2.0, 0.3, 0.5)
    assert settings.protocol == "HTTP" and settings.first_check_grace_s == 1.3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hds:\n  body: x\n", r"x.yaml:1 hds: .*body needs check: http"),
        ("hds:\n  quorum: 3\n", r"x.yaml:1 hds: .*quorum cannot exceed checkers_per_endpoint"),
        ("hds:\n  report_ttl: 1s\n", r"x.yaml:1 hds: .*report_ttl must be longer"),
        ("hds:\n  expected_statuses: [200, 700]\n", r"x.yaml:2 hds.expected_statuses: .*700"),
        ("hds:\n  check: grpc\n", r"x.yaml:2 hds.check: 'grpc' is not one of"),
        ("hds:\n  path: health\n", r"x.yaml:2 hds.path: "),
        ("hds:\n  interval: 1\n", r"x.yaml:2 hds.interval: .*not a duration"),
        ("hds:\n  checkers_per_endpoint: 0\n", r"x.yaml:2 hds.checkers_per_endpoint: "),
        (
            "hds:\n  chekers_per_endpoint: 2\n",
            r'x.yaml:2 hds.chekers_per_endpoint: unknown key \(did you mean "checkers_per_endpoint"\?\)',
        ),
    ],
)
def test_bad_hds_settings_name_line_and_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text + BASE, "x.yaml", {})
    assert any(re.match(message, m) for m in caught.value.messages), caught.value.messages
