"""HDS protobufs <-> the domain: the only module of ``llm_health.hds`` that knows them.

Envoy behaviour this relies on (Envoy 1.40, source/common/upstream/
health_discovery_service.cc, checked against the real binary in tests/e2e/test_hds.py):

- A stream starts with one ``HealthCheckRequest`` (node + ``Capability``: HTTP and TCP).
  Envoy reports only after it received a ``HealthCheckSpecifier``, then every
  ``HealthCheckSpecifier.interval`` (default 1 s), even with nothing to check: then the
  message has neither ``health_check_request`` nor ``endpoint_health_response`` set.
- A specifier identical to the previous one on the stream is ignored; a changed one
  updates the HDS clusters *by name* in place (hosts kept keep their health); hosts new
  to a cluster start failed and are reported UNHEALTHY until their first check ran.
- Every report carries the same entries twice: per cluster/locality
  (``cluster_endpoints_health``) and flat (``endpoints_health``, kept for older servers).
  We read the per-cluster form when present and the flat form otherwise.
- HDS clusters never carry traffic, so Envoy would check them at ``no_traffic_interval``
  (default 60 s): both no-traffic intervals are set to the check interval.
- HDS cluster names get their own stats scope (``cluster.<name>.health_check.*``), so they
  carry a prefix: ``hds_<cluster>`` never collides with the EDS cluster's own stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.service.health.v3 import hds_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import duration_pb2, wrappers_pb2

from llm_health.hds.fleet import NodePlan, ReportEntry
from llm_health.hds.ledger import Said
from llm_health.hds.settings import HdsConfig

HDS_CLUSTER_PREFIX = "hds_"

_SAID = {
    health_check_pb2.HEALTHY: Said.HEALTHY,
    health_check_pb2.DEGRADED: Said.HEALTHY,  # reachable; degradation is the probe's call
    health_check_pb2.UNHEALTHY: Said.UNHEALTHY,
    health_check_pb2.TIMEOUT: Said.TIMEOUT,
}


@dataclass(frozen=True, slots=True)
class Identity:
    """Who opened a stream: node id, the node's cluster, what checks it can run."""

    node_id: str
    node_cluster: str
    protocols: frozenset[str]


@dataclass(frozen=True, slots=True)
class Report:
    """One translated ``EndpointHealthResponse``. ``malformed``: entries dropped because
    they had no usable IP socket address or named a cluster we never sent."""

    entries: tuple[ReportEntry, ...]
    malformed: int
    form: Literal["clusters", "flat", "empty"]


def hds_cluster_name(cluster: str) -> str:
    return HDS_CLUSTER_PREFIX + cluster


def identity(request: hds_pb2.HealthCheckRequest) -> Identity:
    protocols = frozenset(_protocol_name(p) for p in request.capability.health_check_protocols)
    return Identity(request.node.id, request.node.cluster, protocols)


def specifier(plan: NodePlan, settings: HdsConfig) -> hds_pb2.HealthCheckSpecifier:
    """The specifier for one node; no clusters at all when it has nothing to check."""
    check = health_check(settings)
    message = hds_pb2.HealthCheckSpecifier(interval=_duration(settings.report_interval))
    for cluster, targets in plan.clusters:
        entry = message.cluster_health_checks.add(cluster_name=hds_cluster_name(cluster))
        entry.health_checks.append(check)
        locality = entry.locality_endpoints.add()
        for host, port in targets:
            address = locality.endpoints.add().address.socket_address
            address.address, address.port_value = host, port
    return message


def health_check(check: HdsConfig) -> health_check_pb2.HealthCheck:
    """envoy.config.core.v3.HealthCheck for ``check`` (timeout, interval and both
    thresholds are required by Envoy's validation)."""
    interval = _duration(check.interval)
    message = health_check_pb2.HealthCheck(
        timeout=_duration(check.timeout),
        interval=interval,
        no_traffic_interval=interval,
        no_traffic_healthy_interval=interval,
        unhealthy_threshold=wrappers_pb2.UInt32Value(value=check.unhealthy_threshold),
        healthy_threshold=wrappers_pb2.UInt32Value(value=check.healthy_threshold),
    )
    if check.check == "tcp":
        message.tcp_health_check.SetInParent()  # no payload: a connect-only check
        return message
    http = message.http_health_check
    http.path = check.path
    http.expected_statuses.extend(status_ranges(check.expected_statuses))
    if check.body is not None:
        http.method = base_pb2.POST
        http.send.binary = check.body.encode()
    return message


def status_ranges(statuses: tuple[int, ...]) -> list[range_pb2.Int64Range]:
    """[200, 201, 204] -> [200, 202), [204, 205) (Int64Range: start inclusive, end not)."""
    spans: list[list[int]] = []
    for status in sorted(set(statuses)):
        if spans and spans[-1][1] == status:
            spans[-1][1] = status + 1
        else:
            spans.append([status, status + 1])
    return [range_pb2.Int64Range(start=start, end=end) for start, end in spans]


def read_report(response: hds_pb2.EndpointHealthResponse) -> Report:
    if response.cluster_endpoints_health:
        return _read_clusters(response)
    if response.endpoints_health:
        flat = [_entry(None, e) for e in response.endpoints_health]
        return _report(flat, "flat")
    return Report((), 0, "empty")


def _read_clusters(response: hds_pb2.EndpointHealthResponse) -> Report:
    found: list[ReportEntry | None] = []
    for cluster in response.cluster_endpoints_health:
        name = cluster.cluster_name
        ours = name.startswith(HDS_CLUSTER_PREFIX)
        for locality in cluster.locality_endpoints_health:
            for endpoint in locality.endpoints_health:
                plugin_cluster = name.removeprefix(HDS_CLUSTER_PREFIX)
                found.append(_entry(plugin_cluster, endpoint) if ours else None)
    return _report(found, "clusters")


def _report(found: list[ReportEntry | None], form: Literal["clusters", "flat"]) -> Report:
    entries = tuple(e for e in found if e is not None)
    return Report(entries, len(found) - len(entries), form if found else "empty")


def _entry(cluster: str | None, endpoint: hds_pb2.EndpointHealth) -> ReportEntry | None:
    address = endpoint.endpoint.address
    if not address.HasField("socket_address"):
        return None
    socket = address.socket_address
    if not socket.address or not 0 < socket.port_value < 65536:
        return None
    said = _SAID.get(endpoint.health_status, Said.UNKNOWN)
    return ReportEntry(cluster, socket.address, socket.port_value, said)


def _protocol_name(value: int) -> str:
    try:
        name: str = hds_pb2.Capability.Protocol.Name(value)
    except ValueError:
        return str(value)
    return name


def _duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message
