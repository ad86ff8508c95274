"""The overload rule (docs/design.md §3.5): a SLOW or TIMEOUT probe is OVERLOADED only while
the engine admitted during the probe's wait (two reads after it was sent:
``ProbeResult.admission``), or, with an ``admission_window``, a scheduled read's advance or
a real request's first token lies wholly in the window before it. Table-driven over the
evidence, then through the machine and the board: saturation never makes UNHEALTHY, and
without admission (a frozen engine, a scheduler deadlock, a failed read, users admitted
just before a hang) today's rule stands."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from llm_health.model.admission import (
    NO_ADMISSION,
    Admission,
    after_first_token,
    after_read,
    evidence,
    excused,
)
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State

COUNTER = "vllm:prompt_tokens_total"
WINDOW = 2.0
TIMEOUT_MS = 800.0
T0 = 1000.0


def timeout() -> ProbeResult:
    return ProbeResult(Outcome.TIMEOUT, started_at=0.0, total_ms=TIMEOUT_MS)


def slow() -> ProbeResult:
    return ProbeResult(Outcome.SLOW, started_at=0.0, ttft_ms=450.0, total_ms=450.0)


def bracketed(result: ProbeResult) -> ProbeResult:
    """``result`` as told after its wait was bracketed by reads that saw admission."""
    return replace(result, admission=f"{COUNTER} +512 during the wait")


def reads(
    *points: tuple[float, float | None], in_flight: float | None = None, window: float = WINDOW
) -> Admission:
    """The admission after reads (time, value), each showing ``in_flight`` requests in
    the engine (None: not exported), with an admission window of ``window``; a value of
    None: a failed read, which changes nothing (the engine checks call nothing for it)."""
    admission = NO_ADMISSION
    for at, count in points:
        if count is not None:
            admission = after_read(admission, COUNTER, count, at, window, in_flight)
    return admission


@dataclass(frozen=True)
class Row:
    name: str
    admission: Admission
    result: ProbeResult
    excused: bool


# The probe is folded at T0 + 10; a TIMEOUT waited from T0 + 9.2, so with a window
# evidence counts from T0 + 7.2 (the wait's start less the window).
NOW = T0 + 10.0
ROWS = [
    Row("admitted during the wait", NO_ADMISSION, bracketed(timeout()), True),
    Row(
        "admitted during the wait, a queue in the engine",
        reads((T0 + 9.0, 100), (T0 + 9.5, 100), in_flight=24, window=0.0),
        bracketed(timeout()),
        True,
    ),
    Row(  # serve beside the agent: the engine admitted its probe, then froze idle
        "admitted during the wait, the engine idle: another prober",
        reads((T0 + 9.0, 100), (T0 + 9.5, 141), in_flight=0, window=0.0),
        bracketed(timeout()),
        False,
    ),
    Row(  # users admitted, then a hang: the zombie under light traffic
        "no window: a scheduled read's advance that began before the wait",
        reads((T0 + 9.0, 100), (T0 + 9.5, 5220), in_flight=6, window=0.0),
        timeout(),
        False,
    ),
    Row(
        "no window: a real first token before the wait",
        after_first_token(reads((T0 + 9, 5), window=0.0), T0 + 9.1),
        timeout(),
        False,
    ),
    Row(
        "no window: a real first token in the wait",
        after_first_token(reads((T0 + 9, 5), window=0.0), T0 + 9.3),
        timeout(),
        True,
    ),
    Row("advanced during the wait", reads((T0 + 9.0, 100), (T0 + 9.5, 5220)), timeout(), True),
    Row(
        "advanced, its whole span just inside the window",
        reads((T0 + 7.25, 1), (T0 + 7.3, 2)),
        timeout(),
        True,
    ),
    Row(
        "advanced, its span begun before the window",
        reads((T0 + 6, 1), (T0 + 7.3, 2)),
        timeout(),
        False,
    ),
    Row(
        "advanced before the window",
        reads((T0 + 6, 1), (T0 + 7.1, 2), (T0 + 9.9, 2)),
        timeout(),
        False,
    ),
    Row(
        "never advanced: stale busy engine",
        reads((T0 + 8, 7), (T0 + 9, 7), (T0 + 9.9, 7)),
        timeout(),
        False,
    ),
    Row(
        "advanced during the wait, a queue in the engine",
        reads((T0 + 9.0, 100), (T0 + 9.5, 5220), in_flight=24),
        timeout(),
        True,
    ),
    Row(  # serve beside the agent: the engine admitted its probe, then froze idle
        "advanced during the wait, the engine idle: another prober",
        reads((T0 + 9.0, 100), (T0 + 9.5, 141), in_flight=0),
        timeout(),
        False,
    ),
    Row(
        "advanced, one request in the engine: nothing to queue behind",
        reads((T0 + 9.0, 100), (T0 + 9.5, 141), in_flight=1),
        slow(),
        False,
    ),
    Row(
        "a real first token, the engine idle",
        after_first_token(reads((T0 + 9, 5), (T0 + 9.5, 5), in_flight=0), T0 + 9.6),
        timeout(),
        False,
    ),
    Row("one read: a baseline only", reads((T0 + 9.5, 100)), timeout(), False),
    Row(  # what good reads saw stays, and ages out
        "advance then a failed read",
        reads((T0 + 9, 1), (T0 + 9.5, 9), (T0 + 9.8, None)),
        timeout(),
        True,
    ),
    Row(
        "a failed read between two good ones",
        reads((T0 + 8, 1), (T0 + 9, None), (T0 + 9.5, 9)),
        timeout(),
        True,
    ),
    Row(
        "good reads further apart than the window: its span begun before it",
        reads((T0 + 6, 1), (T0 + 7, None), (T0 + 8, None), (T0 + 9.5, 9)),
        timeout(),
        False,
    ),
    Row("failed reads only", reads((T0 + 9, None), (T0 + 9.5, None)), timeout(), False),
    Row("counter went back: a new process", reads((T0 + 9, 50), (T0 + 9.5, 3)), timeout(), False),
    Row(
        "not exported",
        after_read(
            after_read(NO_ADMISSION, COUNTER, None, T0 + 9, WINDOW), COUNTER, None, T0 + 9.5, WINDOW
        ),
        timeout(),
        False,
    ),
    Row("slow with admission", reads((T0 + 9, 1), (T0 + 9.5, 2)), slow(), True),
    Row(
        "error is never excused",
        reads((T0 + 9, 1), (T0 + 9.5, 2)),
        ProbeResult(Outcome.ERROR, started_at=0.0),
        False,
    ),
    Row(
        "fatal is never excused",
        reads((T0 + 9, 1), (T0 + 9.5, 2)),
        ProbeResult(Outcome.FATAL, started_at=0.0),
        False,
    ),
    Row(
        "a real first token in the wait", after_first_token(NO_ADMISSION, T0 + 9.6), timeout(), True
    ),
    Row("a real first token long ago", after_first_token(NO_ADMISSION, T0 + 5.0), timeout(), False),
    Row(
        "a real first token, a counter that stays put",
        after_first_token(reads((T0 + 9, 5), (T0 + 9.5, 5)), T0 + 9.6),
        timeout(),
        True,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_evidence_table(row: Row) -> None:
    result = excused(row.result, row.admission, NOW)
    if row.excused:
        assert result.outcome is Outcome.OVERLOADED
        assert result.ttft_ms == row.result.ttft_ms
        assert evidence(row.result, row.admission, NOW) in result.detail
    else:
        assert result == row.result


def test_reason_names_the_counter_and_its_advance() -> None:
    admission = reads((T0 + 9.0, 100), (T0 + 10.0, 5220))
    result = excused(timeout(), admission, T0 + 10.3)
    assert result.detail == (
        "timed out behind a queue: vllm:prompt_tokens_total +5120 in 1.0 s, 0.3 s ago"
    )


def test_a_gauge_like_counter_that_stays_put_is_no_evidence_however_busy() -> None:
    """Many reads of the same value: each is a read, none an advance."""
    admission = reads(*[(T0 + i * 0.5, 42.0) for i in range(20)])
    assert admission.advanced_at is None
    assert excused(timeout(), admission, NOW).outcome is Outcome.TIMEOUT


# --- through the board: the machine does the rest --------------------------------------

POLICY = Policy(timeout_s=0.8, unhealthy_after=2, healthy_after=3)
ADDRESS = "10.0.0.1:8000"


def board() -> Board:
    spec = ClusterSpec("c", POLICY, (EndpointSpec(ADDRESS, "10.0.0.1", 8000),))
    b = Board([spec], T0, 0.0)
    fast = ProbeResult(Outcome.FAST, started_at=0.0, ttft_ms=40.0)
    for i in range(3):
        b.record("c", ADDRESS, fast, T0 + i)
    assert b.health("c", ADDRESS).state is State.HEALTHY
    return b


def test_saturated_timeouts_are_overloaded_never_unhealthy() -> None:
    b = board()
    count = 0.0
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, count, T0 + 9, WINDOW))
    for i in range(30):
        now = T0 + 10 + i
        count += 4096 if i % 2 == 0 else 0  # admits every other read: a queue of 20, 4 slots
        b.note_admission(
            "c", ADDRESS, lambda a, n=now, c=count: after_read(a, COUNTER, c, n, WINDOW)
        )
        b.record("c", ADDRESS, timeout(), now + 0.5)
        health = b.health("c", ADDRESS)
        assert health.state is State.DEGRADED, health.reason
    assert b.health("c", ADDRESS).cause is Cause.OVERLOADED
    assert "timed out behind a queue: vllm:prompt_tokens_total" in b.health("c", ADDRESS).reason


def test_frozen_counter_timeouts_are_unhealthy_within_today_bounds() -> None:
    """Stale busy figures: the counter is read, it does not move; 2 timeouts -> UNHEALTHY."""
    b = board()
    for i in range(2):
        now = T0 + 10 + i
        b.note_admission("c", ADDRESS, lambda a, n=now: after_read(a, COUNTER, 777.0, n, WINDOW))
        b.record("c", ADDRESS, timeout(), now + 0.5)
    health = b.health("c", ADDRESS)
    assert health.state is State.UNHEALTHY
    assert health.cause is Cause.TIMEOUT


def test_deadlock_is_unhealthy_once_the_last_advance_leaves_the_window() -> None:
    """Admission stopped at T0 + 10 (decode and completions may go on: not read here)."""
    b = board()
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 1.0, T0 + 9, WINDOW))
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 2.0, T0 + 10, WINDOW))
    states = []
    for i in range(6):
        now = T0 + 10 + i
        b.note_admission("c", ADDRESS, lambda a, n=now: after_read(a, COUNTER, 2.0, n, WINDOW))
        b.record("c", ADDRESS, timeout(), now + 0.9)
        states.append(b.health("c", ADDRESS).state)
    # Excused while the advance's span (T0 + 9, T0 + 10] is within 2 s before the wait:
    # the wait from T0 + 10.1; then two timeouts count.
    assert states[:2] == [State.DEGRADED, State.DEGRADED]
    assert states[2] is State.UNHEALTHY


def test_slow_behind_a_queue_still_recovers_an_unhealthy_endpoint() -> None:
    b = board()
    for i in range(2):
        b.record("c", ADDRESS, timeout(), T0 + 10 + i)
    assert b.health("c", ADDRESS).state is State.UNHEALTHY
    count = 0.0
    for i in range(3):
        now = T0 + 20 + i
        b.note_admission(
            "c", ADDRESS, lambda a, n=now, c=count: after_read(a, COUNTER, c, n, WINDOW)
        )
        count += 100  # users admitted after our last probe's span
        at = now + 0.3
        b.note_admission(
            "c", ADDRESS, lambda a, n=at, c=count: after_read(a, COUNTER, c, n, WINDOW)
        )
        b.record("c", ADDRESS, slow(), now + 0.5)
    health = b.health("c", ADDRESS)
    assert health.state is State.DEGRADED
    assert health.last_outcome is Outcome.OVERLOADED


def fast(total_ms: float = 60.0) -> ProbeResult:
    return ProbeResult(Outcome.FAST, started_at=0.0, ttft_ms=40.0, total_ms=total_ms)


def test_an_advance_our_own_fast_probe_explains_is_no_evidence_read_after() -> None:
    """An idle engine: the only admission is our last fast probe's; then it hangs."""
    b = board()
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 10.0, T0 + 9.0, WINDOW))
    b.record("c", ADDRESS, fast(), T0 + 9.3)  # admitted in (9.24, 9.3]
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 30.0, T0 + 9.5, WINDOW))
    assert b.admission("c", ADDRESS).advanced_at is None
    b.record("c", ADDRESS, timeout(), T0 + 10.3)
    b.record("c", ADDRESS, timeout(), T0 + 10.8)
    assert b.health("c", ADDRESS).state is State.UNHEALTHY


def test_an_advance_our_own_fast_probe_explains_is_no_evidence_read_before() -> None:
    """The read saw the probe's prefill before its result was folded."""
    b = board()
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 10.0, T0 + 9.0, WINDOW))
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 30.0, T0 + 9.5, WINDOW))
    assert b.admission("c", ADDRESS).advanced_at == T0 + 9.5
    b.record("c", ADDRESS, fast(total_ms=200.0), T0 + 9.6)  # admitted in [9.4, 9.6]
    assert b.admission("c", ADDRESS).advanced_at is None
    b.record("c", ADDRESS, timeout(), T0 + 10.3)
    b.record("c", ADDRESS, timeout(), T0 + 10.8)
    assert b.health("c", ADDRESS).state is State.UNHEALTHY


def test_users_admitted_after_our_probe_still_count() -> None:
    b = board()
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 10.0, T0 + 9.0, WINDOW))
    b.record("c", ADDRESS, fast(), T0 + 9.1)
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 12.0, T0 + 9.5, WINDOW))
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, 400.0, T0 + 10.0, WINDOW))
    assert b.admission("c", ADDRESS).advanced_at == T0 + 10.0
    b.record("c", ADDRESS, timeout(), T0 + 10.3)
    assert b.health("c", ADDRESS).last_outcome is Outcome.OVERLOADED


def test_an_endpoint_out_before_the_evidence_came_back_under_load() -> None:
    """The onset of a peak (or a plugin restart during one): two timeouts before any
    advance was seen make it UNHEALTHY; then excused timeouts, healthy_after of them, bring
    it back DEGRADED while the load lasts (out would send the peak to the others)."""
    b = board()
    for i in range(2):
        b.record("c", ADDRESS, timeout(), T0 + 10 + i * 0.5)
    assert b.health("c", ADDRESS).state is State.UNHEALTHY
    count, states = 0.0, []
    b.note_admission("c", ADDRESS, lambda a: after_read(a, COUNTER, count, T0 + 11.5, WINDOW))
    for i in range(3):
        now = T0 + 12 + i
        count += 800
        b.note_admission(
            "c", ADDRESS, lambda a, n=now, c=count: after_read(a, COUNTER, c, n, WINDOW)
        )
        b.record("c", ADDRESS, timeout(), now + 0.5)
        states.append(b.health("c", ADDRESS).state)
    assert states == [State.UNHEALTHY, State.UNHEALTHY, State.DEGRADED]
    assert b.health("c", ADDRESS).reason == "recovered: 3 consecutive successes, not all fast"


def test_an_engine_that_says_429_is_not_excused_and_does_not_recover_by_it() -> None:
    """OVERLOADED from the engine itself (429) keeps its meaning: no success."""
    b = board()
    for i in range(2):
        b.record("c", ADDRESS, timeout(), T0 + 10 + i * 0.5)
    for i in range(4):
        b.record(
            "c", ADDRESS, ProbeResult(Outcome.OVERLOADED, started_at=0.0, status=429), T0 + 12 + i
        )
    assert b.health("c", ADDRESS).state is State.UNHEALTHY


def test_users_admitted_just_before_a_hang_excuse_nothing_without_a_window() -> None:
    """The zombie under light traffic, with the default (no ``admission_window``): the
    scheduled read after the hang shows the users admitted before it, and in-flight
    requests piling up; the two timeouts after it still make UNHEALTHY."""
    b = board()
    for at, count in ((T0 + 9.0, 100.0), (T0 + 9.9, 180.0)):  # hang at T0 + 9.8
        b.note_admission(
            "c", ADDRESS, lambda a, n=at, c=count: after_read(a, COUNTER, c, n, 0.0, 8.0)
        )
    b.record("c", ADDRESS, timeout(), T0 + 10.7)  # waited from T0 + 9.9
    b.record("c", ADDRESS, timeout(), T0 + 11.7)
    health = b.health("c", ADDRESS)
    assert health.state is State.UNHEALTHY
    assert health.cause is Cause.TIMEOUT
