"""Webhook alerts (docs/design.md §5.5). The pure part, exported here: which transitions
are alerts, their payload, deduplication and rate limiting (``events``, ``dedup``,
``ratelimit``), what goes on the wire (``wire``). ``settings``: the ``alerts:`` section;
``component``: delivery (aiohttp, retries, one bounded queue per webhook)."""

from llm_health.alerts.dedup import Deduplicator
from llm_health.alerts.events import (
    AlertEvent,
    AlertKind,
    alert_event,
    classify,
    iso_time,
    payload,
)
from llm_health.alerts.ratelimit import RateLimiter, Suppressed, summary_payload

__all__ = [
    "AlertEvent",
    "AlertKind",
    "Deduplicator",
    "RateLimiter",
    "Suppressed",
    "alert_event",
    "classify",
    "iso_time",
    "payload",
    "summary_payload",
]
