"""The thresholds the state machine and the classifier apply, in seconds and counts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Policy:
    """Per-cluster health policy (docs/design.md §3). Built from config; frozen.

    Units: every ``*_s`` is seconds. ``degraded_weight`` is the share of the base weight a
    DEGRADED endpoint keeps (0 < x <= 1). ``max_loop_lag_s``: a SLOW or TIMEOUT probe that
    ran while the prober's own event loop lagged more than this is not trusted.
    """

    healthy_ttft_s: float = 0.2
    timeout_s: float = 0.8
    healthy_after: int = 3
    unhealthy_after: int = 2
    degraded_weight: float = 0.3
    startup_grace_s: float = 600.0
    drain_time_s: float = 30.0
    max_loop_lag_s: float = 0.1
    max_ejection_percent: int = 50
