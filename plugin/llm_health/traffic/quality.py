"""The quality verdict (pure; docs/design.md §15.3): a window's figures against
``probe.quality``. Over a limit with enough requests: the reason text of a DEGRADED
limit (cause "quality"); never UNHEALTHY on quality alone."""

from __future__ import annotations

from llm_health.traffic.settings import QualityConfig
from llm_health.traffic.window import Summary


def verdict(summary: Summary, settings: QualityConfig) -> str | None:
    """Why the endpoint's real traffic is not good enough, or None."""
    span = f"{summary.span_s:g} s"
    if summary.requests >= settings.min_requests and summary.error_rate > settings.max_error_rate:
        return (
            f"error rate {100 * summary.error_rate:.1f} % over {span} ({summary.requests} requests)"
        )
    p95 = summary.p95_ttft_s
    enough = summary.ttft_count >= settings.min_requests
    if enough and p95 is not None and p95 > settings.max_p95_ttft:
        return (
            f"p95 TTFT {_time(p95)} > {_time(settings.max_p95_ttft)} over {span} "
            f"({summary.ttft_count} requests)"
        )
    return None


def note(summary: Summary, settings: QualityConfig) -> str:
    """/status: why there is or is not a verdict."""
    if summary.requests < settings.min_requests and summary.ttft_count < settings.min_requests:
        return f"no verdict: {summary.requests} requests, {settings.min_requests} needed"
    return verdict(summary, settings) or "within limits"


def _time(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
