"""SnapshotHub: where the owner publishes HealthSnapshots and readers wait for newer ones.

A publish replaces the current snapshot and resolves one future every watcher waits on
(shielded: a watcher that gives up does not cancel it for the others): watchers never
poll, and a slow watcher simply sees the latest snapshot when it wakes (intermediate ones
are skipped, by design: xDS is state-of-the-world per resource). ``put`` publishes
without waiting, so the board's owner can publish from a callback (a first round's
thousands of state changes publish once a loop turn, without a task each).
Must be used from one event loop.
"""

from __future__ import annotations

import asyncio

from llm_health.model.board import HealthSnapshot


class SnapshotHub:
    def __init__(self, initial: HealthSnapshot) -> None:
        self._current = initial
        self._newer: asyncio.Future[None] | None = None  # resolved by the next publish

    def current(self) -> HealthSnapshot:
        """The latest snapshot; never blocks."""
        return self._current

    def put(self, snapshot: HealthSnapshot) -> None:
        """Replace the current snapshot (unless it is the same) and wake every watcher."""
        if snapshot is self._current:
            return
        self._current = snapshot
        newer, self._newer = self._newer, None
        if newer is not None and not newer.done():
            newer.set_result(None)

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        """Return the first snapshot whose revision differs from ``revision``."""
        while self._current.revision == revision:
            if self._newer is None:
                self._newer = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._newer)
        return self._current
