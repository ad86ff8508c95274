"""What ``hds:`` configures, in domain form (no pydantic; tests build it directly).

Built by ``llm_health.config.HdsConfig.to_settings()``. Units are in the names (``_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CheckKind = Literal["tcp", "http"]

#: Extra time after an endpoint is handed to an Envoy before its UNHEALTHY reports count:
#: Envoy creates HDS hosts with FAILED_ACTIVE_HC set and reports them UNHEALTHY until their
#: first check has run (source/common/upstream/health_discovery_service.cc, updateHosts).
FIRST_CHECK_MARGIN_S = 1.0


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """The check every Envoy runs (envoy.config.core.v3.HealthCheck).

    - ``kind``: "tcp" (connect only) or "http" (``path``; healthy when the status is in
      ``expected_statuses``; a ``body`` makes it a POST carrying that body).
    - ``interval_s``/``timeout_s``: per check; also used as Envoy's no-traffic intervals,
      because HDS clusters never carry traffic and Envoy's default for those is 60 s.
    - ``unhealthy_threshold``/``healthy_threshold``: consecutive failures/successes
      before Envoy flips its own verdict (a new host needs only one success).
    """

    kind: CheckKind = "tcp"
    path: str = "/health"
    expected_statuses: tuple[int, ...] = (200,)
    body: bytes | None = None
    interval_s: float = 1.0
    timeout_s: float = 1.0
    unhealthy_threshold: int = 2
    healthy_threshold: int = 2

    @property
    def protocol(self) -> str:
        """The Envoy capability needed (service.health.v3.Capability.Protocol name)."""
        return "HTTP" if self.kind == "http" else "TCP"


@dataclass(frozen=True, slots=True)
class HdsSettings:
    """- ``enabled``: False refuses HDS streams (gRPC UNIMPLEMENTED).
    - ``report_interval_s``: HealthCheckSpecifier.interval, how often Envoy reports.
    - ``checkers_per_endpoint``: Envoys that check each endpoint (fewer if fewer connect).
    - ``quorum``: how many of an endpoint's reporters must say UNHEALTHY/TIMEOUT to take it
      down; None: a majority. Capped at the number of reporters.
    - ``report_ttl_s``: a report older than this no longer counts (its sender went away
      or stopped reporting); a connected Envoy silent this long gets no assignments.
    """

    enabled: bool = True
    check: CheckSpec = field(default_factory=CheckSpec)
    report_interval_s: float = 1.0
    checkers_per_endpoint: int = 2
    quorum: int | None = None
    report_ttl_s: float = 5.0

    @property
    def first_check_grace_s(self) -> float:
        """How long after assignment an Envoy's UNHEALTHY report may be a not-yet-run check."""
        return self.check.timeout_s + FIRST_CHECK_MARGIN_S
