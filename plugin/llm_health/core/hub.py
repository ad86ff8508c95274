"""SnapshotHub: where the owner publishes HealthSnapshots and readers wait for newer ones.

One ``asyncio.Condition`` wakes every watcher on publish (the grpc_health ``_async`` shape):
watchers never poll, and a slow watcher simply sees the latest snapshot when it wakes
(intermediate ones are skipped, by design: xDS is state-of-the-world per resource).
Must be used from one event loop.
"""

from __future__ import annotations

import asyncio

from llm_health.model.board import HealthSnapshot


class SnapshotHub:
    def __init__(self, initial: HealthSnapshot) -> None:
        self._current = initial
        self._changed = asyncio.Condition()

    def current(self) -> HealthSnapshot:
        """The latest snapshot; never blocks."""
        return self._current

    async def publish(self, snapshot: HealthSnapshot) -> None:
        """Replace the current snapshot (if newer) and wake every watcher."""
        if snapshot.revision == self._current.revision and snapshot is self._current:
            return
        async with self._changed:
            self._current = snapshot
            self._changed.notify_all()

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        """Return the first snapshot whose revision differs from ``revision``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._current.revision != revision)
            return self._current
