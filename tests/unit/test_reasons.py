"""Reason classes: the bounded vocabulary behind metric labels."""

from __future__ import annotations

import pytest

from llm_health.model.outcome import Outcome
from llm_health.model.reasons import REASON_CLASSES, reason_class
from llm_health.model.states import State

S, H, D, U, DR = State.STARTING, State.HEALTHY, State.DEGRADED, State.UNHEALTHY, State.DRAINING
CASES = {
    "ready from starting": (S, H, "ready: 3 consecutive fast probes", Outcome.FAST, "startup"),
    "ready but slow": (S, D, "ready: first probe slow", Outcome.SLOW, "startup"),
    "grace ran out": (
        S,
        U,
        "never became ready within startup_grace (600s); last: error: refused",
        Outcome.ERROR,
        "startup_timeout",
    ),
    "failed since plugin start": (
        S,
        U,
        "2 consecutive timeouts (>800 ms) since the plugin started",
        Outcome.TIMEOUT,
        "timeout",
    ),
    "one slow probe": (H, D, "slow first token: 450 ms", Outcome.SLOW, "slow"),
    "overloaded": (H, D, "overloaded: 429", Outcome.OVERLOADED, "overloaded"),
    "single timeout": (H, D, "timeout: no first token", Outcome.TIMEOUT, "timeout"),
    "two timeouts": (D, U, "2 consecutive timeouts (>800 ms)", Outcome.TIMEOUT, "timeout"),
    "errors": (H, U, "2 consecutive errors", Outcome.ERROR, "error"),
    "fatal": (H, U, "fatal engine error: CUDA error", Outcome.FATAL, "fatal"),
    "fatal while starting": (S, U, "fatal engine error: Xid 79", Outcome.FATAL, "fatal"),
    "recovered to healthy": (
        D,
        H,
        "recovered: 3 consecutive fast probes",
        Outcome.FAST,
        "recovered",
    ),
    "recovered to degraded": (
        U,
        D,
        "recovered: 3 consecutive successes",
        Outcome.SLOW,
        "recovered",
    ),
    "operator drain": (H, DR, "kernel upgrade", None, "drained"),
    "reload removal": (H, DR, "removed from config", None, "removed"),
    "undrain": (DR, S, "undrained; awaiting healthy probes", None, "undrained"),
    "hds signal": (H, U, "unreachable from gw-2", None, "signal"),
    "no probe, not down": (U, H, "something else", None, "other"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reason_class(case: str) -> None:
    before, after, reason, outcome, expected = CASES[case]
    assert reason_class(before, after, reason, outcome) == expected


def test_every_class_is_in_the_vocabulary_and_reachable() -> None:
    produced = {expected for *_, expected in CASES.values()}
    assert produced <= set(REASON_CLASSES)
    assert set(REASON_CLASSES) - produced == set()


def test_free_text_never_becomes_a_class() -> None:
    weird = "timeout: token sk-live-123 leaked {salt=abc}"
    assert reason_class(H, D, weird, Outcome.TIMEOUT) in REASON_CLASSES
    assert reason_class(H, D, weird, Outcome.TIMEOUT) == "timeout"
