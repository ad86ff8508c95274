"""Per-cluster admission data, computed once per published snapshot (not per request).

Capacity of a cluster = sum of the weights sent to Envoy for its routable (HEALTHY or
DEGRADED) endpoints / sum of the base weights of its endpoints (those being removed from
the config excluded). All HEALTHY: 1.0; one of three DEGRADED at 30 %: 0.77; nothing
routable: 0.0. The answers a check can give for a cluster (OK with its capacity header,
503, 429, 403, ...) are prebuilt here with their headers and JSON bodies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llm_health.authz.decision import Decision, Headers, Rule
from llm_health.authz.settings import AuthzConfig
from llm_health.model.board import ClusterSnapshot, HealthSnapshot
from llm_health.model.states import State

_ROUTABLE = (State.HEALTHY, State.DEGRADED)


@dataclass(frozen=True, slots=True)
class Capacity:
    """``ratio`` in 0..1: routable weight sent to Envoy / base weight."""

    healthy: int
    degraded: int
    down: int  # UNHEALTHY, STARTING, DRAINING
    sent_weight: int
    base_weight: int

    @property
    def routable(self) -> int:
        return self.healthy + self.degraded

    @property
    def ratio(self) -> float:
        return self.sent_weight / self.base_weight if self.base_weight else 0.0


def cluster_capacity(cluster: ClusterSnapshot) -> Capacity:
    healthy = degraded = down = sent = base = 0
    for endpoint in cluster.endpoints:
        if not endpoint.removing:
            base += endpoint.spec.weight
        if endpoint.state is State.HEALTHY:
            healthy += 1
        elif endpoint.state is State.DEGRADED:
            degraded += 1
        else:
            down += 1
        if endpoint.state in _ROUTABLE:
            sent += endpoint.view.weight
    return Capacity(healthy, degraded, down, sent, base)


@dataclass(frozen=True, slots=True)
class ClusterAdmission:
    """One cluster's capacity and its prebuilt answers."""

    name: str
    warm: bool
    capacity: Capacity
    ok: Decision
    routed: Decision  # high priority, while a HEALTHY endpoint exists
    no_capacity: Decision
    shed: Decision
    probe_denied: Decision
    cold: Decision


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """Everything ``decide`` needs from one snapshot, for one AuthzConfig."""

    revision: int
    clusters: Mapping[str, ClusterAdmission]
    probe_denied: Decision  # for a request that names no known cluster


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What admission knows of one cluster: all a view is built from. Small and plain, so
    it crosses to the admission process (``server.authz_isolation: process``) instead of
    the whole snapshot."""

    name: str
    warm: bool
    capacity: Capacity


def cluster_facts(snapshot: HealthSnapshot) -> tuple[ClusterFacts, ...]:
    return tuple(
        ClusterFacts(c.name, c.warm, cluster_capacity(c)) for c in snapshot.clusters.values()
    )


def build_view(snapshot: HealthSnapshot, settings: AuthzConfig) -> AdmissionView:
    return view_from_facts(snapshot.revision, cluster_facts(snapshot), settings)


def view_from_facts(
    revision: int, facts: tuple[ClusterFacts, ...], settings: AuthzConfig
) -> AdmissionView:
    clusters = {f.name: _cluster(f, settings) for f in facts}
    return AdmissionView(revision, MappingProxyType(clusters), _probe_denied(None, settings))


def _cluster(facts: ClusterFacts, settings: AuthzConfig) -> ClusterAdmission:
    capacity = facts.capacity
    text = f"{capacity.ratio:.2f}"
    tag = ((settings.capacity_header, text),)
    name = facts.name
    return ClusterAdmission(
        name=name,
        warm=facts.warm,
        capacity=capacity,
        ok=Decision(Rule.OK, name, set_headers=tag),
        routed=Decision(
            Rule.PRIORITY_ROUTED,
            name,
            set_headers=((settings.route_header, settings.route_value), *tag),
        ),
        no_capacity=_deny(Rule.NO_CAPACITY, name, 503, _no_capacity(name, capacity), settings, tag),
        shed=_deny(Rule.SHED, name, 429, _shed(name, capacity, settings), settings, tag),
        probe_denied=_probe_denied(name, settings),
        cold=Decision(Rule.COLD, name),
    )


def _no_capacity(name: str, capacity: Capacity) -> str:
    return (
        f"no healthy backend in cluster {name}: "
        f"{capacity.down} of {capacity.down + capacity.routable} endpoints are out of service"
    )


def _shed(name: str, capacity: Capacity, settings: AuthzConfig) -> str:
    return (
        f"cluster {name} is at {capacity.ratio:.0%} of its capacity (below "
        f"{settings.shed_below:.0%}): low-priority requests are turned away, retry later"
    )


def _deny(
    rule: Rule, name: str, status: int, message: str, settings: AuthzConfig, extra: Headers
) -> Decision:
    retry_after = settings.retry_after_s
    body = _body(message, rule, status, cluster=name, retry_after_s=retry_after)
    headers = (("retry-after", str(retry_after)), ("content-type", "application/json"), *extra)
    return Decision(rule, name, status, reply_headers=headers, body=body)


def _probe_denied(name: str | None, settings: AuthzConfig) -> Decision:
    message = f"client requests may not carry the {settings.probe_header_name} header"
    body = _body(message, Rule.PROBE_DENIED, 403, cluster=name)
    headers = (("content-type", "application/json"),)
    return Decision(Rule.PROBE_DENIED, name, 403, reply_headers=headers, body=body)


def _body(message: str, rule: Rule, status: int, **fields: object) -> str:
    """An OpenAI-style error object, so SDK clients show ``message``."""
    error = {"message": message, "type": rule.value, "code": status, **fields}
    return json.dumps({"error": error}, separators=(",", ":"))
