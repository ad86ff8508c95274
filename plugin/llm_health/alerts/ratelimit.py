"""Per-webhook rate limit with a summary of what was held back (pure; ``now`` in seconds).

At most ``limit`` messages per ``window_s`` (a sliding window, default one minute). Once
the limit is hit, every further event is counted into a pending summary instead of being
sent, and keeps being counted until the summary itself has gone out: the summary takes
the next free slot (``take_summary``), so a steady storm produces ``limit`` messages a
minute, one of them the summary, and never starves it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from llm_health.alerts.events import AlertEvent, iso_time

MAX_SUMMARY_ENDPOINTS = 20


@dataclass(slots=True)
class Suppressed:
    """Events held back since the last summary. ``first``/``last``: wall-clock seconds."""

    count: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    endpoints: list[str] = field(default_factory=list)  # the first MAX_SUMMARY_ENDPOINTS
    seen: set[str] = field(default_factory=set)  # bounded by the configured endpoints
    first: float = 0.0
    last: float = 0.0

    @property
    def more_endpoints(self) -> int:
        return len(self.seen) - len(self.endpoints)

    def add(self, event: AlertEvent) -> None:
        if self.count == 0:
            self.first = event.time
        self.count += 1
        self.last = event.time
        self.by_kind[event.primary.value] += 1
        key = event.endpoint_key
        if key in self.seen:
            return
        self.seen.add(key)
        if len(self.endpoints) < MAX_SUMMARY_ENDPOINTS:
            self.endpoints.append(key)


class RateLimiter:
    """Not thread-safe: one owner. ``limit`` >= 1 messages per ``window_s``."""

    def __init__(self, limit: int, window_s: float = 60.0) -> None:
        self.limit = limit
        self.window_s = window_s
        self._sent: deque[float] = deque()
        self.pending = Suppressed()

    def admit(self, event: AlertEvent, now: float) -> bool:
        """True: send ``event`` now (uses a slot). False: it was added to the summary."""
        if self.pending.count == 0 and self._take_slot(now):
            return True
        self.pending.add(event)
        return False

    def take_summary(self, now: float, wall_time: float, summary_id: str) -> dict[str, Any] | None:
        """The summary payload when events are pending and a slot is free, else None.
        Taking it uses the slot and starts a fresh summary."""
        if self.pending.count == 0 or not self._take_slot(now):
            return None
        held, self.pending = self.pending, Suppressed()
        return summary_payload(held, self.limit, wall_time, summary_id)

    def _take_slot(self, now: float) -> bool:
        while self._sent and now - self._sent[0] >= self.window_s:
            self._sent.popleft()
        if len(self._sent) >= self.limit:
            return False
        self._sent.append(now)
        return True


def summary_payload(
    held: Suppressed, limit: int, wall_time: float, summary_id: str
) -> dict[str, Any]:
    return {
        "id": summary_id,
        "event": "rate_limited",
        "suppressed": held.count,
        "by_event": dict(sorted(held.by_kind.items())),
        "endpoints": list(held.endpoints),
        "more_endpoints": held.more_endpoints,
        "first_time": iso_time(held.first),
        "last_time": iso_time(held.last),
        "time": iso_time(wall_time),
        "max_per_minute": limit,
        "source": "llm-health",
    }
