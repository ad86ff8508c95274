"""What changed between two HealthSnapshots, per endpoint (the admin API's watch stream).

An endpoint "changed" when anything a reader acts on differs: state, reason, since, what
Envoy receives, the machine's own verdict, overrides, outside signals, removal. A new
probe result alone is not a change (that is every second per endpoint). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from llm_health.model.board import EndpointSnapshot, HealthSnapshot
from llm_health.model.states import EndpointKey


@dataclass(frozen=True, slots=True)
class EndpointChanges:
    """``changed``: added or changed endpoints (after); ``removed``: gone since before."""

    changed: tuple[EndpointSnapshot, ...]
    removed: tuple[EndpointKey, ...]

    def __bool__(self) -> bool:
        return bool(self.changed or self.removed)


def endpoints_of(
    snapshot: HealthSnapshot, cluster: str | None = None
) -> Iterator[EndpointSnapshot]:
    """Every endpoint of ``snapshot`` (of one cluster when ``cluster`` is given)."""
    for name, entry in snapshot.clusters.items():
        if cluster is None or name == cluster:
            yield from entry.endpoints


def diff(
    before: HealthSnapshot, after: HealthSnapshot, cluster: str | None = None
) -> EndpointChanges:
    """Endpoints added/changed in ``after`` and removed from ``before``, in board order."""
    old = {_key(e): e for e in endpoints_of(before, cluster)}
    new = {_key(e): e for e in endpoints_of(after, cluster)}
    changed = tuple(e for k, e in new.items() if k not in old or _view(old[k]) != _view(e))
    removed = tuple(k for k in old if k not in new)
    return EndpointChanges(changed, removed)


def _key(endpoint: EndpointSnapshot) -> EndpointKey:
    return endpoint.cluster, endpoint.spec.address


def _view(e: EndpointSnapshot) -> tuple[object, ...]:
    signals = tuple(sorted(e.signals.items()))
    return (
        e.spec,
        e.state,
        e.reason,
        e.since,
        e.view,
        e.probe_state,
        signals,
        e.override_until,
        e.removing,
    )
