"""The runtime's stop is bounded (docs/design.md §7.9, ``app.stopping``): a step that
hangs ends the stop with an error naming it, not a stop that never returns."""

from __future__ import annotations

import asyncio

import pytest

import llm_health.app.runtime as runtime_module
from llm_health.ops.http_server import _GuardedRunner
from tests.polling import wait_until_async
from tests.ports import free_port
from tests.runtime import Running, runtime_for


async def test_an_http_server_that_does_not_stop_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cleanup = _GuardedRunner.cleanup

    async def cleanup_then_hang(runner: _GuardedRunner) -> None:
        await cleanup(runner)  # its sockets closed: nothing leaks
        await asyncio.Event().wait()  # as a handler aiohttp waits for that never ends

    monkeypatch.setattr(_GuardedRunner, "cleanup", cleanup_then_hang)
    monkeypatch.setattr(runtime_module, "HTTP_STOP_S", 0.2)
    running = Running(runtime_for([f"127.0.0.1:{free_port()}"], "stop.yaml"))
    with pytest.raises(TimeoutError, match=r"^the HTTP server did not stop within 0\.2 s$"):
        async with running:
            await wait_until_async(lambda: running.runtime.http_port, 10, "the HTTP server up")
