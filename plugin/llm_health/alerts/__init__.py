"""Alerts, the pure part: which transitions are alerts, their payload, deduplication and
rate limiting. Delivery (aiohttp, retries) lives in ``llm_health.app.alerts``."""

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
