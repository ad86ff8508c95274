"""In-flight silence (docs/design.md §3.2): a probe still without a first token at
healthy_ttft makes a HEALTHY endpoint DEGRADED at once, provisionally; the probe's own
result then decides by the normal rules."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.machine import drain, initial_health, silence, step
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

POLICY = Policy(healthy_after=3, unhealthy_after=2)
T0 = 1000.0


def probe(outcome: Outcome, ttft_ms: float | None = None) -> ProbeResult:
    return ProbeResult(outcome, started_at=0.0, ttft_ms=ttft_ms)


FAST, SLOW = probe(Outcome.FAST, 40.0), probe(Outcome.SLOW, 450.0)
TIMEOUT = probe(Outcome.TIMEOUT)


def healthy() -> EndpointHealth:
    ready = step(initial_health(T0, POLICY, known_at_boot=True), FAST, T0, POLICY).after
    assert ready.state is State.HEALTHY
    return ready


def test_silence_degrades_a_healthy_endpoint_at_once_without_touching_counters() -> None:
    before = healthy()
    quiet = silence(before, T0 + 5.2, 200.0)
    assert quiet.changed and quiet.from_state is State.HEALTHY
    assert quiet.to_state is State.DEGRADED and quiet.cause is Cause.SILENT
    assert quiet.after.reason == "silent for 200 ms" and quiet.after.since == T0 + 5.2
    assert not quiet.alert
    counters = ("successes", "fast_streak", "failures", "all_fast", "last_outcome")
    assert all(getattr(quiet.after, c) == getattr(before, c) for c in counters)


def test_a_late_token_that_still_counts_fast_restores_healthy() -> None:
    quiet = silence(healthy(), T0 + 5.2, 200.0).after
    back = step(quiet, FAST, T0 + 5.3, POLICY)
    assert back.changed and back.from_state is State.DEGRADED
    assert back.to_state is State.HEALTHY and back.cause is Cause.RECOVERED
    assert not back.after.silenced


def test_a_slow_token_keeps_the_silence_verdict_without_another_change() -> None:
    quiet = silence(healthy(), T0 + 5.2, 200.0).after
    slow = step(quiet, SLOW, T0 + 5.45, POLICY)
    assert not slow.changed and slow.to_state is State.DEGRADED
    assert slow.after.since == T0 + 5.2  # degraded since the silence, not since the token
    assert slow.after.reason.startswith("slow first token") and not slow.after.silenced


def test_the_timeout_and_the_overlapping_confirm_make_it_unhealthy() -> None:
    quiet = silence(healthy(), T0 + 5.2, 200.0).after
    first = step(quiet, TIMEOUT, T0 + 5.8, POLICY)
    assert not first.changed and first.to_state is State.DEGRADED
    second = step(first.after, TIMEOUT, T0 + 6.0, POLICY)
    assert second.changed and second.to_state is State.UNHEALTHY and second.alert
    assert second.cause is Cause.TIMEOUT


def test_silence_changes_nothing_outside_healthy() -> None:
    h = healthy()
    for state in (State.STARTING, State.DEGRADED, State.UNHEALTHY, State.DRAINING):
        t = silence(replace(h, state=state), T0 + 9, 300.0)
        assert not t.changed and t.after.state is state and not t.after.silenced


def test_draining_a_silenced_endpoint_clears_the_provisional_mark() -> None:
    drained = drain(silence(healthy(), T0 + 5.2, 200.0).after, T0 + 5.3, "maintenance")
    assert drained.to_state is State.DRAINING and not drained.after.silenced
    assert not step(drained.after, FAST, T0 + 6, POLICY).changed  # still draining


def test_an_endpoint_held_by_a_signal_is_not_silenced() -> None:
    spec = EndpointSpec("127.0.0.1:8000", "127.0.0.1", 8000)
    board = Board([ClusterSpec("c", POLICY, (spec,))], T0, 0.0)
    board.record("c", spec.address, FAST, T0)
    assert board.silence("c", spec.address, T0 + 1, 200.0).changed
    board.record("c", spec.address, FAST, T0 + 1.1)
    board.set_signal("c", spec.address, "hds", "unreachable from gw-1", T0 + 2)
    held = board.silence("c", spec.address, T0 + 3, 200.0)
    assert not held.changed and board.health("c", spec.address).state is State.UNHEALTHY


@given(st.lists(st.sampled_from(["F", "S"]), min_size=1, max_size=60))
def test_a_jittery_backend_gains_no_state_changes(codes: list[str]) -> None:
    """TTFT 200 ms ± 100 ms around healthy_ttft: every SLOW probe passed the silence point
    first. Silencing before each SLOW gives exactly the changes the probes alone give."""
    plain, silenced = healthy(), healthy()
    plain_changes = silenced_changes = 0
    for i, code in enumerate(codes):
        now = T0 + 10 + i
        result = FAST if code == "F" else SLOW
        t = step(plain, result, now, POLICY)
        plain, plain_changes = t.after, plain_changes + t.changed
        if code == "S":
            quiet = silence(silenced, now - 0.3, 200.0)
            silenced, silenced_changes = quiet.after, silenced_changes + quiet.changed
        t = step(silenced, result, now, POLICY)
        silenced, silenced_changes = t.after, silenced_changes + t.changed
        assert silenced.state is plain.state
    assert silenced_changes == plain_changes
