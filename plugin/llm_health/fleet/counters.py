"""The fleet's counters, declared once: their series on /metrics, and their keys in
``/status`` and ``FleetComponent.counters`` (the series without ``llm_health_fleet_``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric

from llm_health.core.families import counter

PREFIX = "llm_health_fleet_"
# (series, what it counts). "fenced": not a live member with our epoch; "not_owner":
# another member owns the endpoint (the member lists differ).
COUNTERS: tuple[tuple[str, str], ...] = (
    (
        "llm_health_fleet_verdicts_published_total",
        "Verdicts of owned endpoints published to Redis.",
    ),
    ("llm_health_fleet_verdicts_applied_total", "Verdicts of the endpoints' owners adopted here."),
    (
        "llm_health_fleet_verdicts_rejected_total",
        "Verdicts and events read from Redis and refused (unusable).",
    ),
    (
        "llm_health_fleet_verdicts_fenced_total",
        "Verdicts Redis refused: not a live member with our epoch.",
    ),
    (
        "llm_health_fleet_verdicts_not_owner_total",
        "Verdicts Redis refused: another member owns the endpoint.",
    ),
    ("llm_health_fleet_redis_errors_total", "Redis commands that failed."),
    ("llm_health_fleet_fallbacks_total", "Times this replica fell back to probing every endpoint."),
    ("llm_health_fleet_takeovers_total", "Endpoints taken over from a member that left."),
    ("llm_health_fleet_rejoins_total", "Times this replica joined the fleet again (a new epoch)."),
    ("llm_health_fleet_actions_shared_total", "Operator actions taken here shared with the fleet."),
    (
        "llm_health_fleet_actions_applied_total",
        "Operator actions from other replicas applied here.",
    ),
)


def zeroed() -> dict[str, int]:
    """Every counter at 0, by key (``verdicts_published_total`` ...), in declared order."""
    return {series.removeprefix(PREFIX): 0 for series, _ in COUNTERS}


def families(counters: Mapping[str, int]) -> Iterator[Metric]:
    """The counters as /metrics families."""
    for series, what in COUNTERS:
        yield counter(series, what, counters[series.removeprefix(PREFIX)])
