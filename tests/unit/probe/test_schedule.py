"""Probe scheduling, pure parts (docs/design.md §2): even stable phases, no catch-up bursts."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.probe.slots import (
    MAX_START_TICK_S,
    STARTS_PER_TICK,
    next_slot,
    on_tick,
    phases,
    start_tick,
)
from llm_health.probe.target import ProbeTarget


def target(cluster: str, address: str, interval_s: float = 1.0) -> ProbeTarget:
    return ProbeTarget(
        cluster=cluster,
        address=address,
        url=f"http://{address}/v1/completions",
        api="openai-completions",
        model=None,
        prompt="hi",
        cache_bust="salt",
        timeout_s=0.8,
        healthy_ttft_s=0.2,
        interval_s=interval_s,
        confirm_delay_s=0.05,
        unhealthy_after=2,
        fatal_patterns=None,
    )


def fleet(n: int, interval_s: float = 1.0) -> list[ProbeTarget]:
    return [
        target(f"c{i % 3}", f"10.0.{i // 250}.{i % 250 + 1}:8000", interval_s) for i in range(n)
    ]


# --- phases -------------------------------------------------------------------------------


def test_fifty_targets_are_evenly_spaced() -> None:
    targets = fleet(50)
    result = phases(targets)
    assert set(result) == {t.key for t in targets}
    ordered = sorted(result.values())
    # Exactly the instants 0, 1/50, 2/50, ... 49/50 of the 1 s interval.
    assert ordered == pytest.approx([i / 50 for i in range(50)], abs=1e-12)
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    assert all(math.isclose(g, 0.02, abs_tol=1e-12) for g in gaps)
    assert all(0.0 <= p < 1.0 for p in ordered)


def test_no_two_targets_share_a_phase() -> None:
    result = phases(fleet(50))
    assert len(set(result.values())) == 50


@pytest.mark.parametrize("interval", [0.5, 2.0, 10.0])
def test_phases_scale_with_the_interval(interval: float) -> None:
    ordered = sorted(phases(fleet(8, interval)).values())
    assert ordered == pytest.approx([interval * i / 8 for i in range(8)])


def test_phases_are_stable() -> None:
    targets = fleet(50)
    first = phases(targets)
    again = phases(fleet(50))  # rebuilt objects, same keys
    assert first == again
    shuffled = targets[:]
    random.Random(7).shuffle(shuffled)
    assert phases(shuffled) == first
    assert phases(reversed(targets)) == first  # any iterable, any order


def test_phase_order_does_not_follow_config_order() -> None:
    """Stable hashing, not list position: otherwise endpoints of one cluster (adjacent in
    the config) would be probed back to back."""
    targets = fleet(50)
    result = phases(targets)
    by_position = [result[t.key] for t in targets]
    assert by_position != sorted(by_position)


def test_single_and_empty() -> None:
    assert phases([target("a", "h:1")]) == {"a/h:1": 0.0}
    assert phases([]) == {}


# --- next_slot ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "origin", "phase", "interval", "expected"),
    [
        (0.0, 0.0, 0.3, 1.0, 0.3),  # before the first slot: the first slot
        (0.29, 0.0, 0.3, 1.0, 0.3),
        (0.3, 0.0, 0.3, 1.0, 1.3),  # exactly on a slot: the next one (strictly after)
        (0.31, 0.0, 0.3, 1.0, 1.3),
        (1.3, 0.0, 0.3, 1.0, 2.3),
        (5.75, 0.0, 0.3, 1.0, 6.3),  # 5 missed slots skipped, no burst
        (100.0, 100.0, 0.0, 2.0, 102.0),
        (107.0, 100.0, 0.5, 2.0, 108.5),
        (99.0, 100.0, 0.5, 2.0, 100.5),
    ],
)
def test_next_slot_examples(
    now: float, origin: float, phase: float, interval: float, expected: float
) -> None:
    assert next_slot(now, origin, phase, interval) == pytest.approx(expected)


@given(
    origin=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    interval=st.sampled_from([0.05, 0.1, 0.25, 1.0, 1.5, 5.0, 30.0]),
    phase_share=st.fractions(min_value=0, max_value=1).filter(lambda f: f < 1),
    elapsed=st.floats(min_value=-100.0, max_value=1e5, allow_nan=False),
)
@settings(max_examples=400, deadline=None, derandomize=True)
def test_next_slot_properties(
    origin: float, interval: float, phase_share: Fraction, elapsed: float
) -> None:
    phase = float(phase_share) * interval
    now = origin + elapsed
    slot = next_slot(now, origin, phase, interval)
    assert slot > now, "a slot at or before now would fire at once, a burst"
    tol = 1e-12 * max(1.0, abs(now))  # seconds: a few ulps at this magnitude
    # It is on the grid origin + phase + k * interval, k >= 0 ...
    k = (slot - origin - phase) / interval
    assert k > -tol / interval
    assert abs(k - round(k)) < tol / interval
    # ... and it is the first one after now: the previous grid point is not after now.
    if round(k) >= 1:
        assert slot - interval <= now + tol
    if now >= origin + phase:
        # Missed slots are skipped: never more than one interval ahead.
        assert slot - now <= interval + tol
    else:
        assert slot == origin + phase


def test_next_slot_strictly_after_now_on_grid_points() -> None:
    rng = random.Random(1)
    offenders = []
    for _ in range(2000):
        origin = rng.uniform(0, 1e6)
        interval = rng.choice([0.05, 0.1, 0.3, 0.7, 1.0, 1.5])
        phase = rng.random() * interval
        now = origin + phase + rng.randint(0, 100_000) * interval
        slot = next_slot(now, origin, phase, interval)
        if slot <= now:
            offenders.append((now, origin, phase, interval, slot))
    assert not offenders, f"{len(offenders)} of 2000, e.g. {offenders[0]}"


def test_next_slot_sequence_keeps_the_grid() -> None:
    """Repeated use (probe, then ask for the next slot) stays on the endpoint's grid even
    when probes take random, sometimes multi-interval, time."""
    rng = random.Random(3)
    origin, phase, interval = 1000.0, 0.37, 1.0
    now, slots = origin, []
    for _ in range(200):
        slot = next_slot(now, origin, phase, interval)
        assert slot > now
        slots.append(slot)
        now = slot + rng.choice([0.01, 0.2, 0.9, 1.7, 3.2])  # the probe's duration
    offsets = [(s - origin - phase) / interval for s in slots]
    assert all(abs(o - round(o)) < 1e-6 for o in offsets)
    assert len(set(round(o) for o in offsets)) == len(offsets)  # never the same slot twice


# --- gathered starts (start_tick, on_tick) -------------------------------------------------


@pytest.mark.parametrize(
    "count,interval,expected",
    [
        (500, 1.0, STARTS_PER_TICK / 500),  # 64 ms: 32 starts a tick
        (1000, 1.0, STARTS_PER_TICK / 1000),  # 32 ms
        (200, 1.0, MAX_START_TICK_S),  # 160 ms would be too late: the bound
        (20, 1.0, MAX_START_TICK_S),  # two starts a tick, at the bound
        (10, 1.0, 0.0),  # 100 ms would gather one: not worth a later start
        (1, 1.0, 0.0),
        (0, 1.0, 0.0),
        (40_000, 1.0, 0.0),  # 0.8 ms: below the floor
        (100, 10.0, 0.0),  # 10 probes a second, 100 ms apart: a tick would gather one
        (5000, 10.0, 0.064),  # the same rate as 500 every second
    ],
)
def test_the_start_tick_gathers_a_few_starts_and_stays_near_the_slot(
    count: int, interval: float, expected: float
) -> None:
    assert start_tick(count, interval) == pytest.approx(expected)


@settings(max_examples=300)
@given(
    due=st.floats(0, 1e5, allow_nan=False),
    origin=st.floats(0, 1e5, allow_nan=False),
    tick=st.sampled_from([0.0, 0.001, 0.016, 0.08, 0.1]),
)
def test_a_start_moves_to_the_next_tick_never_earlier_never_a_tick_later(
    due: float, origin: float, tick: float
) -> None:
    moved = on_tick(due, origin, tick)
    if tick == 0:
        assert moved == due
        return
    assert due <= moved < due + tick + 1e-6  # never early, not by a rounding error
    steps = (moved - origin) / tick
    assert abs(steps - round(steps)) < 1e-5  # on the grid from the origin


def test_a_slot_a_rounding_error_past_a_tick_is_not_moved_back_onto_it() -> None:
    """A slot just past a tick (float rounding) once went back to that tick: when that
    tick was now, the endpoint was probed again at once, in a loop on virtual time."""
    tick = 0.08
    due = 3 * tick + 1e-12
    assert on_tick(due, 0.0, tick) >= due
    assert on_tick(due, 0.0, tick) == pytest.approx(3 * tick)


def test_starts_due_within_one_tick_share_it() -> None:
    tick = start_tick(200, 1.0)
    dues = [10.0 + i * 0.005 for i in range(16)]  # 16 slots 5 ms apart
    moved = {on_tick(d, 10.0 - 1e-3, tick) for d in dues}
    assert len(moved) <= 2  # gathered on at most two ticks, not 16 wake-ups
