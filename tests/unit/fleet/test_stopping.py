"""The fleet's tasks end when cancelled, even when a Redis call swallowed the
cancellation: on Python 3.11, ``asyncio.wait_for`` (which redis-py uses for every socket
write) returns the result of a write that completes as the cancellation arrives and drops
the CancelledError, leaving the request counted (``Task.cancelling()``). A loop that goes
on then never ends: a runtime that cannot stop, a test that hangs at teardown."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from llm_health.config import parse_config
from llm_health.fleet.component import FleetComponent
from llm_health.fleet.wire import Member, Membership
from llm_health.model.board import Board
from tests.fakes import FakeControl

CONFIG = """
fleet: {redis: "redis://127.0.0.1:9/0", name: it, member_id: me, heartbeat: 100ms, member_ttl: 300ms}
clusters:
  - name: c
    endpoints: [{address: "127.0.0.1:9001"}]
"""


async def swallowing(result: Any) -> Any:
    """A Redis call answered as a cancellation arrives: the answer wins, as in 3.11's
    ``asyncio.wait_for``; the cancellation request stays counted."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.02)
    return result


class SwallowingStore:
    """Every call swallows a cancellation that arrives during it."""

    def __init__(self) -> None:
        self.commands = 0
        self.calls = 0

    async def join(self) -> int:
        return await swallowing(7)

    async def heartbeat(self, epoch: int, vouch: bool = True) -> Membership:
        self.calls += 1
        return await swallowing(Membership(0, {"me": Member(epoch, 0)}))

    def heartbeat_blocking(self, epoch: int, vouch: bool) -> Membership:
        """The heartbeat's thread (``fleet.pulse``): nothing of the loop to swallow."""
        self.calls += 1
        return Membership(0, {"me": Member(epoch, 0)})

    async def verdicts(self) -> dict[str, bytes]:
        return await swallowing({})

    async def stored(self, keys: Any) -> dict[str, bytes]:
        return await swallowing({})

    async def overrides(self) -> dict[str, bytes]:
        return await swallowing({})

    async def publish(self, epoch: int, items: Any) -> list[str]:
        return await swallowing(["ok" for _ in items])

    async def events(self) -> Any:
        await swallowing(None)  # the subscription
        while True:
            await asyncio.sleep(0.05)  # waiting for a message: cancellable
            yield b"m\nsomeone"

    async def leave(self, epoch: int) -> None:
        await swallowing(None)

    async def close(self) -> None:
        pass


class Routing:
    def on_targets(self, follow: Any) -> None:
        self.follow = follow

    def refilter(self) -> None:
        pass


async def test_every_task_ends_when_cancelled_although_redis_swallowed_it() -> None:
    config = parse_config(CONFIG, "t.yaml", {})
    assert config.fleet is not None
    control = FakeControl(Board(config.cluster_specs(), 0.0, 0.0))
    store = SwallowingStore()
    fleet = FleetComponent(config.fleet, "me", control, Routing(), store=store)  # type: ignore[arg-type]
    await fleet.prepare()
    assert fleet.mode == "sharing"
    tasks = [asyncio.create_task(job()) for job in fleet.tasks()]
    for _ in range(20):  # cancel each task in the middle of a Redis call
        await asyncio.sleep(0.013)
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=3.0)
    stuck = [t.get_coro().__qualname__ for t in pending]  # type: ignore[union-attr]
    for _ in range(100):  # do not leave them running past the test
        if all(t.done() for t in tasks):
            break
        for task in tasks:
            task.cancel()
        await asyncio.sleep(0.01)
    assert not stuck, f"still running 3 s after cancel: {stuck}"
