"""``LoopLagMonitor.stalled_within`` (docs/design.md §7.4): only the part of a stall
inside the window counts, so a stall after a first token's arrival is never subtracted
from its TTFT, and one before it is."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import pytest

from llm_health.probe.lag import LoopLagMonitor

TICK_S = 0.02


@contextlib.asynccontextmanager
async def monitor(
    samples: list[tuple[float, float]], last_tick: float, last_lag_ms: float = 0.0
) -> AsyncIterator[LoopLagMonitor]:
    """A running monitor that has recorded ``samples`` ((taken at, lag ms), in time order),
    then its last tick at ``last_tick``, ``last_lag_ms`` late (so "overdue now" is measured
    from there). Read it without awaiting: its own first tick is a loop turn away."""
    lag = LoopLagMonitor(tick_s=TICK_S)
    ticker = asyncio.create_task(lag.run())
    await asyncio.sleep(0)  # running: the tick overdue now counts
    for at, value in samples:
        lag.record(at, value)
    lag.record(last_tick, last_lag_ms)
    try:
        yield lag
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)


async def test_a_stall_before_the_end_counts_one_after_it_does_not() -> None:
    now = time.perf_counter()
    start, end = now - 1.0, now - 0.5
    async with monitor([(now - 0.6, 80.0)], last_tick=now) as before:  # stalled [-0.68, -0.6]
        assert before.stalled_within(start, end) == pytest.approx(80.0, abs=0.5)
    async with monitor([(now - 0.3, 80.0)], last_tick=now) as after:  # stalled [-0.38, -0.3]
        assert after.stalled_within(start, end) == 0.0


async def test_only_the_part_inside_the_window_counts() -> None:
    now = time.perf_counter()
    start, end = now - 1.0, now - 0.5
    # stalled over [-0.6, -0.4]: 100 ms of it before the end
    async with monitor([(now - 0.4, 200.0)], last_tick=now) as lag:
        assert lag.stalled_within(start, end) == pytest.approx(100.0, abs=0.5)
    # stalled over [-1.1, -0.95]: 50 ms of it after the start
    async with monitor([(now - 0.95, 150.0)], last_tick=now) as early:
        assert early.stalled_within(start, end) == pytest.approx(50.0, abs=0.5)


async def test_a_tick_overdue_now_counts_up_to_the_end() -> None:
    now = time.perf_counter()
    async with monitor([], last_tick=now - 0.3) as lag:  # due at -0.28: overdue since then
        assert lag.stalled_within(now - 1.0, now - 0.2) == pytest.approx(80.0, abs=1.0)
        assert lag.stalled_within(now - 1.0, now - 0.29) == 0.0
        assert lag.max_since(now - 1.0) >= 279  # the whole-probe figure keeps all of it


def old_max_since(samples: list[tuple[float, float]], last_tick: float, start: float) -> float:
    """``max_since`` as it was, a walk of its own over a running monitor's ``samples``
    (the last taken at ``last_tick``): the oracle of ``over``."""
    overdue_ms = (time.perf_counter() - last_tick - TICK_S) * 1000
    worst = max(0.0, overdue_ms)
    for at, value in reversed(samples):
        if at < start:
            break
        worst = max(worst, value)
    return worst


def old_stalled_within(
    samples: list[tuple[float, float]], last_tick: float, start: float, end: float
) -> float:
    """``stalled_within`` as it was, a walk of its own (the oracle of ``over``)."""
    now = time.perf_counter()
    due = last_tick + TICK_S
    worst = max(0.0, min(end, now) - max(due, start))
    for at, value in reversed(samples):
        if at < start:
            break
        worst = max(worst, min(at, end) - max(at - value / 1000, start))
    return worst * 1000


async def test_one_pass_gives_what_the_two_readings_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """``over`` (a result's one reading, and now the two readings' too) against the two
    walks it replaced, on random samples, windows and ends. The clock stands still while
    the readings are taken: the overdue tick grows with it, and a test process paused
    between two readings (a loaded CI machine: 4 ms once) would compare two moments."""
    rng = random.Random(11)
    clock = [time.perf_counter()]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    lags = [0.0, 0.3, 5.0, 40.0, 250.0]
    for _ in range(300):
        clock[0] += 3.0
        now = time.perf_counter()
        last_tick = now - rng.choice([0.0, 0.01, 0.3])
        earlier = sorted(
            (last_tick - rng.uniform(0, 2.0), rng.choice(lags)) for _ in range(rng.randint(0, 30))
        )
        last_lag_ms = rng.choice(lags)
        samples = [*earlier, (last_tick, last_lag_ms)]
        start = now - rng.uniform(0, 2.5)
        end = rng.choice([None, start + rng.uniform(0, 2.5)])
        async with monitor(earlier, last_tick, last_lag_ms) as lag:
            worst, stalled = lag.over(start, end)
        assert worst == pytest.approx(old_max_since(samples, last_tick, start), abs=1.0)
        expected = 0.0 if end is None else old_stalled_within(samples, last_tick, start, end)
        assert stalled == pytest.approx(expected, abs=1.0)
