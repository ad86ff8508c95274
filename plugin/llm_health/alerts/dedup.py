"""Deduplication of alerts (pure; the caller passes ``now`` in seconds, monotonic).

An event is a duplicate when the previous event let through for the same endpoint was of
the same primary kind and came less than ``window_s`` before it. A different kind always
passes, so a receiver's latest word on an endpoint is never stale: unhealthy, recovered,
unhealthy are three deliveries however fast they follow each other (flapping is the rate
limiter's business). The window counts from the last event let through, so a condition
that keeps re-alerting (FATAL, error, FATAL ...) is re-announced once per window.
"""

from __future__ import annotations

from llm_health.alerts.events import AlertEvent, AlertKind

_PRUNE_FLOOR = 1024


class Deduplicator:
    """Not thread-safe: one owner (the alerts component, on the event loop)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[str, tuple[AlertKind, float]] = {}
        self._prune_at = _PRUNE_FLOOR

    def admit(self, event: AlertEvent, now: float) -> bool:
        """True: send it (and remember it); False: a duplicate, drop it."""
        key = event.endpoint_key
        previous = self._last.get(key)
        if (
            previous is not None
            and previous[0] is event.primary
            and now - previous[1] < self.window_s
        ):
            return False
        self._last[key] = (event.primary, now)
        if len(self._last) > self._prune_at:
            self._prune(now)
        return True

    def _prune(self, now: float) -> None:
        """Forget entries older than the window (they cannot make a duplicate any more)."""
        self._last = {k: v for k, v in self._last.items() if now - v[1] < self.window_s}
        self._prune_at = max(_PRUNE_FLOOR, 2 * len(self._last))

    def __len__(self) -> int:
        return len(self._last)
