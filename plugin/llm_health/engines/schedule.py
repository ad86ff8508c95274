"""When each endpoint's side reads are due (pure, clock passed in; docs/design.md §14,
§16.5).

- /metrics every ``engine_metrics.interval``, stretched so that all endpoints' reads
  together stay within MAX_METRICS_READS_PER_S. Reading and parsing one engine's document
  costs the loop that also times the probes (docs/benchmarks.md); at 1 s per endpoint and
  thousands of endpoints that alone would take a core. An endpoint's first read is placed within the stretched interval by a stable
  hash of its key (a spread, not a burst each second); the TTFT histogram (most of the
  lines) is parsed on every TTFT_HISTOGRAM_EVERY-th read only.
- /v1/models at start and every ``verify.every`` (MODELS_EVERY_S when verify is off).
- Engine detection (``engine: auto``, while unknown) at most every DETECT_RETRY_S.
- Both are placed by the same hash after their first, and so are known-answer probes
  (``next_after``): endpoints started together (a whole fleet at start) were otherwise
  all checked in the same tick every period ever after (1,000 endpoints: 335 reads queued
  at once every 30 s, beside the probes' loop; 1,000 known-answer probes judged within a
  second every 30 s).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass

MAX_TICK_S = 0.25  # how often due reads are looked for
MAX_METRICS_READS_PER_S = 100.0  # /metrics reads a second, all endpoints together
TTFT_HISTOGRAM_EVERY = 5  # reads: the TTFT histogram every 5th read
MODELS_EVERY_S = 30.0  # served-model check when verify is off
DETECT_RETRY_S = 30.0


@dataclass(slots=True)
class _Dues:
    reading: float | None = None  # None: not placed yet (placed by its phase)
    models: float = 0.0  # monotonic; 0: at once
    detect: float = 0.0


class SideReadSchedule:
    """Per endpoint key, when its next reads are due. Each ``*_due`` call that answers
    True books the next one."""

    def __init__(self) -> None:
        self._dues: dict[str, _Dues] = {}
        self.stretch = 0.0  # the shortest /metrics interval within the budget

    def plan(self, readers: int) -> None:
        """``readers`` endpoints have their /metrics read (counted once per target change,
        not per tick)."""
        self.stretch = readers / MAX_METRICS_READS_PER_S

    def metrics_due(self, key: str, interval_s: float, now: float) -> bool:
        dues = self._of(key)
        every = max(interval_s, self.stretch)
        if dues.reading is None:  # first reads spread within the budget
            spread = self.stretch if self.stretch > MAX_TICK_S else 0.0  # else all at once
            dues.reading = now + phase(key) * spread
        if now < dues.reading:
            return False
        dues.reading = max(dues.reading + every, now)
        return True

    def models_due(self, key: str, every_s: float, now: float) -> bool:
        dues = self._of(key)
        if now < dues.models:
            return False
        dues.models = now + next_after(key, every_s, first=dues.models == 0.0)
        return True

    def detect_due(self, key: str, now: float) -> bool:
        dues = self._of(key)
        if now < dues.detect:
            return False
        dues.detect = now + next_after(key, DETECT_RETRY_S, first=dues.detect == 0.0)
        return True

    def next_due(self, key: str, *, metrics: bool, models: bool, detect: bool) -> float | None:
        """The soonest of the key's reads in force (``metrics``, ``models``, ``detect``):
        before it, no ``*_due`` call of the key answers True. None: no read in force."""
        dues = self._of(key)
        times = []
        if metrics:
            times.append(dues.reading if dues.reading is not None else 0.0)
        if models:
            times.append(dues.models)
        if detect:
            times.append(dues.detect)
        return min(times) if times else None

    def forget(self, keep: Collection[str]) -> None:
        """Drop the endpoints not in ``keep`` (no longer checked here)."""
        for key in [k for k in self._dues if k not in keep]:
            del self._dues[key]

    def _of(self, key: str) -> _Dues:
        dues = self._dues.get(key)
        if dues is None:
            dues = self._dues[key] = _Dues()
        return dues


def next_after(key: str, every_s: float, *, first: bool) -> float:
    """How long after this check the next is due: ``every_s``, but after the first, a
    place in [every_s / 2, every_s) by the endpoint's hash (never later than every_s)."""
    return every_s * (1 + phase(key)) / 2 if first else every_s


def phase(key: str) -> float:
    """A stable place in [0, 1) for an endpoint: reads spread evenly, stay put."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def with_ttft(reads: int) -> bool:
    """Whether the ``reads``-th good read (counted from 1) parses the TTFT histogram."""
    return reads % TTFT_HISTOGRAM_EVERY == 1
