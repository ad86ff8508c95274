"""EDS resources: a ``ClusterSnapshot`` as Envoy's ``ClusterLoadAssignment`` (docs/design.md §4).

The only module that turns domain objects into endpoint protobufs. Built resources are
cached per ``(cluster name, envoy_version)``: ``envoy_version`` is a content hash of exactly
the fields written here, so a 1,000-endpoint cluster is serialised once per change, not
once per stream or per push. And a change costs only the endpoints that changed: each
endpoint's ``LbEndpoint`` is serialised once per (address, health, weight, label) and the
assignment is the concatenation of those bytes (protobuf's wire format: a message is its
fields one after another, a repeated field is each element tagged in turn), so a state
change in a 10,000-endpoint cluster serialises one endpoint, not 10,000
(docs/design.md §16). Single event loop; not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from envoy.config.core.v3 import address_pb2, base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, struct_pb2, wrappers_pb2

from llm_health.model.board import ClusterSnapshot, EndpointSnapshot
from llm_health.model.envoy_view import EnvoyHealth

TYPE_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

LB_METADATA_NAMESPACE = "envoy.lb"
"""``filter_metadata`` key the subset load balancer reads (``LbSubsetConfig``)."""
LB_METADATA_KEY = "llm_health"

_HEALTH = {
    EnvoyHealth.HEALTHY: health_check_pb2.HEALTHY,
    EnvoyHealth.UNHEALTHY: health_check_pb2.UNHEALTHY,
    EnvoyHealth.DRAINING: health_check_pb2.DRAINING,
}


def cluster_load_assignment(cluster: ClusterSnapshot) -> endpoint_pb2.ClusterLoadAssignment:
    """One locality holding every endpoint of ``cluster``, UNHEALTHY ones included
    (docs/design.md §4: Envoy's view stays complete; Envoy routes only to HEALTHY hosts)."""
    locality = endpoint_components_pb2.LocalityLbEndpoints(
        lb_endpoints=[lb_endpoint(e) for e in cluster.endpoints]
    )
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster.name, endpoints=[locality])


def lb_endpoint(endpoint: EndpointSnapshot) -> endpoint_components_pb2.LbEndpoint:
    """One ``LbEndpoint``: address, ``health_status``, ``load_balancing_weight``, label."""
    view = endpoint.view
    address = address_pb2.Address(
        socket_address=address_pb2.SocketAddress(
            address=endpoint.spec.host, port_value=endpoint.spec.port
        )
    )
    lb = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(address=address),
        health_status=_HEALTH[view.health],
        load_balancing_weight=wrappers_pb2.UInt32Value(value=_weight(view.weight)),
    )
    if view.lb_label is not None:
        lb.metadata.CopyFrom(_label_metadata(view.lb_label))
    return lb


def _weight(weight: int) -> int:
    """Never 0: ``LbEndpoint.load_balancing_weight`` has the validate rule ``gte: 1``, and
    Envoy NACKs the whole assignment otherwise. "No traffic" is health_status UNHEALTHY."""
    return max(1, weight)


def _label_metadata(label: str) -> base_pb2.Metadata:
    """``filter_metadata["envoy.lb"]["llm_health"] = label`` for subset routing."""
    fields = struct_pb2.Struct()
    fields.update({LB_METADATA_KEY: label})
    return base_pb2.Metadata(filter_metadata={LB_METADATA_NAMESPACE: fields})


@dataclass(frozen=True, slots=True)
class BuiltResource:
    """A cluster's assignment, packed once: ``packed`` for SotW ``DiscoveryResponse``,
    ``delta`` (a ``Resource`` with name and version) for ``DeltaDiscoveryResponse``.
    Treat both as read-only: they are shared by every stream."""

    name: str
    version: str
    packed: any_pb2.Any
    delta: discovery_pb2.Resource


class ResourceCache:
    """LRU of ``BuiltResource`` by ``(name, envoy_version)``. ``max_entries`` bounds memory
    (each entry is one serialised assignment); a miss costs one build."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._entries: OrderedDict[tuple[str, str], BuiltResource] = OrderedDict()
        self._max_entries = max_entries
        self._parts = EndpointBytes()
        # Per cluster, the endpoints of the last build and their bytes: the board reuses
        # an unchanged endpoint's snapshot object, so an identity check finds what to
        # reuse without even a dict lookup (holding them keeps the identities valid).
        self._last: dict[str, tuple[tuple[EndpointSnapshot, ...], list[bytes]]] = {}

    def get(self, cluster: ClusterSnapshot) -> BuiltResource:
        key = (cluster.name, cluster.envoy_version)
        built = self._entries.get(key)
        if built is None:
            built = self._entries[key] = build(cluster, self._framed(cluster))
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return built

    def __len__(self) -> int:
        return len(self._entries)

    def _framed(self, cluster: ClusterSnapshot) -> list[bytes]:
        endpoints, get = cluster.endpoints, self._parts.get
        old_endpoints, old_bytes = self._last.get(cluster.name, ((), []))
        if len(old_endpoints) == len(endpoints):
            framed = [
                b if new is old else get(new)
                for new, old, b in zip(endpoints, old_endpoints, old_bytes, strict=True)
            ]
        else:
            framed = [get(e) for e in endpoints]
        if len(self._last) >= self._max_entries and cluster.name not in self._last:
            self._last.clear()
        self._last[cluster.name] = (endpoints, framed)
        return framed


class EndpointBytes:
    """Serialised ``LbEndpoint`` per Envoy-visible content, framed as an element of
    ``LocalityLbEndpoints.lb_endpoints``. Bounded: cleared when it outgrows
    ``max_entries`` (rebuilding costs one serialisation per endpoint)."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._entries: dict[tuple[str, int, EnvoyHealth, int, str | None], bytes] = {}
        self._max_entries = max_entries

    def get(self, endpoint: EndpointSnapshot) -> bytes:
        view = endpoint.view
        key = (endpoint.spec.host, endpoint.spec.port, view.health, view.weight, view.lb_label)
        framed = self._entries.get(key)
        if framed is None:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            payload = lb_endpoint(endpoint).SerializeToString(deterministic=True)
            framed = self._entries[key] = _field(_LB_ENDPOINTS, payload)
        return framed


# Field numbers (envoy/config/endpoint/v3/endpoint.proto, endpoint_components.proto).
_CLUSTER_NAME = 1  # ClusterLoadAssignment.cluster_name
_ENDPOINTS = 2  # ClusterLoadAssignment.endpoints (LocalityLbEndpoints)
_LB_ENDPOINTS = 2  # LocalityLbEndpoints.lb_endpoints
_LENGTH_DELIMITED = 2  # wire type of strings and messages


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field: tag, length, payload."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def assignment_bytes(cluster: ClusterSnapshot, framed: list[bytes]) -> bytes:
    """``cluster_load_assignment(cluster)`` serialised from its endpoints' framed bytes
    (``EndpointBytes``, in order): byte for byte what ``SerializeToString(deterministic=
    True)`` writes (fields in number order; proto3 leaves an empty name out)."""
    locality = b"".join(framed)
    name = _field(_CLUSTER_NAME, cluster.name.encode()) if cluster.name else b""
    return name + _field(_ENDPOINTS, locality)


def build(cluster: ClusterSnapshot, framed: list[bytes] | None = None) -> BuiltResource:
    """Build and pack ``cluster`` (uncached; prefer ``RESOURCES.get``). ``framed``: its
    endpoints' bytes if already at hand."""
    if framed is None:
        parts = EndpointBytes()
        framed = [parts.get(e) for e in cluster.endpoints]
    value = assignment_bytes(cluster, framed)
    packed = any_pb2.Any(type_url=TYPE_URL, value=value)
    delta = discovery_pb2.Resource(
        name=cluster.name, version=cluster.envoy_version, resource=packed
    )
    return BuiltResource(cluster.name, cluster.envoy_version, packed, delta)


RESOURCES = ResourceCache()
"""The process-wide cache every stream shares."""
