"""Domain <-> protobuf for the admin API (``llm_health.v1``). No I/O, no gRPC.

Both directions are exact: ``snapshot_from_pb(snapshot_to_pb(s))`` rebuilds every field
that ``/status`` shows (floats travel as doubles), so the CLI can render the very same
``/status`` document from an API answer (``llm-health status --json``).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from google.protobuf.duration_pb2 import Duration

from llm_health.adminpb import admin_pb2 as pb
from llm_health.model.board import (
    ClusterSnapshot,
    EndpointSnapshot,
    EndpointSpec,
    HealthSnapshot,
)
from llm_health.model.causes import Cause
from llm_health.model.envoy_view import EnvoyHealth, EnvoyView
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import State

_STATES = {
    State.STARTING: pb.STATE_STARTING,
    State.HEALTHY: pb.STATE_HEALTHY,
    State.DEGRADED: pb.STATE_DEGRADED,
    State.UNHEALTHY: pb.STATE_UNHEALTHY,
    State.DRAINING: pb.STATE_DRAINING,
}
_HEALTH = {
    EnvoyHealth.HEALTHY: pb.ENVOY_HEALTH_HEALTHY,
    EnvoyHealth.UNHEALTHY: pb.ENVOY_HEALTH_UNHEALTHY,
    EnvoyHealth.DRAINING: pb.ENVOY_HEALTH_DRAINING,
}
_OUTCOMES = {
    Outcome.FAST: pb.OUTCOME_FAST,
    Outcome.SLOW: pb.OUTCOME_SLOW,
    Outcome.OVERLOADED: pb.OUTCOME_OVERLOADED,
    Outcome.TIMEOUT: pb.OUTCOME_TIMEOUT,
    Outcome.FATAL: pb.OUTCOME_FATAL,
    Outcome.ERROR: pb.OUTCOME_ERROR,
}
# google.protobuf.Duration's own bounds (google/protobuf/duration.proto): ±10,000 years,
# and nanos a fraction of one second with the sign of seconds.
MAX_DURATION_SECONDS = 315_576_000_000
MAX_DURATION_NANOS = 999_999_999
_STATES_BACK = {v: k for k, v in _STATES.items()}
_HEALTH_BACK = {v: k for k, v in _HEALTH.items()}
_OUTCOMES_BACK = {v: k for k, v in _OUTCOMES.items()}


def state_to_pb(state: State) -> pb.State:
    return _STATES[state]


def state_from_pb(value: int) -> State:
    """ValueError for STATE_UNSPECIFIED or an unknown number."""
    try:
        return _STATES_BACK[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"state {value} is not one of {[s.value for s in State]}") from None


def duration_from_pb(message: Duration) -> float:
    """The seconds a Duration holds. ValueError for one its spec does not allow: read as
    ``seconds + nanos / 1e9``, nanos = 2^31-1 would be 2.147 s more than any client meant."""
    seconds, nanos = message.seconds, message.nanos
    if abs(seconds) > MAX_DURATION_SECONDS:
        why = f"seconds must be within ±{MAX_DURATION_SECONDS:,}"
    elif abs(nanos) > MAX_DURATION_NANOS:
        why = f"nanos must be within ±{MAX_DURATION_NANOS:,}"
    elif (seconds < 0 < nanos) or (nanos < 0 < seconds):
        why = "nanos must have the sign of seconds"
    else:
        return seconds + nanos / 1e9
    raise ValueError(
        f"duration is not a valid google.protobuf.Duration (seconds={seconds}, "
        f"nanos={nanos}): {why}"
    )


def result_to_pb(result: ProbeResult) -> pb.ProbeResult:
    message = pb.ProbeResult(
        outcome=_OUTCOMES[result.outcome],
        started_at=result.started_at,
        total_ms=result.total_ms,
        detail=result.detail,
        loop_lag_ms=result.loop_lag_ms,
    )
    _set_optional(message, "ttft_ms", result.ttft_ms)
    _set_optional(message, "connect_ms", result.connect_ms)
    _set_optional(message, "headers_ms", result.headers_ms)
    _set_optional(message, "http_status", result.status)
    return message


def result_from_pb(message: pb.ProbeResult) -> ProbeResult:
    return ProbeResult(
        outcome=_OUTCOMES_BACK.get(message.outcome, Outcome.ERROR),
        started_at=message.started_at,
        ttft_ms=_optional(message, "ttft_ms"),
        connect_ms=_optional(message, "connect_ms"),
        headers_ms=_optional(message, "headers_ms"),
        total_ms=message.total_ms,
        status=message.http_status if message.HasField("http_status") else None,
        detail=message.detail,
        loop_lag_ms=message.loop_lag_ms,
    )


def endpoint_to_pb(endpoint: EndpointSnapshot) -> pb.Endpoint:
    spec, view = endpoint.spec, endpoint.view
    message = pb.Endpoint(
        cluster=endpoint.cluster,
        address=spec.address,
        host=spec.host,
        port=spec.port,
        base_weight=spec.weight,
        state=_STATES[endpoint.state],
        reason=endpoint.reason,
        cause=endpoint.cause.value,
        since=endpoint.since,
        envoy_health=_HEALTH[view.health],
        envoy_weight=view.weight,
        lb_label=view.lb_label or "",
        signals=dict(endpoint.signals),
        removing=endpoint.removing,
    )
    if endpoint.probe_state is not None:
        message.probe_state = _STATES[endpoint.probe_state]
    if endpoint.last is not None:
        message.last_probe.CopyFrom(result_to_pb(endpoint.last))
    _set_optional(message, "override_until", endpoint.override_until)
    return message


def endpoint_from_pb(message: pb.Endpoint) -> EndpointSnapshot:
    return EndpointSnapshot(
        cluster=message.cluster,
        spec=EndpointSpec(message.address, message.host, message.port, message.base_weight),
        state=_STATES_BACK.get(message.state, State.UNHEALTHY),
        reason=message.reason,
        since=message.since,
        view=EnvoyView(
            _HEALTH_BACK.get(message.envoy_health, EnvoyHealth.UNHEALTHY),
            message.envoy_weight,
            message.lb_label or None,
        ),
        last=result_from_pb(message.last_probe) if message.HasField("last_probe") else None,
        probe_state=_STATES_BACK.get(message.probe_state),
        signals=MappingProxyType(dict(message.signals)),
        override_until=_optional(message, "override_until"),
        removing=message.removing,
        cause=_cause(message.cause),
    )


def cluster_to_pb(cluster: ClusterSnapshot) -> pb.Cluster:
    return pb.Cluster(
        name=cluster.name,
        warm=cluster.warm,
        envoy_version=cluster.envoy_version,
        endpoints=[endpoint_to_pb(e) for e in cluster.endpoints],
    )


def snapshot_to_pb(snapshot: HealthSnapshot, cluster: str = "") -> pb.ListEndpointsResponse:
    """``cluster`` empty: every cluster. KeyError for an unknown cluster."""
    if cluster and cluster not in snapshot.clusters:
        raise KeyError(cluster)
    chosen = [c for name, c in snapshot.clusters.items() if cluster in ("", name)]
    return pb.ListEndpointsResponse(
        revision=snapshot.revision, clusters=[cluster_to_pb(c) for c in chosen]
    )


def snapshot_from_pb(message: pb.ListEndpointsResponse) -> HealthSnapshot:
    clusters = {c.name: _cluster_from_pb(c) for c in message.clusters}
    return HealthSnapshot(message.revision, MappingProxyType(clusters))


def _cluster_from_pb(message: pb.Cluster) -> ClusterSnapshot:
    endpoints = tuple(endpoint_from_pb(e) for e in message.endpoints)
    return ClusterSnapshot(message.name, endpoints, message.warm, message.envoy_version)


def keys_to_pb(keys: Iterable[tuple[str, str]]) -> list[pb.EndpointKey]:
    return [pb.EndpointKey(cluster=c, address=a) for c, a in keys]


def _set_optional(message: object, name: str, value: float | int | None) -> None:
    if value is not None:
        setattr(message, name, value)


def _optional(message: object, name: str) -> float | None:
    has: bool = message.HasField(name)  # type: ignore[attr-defined]
    return float(getattr(message, name)) if has else None


def _cause(text: str) -> Cause:
    """A peer's cause label; one this version does not know reads as OTHER."""
    try:
        return Cause(text)
    except ValueError:
        return Cause.OTHER
