"""When a silent probe gets its overlapping confirmation (app.keeper.fold_silence)."""

from __future__ import annotations

import logging

import pytest

from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import ProberStats
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.probe.lag import LoopLagMonitor

A = "10.0.0.1:80"


def keeper(outcome: Outcome) -> BoardKeeper:
    board = Board([ClusterSpec("c", Policy(), (EndpointSpec(A, "10.0.0.1", 80),))], 0.0, 0.0)
    board.record("c", A, ProbeResult(outcome, 0.0, ttft_ms=10.0), 1.0)
    return BoardKeeper(board, lambda: 2.0, ProberStats(LoopLagMonitor()))


async def test_a_healthy_endpoint_is_silenced_and_confirmed() -> None:
    keep = keeper(Outcome.FAST)
    assert await keep.fold_silence("c", A, 210.0)
    assert keep.board.health("c", A).state is State.DEGRADED


async def test_an_endpoint_held_degraded_by_a_limit_with_fast_probes_is_confirmed_too() -> None:
    keep = keeper(Outcome.FAST)
    keep.board.set_limit("c", A, "engine", "12 waiting ≥ 5", 1.5)
    assert keep.board.health("c", A).state is State.DEGRADED
    assert await keep.fold_silence("c", A, 210.0)  # no state change, but the overlap


async def test_a_slow_endpoint_falling_silent_gets_no_extra_probe() -> None:
    keep = keeper(Outcome.SLOW)
    assert keep.board.health("c", A).state is State.DEGRADED
    assert not await keep.fold_silence("c", A, 210.0)


async def test_ignored_probes_are_logged_at_most_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An overloaded prober ignores every probe: one line per IGNORED_LOG_EVERY_S, saying
    how many it left out; the counter has every one."""
    from llm_health.app.keeper import IGNORED_LOG_EVERY_S

    now = [2.0]
    board = Board([ClusterSpec("c", Policy(), (EndpointSpec(A, "10.0.0.1", 80),))], 0.0, 0.0)
    keep = BoardKeeper(board, lambda: now[0], ProberStats(LoopLagMonitor()))
    lagged = ProbeResult(Outcome.TIMEOUT, 0.0, loop_lag_ms=5_000.0)
    caplog.set_level(logging.WARNING, logger="llm_health")
    for _ in range(50):
        await keep.fold_probe("c", A, lagged)
        now[0] += 0.01
    now[0] += IGNORED_LOG_EVERY_S
    await keep.fold_probe("c", A, lagged)
    lines = [r for r in caplog.records if "probe ignored" in r.getMessage()]
    assert len(lines) == 2
    assert [r.__dict__["also_ignored_since_last_line"] for r in lines] == [0, 49]
    assert keep.stats.probes_ignored_loop_lag == 51
    assert board.health("c", A).state is State.STARTING  # and no verdict from any of them
