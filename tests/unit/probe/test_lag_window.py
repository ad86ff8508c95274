"""``LoopLagMonitor.stalled_within`` (docs/design.md §7.4): only the part of a stall
inside the window counts, so a stall after a first token's arrival is never subtracted
from its TTFT, and one before it is."""

from __future__ import annotations

import time

import pytest

from llm_health.probe.lag import LoopLagMonitor


def monitor(samples: list[tuple[float, float]], last_tick: float) -> LoopLagMonitor:
    """A monitor that has recorded ``samples`` ((taken at, lag ms)); its last tick at
    ``last_tick`` (so "overdue now" is measured from there)."""
    lag = LoopLagMonitor(tick_s=0.02)
    lag._samples.extend(samples)
    lag._last_tick = last_tick
    lag._running = True
    return lag


def test_a_stall_before_the_end_counts_one_after_it_does_not() -> None:
    now = time.perf_counter()
    start, end = now - 1.0, now - 0.5
    before = monitor([(now - 0.6, 80.0)], last_tick=now)  # stalled [-0.68, -0.6]
    after = monitor([(now - 0.3, 80.0)], last_tick=now)  # stalled [-0.38, -0.3]
    assert before.stalled_within(start, end) == pytest.approx(80.0, abs=0.5)
    assert after.stalled_within(start, end) == 0.0


def test_only_the_part_inside_the_window_counts() -> None:
    now = time.perf_counter()
    start, end = now - 1.0, now - 0.5
    # stalled over [-0.6, -0.4]: 100 ms of it before the end
    lag = monitor([(now - 0.4, 200.0)], last_tick=now)
    assert lag.stalled_within(start, end) == pytest.approx(100.0, abs=0.5)
    # stalled over [-1.1, -0.95]: 50 ms of it after the start
    early = monitor([(now - 0.95, 150.0)], last_tick=now)
    assert early.stalled_within(start, end) == pytest.approx(50.0, abs=0.5)


def test_a_tick_overdue_now_counts_up_to_the_end() -> None:
    now = time.perf_counter()
    lag = monitor([], last_tick=now - 0.3)  # due at -0.28: overdue since then
    assert lag.stalled_within(now - 1.0, now - 0.2) == pytest.approx(80.0, abs=1.0)
    assert lag.stalled_within(now - 1.0, now - 0.29) == 0.0
    assert lag.max_since(now - 1.0) >= 279  # the whole-probe figure keeps all of it
