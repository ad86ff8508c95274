"""Latency histograms the simulator exports in ``/metrics``, shaped as vLLM exports them.

A :class:`LatencyHistogram` keeps cumulative bucket counts, a sum and a count of
observations (seconds) and renders them as a Prometheus text histogram: ``_bucket``
series with ``le`` (the last one ``+Inf``), then ``_sum`` and ``_count``. The buckets
are vLLM's: :data:`TTFT_BUCKETS` for ``vllm:time_to_first_token_seconds`` and
:data:`E2E_BUCKETS` for ``vllm:e2e_request_latency_seconds``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["E2E_BUCKETS", "TTFT_BUCKETS", "LatencyHistogram"]

#: vLLM's buckets of ``vllm:time_to_first_token_seconds`` (``+Inf`` is implied).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: vLLM's buckets of ``vllm:e2e_request_latency_seconds`` (``+Inf`` is implied).
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class LatencyHistogram:
    """A Prometheus histogram of latencies in seconds (no labels of its own)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)) or not math.isfinite(bounds[-1]):
            raise ValueError(f"buckets: must be finite, distinct and increasing, got {buckets!r}")
        self.buckets = bounds
        self._counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Record one observation (negative values count as 0)."""
        value = max(0.0, seconds)
        # le is inclusive: a value equal to a bound falls in that bound's bucket.
        self._counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def reset(self) -> None:
        """Forget every observation."""
        self._counts = [0] * len(self._counts)
        self.sum = 0.0
        self.count = 0

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` per bucket, ``+Inf`` last, as Prometheus writes them."""
        result: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*self.buckets, math.inf), self._counts, strict=True):
            running += count
            result.append(("+Inf" if bound == math.inf else repr(bound), running))
        return result

    def render(self, name: str, help_text: str, label: str) -> list[str]:
        """The exposition lines of this histogram under ``name``, each series with ``label``
        (e.g. ``model_name="sim-model"``) before ``le``."""
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for le, count in self.cumulative():
            lines.append(f'{name}_bucket{{{label},le="{le}"}} {float(count)!r}')
        lines.append(f"{name}_sum{{{label}}} {self.sum!r}")
        lines.append(f"{name}_count{{{label}}} {float(self.count)!r}")
        return lines
