"""Reads that bracket a probe's wait (docs/design.md §3.5, ``engines.bracket``): a probe with
no token a quarter of its timeout in gets a baseline /metrics read; a timeout is told after
one more read, with the admission the two show; anything else at once; bounded by
CONFIRM_WITHIN_S; nothing once cancelled; each timeout counted by what its reads showed."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from llm_health.engines import bracket
from llm_health.engines.bracket import (
    Evidence,
    Then,
    admitted_between,
    bracketing,
    confirm_wait,
)
from llm_health.model.engine_load import EngineLoad
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started
from llm_health.probe.target import ProbeTarget

TIMEOUT_S = 0.08  # the baseline a quarter in: 20 ms
BASELINE_S = bracket.BASELINE_AT * TIMEOUT_S
TARGET = ProbeTarget(
    cluster="llama",
    address="127.0.0.1:9000",
    url="http://127.0.0.1:9000/v1/completions",
    api="openai-completions",
    model=None,
    prompt="hi",
    cache_bust="salt",
    timeout_s=TIMEOUT_S,
    healthy_ttft_s=0.02,
    interval_s=1.0,
    confirm_delay_s=0.05,
    unhealthy_after=2,
    fatal_patterns=None,
)
SLOW_TARGET = replace(TARGET, timeout_s=1.0)  # the baseline at 0.25 s


def vllm(admitted: float | None, started: float = 1.0) -> EngineLoad:
    return EngineLoad(engine="vllm", admitted=admitted, process_started=started)


class Told:
    """A receiver that keeps what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.results: list[ProbeResult] = []
        self.counted: list[Evidence] = []

    def set(self) -> None:
        self.events.append("token")

    def done(self, result: ProbeResult) -> None:
        self.events.append(f"done {result.outcome.value}")
        self.results.append(result)

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
        self.receiver.done(ProbeResult(outcome, started_at=0.0, total_ms=TIMEOUT_S * 1000))


class Reads:
    """``read_now``: records each read asked for; ``over(load)`` ends the oldest one."""

    def __init__(self, can_start: bool = True) -> None:
        self.can_start = can_start
        self.asked = 0
        self.pending: list[Then] = []

    def read_now(self, target: ProbeTarget, then: Then) -> bool:
        assert target in (TARGET, SLOW_TARGET)
        self.asked += 1
        if self.can_start:
            self.pending.append(then)
        return self.can_start

    def over(self, load: EngineLoad | None) -> None:
        self.pending.pop(0)(load)


def started(
    reads: Reads, metrics_read: bool = True, target: ProbeTarget = TARGET
) -> tuple[Probe, Told, Started]:
    probe, told = Probe(), Told()
    start = bracketing(
        probe.start, reads.read_now, lambda target: metrics_read, told.counted.append
    )
    return probe, told, start(target, told)


async def past_baseline() -> None:
    await asyncio.sleep(BASELINE_S + 0.03)


async def test_a_timeout_is_told_with_the_admission_seen_in_its_wait() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    assert reads.asked == 1  # the baseline
    reads.over(vllm(1000.0))
    probe.finish(Outcome.TIMEOUT)
    assert reads.asked == 2 and told.events == []  # the confirming read
    reads.over(vllm(1512.0))
    assert told.events == ["done timeout"]
    assert told.results[0].admission == "vllm:prompt_tokens_total +512 during the wait"
    assert told.counted == [Evidence.ADMISSION]


async def test_no_admission_in_the_wait_is_told_as_it_is() -> None:
    """Users admitted before the wait, then a hang: both reads show the same count."""
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    reads.over(vllm(1000.0))
    probe.finish(Outcome.TIMEOUT)
    reads.over(vllm(1000.0))
    assert told.events == ["done timeout"] and told.results[0].admission == ""
    assert told.counted == [Evidence.NONE]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, vllm(2000.0)),  # the baseline read failed
        (vllm(1000.0), None),  # the confirming read failed
        (vllm(1000.0), vllm(3.0)),  # the counter went back
        (vllm(1000.0), vllm(2000.0, started=2.0)),  # another process
        (vllm(None), vllm(None)),  # not exported
        (vllm(1000.0), EngineLoad(engine="sglang", admitted=2000.0, process_started=1.0)),
    ],
)
def test_no_evidence_unless_one_counter_grew(
    before: EngineLoad | None, after: EngineLoad | None
) -> None:
    assert admitted_between(before, after) == ""


async def test_a_fast_probe_costs_no_read() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    assert probe.receiver is not None
    probe.receiver.set()
    probe.finish(Outcome.FAST)
    await past_baseline()
    assert reads.asked == 0 and told.events == ["token", "done fast"]
    assert told.counted == []


@pytest.mark.parametrize("outcome", [Outcome.SLOW, Outcome.ERROR, Outcome.FATAL])
async def test_anything_but_a_timeout_is_told_at_once(outcome: Outcome) -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    probe.finish(outcome)
    assert told.events == [f"done {outcome.value}"] and reads.asked == 1
    assert told.counted == []


async def test_a_timeout_without_a_baseline_is_told_at_once() -> None:
    """No read could start a quarter in (side reads at their cap): no evidence to seek."""
    reads = Reads(can_start=False)
    probe, told, _ = started(reads)
    await past_baseline()
    probe.finish(Outcome.TIMEOUT)
    assert told.events == ["done timeout"] and reads.asked == 1
    assert told.counted == [Evidence.NO_BASELINE]


async def test_a_baseline_still_under_way_is_waited_for() -> None:
    """The confirming read ends first: the timeout waits for the baseline (a /metrics
    slow to answer on a loaded engine), within CONFIRM_WITHIN_S."""
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    probe.finish(Outcome.TIMEOUT)
    reads.pending.pop(1)(vllm(2000.0))  # the confirming read ends first
    assert told.events == []
    reads.over(vllm(1000.0))  # then the baseline
    assert told.events == ["done timeout"]
    assert told.results[0].admission == "vllm:prompt_tokens_total +1000 during the wait"
    assert told.counted == [Evidence.ADMISSION]


async def test_a_failed_baseline_costs_no_confirming_read() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    reads.over(None)
    probe.finish(Outcome.TIMEOUT)
    assert told.events == ["done timeout"] and reads.asked == 1
    assert told.counted == [Evidence.NO_BASELINE]


@pytest.mark.parametrize("refused", [False, True])
async def test_a_failed_or_refused_confirming_read_is_counted(refused: bool) -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    reads.over(vllm(1000.0))
    reads.can_start = not refused
    probe.finish(Outcome.TIMEOUT)
    if not refused:
        reads.over(None)
    assert told.events == ["done timeout"] and reads.asked == 2
    assert told.counted == [Evidence.NO_CONFIRM]


async def test_no_read_when_the_endpoint_has_no_metrics_read() -> None:
    reads = Reads()
    probe, told, handle = started(reads, metrics_read=False)
    assert handle is probe  # the probe as it was: nothing in between
    await past_baseline()
    probe.finish(Outcome.TIMEOUT)
    assert told.events == ["done timeout"] and reads.asked == 0


async def test_a_confirming_read_that_takes_too_long_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bracket, "CONFIRM_WITHIN_S", 0.05)
    reads = Reads()
    probe, told, _ = started(reads)
    await past_baseline()
    reads.over(vllm(1000.0))
    probe.finish(Outcome.TIMEOUT)
    await asyncio.sleep(0.2)
    assert told.events == ["done timeout"] and told.counted == [Evidence.LATE]
    reads.over(vllm(2000.0))  # the read ends later: nothing more
    assert told.events == ["done timeout"] and told.counted == [Evidence.LATE]


@pytest.mark.parametrize(
    ("baseline_took_s", "timeout_s", "wait_s"),
    [
        (None, 0.8, bracket.CONFIRM_WITHIN_S),  # the baseline not over: it may hang too
        (0.1, 0.8, bracket.CONFIRM_WITHIN_S),  # a quick /metrics
        (0.35, 0.8, 0.7),  # a slow one: twice its time
        (0.6, 0.8, 0.8),  # never longer than the probe's own timeout
        (0.6, 0.3, bracket.CONFIRM_WITHIN_S),  # nor shorter than CONFIRM_WITHIN_S
    ],
)
def test_the_wait_for_the_reads(
    baseline_took_s: float | None, timeout_s: float, wait_s: float
) -> None:
    assert confirm_wait(baseline_took_s, timeout_s) == pytest.approx(wait_s)


@pytest.mark.parametrize("slow_baseline", [True, False])
async def test_a_slow_baseline_buys_its_confirming_read_more_time(
    monkeypatch: pytest.MonkeyPatch, slow_baseline: bool
) -> None:
    """A /metrics that took 0.3 s to answer a quarter in is waited for 0.6 s at the
    timeout (a busy engine's starved API process), a quick one CONFIRM_WITHIN_S."""
    monkeypatch.setattr(bracket, "CONFIRM_WITHIN_S", 0.1)
    reads = Reads()
    probe, told, _ = started(reads, target=SLOW_TARGET)
    await asyncio.sleep(0.25 + 0.02)
    assert reads.asked == 1
    if slow_baseline:
        await asyncio.sleep(0.3)
    reads.over(vllm(1000.0))
    probe.finish(Outcome.TIMEOUT)
    await asyncio.sleep(0.25)
    if not slow_baseline:
        assert told.counted == [Evidence.LATE]
        return
    assert told.events == []
    reads.over(vllm(1100.0))
    assert told.counted == [Evidence.ADMISSION]


async def test_cancelled_nothing_is_told_and_no_read_starts() -> None:
    reads = Reads()
    probe, told, handle = started(reads)
    handle.cancel()
    await past_baseline()
    assert told.events == [] and probe.cancelled and reads.asked == 0


async def test_cancelled_while_the_confirming_read_runs_nothing_is_told() -> None:
    reads = Reads()
    probe, told, handle = started(reads)
    await past_baseline()
    reads.over(vllm(1000.0))
    probe.finish(Outcome.TIMEOUT)
    handle.cancel()
    reads.over(vllm(2000.0))
    assert told.events == [] and probe.cancelled and told.counted == []


async def test_failures_pass_through() -> None:
    reads = Reads()
    probe, told, _ = started(reads)
    assert probe.receiver is not None
    probe.receiver.failed(RuntimeError("ours"))
    await past_baseline()
    assert told.events == ["failed ours"] and reads.asked == 0
