"""The plugin's real runtime, running in a task of the test's own event loop.

``async with Running.from_config(text) as running:`` builds the runtime from a config
text (as ``llm-health serve`` would from a file), starts it, and at the end of the block
stops it and waits for it to finish (so no task, server or probe outlives the test).
"""

from __future__ import annotations

import asyncio
from typing import Self

from llm_health.app.assemble import build_runtime
from llm_health.app.runtime import Runtime
from llm_health.config import parse_config

STOP_WITHIN_S = 15.0


class Running:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.stop = runtime, asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, text: str, source: str = "test.yaml") -> Running:
        return cls(build_runtime(parse_config(text, source, {})))

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.runtime.run(self.stop))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, STOP_WITHIN_S)
