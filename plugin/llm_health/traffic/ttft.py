"""Real traffic's TTFT from an engine's cumulative histogram (pure; docs/design.md §15.2).

Between two reads of the engine's ``*_time_to_first_token_seconds`` histogram the bucket
deltas are the TTFTs observed meanwhile. The engine cannot tell our probes from users'
requests, so each probe answered in that span (its TTFT as the prober measured it) is taken
out of the bucket it falls in: the window holds real traffic only (the prober's TTFT and
the engine's differ by the network and the HTTP stack, well inside a bucket of vLLM's
bounds in most cases; a probe whose bucket is already empty is dropped, never made
negative).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


def delta(
    bounds: Sequence[float],
    before: Sequence[float],
    after: Sequence[float],
    probes_s: Sequence[float] = (),
) -> list[int] | None:
    """Non-cumulative counts per bucket between two cumulative snapshots with the same
    ``bounds``, probes removed; None when the counters went back (the engine restarted)."""
    if len(before) != len(bounds) or len(after) != len(bounds):
        return None
    counts: list[int] = []
    previous_before = previous_after = 0.0
    for low, high in zip(before, after, strict=True):
        grown = (high - previous_after) - (low - previous_before)
        if high < low:
            return None
        counts.append(max(0, round(grown)))
        previous_before, previous_after = low, high
    for ttft in probes_s:
        index = bisect_left(bounds, ttft)
        if index < len(counts) and counts[index] > 0:
            counts[index] -= 1
    return counts
