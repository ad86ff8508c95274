"""``probe.quality`` and ``probe.backoff_when_busy`` in domain form (seconds)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QualitySettings:
    """Over ``window_s``, with at least ``min_requests`` real requests: an error rate over
    ``max_error_rate`` or a p95 TTFT over ``max_p95_ttft_s`` makes the endpoint DEGRADED
    (cause "quality"); never UNHEALTHY on quality alone."""

    window_s: float = 60.0
    min_requests: int = 50
    max_error_rate: float = 0.01
    max_p95_ttft_s: float = 0.8


@dataclass(frozen=True, slots=True)
class BusySettings:
    """An endpoint whose last interval held at least ``min_requests`` successful real
    requests and no error (nor one that outlived the probe timeout) is probed at most
    every ``every`` intervals."""

    min_requests: int = 10
    every: int = 5
