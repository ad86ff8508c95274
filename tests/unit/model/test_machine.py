"""Table-driven tests of the per-endpoint state machine (docs/design.md §3).

Every row starts from a known state, feeds a sequence of probe outcomes through ``step``
on a fake monotonic clock, and states the expected state after *each* probe. ``changed``
is derived from the expected states, and the expected alerts are listed per row, so every
step of every row is checked, not only the last one.

Outcome codes: F=FAST S=SLOW O=OVERLOADED T=TIMEOUT E=ERROR X=FATAL.
State codes: st=STARTING h=HEALTHY d=DEGRADED u=UNHEALTHY dr=DRAINING.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from llm_health.model.machine import Transition, drain, initial_health, step, trusted, undrain
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

OUTCOME = {
    "F": Outcome.FAST,
    "S": Outcome.SLOW,
    "O": Outcome.OVERLOADED,
    "T": Outcome.TIMEOUT,
    "E": Outcome.ERROR,
    "X": Outcome.FATAL,
}
STATE = {
    "st": State.STARTING,
    "h": State.HEALTHY,
    "d": State.DEGRADED,
    "u": State.UNHEALTHY,
    "dr": State.DRAINING,
}
FATAL_DETAIL = "CUDA error: an illegal memory access was encountered"
SLOW_TTFT_MS = 450.0
T0 = 1000.0  # the fake monotonic clock starts here (not 0, so "since" bugs show)


def probe(code: str) -> ProbeResult:
    """A ProbeResult for one outcome code, with the timings a real probe would carry."""
    outcome = OUTCOME[code]
    if outcome is Outcome.FAST:
        return ProbeResult(outcome, started_at=0.0, ttft_ms=40.0)
    if outcome is Outcome.SLOW:
        return ProbeResult(outcome, started_at=0.0, ttft_ms=SLOW_TTFT_MS)
    if outcome is Outcome.FATAL:
        return ProbeResult(outcome, started_at=0.0, status=500, detail=FATAL_DETAIL)
    if outcome is Outcome.OVERLOADED:
        return ProbeResult(outcome, started_at=0.0, status=429)
    return ProbeResult(outcome, started_at=0.0)


def fresh(state: State, now: float = T0) -> EndpointHealth:
    """An endpoint that has just entered ``state`` with clean counters."""
    qualify = 1 if state is State.STARTING else 3
    return EndpointHealth(state, now, f"test: entered {state.value}", now, qualify)


def start(kind: str, policy: Policy) -> EndpointHealth:
    if kind == "new":
        return initial_health(T0, policy)
    if kind == "boot":
        return initial_health(T0, policy, known_at_boot=True)
    if kind == "dr":
        return drain(fresh(State.HEALTHY), T0, "operator drain").after
    return fresh(STATE[kind])


def run(
    health: EndpointHealth,
    codes: str,
    policy: Policy,
    times: Sequence[float] | None = None,
    gap: float = 1.0,
) -> list[Transition]:
    """Feed ``codes`` through ``step``; the clock is ``times`` or T0 + gap, T0 + 2*gap, ..."""
    clock = list(times) if times is not None else [T0 + gap * (i + 1) for i in range(len(codes))]
    assert len(clock) == len(codes)
    transitions = []
    for code, now in zip(codes, clock, strict=True):
        transition = step(health, probe(code), now, policy)
        transitions.append(transition)
        health = transition.after
    return transitions


@dataclass(frozen=True)
class Row:
    id: str
    start: str  # "new" | "boot" | a state code
    codes: str
    states: str  # expected state after each probe, space separated
    words: tuple[str, ...] = ()  # substrings expected in the reason of the last change
    alerts: frozenset[int] = frozenset()  # indexes of the probes that must alert
    times: tuple[float, ...] | None = None
    policy: dict[str, float] = field(default_factory=dict)


def alerts(*indexes: int) -> frozenset[int]:
    return frozenset(indexes)


ROWS = [
    # --- STARTING -------------------------------------------------------------------------
    Row("starting/new/3-fast->healthy", "new", "FFF", "st st h", ("ready", "3 consecutive fast")),
    Row("starting/new/2-fast-stays", "new", "FF", "st st"),
    Row("starting/new/slow-in-run->degraded", "new", "FSF", "st st d", ("not all fast",)),
    Row("starting/new/slow-first->degraded", "new", "SFF", "st st d", ("3 consecutive",)),
    Row("starting/new/all-slow->degraded", "new", "SSS", "st st d", ("not all fast",)),
    Row("starting/new/timeout-resets-streak", "new", "FFTFFF", "st st st st st h"),
    Row("starting/new/error-resets-streak", "new", "FEFFF", "st st st st h"),
    Row("starting/new/overloaded-resets-streak", "new", "FFOFFF", "st st st st st h"),
    Row("starting/new/slow-before-reset-forgotten", "new", "STFFF", "st st st st h"),
    Row("starting/boot/1-fast->healthy", "boot", "F", "h", ("ready",)),
    Row("starting/boot/1-slow->degraded", "boot", "S", "d", ("ready", "slow")),
    Row("starting/boot/one-failure-then-fast", "boot", "TF", "st h"),
    # Known at boot: probably serving already, so no startup grace for a dead backend:
    # `unhealthy_after` consecutive failures eject it, as from HEALTHY.
    Row(
        "starting/boot/2-timeouts->unhealthy",
        "boot",
        "TT",
        "st u",
        ("2 consecutive timeouts (>800 ms)", "since the plugin started"),
        alerts(1),
    ),
    Row(
        "starting/boot/2-failures->unhealthy",
        "boot",
        "TE",
        "st u",
        ("2 consecutive failures", "error", "timeout"),
        alerts(1),
    ),
    Row("starting/boot/overloaded-breaks-failure-run", "boot", "TOTO", "st st st st"),
    Row(
        "starting/boot/unhealthy_after=3",
        "boot",
        "TTT",
        "st st u",
        ("3 consecutive timeouts",),
        alerts(2),
        policy={"unhealthy_after": 3},
    ),
    Row(
        "starting/healthy_after=1/1-fast",
        "new",
        "F",
        "h",
        policy={"healthy_after": 1},
    ),
    Row(
        "starting/healthy_after=5/needs-5",
        "new",
        "FFFFF",
        "st st st st h",
        ("5 consecutive fast",),
        policy={"healthy_after": 5},
    ),
    Row(
        "starting/failures-tolerated-within-grace",
        "new",
        "TEOTE",
        "st st st st st",
        times=(T0 + 1, T0 + 100, T0 + 300, T0 + 599, T0 + 599.9),
    ),
    Row(
        "starting/timeout-at-grace->unhealthy",
        "new",
        "TT",
        "st u",
        ("never became ready", "startup_grace", "600s", "timeout"),
        alerts(1),
        times=(T0 + 1, T0 + 600),
    ),
    Row(
        "starting/error-after-grace->unhealthy",
        "new",
        "E",
        "u",
        ("startup_grace", "error"),
        alerts(0),
        times=(T0 + 700,),
    ),
    Row(
        "starting/overloaded-after-grace->unhealthy",
        "new",
        "O",
        "u",
        ("startup_grace",),
        alerts(0),
        times=(T0 + 700,),
    ),
    Row(
        "starting/boot/timeout-after-grace->unhealthy",
        "boot",
        "T",
        "u",
        ("startup_grace",),
        alerts(0),
        times=(T0 + 601,),
    ),
    Row(
        "starting/short-grace",
        "new",
        "TT",
        "st u",
        ("startup_grace", "30s"),
        alerts(1),
        times=(T0 + 29, T0 + 30),
        policy={"startup_grace_s": 30.0},
    ),
    Row(
        "starting/successes-after-grace-do-not-eject",
        "new",
        "FFF",
        "st st h",
        times=(T0 + 700, T0 + 701, T0 + 702),
    ),
    Row("starting/new/fatal->unhealthy", "new", "X", "u", ("fatal", FATAL_DETAIL), alerts(0)),
    Row("starting/boot/fatal->unhealthy", "boot", "X", "u", ("fatal",), alerts(0)),
    Row("starting/fatal-after-fast", "new", "FFX", "st st u", ("fatal",), alerts(2)),
    # --- HEALTHY --------------------------------------------------------------------------
    Row("healthy/fast-stays", "h", "FFFFF", "h h h h h"),
    Row("healthy/slow->degraded", "h", "S", "d", ("slow", f"{SLOW_TTFT_MS:.0f} ms")),
    Row("healthy/overloaded->degraded", "h", "O", "d", ("overloaded",)),
    Row("healthy/one-timeout->degraded", "h", "T", "d", ("timeout",)),
    Row("healthy/one-error->degraded", "h", "E", "d", ("error",)),
    Row("healthy/2-timeouts->unhealthy", "h", "TT", "d u", ("2 consecutive timeouts",), alerts(1)),
    Row("healthy/2-errors->unhealthy", "h", "EE", "d u", ("2 consecutive errors",), alerts(1)),
    Row(
        "healthy/timeout+error->unhealthy",
        "h",
        "TE",
        "d u",
        ("2 consecutive failures", "error", "timeout"),
        alerts(1),
    ),
    Row("healthy/fatal->unhealthy", "h", "X", "u", ("fatal", FATAL_DETAIL), alerts(0)),
    Row("healthy/fast-breaks-failure-run", "h", "TFT", "d d d"),
    Row("healthy/slow-breaks-failure-run", "h", "TST", "d d d"),
    Row("healthy/overloaded-breaks-failure-run", "h", "TOT", "d d d"),
    Row(
        "healthy/unhealthy_after=3",
        "h",
        "TTT",
        "d d u",
        ("3 consecutive timeouts",),
        alerts(2),
        policy={"unhealthy_after": 3},
    ),
    Row(
        "healthy/unhealthy_after=1",
        "h",
        "E",
        "u",
        ("1 consecutive errors",),
        alerts(0),
        policy={"unhealthy_after": 1},
    ),
    Row(
        "healthy/timeout-threshold-in-reason",
        "h",
        "TT",
        "d u",
        ("(>1500 ms)",),
        alerts(1),
        policy={"timeout_s": 1.5, "healthy_ttft_s": 0.5},
    ),
    # --- DEGRADED -------------------------------------------------------------------------
    Row("degraded/3-fast->healthy", "d", "FFF", "d d h", ("recovered", "3 consecutive fast")),
    Row("degraded/2-fast-stays", "d", "FF", "d d"),
    Row("degraded/slow-resets-fast-streak", "d", "FFSFFF", "d d d d d h"),
    Row("degraded/overloaded-resets-fast-streak", "d", "FFOFFF", "d d d d d h"),
    Row("degraded/one-failure-resets-fast-streak", "d", "FFTFFF", "d d d d d h"),
    Row("degraded/slow-stays", "d", "SSSS", "d d d d"),
    Row("degraded/overloaded-stays", "d", "OOOO", "d d d d"),
    Row("degraded/2-timeouts->unhealthy", "d", "TT", "d u", ("2 consecutive timeouts",), alerts(1)),
    Row("degraded/2-errors->unhealthy", "d", "EE", "d u", ("2 consecutive errors",), alerts(1)),
    Row("degraded/fast-breaks-failure-run", "d", "TFT", "d d d"),
    Row("degraded/fatal->unhealthy", "d", "X", "u", ("fatal",), alerts(0)),
    Row(
        "degraded/healthy_after=1",
        "d",
        "SF",
        "d h",
        ("recovered",),
        policy={"healthy_after": 1},
    ),
    Row(
        "degraded/healthy_after=4",
        "d",
        "FFFF",
        "d d d h",
        ("4 consecutive fast",),
        policy={"healthy_after": 4},
    ),
    # --- UNHEALTHY ------------------------------------------------------------------------
    Row("unhealthy/3-fast->healthy", "u", "FFF", "u u h", ("recovered", "3 consecutive fast")),
    Row("unhealthy/mixed->degraded", "u", "FSF", "u u d", ("recovered", "not all fast")),
    Row("unhealthy/3-slow->degraded", "u", "SSS", "u u d", ("not all fast",)),
    Row("unhealthy/2-fast-stays", "u", "FF", "u u"),
    Row("unhealthy/overloaded-breaks-streak", "u", "FFOFF", "u u u u u"),
    Row("unhealthy/overloaded-then-3-fast", "u", "FFOFFF", "u u u u u h"),
    Row("unhealthy/timeout-breaks-streak", "u", "FFTFFF", "u u u u u h"),
    Row("unhealthy/failures-stay-quietly", "u", "TETEO", "u u u u u"),
    Row("unhealthy/fatal-refreshes-reason", "u", "X", "u", ("fatal", FATAL_DETAIL), alerts(0)),
    Row("unhealthy/repeated-fatal-alerts-once", "u", "XXX", "u u u", ("fatal",), alerts(0)),
    Row("unhealthy/fatal-again-after-other", "u", "XTX", "u u u", ("fatal",), alerts(0, 2)),
    Row(
        "unhealthy/healthy_after=1",
        "u",
        "S",
        "d",
        ("recovered",),
        policy={"healthy_after": 1},
    ),
    Row(
        "unhealthy/healthy_after=2",
        "u",
        "FF",
        "u h",
        ("2 consecutive fast",),
        policy={"healthy_after": 2},
    ),
    # --- DRAINING: outcomes never change the state -----------------------------------------
    Row("draining/fast", "dr", "FFFFF", "dr dr dr dr dr"),
    Row("draining/slow", "dr", "SSS", "dr dr dr"),
    Row("draining/timeouts", "dr", "TTTTT", "dr dr dr dr dr"),
    Row("draining/errors", "dr", "EEE", "dr dr dr"),
    Row("draining/fatal", "dr", "XX", "dr dr"),
    Row("draining/overloaded", "dr", "OO", "dr dr"),
    Row("draining/after-grace", "dr", "TX", "dr dr", times=(T0 + 10_000, T0 + 10_001)),
]


def last_change(transitions: list[Transition]) -> Transition | None:
    changes = [t for t in transitions if t.changed]
    return changes[-1] if changes else None


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_transition_table(row: Row) -> None:
    policy = Policy(**row.policy)  # type: ignore[arg-type]
    health = start(row.start, policy)
    expected = [STATE[code] for code in row.states.split()]
    assert len(expected) == len(row.codes), "bad row: one expected state per outcome"

    clock = row.times or tuple(T0 + 1.0 * (i + 1) for i in range(len(row.codes)))
    transitions = run(health, row.codes, policy, clock)

    got = [t.after.state for t in transitions]
    assert got == expected
    previous = health.state
    for index, (transition, want) in enumerate(zip(transitions, expected, strict=True)):
        where = f"probe #{index} ({row.codes[index]})"
        assert transition.from_state is previous, where
        assert transition.changed is (want is not previous), where
        assert transition.alert is (index in row.alerts), where
        if transition.changed:
            assert transition.after.reason.strip(), f"{where}: empty reason on a change"
            assert transition.after.since == clock[index], f"{where}: since not updated"
        previous = want

    if row.words:
        reason_of = last_change(transitions)
        reason = (reason_of or transitions[-1]).after.reason
        for word in row.words:
            assert word in reason, f"{word!r} not in reason {reason!r}"


def test_two_timeouts_reason_is_exact() -> None:
    """The docs/design.md §3 example, word for word, with the default policy."""
    policy = Policy(unhealthy_after=2)
    transitions = run(fresh(State.HEALTHY), "TT", policy)
    assert [t.after.state for t in transitions] == [State.DEGRADED, State.UNHEALTHY]
    assert transitions[-1].after.reason == "2 consecutive timeouts (>800 ms)"
    assert transitions[-1].alert


@pytest.mark.parametrize(
    ("start_kind", "prefix"),
    [("new", "FF"), ("boot", ""), ("h", "FF"), ("d", "SF"), ("d", "T")],
    ids=["starting-new", "starting-boot", "healthy", "degraded", "degraded-after-failure"],
)
def test_fatal_from_every_routable_or_starting_state(start_kind: str, prefix: str) -> None:
    policy = Policy()
    before = run(start(start_kind, policy), prefix, policy)[-1].after if prefix else None
    health = before or start(start_kind, policy)
    state_before = health.state
    transition = step(health, probe("X"), T0 + 50, policy)
    assert state_before is not State.UNHEALTHY
    assert transition.after.state is State.UNHEALTHY
    assert transition.changed and transition.alert
    assert transition.after.since == T0 + 50
    assert FATAL_DETAIL in transition.after.reason


def test_fatal_without_detail_still_explains() -> None:
    result = ProbeResult(Outcome.FATAL, started_at=0.0)
    transition = step(fresh(State.HEALTHY), result, T0 + 1, Policy())
    assert transition.after.state is State.UNHEALTHY
    assert "fatal" in transition.after.reason


def test_fatal_in_unhealthy_keeps_since() -> None:
    health = fresh(State.UNHEALTHY, now=T0)
    transition = step(health, probe("X"), T0 + 30, Policy())
    assert transition.after.state is State.UNHEALTHY
    assert not transition.changed
    assert transition.after.since == T0


def test_since_is_the_time_of_the_change() -> None:
    policy = Policy()
    times = (T0 + 1, T0 + 2, T0 + 7)
    transitions = run(fresh(State.HEALTHY), "FTT", policy, times)
    assert transitions[0].after.since == T0  # no change: since kept
    assert transitions[1].after.since == T0 + 2
    assert transitions[2].after.since == T0 + 7


def test_initial_health() -> None:
    policy = Policy(healthy_after=4)
    new = initial_health(T0, policy)
    boot = initial_health(T0, policy, known_at_boot=True)
    assert new.state is State.STARTING and boot.state is State.STARTING
    assert new.qualify_after == 4
    assert boot.qualify_after == 1
    assert new.reason and boot.reason
    assert new.first_seen == T0 == new.since


# --- drain / undrain ----------------------------------------------------------------------


@pytest.mark.parametrize("state", ["st", "h", "d", "u"])
def test_drain_from_any_state(state: str) -> None:
    transition = drain(fresh(STATE[state]), T0 + 5, "removed by discovery")
    assert transition.after.state is State.DRAINING
    assert transition.changed
    assert transition.from_state is STATE[state]
    assert transition.after.reason == "removed by discovery"
    assert transition.after.since == T0 + 5
    assert not transition.alert


def test_drain_when_draining_is_no_change() -> None:
    drained = drain(fresh(State.HEALTHY), T0, "operator").after
    again = drain(drained, T0 + 1, "operator again")
    assert again.after.state is State.DRAINING
    assert not again.changed


def test_undrain_requires_qualifying_like_a_new_endpoint() -> None:
    policy = Policy(healthy_after=3)
    drained = drain(fresh(State.HEALTHY), T0, "operator").after
    back = undrain(drained, T0 + 10, policy)
    assert back.after.state is State.STARTING
    assert back.changed and back.from_state is State.DRAINING
    assert back.after.reason
    assert back.after.since == T0 + 10
    transitions = run(back.after, "FFF", policy, (T0 + 11, T0 + 12, T0 + 13))
    assert [t.after.state for t in transitions] == [State.STARTING, State.STARTING, State.HEALTHY]


def test_undrain_discards_counters_gathered_while_draining() -> None:
    policy = Policy(healthy_after=3)
    drained = drain(fresh(State.HEALTHY), T0, "operator").after
    drained = run(drained, "FFFFF", policy)[-1].after
    back = undrain(drained, T0 + 10, policy).after
    transitions = run(back, "F", policy, (T0 + 11,))
    assert transitions[0].after.state is State.STARTING


def test_undrain_restarts_startup_grace() -> None:
    policy = Policy(startup_grace_s=600.0)
    drained = drain(initial_health(T0, policy), T0 + 1, "operator").after
    back = undrain(drained, T0 + 5000, policy).after
    # Long after the original first_seen, but only 10 s after the undrain: tolerated.
    tolerated = step(back, probe("T"), T0 + 5010, policy)
    assert tolerated.after.state is State.STARTING and not tolerated.alert
    expired = step(tolerated.after, probe("T"), T0 + 5600, policy)
    assert expired.after.state is State.UNHEALTHY
    assert "startup_grace" in expired.after.reason


@pytest.mark.parametrize(
    ("outcome", "lag_ms", "timeout_s", "expected"),
    [
        # The absolute bound (max_loop_lag 100 ms) for every SLOW and TIMEOUT verdict.
        (Outcome.SLOW, 100.0, 0.8, True),
        (Outcome.SLOW, 101.0, 0.8, False),
        (Outcome.TIMEOUT, 100.0, 0.8, True),
        (Outcome.TIMEOUT, 101.0, 0.8, False),
        # A TIMEOUT over a long budget: up to a tenth of it (500 ms of 5 s) proves the
        # engine took at least 90 % of the timeout.
        (Outcome.TIMEOUT, 150.0, 5.0, True),
        (Outcome.TIMEOUT, 500.0, 5.0, True),
        (Outcome.TIMEOUT, 501.0, 5.0, False),
        # SLOW keeps the absolute bound whatever the timeout.
        (Outcome.SLOW, 150.0, 5.0, False),
        # Lag never voids what it cannot invent.
        (Outcome.FAST, 5_000.0, 0.8, True),
        (Outcome.ERROR, 5_000.0, 0.8, True),
        (Outcome.FATAL, 5_000.0, 0.8, True),
    ],
)
def test_trusted_bounds_the_lag_a_verdict_may_bear(
    outcome: Outcome, lag_ms: float, timeout_s: float, expected: bool
) -> None:
    policy = Policy(timeout_s=timeout_s, max_loop_lag_s=0.1)
    result = ProbeResult(outcome, 0.0, ttft_ms=None, loop_lag_ms=lag_ms)
    assert trusted(result, policy) is expected


def test_counting_keeps_every_field_but_the_counters() -> None:
    """``_count`` builds the new health field by field (not ``dataclasses.replace``): every
    field it does not count must come through as it was, whatever fields exist."""
    from dataclasses import fields

    from llm_health.model.causes import Cause
    from llm_health.model.machine import _count

    counters = {"successes", "all_fast", "fast_streak", "failures", "failure_kinds"}
    counters.add("last_outcome")
    health = EndpointHealth(
        State.DEGRADED, 12.5, "some reason", 3.25, 4, True, 2, False, 1, 0,
        frozenset(), Outcome.SLOW, Cause.SILENT, True,
    )  # fmt: skip
    assert len(fields(EndpointHealth)) == 14  # a new field: teach _counted about it
    for outcome in Outcome:
        counted = _count(health, outcome)
        for f in fields(EndpointHealth):
            if f.name not in counters:
                assert getattr(counted, f.name) == getattr(health, f.name), (outcome, f.name)
        assert counted.last_outcome is outcome


def test_the_steady_state_path_is_the_general_one() -> None:
    """``step``'s short way for a FAST probe on a HEALTHY endpoint gives exactly what
    counting it and ``_decide_healthy`` give, whatever the counters and flags."""
    import random
    from dataclasses import replace

    from llm_health.model.machine import _count, _decide_healthy

    rng = random.Random(5)
    policy = Policy()
    for _ in range(500):
        health = replace(
            initial_health(0.0, policy, known_at_boot=rng.random() < 0.5),
            state=State.HEALTHY,
            successes=rng.randint(0, 5),
            all_fast=rng.random() < 0.5,
            fast_streak=rng.randint(0, 5),
            failures=rng.choice([0, 0, 1]),
            failure_kinds=rng.choice([frozenset(), frozenset({Outcome.TIMEOUT})]),
            last_outcome=rng.choice(list(Outcome)),
            silenced=rng.random() < 0.2,
        )
        result = ProbeResult(Outcome.FAST, 0.0, ttft_ms=rng.uniform(1, 100))
        expected = _decide_healthy(health, _count(health, Outcome.FAST), result, 1.0, policy)
        assert step(health, result, 1.0, policy) == expected
