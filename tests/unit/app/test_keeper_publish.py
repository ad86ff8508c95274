"""A folded result's publish (``app.keeper.BoardKeeper.fold_result``): what changes in a
loop turn is published once, in the next turn, without a task; probe-now's
``fold_probe`` has published before it returns."""

from __future__ import annotations

import asyncio

from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import ProberStats
from llm_health.model.board import Board, ClusterSpec, EndpointSpec, HealthSnapshot
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.probe.lag import LoopLagMonitor

ADDRESSES = [f"10.0.0.{i}:80" for i in range(1, 4)]
FAST = ProbeResult(Outcome.FAST, 0.0, ttft_ms=10.0)


def counted() -> tuple[BoardKeeper, list[HealthSnapshot]]:
    specs = tuple(EndpointSpec(a, a.split(":")[0], 80) for a in ADDRESSES)
    board = Board([ClusterSpec("c", Policy(healthy_after=1), specs)], 0.0, 0.0)
    keeper = BoardKeeper(board, lambda: 1.0, ProberStats(LoopLagMonitor()))
    published: list[HealthSnapshot] = []
    put = keeper.hub.put
    keeper.hub.put = lambda snapshot: (published.append(snapshot), put(snapshot))[1]  # type: ignore[method-assign]
    return keeper, published


async def test_every_change_of_a_turn_is_published_once_in_the_next() -> None:
    keeper, published = counted()
    tasks = len(asyncio.all_tasks())
    for address in ADDRESSES:
        assert keeper.fold_result("c", address, FAST) is None
        assert keeper.board.health("c", address).state is State.HEALTHY  # folded at once
    assert published == [] and len(asyncio.all_tasks()) == tasks  # no task for it
    await asyncio.sleep(0)
    assert len(published) == 1
    assert published[0] is keeper.published() is keeper.snapshot()
    keeper.fold_result("c", ADDRESSES[0], FAST)  # no change: nothing to publish
    await asyncio.sleep(0)
    assert len(published) == 1


async def test_probe_now_has_published_what_it_changed_when_it_returns() -> None:
    keeper, published = counted()
    await keeper.fold_probe("c", ADDRESSES[0], FAST)
    assert len(published) == 1 and published[0] is keeper.snapshot()
    await asyncio.sleep(0)
    assert len(published) == 1  # the turn's publish found it done
