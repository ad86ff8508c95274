"""``hds:``: the Health Discovery Service section of the config (docs/design.md §5.2),
validated here and read as it is by the HDS engine. Durations are in seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_health.core.settings import Duration, Frozen, Int

#: Extra time after an endpoint is handed to an Envoy before its UNHEALTHY reports count:
#: Envoy creates HDS hosts with FAILED_ACTIVE_HC set and reports them UNHEALTHY until their
#: first check has run (source/common/upstream/health_discovery_service.cc, updateHosts).
FIRST_CHECK_MARGIN_S = 1.0


class HdsConfig(Frozen):
    """Dormant until an Envoy with ``hds_config`` connects.

    The check every Envoy runs (envoy.config.core.v3.HealthCheck):
    - ``check``: "tcp" (connect only) or "http" (``path``; healthy when the status is in
      ``expected_statuses``; a ``body`` makes it a POST carrying that body).
    - ``interval``/``timeout``: per check; also used as Envoy's no-traffic intervals,
      because HDS clusters never carry traffic and Envoy's default for those is 60 s.
    - ``unhealthy_threshold``/``healthy_threshold``: consecutive failures/successes
      before Envoy flips its own verdict (a new host needs only one success).

    What is done with the reports:
    - ``enabled``: False refuses HDS streams (gRPC UNIMPLEMENTED).
    - ``report_interval``: HealthCheckSpecifier.interval, how often Envoy reports.
    - ``checkers_per_endpoint``: Envoys that check each endpoint (fewer if fewer connect).
    - ``quorum``: how many of an endpoint's reporters must say UNHEALTHY/TIMEOUT to take it
      down; None: a majority. Capped at the number of reporters.
    - ``report_ttl``: a report older than this no longer counts (its sender went away
      or stopped reporting); a connected Envoy silent this long gets no assignments.
    """

    enabled: bool = True
    check: Literal["tcp", "http"] = "tcp"
    path: str = Field("/health", pattern=r"^/[^\s]*$", max_length=2000)
    expected_statuses: tuple[Int, ...] = Field((200,), min_length=1, max_length=100)
    body: str | None = Field(None, max_length=65536)
    interval: Duration = 1.0
    timeout: Duration = 1.0
    unhealthy_threshold: Int = Field(2, ge=1, le=100)
    healthy_threshold: Int = Field(2, ge=1, le=100)
    report_interval: Duration = 1.0
    checkers_per_endpoint: Int = Field(2, ge=1, le=100)
    quorum: Int | None = Field(None, ge=1, le=100)
    report_ttl: Duration = 5.0

    @field_validator("expected_statuses")
    @classmethod
    def _http_statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [status for status in value if not 100 <= status <= 599]
        if bad:
            raise ValueError(f"{bad[0]} is not an HTTP status (100-599)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HdsConfig:
        if self.body is not None and self.check != "http":
            raise ValueError("body needs check: http (a tcp check sends nothing)")
        if self.quorum is not None and self.quorum > self.checkers_per_endpoint:
            raise ValueError("quorum cannot exceed checkers_per_endpoint")
        if self.report_ttl <= self.report_interval:
            raise ValueError("report_ttl must be longer than report_interval")
        return self

    @property
    def protocol(self) -> str:
        """The Envoy capability needed (service.health.v3.Capability.Protocol name)."""
        return "HTTP" if self.check == "http" else "TCP"

    @property
    def first_check_grace_s(self) -> float:
        """How long after assignment an Envoy's UNHEALTHY report may be a not-yet-run check."""
        return self.timeout + FIRST_CHECK_MARGIN_S
