"""Remediation hooks run for real (docs/design.md §13): real child processes started by
the component over a real board, on a clock the test moves."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import Notice, ProberStats
from llm_health.core.settings import MERGING
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.probe.lag import LoopLagMonitor
from llm_health.remediation.component import MAX_OUTPUT, RemediationComponent
from llm_health.remediation.settings import LimitsConfig, RemediationConfig

ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
WALL = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL + self.now


def rule(for_s: float, run: tuple[str, ...], **more: object) -> RemediationConfig:
    when = {"state": "unhealthy", "for": for_s}
    return RemediationConfig.model_validate({"when": when, "run": run, **more}, context=MERGING)


def limits(**values: object) -> LimitsConfig:
    return LimitsConfig.model_validate(values, context=MERGING)


def build(
    hook: RemediationConfig, bounds: LimitsConfig, clock: Clock
) -> tuple[Board, RemediationComponent, list[Notice]]:
    specs = tuple(EndpointSpec(a, a.split(":")[0], 8000) for a in ADDRESSES)
    policy = Policy(startup_grace_s=5.0, max_ejection_percent=50)
    board = Board([ClusterSpec("c", policy, specs)], 0.0, WALL)
    keeper = BoardKeeper(board, clock, ProberStats(LoopLagMonitor()))
    notices: list[Notice] = []
    keeper.on_notice(notices.append)
    component = RemediationComponent(
        (hook,),
        bounds,
        keeper,
        clock=clock,
        wall_clock=clock.wall,
    )
    return board, component, notices


def down(board: Board, address: str, at: float) -> None:
    board.set_signal("c", address, "test", "engine dead", at)
    assert board.health("c", address).state is State.UNHEALTHY


def writer(path: Path) -> tuple[str, ...]:
    code = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + ' ' + sys.argv[3] + '\\n')"
    return (sys.executable, "-c", code, str(path), "{address}", "{cause}")


async def settle(component: RemediationComponent) -> None:
    for _ in range(500):
        if not component.ledger.running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("a hook is still running")


async def test_fires_once_past_for_never_in_grace_never_for_starting(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    clock = Clock()
    hook = rule(2.0, writer(log), timeout=10.0)
    board, component, notices = build(hook, limits(cooldown=600.0), clock)
    clock.now = 1.0
    down(board, ADDRESSES[0], 1.0)
    clock.now = 4.0  # unhealthy for 3 s, but within startup_grace (5 s from first sight)
    assert component.tick(board.snapshot()) == []
    clock.now = 6.0
    assert len(component.tick(board.snapshot())) == 1
    await settle(component)
    for later in (7.0, 60.0, 600.0):  # within the cooldown: never again
        clock.now = later
        assert component.tick(board.snapshot()) == []
    assert log.read_text() == f"{ADDRESSES[0]} signal\n"  # the other three are STARTING
    (entry,) = component.status()["recent"]
    assert entry["outcome"] == "ok" and entry["exit"] == 0 and entry["endpoint"] == ADDRESSES[0]
    assert [n.kind for n in notices] == ["remediation"] and "ok" in notices[0].reason
    clock.now = 610.0  # the cooldown is over: again
    assert len(component.tick(board.snapshot())) == 1
    await settle(component)
    assert log.read_text().count(ADDRESSES[0]) == 2


async def test_never_more_than_the_limit_at_once(tmp_path: Path) -> None:
    clock = Clock()
    slow = (sys.executable, "-c", "import time; time.sleep(0.5)")
    board, component, _ = build(rule(1.0, slow), limits(max_concurrent_per_cluster=4), clock)
    for address in ADDRESSES:
        down(board, address, 0.0)
    clock.now = 10.0
    started = component.tick(board.snapshot())
    # max_concurrent 4, but max_ejection_percent 50 % of 4 endpoints: 2 at once.
    assert len(started) == 2
    clock.now = 10.5
    assert component.tick(board.snapshot()) == []  # still running
    await settle(component)
    clock.now = 11.0
    assert len(component.tick(board.snapshot())) == 2  # the other two, once the first are done
    await settle(component)
    assert component.counters.runs_total == 4 and component.counters.refused_total >= 2


async def test_a_hanging_hook_is_killed_and_output_is_bounded(tmp_path: Path) -> None:
    clock = Clock()
    hang = (
        sys.executable,
        "-c",
        "import sys, time; sys.stdout.write('x' * 1_000_000); sys.stdout.flush(); time.sleep(60)",
    )
    board, component, notices = build(rule(1.0, hang, timeout=0.5), limits(), clock)
    down(board, ADDRESSES[1], 0.0)
    clock.now = 10.0
    started = time.monotonic()
    assert len(component.tick(board.snapshot())) == 1
    await settle(component)
    assert time.monotonic() - started < 5
    (entry,) = component.status()["recent"]
    assert entry["outcome"] == "killed after 0.5 s"
    assert component.counters.killed_total == 1
    assert "killed" in notices[0].reason

    talk = (sys.executable, "-c", "print('y' * 1_000_000)")
    board, component, _ = build(rule(1.0, talk), limits(), clock)
    down(board, ADDRESSES[1], 0.0)
    component.tick(board.snapshot())
    await settle(component)
    (entry,) = component.status()["recent"]
    assert entry["outcome"] == "ok" and 0 < len(entry["output"]) <= MAX_OUTPUT


async def test_dry_run_only_logs(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    clock = Clock()
    board, component, notices = build(rule(1.0, writer(log)), limits(dry_run=True), clock)
    down(board, ADDRESSES[2], 0.0)
    clock.now = 10.0
    assert len(component.tick(board.snapshot())) == 1
    await settle(component)
    assert not log.exists()
    (entry,) = component.status()["recent"]
    assert entry["outcome"] == "dry run: not run"
    assert component.counters.dry_runs_total == 1 and component.counters.runs_total == 0
    assert "dry run" in notices[0].reason
