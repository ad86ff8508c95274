"""What ``probe.verify`` and ``probe.engine_metrics`` configure (docs/design.md §6, §14):
the sections' models, validated from the file and received as they are by the engine
checks. Per cluster like every probe key (``config.schema.ProbeSettings`` holds them);
the checks in force for one cluster are ``in_force``. The class names are part of the
validation messages ("Input should be a valid dictionary or instance of VerifyConfig").
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated

from pydantic import AfterValidator, Field

from llm_health.core.settings import Duration, Frozen, Int, Number, UrlPath, regex


class VerifyConfig(Frozen):
    """``probe.verify``: the known-answer probe (docs/design.md §14). ``expect``: a regex
    the answer must match (searched, not anchored); null: the cluster's consensus. Also
    what the probe asks (``probe.client.Question``: ``prompt``, ``max_tokens``)."""

    enabled: bool = True
    every: Duration = Field(30.0, ge=1.0, le=86400.0)
    prompt: str = Field("The capital of France is", min_length=1, max_length=500)
    max_tokens: Int = Field(3, ge=1, le=32)
    expect: Annotated[str | None, AfterValidator(regex)] = Field(None, max_length=500)

    @cached_property
    def pattern(self) -> re.Pattern[str] | None:
        """``expect`` compiled (once per settings object)."""
        return re.compile(self.expect) if self.expect is not None else None


class EngineMetricsConfig(Frozen):
    """``probe.engine_metrics``: saturation from the engine's own /metrics (§14.3);
    ``path: null`` disables it. ``admission_window``: how long before a probe's wait an
    advance of the engine's admission counter (or a real request's first token) still
    makes a slow or timed-out probe OVERLOADED (docs/design.md §3.5); null: only the
    admission during the wait counts (``engines.bracket``)."""

    path: UrlPath | None = "/metrics"
    interval: Duration = Field(1.0, ge=0.1, le=3600.0)
    queue_threshold: Number = Field(5.0, gt=0, le=1_000_000)
    kv_cache_threshold: Number = Field(0.8, gt=0, le=1)
    admission_window: Duration | None = Field(None, ge=0.1, le=600.0)

    @property
    def window(self) -> float:
        """``admission_window`` in seconds; 0 when null (only during the wait)."""
        return self.admission_window or 0.0


# One cluster's checks: (probe.verify, probe.engine_metrics), None where off.
ClusterChecks = tuple[VerifyConfig | None, EngineMetricsConfig | None]
NO_CHECKS: ClusterChecks = (None, None)


def in_force(verify: VerifyConfig | None, metrics: EngineMetricsConfig | None) -> ClusterChecks:
    """The checks that run: ``verify`` unless null or ``enabled: false``,
    ``engine_metrics`` unless null or ``path: null``."""
    return (
        verify if verify is not None and verify.enabled else None,
        metrics if metrics is not None and metrics.path is not None else None,
    )
