"""The plugin's real runtime, running in a task of the test's own event loop.

``async with Running.from_config(text) as running:`` builds the runtime from a config
text (as ``llm-health serve`` would from a file), starts it, and at the end of the block
stops it and waits for it to finish (so no task, server or probe outlives the test).
``Running(runtime)`` runs a runtime the test built itself (e.g. to hook its callbacks in
before it starts). Config texts usually come from :func:`tests.configs.plugin_yaml`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Self

from llm_health.app.assemble import build_runtime
from llm_health.app.runtime import Runtime
from llm_health.config import parse_config
from tests.configs import Endpoints, plugin_yaml
from tests.hangs import task_stacks
from tests.polling import wait_until_async

STOP_WITHIN_S = 15.0
CANCEL_WITHIN_S = 5.0
READY_WITHIN_S = 30.0


def runtime_from(
    text: str, source: str = "test.yaml", environ: Mapping[str, str] | None = None
) -> Runtime:
    """The runtime ``llm-health serve`` would build from a file with ``text`` (``environ``
    for its ``${VAR}`` references), not started."""
    return build_runtime(parse_config(text, source, environ or {}))


def runtime_for(endpoints: Endpoints, source: str = "test.yaml", **settings: Any) -> Runtime:
    """The runtime of a ``plugin_yaml(endpoints, **settings)`` file named ``source``, not
    started (each test module keeps its own settings; this builds them one way)."""
    return runtime_from(plugin_yaml(endpoints, **settings), source)


class Running:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.stop = runtime, asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(
        cls, text: str, source: str = "test.yaml", environ: Mapping[str, str] | None = None
    ) -> Running:
        return cls(runtime_from(text, source, environ))

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.runtime.run(self.stop))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        """Stop and wait; a runtime that does not end within STOP_WITHIN_S is cancelled
        and the test fails with every task's stack, never waits on without bound (a
        cancellation the runtime does not finish would hang ``asyncio.wait_for``). The
        runtime's own bounds (``app.stopping``, together below STOP_WITHIN_S) come first:
        its error names the server or the tasks that did not stop."""
        self.stop.set()
        assert self.task is not None
        done, _ = await asyncio.wait({self.task}, timeout=STOP_WITHIN_S)
        if done:
            self.task.result()
            return
        stacks = task_stacks(asyncio.get_running_loop())
        self.task.cancel()
        await asyncio.wait({self.task}, timeout=CANCEL_WITHIN_S)
        raise AssertionError(f"the runtime did not stop within {STOP_WITHIN_S} s:\n{stacks}")

    async def ready(self, within: float = READY_WITHIN_S) -> Self:
        """Wait until the runtime reports no readiness problem (what /readyz answers)."""
        await wait_until_async(
            lambda: not self.runtime.ready_problems(), within, "the runtime to be ready"
        )
        return self
