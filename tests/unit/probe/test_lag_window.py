"""``LoopLagMonitor.stalled_within`` (docs/design.md §7.4): only the part of a stall
inside the window counts, so a stall after a first token's arrival is never subtracted
from its TTFT, and one before it is."""

from __future__ import annotations

import random
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


def old_max_since(lag: LoopLagMonitor, start: float) -> float:
    """``max_since`` as it was, a walk of its own (the oracle of ``over``)."""
    overdue_ms = (time.perf_counter() - lag._last_tick - lag._tick_s) * 1000
    worst = max(0.0, overdue_ms) if lag._running else 0.0
    for at, value in reversed(lag._samples):
        if at < start:
            break
        worst = max(worst, value)
    return worst


def old_stalled_within(lag: LoopLagMonitor, start: float, end: float) -> float:
    """``stalled_within`` as it was, a walk of its own (the oracle of ``over``)."""
    worst = 0.0
    now = time.perf_counter()
    if lag._running:
        due = lag._last_tick + lag._tick_s
        worst = max(0.0, min(end, now) - max(due, start))
    for at, value in reversed(lag._samples):
        if at < start:
            break
        worst = max(worst, min(at, end) - max(at - value / 1000, start))
    return worst * 1000


def test_one_pass_gives_what_the_two_readings_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """``over`` (a result's one reading, and now the two readings' too) against the two
    walks it replaced, on random samples, windows and ends. The clock stands still while
    the readings are taken: the overdue tick grows with it, and a test process paused
    between two readings (a loaded CI machine: 4 ms once) would compare two moments."""
    rng = random.Random(11)
    clock = [time.perf_counter()]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    for _ in range(300):
        clock[0] += 3.0
        now = time.perf_counter()
        samples = sorted(
            (now - rng.uniform(0, 2.0), rng.choice([0.0, 0.3, 5.0, 40.0, 250.0]))
            for _ in range(rng.randint(0, 30))
        )
        lag = monitor(samples, last_tick=now - rng.choice([0.0, 0.01, 0.3]))
        start = now - rng.uniform(0, 2.5)
        end = rng.choice([None, start + rng.uniform(0, 2.5)])
        worst, stalled = lag.over(start, end)
        assert worst == pytest.approx(old_max_since(lag, start), abs=1.0)
        expected = 0.0 if end is None else old_stalled_within(lag, start, end)
        assert stalled == pytest.approx(expected, abs=1.0)
