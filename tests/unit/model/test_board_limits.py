"""Board: limits (at most DEGRADED: a saturated engine) and signals that carry their own
cause (garbage output, wrong answer, wrong model)."""

from __future__ import annotations

from llm_health.model.board import Board
from llm_health.model.causes import Cause
from llm_health.model.envoy_view import EnvoyHealth
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from tests import boards

POLICY = Policy(healthy_after=3, unhealthy_after=2, drain_time_s=30.0, degraded_weight=0.3)
A, B = "10.0.0.1:80", "10.0.0.2:80"


def probe(board: Board, address: str, now: float, outcome: Outcome = Outcome.FAST, times: int = 1):  # type: ignore[no-untyped-def]
    transition = None
    for i in range(times):
        result = ProbeResult(outcome, 0.0, ttft_ms=10 if outcome is not Outcome.TIMEOUT else None)
        transition = board.record("c", address, result, now + i)
    return transition


def seen(board: Board, address: str):  # type: ignore[no-untyped-def]
    return board.snapshot().endpoint("c", address)


def healthy_board() -> Board:
    return boards.healthy_board(A, B, policy=POLICY)


def test_a_limit_degrades_a_healthy_endpoint_with_its_reason_and_weight() -> None:
    board = healthy_board()
    t = board.set_limit("c", A, "engine", "12 waiting ≥ 5", now=5.0)
    assert t.changed and t.to_state is State.DEGRADED and t.cause is Cause.SATURATED
    endpoint = seen(board, A)
    assert endpoint.reason == "12 waiting ≥ 5" and endpoint.cause is Cause.SATURATED
    assert endpoint.limits == {"engine": "12 waiting ≥ 5"}
    assert endpoint.view.health is EnvoyHealth.HEALTHY and endpoint.view.weight == 30
    assert seen(board, B).state is State.HEALTHY


def test_fast_probes_never_lift_a_limit_and_recovery_needs_the_usual_streak() -> None:
    board = healthy_board()
    board.set_limit("c", A, "engine", "12 waiting ≥ 5", now=5.0)
    t = probe(board, A, 6.0, times=5)
    assert t is not None and not t.changed
    assert seen(board, A).state is State.DEGRADED
    board.set_limit("c", A, "engine", None, now=12.0)
    assert seen(board, A).limits == {}
    probe(board, A, 13.0, times=2)
    assert seen(board, A).state is State.DEGRADED  # hysteresis: healthy_after is 3
    t = probe(board, A, 16.0)
    assert t is not None and t.changed and seen(board, A).state is State.HEALTHY


def test_a_limit_never_takes_an_endpoint_out_but_failures_still_do() -> None:
    board = healthy_board()
    board.set_limit("c", A, "engine", "kv cache 0.95 ≥ 0.8", now=5.0)
    t = probe(board, A, 6.0, Outcome.TIMEOUT, times=2)
    assert t is not None and t.to_state is State.UNHEALTHY and t.cause is Cause.TIMEOUT
    # Recovering from UNHEALTHY under the limit: DEGRADED, not HEALTHY.
    t = probe(board, A, 10.0, times=3)
    assert t is not None and t.to_state is State.DEGRADED and t.cause is Cause.SATURATED


def test_setting_the_same_limit_again_changes_nothing() -> None:
    board = healthy_board()
    board.set_limit("c", A, "engine", "12 waiting ≥ 5", now=5.0)
    revision = board.snapshot().revision
    t = board.set_limit("c", A, "engine", "12 waiting ≥ 5", now=6.0)
    assert not t.changed and board.snapshot().revision == revision


def test_a_signal_carries_its_cause_while_held() -> None:
    board = healthy_board()
    t = board.set_signal("c", A, "verify", "garbage output: '!!!'", 5.0, Cause.GARBAGE)
    assert t.changed and t.to_state is State.UNHEALTHY and t.alert
    assert t.cause is Cause.GARBAGE
    t = probe(board, A, 6.0)  # the plain probes are fast: still held, same cause
    assert t is not None and not t.changed and t.cause is Cause.GARBAGE
    endpoint = seen(board, A)
    assert endpoint.cause is Cause.GARBAGE and endpoint.signals == {
        "verify": "garbage output: '!!!'"
    }
    assert endpoint.view.health is EnvoyHealth.UNHEALTHY


def test_when_one_of_two_limits_lifts_the_reason_names_the_one_left() -> None:
    board = healthy_board()
    board.set_limit("c", A, "engine", "5 waiting ≥ 5", now=5.0)
    board.set_limit("c", A, "quality", "p95 TTFT 922 ms > 800 ms", now=6.0, cause=Cause.QUALITY)
    assert seen(board, A).cause is Cause.SATURATED
    board.set_limit("c", A, "engine", None, now=7.0)
    endpoint = seen(board, A)
    assert endpoint.state is State.DEGRADED and endpoint.cause is Cause.QUALITY
    assert endpoint.reason == "p95 TTFT 922 ms > 800 ms" and endpoint.since == 5.0
