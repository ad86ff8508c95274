"""What Envoy receives for each state (docs/design.md §4), in domain words (no protobuf here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llm_health.model.states import State


class EnvoyHealth(enum.Enum):
    """Mirrors envoy.config.core.v3.HealthStatus values we use."""

    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"


@dataclass(frozen=True, slots=True)
class EnvoyView:
    """``weight`` is always >= 1: Envoy NACKs a load_balancing_weight of 0
    (config.endpoint.v3.LbEndpoint.load_balancing_weight, "gte: 1").
    ``lb_label`` goes to filter_metadata["envoy.lb"]["llm_health"] for subset routing."""

    health: EnvoyHealth
    weight: int
    lb_label: str | None


def degraded_weight(base_weight: int, share: float) -> int:
    """max(1, round(base x share)): a Degraded endpoint keeps a reduced, never-zero share."""
    return max(1, round(base_weight * share))


def envoy_view(state: State, base_weight: int, share: float) -> EnvoyView:
    """The docs/design.md §4 table. Envoy's own DEGRADED status is deliberately not used: it means
    spill-over only (no traffic while enough hosts are healthy), not a reduced share."""
    base = max(1, base_weight)
    if state is State.HEALTHY:
        return EnvoyView(EnvoyHealth.HEALTHY, base, "healthy")
    if state is State.DEGRADED:
        return EnvoyView(EnvoyHealth.HEALTHY, degraded_weight(base, share), "degraded")
    if state is State.DRAINING:
        return EnvoyView(EnvoyHealth.DRAINING, base, None)
    return EnvoyView(EnvoyHealth.UNHEALTHY, base, None)
