"""What readers of the board see: immutable snapshots of every endpoint's health.

``model/board.py`` owns the health and its rules; ``model/snapshot_builder.py`` turns it
into these values, incrementally; readers (xDS, authz, admin, metrics, status) only ever
hold these. Each cluster's ``envoy_version`` is a content hash of exactly what Envoy would
receive for it (addresses, health, weights, labels): it changes when and only when the
Envoy-visible view changes, so xDS pushes happen only on change and a NACKed version is
recognisable when it comes round again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_health.model.causes import Cause
from llm_health.model.envoy_view import EnvoyView
from llm_health.model.outcome import ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A configured endpoint: ``address`` is "host:port" as written in the config."""

    address: str
    host: str
    port: int
    weight: int = 100


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A configured cluster (``name`` is the Envoy cluster / EDS resource name)."""

    name: str
    policy: Policy
    endpoints: tuple[EndpointSpec, ...]


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One endpoint as readers see it. ``since`` is wall-clock seconds (epoch).

    ``state``/``reason``/``view`` are the effective ones (an override wins); ``cause``: why
    the state machine's verdict last changed (``Cause.OVERRIDE`` while an override holds);
    ``probe_state`` is the state machine's own verdict. ``signals``: outside sources that
    currently hold the endpoint down (e.g. {"hds": "unreachable from gw-2"}); ``limits``:
    outside sources that currently allow it at most DEGRADED (e.g. {"engine": "12 waiting
    ≥ 5"}).
    ``override_until``: wall-clock end of a forced state, if any.
    """

    cluster: str
    spec: EndpointSpec
    state: State
    reason: str
    since: float
    view: EnvoyView
    last: ProbeResult | None
    probe_state: State | None = None
    signals: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    override_until: float | None = None
    removing: bool = False
    cause: Cause = Cause.OTHER


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """``warm``: every endpoint has had a probe since boot (or the warm-up timed out):
    only warm clusters may be pushed to Envoy (docs/design.md §7)."""

    name: str
    endpoints: tuple[EndpointSnapshot, ...]
    warm: bool
    envoy_version: str


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """Immutable view of the whole board. ``revision`` grows on every change of any kind."""

    revision: int
    clusters: Mapping[str, ClusterSnapshot]

    def endpoint(self, cluster: str, address: str) -> EndpointSnapshot:
        """The snapshot of ``address`` ("host:port" as configured) in ``cluster``.
        KeyError if the cluster or the endpoint is not in this snapshot."""
        for endpoint in self.clusters[cluster].endpoints:
            if endpoint.spec.address == address:
                return endpoint
        raise KeyError(f"{cluster}/{address}")
