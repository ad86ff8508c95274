"""Causes: the bounded vocabulary behind metric labels, set by the machine and the board
where they write the reason (never read back from the text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.machine import (
    Transition,
    cap,
    drain,
    force_unhealthy,
    initial_health,
    silence,
    step,
    undrain,
)
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

POLICY = Policy(startup_grace_s=600.0, healthy_after=3, unhealthy_after=2)
T0 = 1000.0
CODES = {
    "F": Outcome.FAST,
    "S": Outcome.SLOW,
    "O": Outcome.OVERLOADED,
    "T": Outcome.TIMEOUT,
    "E": Outcome.ERROR,
    "X": Outcome.FATAL,
}


def result(code: str) -> ProbeResult:
    ttft = {"F": 40.0, "S": 450.0}.get(code)
    return ProbeResult(CODES[code], started_at=0.0, ttft_ms=ttft, detail="engine said no")


def feed(health: EndpointHealth, codes: str, start: float = T0) -> Transition:
    """Run ``codes`` through the machine one second apart; the last transition."""
    transition = None
    for i, code in enumerate(codes):
        transition = step(health, result(code), start + i, POLICY)
        health = transition.after
    assert transition is not None
    return transition


def routed(state: State, codes: str) -> Transition:
    """From an endpoint that reached ``state`` the way the machine gets there."""
    ready = feed(initial_health(T0, POLICY, known_at_boot=True), "F").after
    assert ready.state is State.HEALTHY
    if state is State.DEGRADED:
        ready = feed(ready, "S").after
    if state is State.UNHEALTHY:
        ready = feed(ready, "TT").after
    assert ready.state is state
    return feed(ready, codes, T0 + 100)


def removed_by_reload() -> Transition:
    endpoint = EndpointSpec("127.0.0.1:8000", "127.0.0.1", 8000)
    board = Board([ClusterSpec("c", POLICY, (endpoint,))], T0, 0.0)
    (change,) = board.apply_specs([ClusterSpec("c", POLICY, ())], T0 + 1)
    assert change.transition is not None
    return change.transition


def added_by_discovery() -> Transition:
    known = EndpointSpec("127.0.0.1:8000", "127.0.0.1", 8000)
    endpoint = EndpointSpec("127.0.0.2:8000", "127.0.0.2", 8000)
    board = Board([ClusterSpec("c", POLICY, (known,))], T0, 0.0)
    board.mark_warm()  # past the first round: a new address is a new backend
    specs = [ClusterSpec("c", POLICY, (known, endpoint))]
    (change,) = board.apply_specs(specs, T0 + 1, source="DNS")
    assert change.transition is not None and not change.transition.changed
    assert change.transition.after.reason == "new endpoint (from DNS)"
    return change.transition


CASES: dict[str, tuple[Callable[[], Transition], State, State, str]] = {
    "ready from starting": (lambda: feed(initial_health(T0, POLICY), "FFF"), "st", "h", "startup"),
    "ready but slow": (
        lambda: feed(initial_health(T0, POLICY, known_at_boot=True), "S"),
        "st",
        "d",
        "startup",
    ),
    "grace ran out": (
        lambda: feed(initial_health(T0, POLICY), "E", T0 + 700),
        "st",
        "u",
        "startup_timeout",
    ),
    "failed since plugin start": (
        lambda: feed(initial_health(T0, POLICY, known_at_boot=True), "TT"),
        "st",
        "u",
        "timeout",
    ),
    "one slow probe": (lambda: routed(State.HEALTHY, "S"), "h", "d", "slow"),
    "overloaded": (lambda: routed(State.HEALTHY, "O"), "h", "d", "overloaded"),
    "single timeout": (lambda: routed(State.HEALTHY, "T"), "h", "d", "timeout"),
    "two timeouts": (lambda: routed(State.DEGRADED, "TT"), "d", "u", "timeout"),
    "errors": (lambda: routed(State.HEALTHY, "E"), "h", "d", "error"),
    "fatal": (lambda: routed(State.HEALTHY, "X"), "h", "u", "fatal"),
    "fatal while starting": (lambda: feed(initial_health(T0, POLICY), "X"), "st", "u", "fatal"),
    "recovered to healthy": (lambda: routed(State.DEGRADED, "FFF"), "d", "h", "recovered"),
    "recovered to degraded": (lambda: routed(State.UNHEALTHY, "SSS"), "u", "d", "recovered"),
    "operator drain": (
        lambda: drain(routed(State.HEALTHY, "F").after, T0 + 200, "kernel upgrade"),
        "h",
        "dr",
        "drained",
    ),
    "reload removal": (removed_by_reload, "st", "dr", "removed"),
    "found in DNS": (added_by_discovery, "st", "st", "added"),
    "undrain": (
        lambda: undrain(drain(initial_health(T0, POLICY), T0, "x").after, T0 + 1, POLICY),
        "dr",
        "st",
        "undrained",
    ),
    "hds signal": (
        lambda: force_unhealthy(routed(State.HEALTHY, "F").after, T0 + 200, "unreachable"),
        "h",
        "u",
        "signal",
    ),
    "garbage output": (
        lambda: force_unhealthy(
            routed(State.HEALTHY, "F").after, T0 + 200, "garbage output: '!!!'", Cause.GARBAGE
        ),
        "h",
        "u",
        "garbage_output",
    ),
    "wrong answer": (
        lambda: force_unhealthy(
            routed(State.DEGRADED, "S").after, T0 + 200, "wrong answer", Cause.WRONG_ANSWER
        ),
        "d",
        "u",
        "wrong_answer",
    ),
    "wrong model": (
        lambda: force_unhealthy(
            routed(State.HEALTHY, "F").after, T0 + 200, "serves x, expected y", Cause.WRONG_MODEL
        ),
        "h",
        "u",
        "wrong_model",
    ),
    "saturated engine": (
        lambda: cap(routed(State.HEALTHY, "F").after, T0 + 200, "12 waiting ≥ 5", Cause.SATURATED),
        "h",
        "d",
        "saturated",
    ),
    "poor real traffic": (
        lambda: cap(
            routed(State.HEALTHY, "F").after,
            T0 + 200,
            "error rate 3.1 % over 60 s (412 requests)",
            Cause.QUALITY,
        ),
        "h",
        "d",
        "quality",
    ),
    "a probe that changes nothing": (lambda: routed(State.HEALTHY, "F"), "h", "h", "other"),
    "silent in flight": (
        lambda: silence(routed(State.HEALTHY, "F").after, T0 + 200, 200.0),
        "h",
        "d",
        "silent",
    ),
}
STATES = {
    "st": State.STARTING,
    "h": State.HEALTHY,
    "d": State.DEGRADED,
    "u": State.UNHEALTHY,
    "dr": State.DRAINING,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cause_of_each_transition(case: str) -> None:
    make, from_state, to_state, expected = CASES[case]
    transition = make()
    assert transition.from_state is STATES[from_state]  # type: ignore[index]
    assert transition.to_state is STATES[to_state]  # type: ignore[index]
    assert transition.cause.value == expected


def test_every_cause_is_reachable() -> None:
    """Every cause but OVERRIDE labels a transition; OVERRIDE labels a forced state."""
    produced = {expected for *_, expected in CASES.values()}
    assert produced == {cause.value for cause in Cause} - {Cause.OVERRIDE.value}


def test_an_override_shows_as_its_own_cause_and_clears() -> None:
    endpoint = EndpointSpec("127.0.0.1:8000", "127.0.0.1", 8000)
    board = Board([ClusterSpec("c", POLICY, (endpoint,))], T0, 0.0)
    board.record("c", endpoint.address, result("F"), T0)
    board.set_override("c", endpoint.address, State.UNHEALTHY, T0 + 60, "maintenance")
    (forced,) = board.snapshot().clusters["c"].endpoints
    assert forced.cause is Cause.OVERRIDE
    board.clear_override("c", endpoint.address)
    (plain,) = board.snapshot().clusters["c"].endpoints
    assert plain.cause is Cause.STARTUP


def test_rewording_a_reason_never_changes_the_cause() -> None:
    transition = routed(State.HEALTHY, "T")
    reworded = replace(transition, after=replace(transition.after, reason="startup_grace fatal"))
    assert reworded.cause is transition.cause is Cause.TIMEOUT


def test_a_held_ejection_keeps_the_probe_cause() -> None:
    """max_ejection_percent holds the endpoint DEGRADED: still a timeout, not 'other'."""
    policy = replace(POLICY, max_ejection_percent=1)
    specs = [EndpointSpec(f"127.0.0.{i}:80", f"127.0.0.{i}", 80) for i in (1, 2, 3)]
    board = Board([ClusterSpec("c", policy, tuple(specs))], T0, 0.0)
    for spec in specs:
        board.record("c", spec.address, result("F"), T0)
    for now in (T0 + 1, T0 + 2):
        board.record("c", specs[0].address, result("T"), now)
    board.record("c", specs[1].address, result("T"), T0 + 3)
    held = board.record("c", specs[1].address, result("T"), T0 + 4)
    assert board.health("c", specs[0].address).state is State.UNHEALTHY
    assert held.to_state is State.DEGRADED and "held" in held.after.reason
    assert held.cause is Cause.TIMEOUT
