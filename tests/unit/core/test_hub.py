"""The snapshot hub (``core.hub``): a publish wakes every watcher waiting for a newer
revision, a watcher that gives up does not take the wake-up from the others, and ``put``
publishes from a plain callback (the keeper's once-a-turn publish)."""

from __future__ import annotations

import asyncio

from llm_health.core.hub import SnapshotHub
from llm_health.model.board import HealthSnapshot


def snapshots(count: int) -> list[HealthSnapshot]:
    return [HealthSnapshot(revision, {}) for revision in range(1, count + 1)]


async def test_a_put_from_a_callback_wakes_every_watcher_but_the_one_that_gave_up() -> None:
    first, second = snapshots(2)
    hub = SnapshotHub(first)
    waiting = [asyncio.create_task(hub.wait_newer(first.revision)) for _ in range(3)]
    await asyncio.sleep(0)
    waiting[0].cancel()  # gave up (a stream that ended, a wait_for that timed out)
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_soon(hub.put, second)
    got = await asyncio.wait_for(asyncio.gather(*waiting[1:]), 2)
    assert got == [second, second] and waiting[0].cancelled()
    assert await hub.wait_newer(first.revision) is second  # already newer: no wait


async def test_a_slow_watcher_sees_the_latest_and_the_same_snapshot_wakes_nobody() -> None:
    first, second, third = snapshots(3)
    hub = SnapshotHub(first)
    watcher = asyncio.create_task(hub.wait_newer(first.revision))
    hub.put(second)
    hub.put(third)  # before the watcher ran again
    assert await asyncio.wait_for(watcher, 2) is third
    again = asyncio.create_task(hub.wait_newer(third.revision))
    hub.put(third)
    await asyncio.sleep(0.05)
    assert not again.done()
    again.cancel()
