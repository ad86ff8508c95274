"""``probe.quality`` and ``probe.backoff_when_busy``: the passive-health sections of the
config (docs/design.md §15), validated here and read as they are by the traffic
component. Durations are in seconds. ``config.schema`` places both in ``probe:``, where a
cluster's overrides merge with them key by key.
"""

from __future__ import annotations

from pydantic import Field

from llm_health.core.settings import Duration, Frozen, Int, Number


class QualityConfig(Frozen):
    """``probe.quality``: the rolling window of real traffic. Over ``window``, with at
    least ``min_requests`` real requests: an error rate over ``max_error_rate`` or a p95
    TTFT over ``max_p95_ttft`` makes the endpoint DEGRADED (cause "quality"); never
    UNHEALTHY on quality alone."""

    window: Duration = Field(60.0, ge=10.0, le=3600.0)
    min_requests: Int = Field(50, ge=1, le=1_000_000)
    max_error_rate: Number = Field(0.01, ge=0, le=1)
    max_p95_ttft: Duration = Field(0.8, le=600.0)


def busy_shorthand(value: object) -> object:
    """``backoff_when_busy: true`` is the section with its defaults; ``false``: off."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


class BusyConfig(Frozen):
    """``probe.backoff_when_busy``: probe at most every ``every`` intervals an endpoint
    whose last interval held ``min_requests`` successful real requests and no error (nor
    one that outlived the probe timeout)."""

    min_requests: Int = Field(10, ge=1, le=1_000_000)
    every: Int = Field(5, ge=2, le=100)
