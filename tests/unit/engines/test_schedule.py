"""When side reads are due (``engines.schedule``): spread, never late, never bursting."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from llm_health.engines.schedule import DETECT_RETRY_S, MAX_TICK_S, SideReadSchedule

KEYS = [f"c/10.0.{i // 250}.{i % 250}:8000" for i in range(1000)]
EVERY_S = 30.0


def ticks(until_s: float) -> list[float]:
    return [round(n * MAX_TICK_S, 6) for n in range(int(until_s / MAX_TICK_S) + 1)]


def due_times(kind: str, until_s: float) -> dict[str, list[float]]:
    """Each key's due times, ticking every MAX_TICK_S from 0 as the component does."""
    schedule = SideReadSchedule()
    found: dict[str, list[float]] = {key: [] for key in KEYS}
    for now in ticks(until_s):
        for key in KEYS:
            due = (
                schedule.models_due(key, EVERY_S, now)
                if kind == "models"
                else schedule.detect_due(key, now)
            )
            if due:
                found[key].append(now)
    return found


@pytest.mark.parametrize(("kind", "every"), [("models", EVERY_S), ("detect", DETECT_RETRY_S)])
def test_all_at_start_then_spread_and_never_later_than_the_period(kind: str, every: float) -> None:
    found = due_times(kind, 4 * every)
    assert all(times[0] == 0.0 for times in found.values())  # a wrong model found at once
    for times in found.values():
        gaps = [b - a for a, b in pairwise(times)]
        assert gaps and max(gaps) <= every + MAX_TICK_S
        assert min(gaps) >= every / 2
    per_tick = Counter(t for times in found.values() for t in times if t > 0)
    even = len(KEYS) * MAX_TICK_S / (every / 2)  # the second reads over half a period
    assert max(per_tick.values()) <= 4 * even, per_tick.most_common(3)


def test_an_endpoint_keeps_its_place() -> None:
    first, again = due_times("models", 3 * EVERY_S), due_times("models", 3 * EVERY_S)
    assert first == again
