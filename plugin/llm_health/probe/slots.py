"""Where probe rounds go in time (docs/design.md §2): pure functions of the targets and
the clock, the scheduler's arithmetic."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from llm_health.probe.target import ProbeTarget

FIRST_ROUND_SPACING_S = 0.001  # first round: at most 1,000 probe starts per second
# Probe starts are gathered on ticks (``start_tick``): a wake-up of the prober costs more
# than the probe it starts when probes are a few milliseconds apart (docs/design.md §2).
STARTS_PER_TICK = 32  # what a tick gathers on average
MAX_START_TICK_S = 0.1  # a probe starts at most this long after its slot
MIN_START_TICK_S = 0.001  # below this, probes are not gathered


def stable_rank_key(key: str) -> bytes:
    """Order endpoints by a hash of their key: stable across restarts and processes."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


def phases(targets: Iterable[ProbeTarget]) -> dict[str, float]:
    """Offset (s) of each endpoint inside its interval: endpoint i of N gets i/N of it.

    Even spacing, not random hashing: N probes per interval land N evenly spaced instants,
    so the prober's load (and a backend's) is flat, never a burst.
    """
    ordered = sorted(targets, key=lambda t: stable_rank_key(t.key))
    count = len(ordered)
    return {t.key: (i / count) * t.interval_s for i, t in enumerate(ordered)}


def first_round(phase: float, interval: float, count: int) -> float:
    """Offset of an endpoint's first probe after start: its phase, compressed.

    The first round decides when the plugin may push to Envoy (warm start, docs/design.md §7), so
    it runs as fast as the prober can keep measuring (FIRST_ROUND_SPACING_S apart, still
    in phase order, still one probe per endpoint) instead of taking a whole interval.
    """
    spread = min(interval, count * FIRST_ROUND_SPACING_S)
    return phase * spread / interval


def start_tick(count: int, interval: float) -> float:
    """The tick probe starts are gathered on, for ``count`` endpoints probed every
    ``interval`` (the shortest): STARTS_PER_TICK of them a tick, the tick at most
    MAX_START_TICK_S; 0 (each at its own instant) below MIN_START_TICK_S or when a tick
    would not gather two. Each wake-up of the prober (timer, connection, answer) then
    serves several probes (docs/benchmarks.md, "CPU per probe beside Envoy's own
    checker"). The bound keeps a gathered start within its slot's
    neighbourhood and the burst of starts a tick brings (STARTS_PER_TICK) small beside
    the TTFTs read meanwhile."""
    if count <= 0 or interval <= 0:
        return 0.0
    tick = min(MAX_START_TICK_S, STARTS_PER_TICK * interval / count)
    if tick < MIN_START_TICK_S or count * tick / interval < 2:
        return 0.0
    return tick


def on_tick(due: float, origin: float, tick: float) -> float:
    """``due``, moved to the first start tick at or after it (ticks from ``origin``).
    Never before ``due``: a slot a rounding error past a tick stays where it is (moved
    back to that tick, it could be the tick that is now, and the probe would start again
    at once, a second time in its slot)."""
    if tick <= 0:
        return due
    return max(due, origin + math.ceil((due - origin) / tick - 1e-9) * tick)


def next_slot(now: float, origin: float, phase: float, interval: float) -> float:
    """The first time ``origin + phase + k*interval`` strictly after ``now`` (k >= 0).

    Missed slots are skipped, so a slow probe never causes a catch-up burst.
    """
    first = origin + phase
    if now < first:
        return first
    slot = first + (math.floor((now - first) / interval) + 1) * interval
    while slot <= now:  # float rounding can land exactly on `now`
        slot += interval
    return slot


def tick_for(targets: Iterable[ProbeTarget]) -> float:
    """The start tick (``start_tick``) for ``targets``: by their count and shortest interval."""
    intervals = [t.interval_s for t in targets]
    return start_tick(len(intervals), min(intervals)) if intervals else 0.0
