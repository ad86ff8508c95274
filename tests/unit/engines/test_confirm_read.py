"""The confirming read (docs/design.md §3.5, ``engines.confirm_read``): a timeout of an
endpoint whose /metrics is read is told after one more read, taken then; anything else at
once; bounded by CONFIRM_WITHIN_S; nothing once cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from llm_health.engines import confirm_read
from llm_health.engines.confirm_read import confirming
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started
from llm_health.probe.target import ProbeTarget

TARGET = ProbeTarget(
    cluster="llama",
    address="127.0.0.1:9000",
    url="http://127.0.0.1:9000/v1/completions",
    api="openai-completions",
    model=None,
    prompt="hi",
    cache_bust="salt",
    timeout_s=0.8,
    healthy_ttft_s=0.2,
    interval_s=1.0,
    confirm_delay_s=0.05,
    unhealthy_after=2,
    fatal_patterns=None,
)


class Told:
    """A receiver that keeps what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def set(self) -> None:
        self.events.append("token")

    def done(self, result: ProbeResult) -> None:
        self.events.append(f"done {result.outcome.value}")

    def failed(self, error: Exception) -> None:
        self.events.append(f"failed {error}")


class Probe:
    """A started probe whose result the test gives (``finish``)."""

    def __init__(self) -> None:
        self.receiver: ProbeReceiver | None = None
        self.cancelled = False

    def start(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        self.receiver = receiver
        return self

    def cancel(self) -> None:
        self.cancelled = True

    def finish(self, outcome: Outcome) -> None:
        assert self.receiver is not None
        self.receiver.done(ProbeResult(outcome, started_at=0.0, total_ms=800.0))


class Reads:
    """``read_now``: records each read asked for; ``over`` ends the last one."""

    def __init__(self, can_start: bool = True) -> None:
        self.can_start = can_start
        self.asked: list[str] = []
        self.then: Callable[[], None] | None = None

    def read_now(self, target: ProbeTarget, then: Callable[[], None]) -> bool:
        self.asked.append(target.address)
        if self.can_start:
            self.then = then
        return self.can_start

    def over(self) -> None:
        assert self.then is not None
        self.then()


def started(reads: Reads, metrics_read: bool = True) -> tuple[Probe, Told, Started]:
    probe, told = Probe(), Told()
    start = confirming(probe.start, reads.read_now, lambda target: metrics_read)
    return probe, told, start(TARGET, told)


async def test_a_timeout_is_told_after_the_read_it_asked_for() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    probe.finish(Outcome.TIMEOUT)
    assert reads.asked == [TARGET.address]
    assert told.events == []
    reads.over()
    assert told.events == ["done timeout"]
    reads.over()  # told once
    assert told.events == ["done timeout"]


@pytest.mark.parametrize("outcome", [Outcome.FAST, Outcome.SLOW, Outcome.ERROR, Outcome.FATAL])
async def test_anything_else_is_told_at_once_without_a_read(outcome: Outcome) -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    probe.finish(outcome)
    assert told.events == [f"done {outcome.value}"]
    assert reads.asked == []


async def test_no_read_when_the_endpoint_has_no_metrics_read() -> None:
    reads = Reads()
    probe, told, handle = started(reads, metrics_read=False)
    assert handle is probe  # the probe as it was: nothing in between
    probe.finish(Outcome.TIMEOUT)
    assert told.events == ["done timeout"] and reads.asked == []


async def test_told_at_once_when_no_read_can_start() -> None:
    reads = Reads(can_start=False)
    probe, told, _ = started(reads)
    probe.finish(Outcome.TIMEOUT)
    assert told.events == ["done timeout"]


async def test_a_read_that_takes_too_long_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confirm_read, "CONFIRM_WITHIN_S", 0.05)
    reads = Reads()
    probe, told, _ = started(reads)
    probe.finish(Outcome.TIMEOUT)
    await asyncio.sleep(0.2)
    assert told.events == ["done timeout"]
    reads.over()  # the read ends later: nothing more
    assert told.events == ["done timeout"]


async def test_cancelled_while_the_read_runs_nothing_is_told() -> None:
    reads = Reads()
    probe, told, handle = started(reads)
    probe.finish(Outcome.TIMEOUT)
    handle.cancel()
    reads.over()
    assert told.events == [] and probe.cancelled


async def test_first_token_and_failures_pass_through() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    assert probe.receiver is not None
    probe.receiver.set()
    probe.receiver.failed(RuntimeError("ours"))
    assert told.events == ["token", "failed ours"]
