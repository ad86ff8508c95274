"""Which state changes are alerts, and what an alert says (pure: no I/O, no clock).

Event kinds (``alerts.webhooks[].on``):
- ``unhealthy``: the endpoint entered UNHEALTHY (from any other state);
- ``recovered``: it left UNHEALTHY for HEALTHY or DEGRADED (routed again);
- ``fatal``: a FATAL probe (CUDA error, NCCL, Xid ...) raised an alert
  (``Transition.alert``), whether it moved the endpoint or found it already UNHEALTHY;
- ``added``: a new endpoint (hot reload or DNS discovery) entered STARTING;
- ``removed``: an endpoint left the config or DNS and is DRAINING out;
- ``discovery_failed`` / ``discovery_recovered``: a cluster's DNS discovery started
  failing (the last known set is kept) / answers again. Cluster-level: ``endpoint`` is
  "*" and there is no state (``notice_event``);
- ``fleet_fallback`` / ``fleet_recovered``: fleet mode lost Redis (this replica probes
  every endpoint itself) / shares probes again. Cluster "*", no endpoint, no state;
- ``remediation``: a remediation hook ran (or was a dry run), with its outcome.

The first three are the default subscription; the others are opt-in.

One state change is one event, even when it is of two kinds (a FATAL probe that takes a
HEALTHY endpoint out is ``unhealthy`` and ``fatal``): a webhook subscribed to either kind
gets it once. Its ``primary`` kind is the most specific one (fatal > unhealthy >
recovered) and names the event in payloads and in deduplication.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_health.model.causes import Cause
from llm_health.model.machine import Transition
from llm_health.model.outcome import ProbeResult, round_ms
from llm_health.model.states import State


class AlertKind(enum.Enum):
    UNHEALTHY = "unhealthy"
    RECOVERED = "recovered"
    FATAL = "fatal"
    ADDED = "added"
    REMOVED = "removed"
    DISCOVERY_FAILED = "discovery_failed"
    DISCOVERY_RECOVERED = "discovery_recovered"
    FLEET_FALLBACK = "fleet_fallback"
    FLEET_RECOVERED = "fleet_recovered"
    REMEDIATION = "remediation"


_PRIORITY = (
    AlertKind.FATAL,
    AlertKind.UNHEALTHY,
    AlertKind.RECOVERED,
    AlertKind.REMOVED,
    AlertKind.ADDED,
    AlertKind.DISCOVERY_FAILED,
    AlertKind.DISCOVERY_RECOVERED,
    AlertKind.FLEET_FALLBACK,
    AlertKind.FLEET_RECOVERED,
    AlertKind.REMEDIATION,
)
_ROUTED = frozenset({State.HEALTHY, State.DEGRADED})


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One alert. ``time`` is wall-clock seconds (``time.time()``); ``id`` is unique per
    event and the same on every delivery attempt (receivers may deduplicate on it)."""

    id: str
    kinds: frozenset[AlertKind]
    cluster: str
    endpoint: str
    state: State | None  # None: a cluster-level event (a notice)
    previous: State | None
    reason: str
    time: float
    result: ProbeResult | None = None
    cause: Cause = Cause.OTHER

    @property
    def primary(self) -> AlertKind:
        return next(kind for kind in _PRIORITY if kind in self.kinds)

    @property
    def endpoint_key(self) -> str:
        return f"{self.cluster}/{self.endpoint}"


def classify(transition: Transition, result: ProbeResult | None) -> frozenset[AlertKind]:
    """The alert kinds of one transition (empty: not an alert)."""
    kinds: set[AlertKind] = set()
    after = transition.after.state
    if transition.changed and after is State.UNHEALTHY and transition.from_state is not after:
        kinds.add(AlertKind.UNHEALTHY)
    if transition.changed and transition.from_state is State.UNHEALTHY and after in _ROUTED:
        kinds.add(AlertKind.RECOVERED)
    if transition.alert and transition.cause is Cause.FATAL:
        kinds.add(AlertKind.FATAL)
    if transition.cause is Cause.ADDED:
        kinds.add(AlertKind.ADDED)
    if transition.changed and after is State.DRAINING and transition.cause is Cause.REMOVED:
        kinds.add(AlertKind.REMOVED)
    return frozenset(kinds)


def notice_event(
    event_id: str, kind: str, cluster: str, reason: str, wall_time: float
) -> AlertEvent | None:
    """The AlertEvent of a cluster-level notice (``core.control.Notice``); None for a
    notice kind that is not an alert kind."""
    try:
        alert_kind = AlertKind(kind)
    except ValueError:
        return None
    return AlertEvent(
        event_id, frozenset({alert_kind}), cluster, "*", None, None, reason, wall_time
    )


def alert_event(
    event_id: str,
    cluster: str,
    endpoint: str,
    transition: Transition,
    result: ProbeResult | None,
    wall_time: float,
) -> AlertEvent | None:
    """The AlertEvent for a transition, or None when it is not an alert."""
    kinds = classify(transition, result)
    if not kinds:
        return None
    health = transition.after
    return AlertEvent(
        event_id,
        kinds,
        cluster,
        endpoint,
        health.state,
        transition.from_state,
        health.reason,
        wall_time,
        result,
        transition.cause,
    )


def payload(event: AlertEvent) -> dict[str, Any]:
    """The JSON body POSTed to a webhook (JSON-ready). A reason or ``detail`` may quote
    what a backend answered: the component scrubs the body of every configured secret
    before it is queued (``alerts.component``)."""
    return {
        "id": event.id,
        "event": event.primary.value,
        "events": sorted(kind.value for kind in event.kinds),
        "cluster": event.cluster,
        "endpoint": event.endpoint,
        "state": None if event.state is None else event.state.value,
        "previous": None if event.previous is None else event.previous.value,
        "reason": event.reason,
        "cause": event.cause.value,
        "time": iso_time(event.time),
        "timings": timings(event.result),
        "source": "llm-health",
    }


def timings(result: ProbeResult | None) -> dict[str, Any] | None:
    """The probe that caused the event, in milliseconds (None: no probe, e.g. a signal)."""
    if result is None:
        return None
    return {
        "outcome": result.outcome.value,
        "started_at": iso_time(result.started_at),
        "connect_ms": round_ms(result.connect_ms),
        "headers_ms": round_ms(result.headers_ms),
        "ttft_ms": round_ms(result.ttft_ms),
        "total_ms": round_ms(result.total_ms),
        "loop_lag_ms": round_ms(result.loop_lag_ms),
        "status": result.status,
        "detail": result.detail,
    }


def iso_time(wall_time: float) -> str:
    """ISO-8601 in UTC with milliseconds, e.g. ``2025-01-02T03:04:05.678Z``."""
    text = datetime.fromtimestamp(wall_time, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")
