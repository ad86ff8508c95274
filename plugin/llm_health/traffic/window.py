"""A rolling window of one endpoint's real traffic (pure; docs/design.md §15.2).

The window is ``SLOTS`` slots of ``window / SLOTS`` seconds each (5 s for 60 s): adding a
request or a TTFT histogram delta touches one slot (O(1); a duration is binned with a
bisect over ``DURATION_BOUNDS``), and a summary adds up at most ``SLOTS`` of them. Memory
is fixed per endpoint: counters, and histograms allocated only in slots that saw data.
The window therefore slides in steps of one slot.

A second, tiny ring (``RECENT`` quarter-second slots) answers the questions the busy rule
asks about the last interval: how many successes, errors and over-long requests, and
whether requests are still succeeding right now (a zombie stops completing at once).

Quantiles are read from histograms as Prometheus' ``histogram_quantile`` does: linear
interpolation inside the bucket the rank falls in.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

SLOTS = 12
RECENT_SLOT_S = 0.25  # the busy rule's ring: quarter seconds ...
RECENT = 16  # ... 4 s of them
LATEST_SLOTS = 2  # "still succeeding": a success in the last 2 quarter seconds
DURATION_BOUNDS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, math.inf,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Summary:
    """The window's figures: ``requests`` real requests in ``span_s`` seconds, of which
    ``errors`` failed; quantiles in seconds (None without data). ``ttft_count``: TTFT
    observations of real traffic from the engine's histogram."""

    span_s: float
    requests: int
    errors: int
    p95_duration_s: float | None
    ttft_count: int
    p50_ttft_s: float | None
    p95_ttft_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "p95_duration_s": _round(self.p95_duration_s),
            "ttft_count": self.ttft_count,
            "p50_ttft_s": _round(self.p50_ttft_s),
            "p95_ttft_s": _round(self.p95_ttft_s),
        }


@dataclass(frozen=True, slots=True)
class Recent:
    """The last interval (the busy rule's): ``latest``: successes in the last half second."""

    successes: int
    errors: int
    long: int  # requests that took longer than the endpoint's probe timeout
    latest: int = 0


@dataclass(slots=True)
class Counts:
    """Raw window totals: what ``Summary`` is computed from; ``merge`` adds another's."""

    span_s: float
    requests: int
    errors: int
    durations: list[int]
    ttft_bounds: tuple[float, ...]
    ttft: list[int]

    def merge(self, other: Counts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        _add_into(self.durations, other.durations)
        if not self.ttft_bounds:
            self.ttft_bounds, self.ttft = other.ttft_bounds, list(other.ttft)
        elif other.ttft_bounds == self.ttft_bounds:
            _add_into(self.ttft, other.ttft)

    def summary(self) -> Summary:
        return Summary(
            span_s=self.span_s,
            requests=self.requests,
            errors=self.errors,
            p95_duration_s=quantile(DURATION_BOUNDS, self.durations, 0.95),
            ttft_count=sum(self.ttft),
            p50_ttft_s=quantile(self.ttft_bounds, self.ttft, 0.5),
            p95_ttft_s=quantile(self.ttft_bounds, self.ttft, 0.95),
        )


class _Slot:
    __slots__ = ("durations", "errors", "index", "requests", "ttft")

    def __init__(self, index: int) -> None:
        self.index = index
        self.requests = 0
        self.errors = 0
        self.durations: array[int] | None = None
        self.ttft: array[int] | None = None


class _Second:
    __slots__ = ("errors", "index", "long", "successes")

    def __init__(self, index: int) -> None:
        self.index, self.successes, self.errors, self.long = index, 0, 0, 0


class Window:
    """One endpoint's window. ``long_after_s``: a request lasting longer is "long" for
    the busy rule (the probe timeout). Clock: seconds, passed in (monotonic)."""

    def __init__(self, window_s: float, long_after_s: float) -> None:
        self.window_s = window_s
        self.slot_s = window_s / SLOTS
        self.long_after_s = long_after_s
        self._slots: list[_Slot | None] = [None] * (SLOTS + 1)
        self._seconds: list[_Second | None] = [None] * RECENT
        self._ttft_bounds: tuple[float, ...] = ()
        self._latest = -SLOTS  # the index of the latest slot anything was added to

    def add(self, now: float, *, success: bool, error: bool, duration_s: float) -> None:
        slot = self._slot(now)
        slot.requests += 1
        slot.errors += error
        if slot.durations is None:
            slot.durations = array("I", bytes(4 * len(DURATION_BOUNDS)))
        slot.durations[bisect_left(DURATION_BOUNDS, duration_s)] += 1
        second = self._second(now)
        second.successes += success
        second.errors += error
        second.long += duration_s > self.long_after_s

    def add_ttft(self, now: float, bounds: Sequence[float], counts: Sequence[int]) -> None:
        """Non-cumulative TTFT counts per bucket (``bounds``: upper bounds, ascending, last
        +Inf) observed since the last call. New bounds (an engine restarted with others)
        restart the TTFT part of the window."""
        if tuple(bounds) != self._ttft_bounds:
            self._ttft_bounds = tuple(bounds)
            for slot in self._slots:
                if slot is not None:
                    slot.ttft = None
        slot = self._slot(now)
        if slot.ttft is None:
            slot.ttft = array("I", bytes(4 * len(bounds)))
        for index, count in enumerate(counts):
            slot.ttft[index] += count

    def counts(self, now: float) -> Counts:
        """The window's raw totals (to summarise, or to add up over endpoints)."""
        current = self._index(now)
        totals = Counts(
            self.window_s,
            0,
            0,
            [0] * len(DURATION_BOUNDS),
            self._ttft_bounds,
            [0] * len(self._ttft_bounds),
        )
        for slot in self._slots:
            if slot is None or current - slot.index > SLOTS - 1:
                continue
            totals.requests += slot.requests
            totals.errors += slot.errors
            _add_into(totals.durations, slot.durations)
            _add_into(totals.ttft, slot.ttft)
        return totals

    def summary(self, now: float) -> Summary:
        return self.counts(now).summary()

    def recent(self, now: float, span_s: float) -> Recent:
        """Counts over the last ``span_s`` seconds, to a quarter second (at most 4 s)."""
        current = math.floor(now / RECENT_SLOT_S)
        back = min(RECENT, max(1, math.ceil(span_s / RECENT_SLOT_S)))
        successes = errors = long = latest = 0
        for second in self._seconds:
            if second is None:
                continue
            age = current - second.index
            if 0 <= age < back:
                successes += second.successes
                errors += second.errors
                long += second.long
            if 0 <= age < LATEST_SLOTS:
                latest += second.successes
        return Recent(successes, errors, long, latest)

    def empty(self, now: float) -> bool:
        """Nothing added within the window (its counts are all 0): an endpoint with no
        traffic, which the judge need not summarise every second."""
        return self._index(now) - self._latest > SLOTS - 1

    def _index(self, now: float) -> int:
        return math.floor(now / self.slot_s)

    def _slot(self, now: float) -> _Slot:
        index = self._index(now)
        self._latest = max(self._latest, index)
        position = index % len(self._slots)
        slot = self._slots[position]
        if slot is None or slot.index != index:
            slot = self._slots[position] = _Slot(index)
        return slot

    def _second(self, now: float) -> _Second:
        index = math.floor(now / RECENT_SLOT_S)
        position = index % RECENT
        second = self._seconds[position]
        if second is None or second.index != index:
            second = self._seconds[position] = _Second(index)
        return second


def _add_into(total: list[int], counts: array[int] | list[int] | None) -> None:
    if counts is not None and len(counts) == len(total):
        for index, count in enumerate(counts):
            total[index] += count


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The q-quantile of a histogram (non-cumulative ``counts`` per upper bound), linear
    inside the bucket as Prometheus does; the +Inf bucket answers its lower bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            lower = bounds[index - 1] if index else 0.0
            upper = bounds[index]
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return bounds[-2] if len(bounds) > 1 else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
