"""The bounds on a stop (``app.stopping``): a step that hangs ends in an error naming it,
a step's own error is its own, and tasks that do not end on their cancel are named."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llm_health.app.stopping import StopTimeout, cancel_within, stop_within


async def test_a_hung_step_is_cancelled_and_named() -> None:
    hung = asyncio.get_running_loop().create_future()

    async def cleanup() -> None:
        await hung

    step = asyncio.ensure_future(cleanup())
    with pytest.raises(StopTimeout, match=r"^the HTTP server did not stop within 0\.05 s$"):
        await stop_within(0.05, "the HTTP server", step)
    assert step.cancelled()


async def test_a_step_that_ends_in_time_is_awaited() -> None:
    ended: list[str] = []

    async def cleanup() -> None:
        await asyncio.sleep(0)
        ended.append("closed")

    await stop_within(1.0, "the gRPC server", cleanup())
    assert ended == ["closed"]


async def test_a_timeout_of_the_step_itself_is_not_taken_for_the_bound() -> None:
    async def cleanup() -> None:
        raise TimeoutError("its own")

    with pytest.raises(TimeoutError, match="its own") as raised:
        await stop_within(1.0, "the probe workers", cleanup())
    assert not isinstance(raised.value, StopTimeout)


async def test_tasks_still_running_after_their_cancel_are_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # its clean-up waits on something that does not come

    async def polite() -> None:
        await asyncio.Event().wait()

    tasks = [
        asyncio.create_task(stubborn(), name="fleet-0"),
        asyncio.create_task(polite(), name="prober"),
    ]
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, "llm_health"):
        await cancel_within(tasks, 0.05)
    (record,) = caplog.records
    assert record.getMessage() == "tasks did not stop"
    assert record.__dict__["tasks"] == [
        "fleet-0 test_tasks_still_running_after_their_cancel_are_named.<locals>.stubborn"
    ]
    assert tasks[1].cancelled() and not tasks[0].done()
    release.set()
    await asyncio.wait(tasks)


async def test_tasks_that_end_on_their_cancel_say_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = [asyncio.create_task(asyncio.Event().wait()) for _ in range(3)]
    await asyncio.sleep(0)
    with caplog.at_level(logging.DEBUG, "llm_health"):
        await cancel_within(tasks, 1.0)
    assert all(t.cancelled() for t in tasks)
    assert not caplog.records
