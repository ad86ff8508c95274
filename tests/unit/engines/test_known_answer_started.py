"""A known-answer probe started by the scheduler (``EngineChecks.starter``) runs with no
task: asked through ``Prober.start_verify``, judged when its answer comes, asked again
after ``confirm_delay`` while a miss may still decide, its last result then told to the
scheduler's receiver; a cancel ends it wherever it is (docs/design.md §14, §16.10)."""

from __future__ import annotations

import asyncio
import time

from llm_health.config import parse_config
from llm_health.engines.component import EngineChecks
from llm_health.engines.verdicts import VERIFY_SIGNAL
from llm_health.model.answer import Answer
from llm_health.model.board import Board
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.client import Question
from llm_health.probe.signals import ProbeReceiver
from llm_health.probe.target import ProbeTarget
from tests.fakes import Clock, FakeControl

CONFIRM_S = 0.05
PARIS = Answer(" Paris is a", (" Paris", " is", " a"))
LYON = Answer(" Lyon is a", (" Lyon", " is", " a"))


class Asked:
    """One ``start_verify`` call: its receiver, and whether it was cancelled."""

    def __init__(self, receiver: ProbeReceiver) -> None:
        self.receiver = receiver
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def answer(self, answer: Answer) -> ProbeResult:
        result = ProbeResult(Outcome.FAST, time.time(), ttft_ms=5.0, answer=answer)
        self.receiver.set()
        self.receiver.done(result)
        return result


class Prober:
    """Records the known-answer probes started; the test answers them."""

    stale_resends = 0

    def __init__(self) -> None:
        self.asked: list[Asked] = []

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        raise NotImplementedError

    async def verify(self, target: ProbeTarget, question: Question) -> ProbeResult:
        raise NotImplementedError

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Asked:
        raise NotImplementedError

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Asked:
        self.asked.append(Asked(receiver))
        return self.asked[-1]


class Receiver:
    def __init__(self) -> None:
        self.tokens = 0
        self.results: list[ProbeResult] = []
        self.errors: list[Exception] = []

    def set(self) -> None:
        self.tokens += 1

    def done(self, result: ProbeResult) -> None:
        self.results.append(result)

    def failed(self, error: Exception) -> None:
        self.errors.append(error)


def checks_for() -> tuple[EngineChecks, FakeControl, ProbeTarget]:
    config = parse_config(
        f"""
clusters:
  - name: c
    probe:
      engine_metrics: null
      unhealthy_after: 2
      confirm_delay: {CONFIRM_S}s
      verify: {{every: 30s, expect: Paris}}
    endpoints: [{{address: "127.0.0.1:9000"}}]
""",
        "test.yaml",
        {},
    )
    clock = Clock()
    control = FakeControl(Board(config.cluster_specs(), clock(), 0.0), clock)
    targets = config.probe_targets()
    return EngineChecks(control, targets, config.engine_checks, clock), control, targets[0]


async def test_a_pass_is_told_at_once_after_one_question() -> None:
    checks, _control, target = checks_for()
    prober, receiver = Prober(), Receiver()
    tasks = len(asyncio.all_tasks())
    checks.starter(prober)(target, receiver)  # type: ignore[arg-type]
    assert len(asyncio.all_tasks()) == tasks  # no task of its own
    result = prober.asked[0].answer(PARIS)
    assert receiver.results == [result] and receiver.tokens == 1
    await asyncio.sleep(CONFIRM_S * 3)
    assert len(prober.asked) == 1 and checks.status()["passes_total"] == 1


async def test_a_miss_is_asked_again_after_confirm_delay_then_held_out() -> None:
    checks, control, target = checks_for()
    prober, receiver = Prober(), Receiver()
    checks.starter(prober)(target, receiver)  # type: ignore[arg-type]
    asked_at = time.monotonic()
    prober.asked[0].answer(LYON)
    assert receiver.results == [] and len(prober.asked) == 1  # not decided: asked again
    while len(prober.asked) == 1:
        assert time.monotonic() - asked_at < 2.0, "never asked again"
        await asyncio.sleep(0.005)
    assert time.monotonic() - asked_at >= CONFIRM_S * 0.9
    last = prober.asked[1].answer(LYON)
    assert receiver.results == [last] and receiver.tokens == 2  # every answer's first token
    assert checks.status()["misses_total"] == 2
    assert control.board.signal("c", "127.0.0.1:9000", VERIFY_SIGNAL) is not None  # held out
    assert len(control.published_snapshots) > 1  # and published before the result was told


async def test_a_cancel_while_waiting_to_ask_again_ends_it() -> None:
    checks, _control, target = checks_for()
    prober, receiver = Prober(), Receiver()
    started = checks.starter(prober)(target, receiver)  # type: ignore[arg-type]
    prober.asked[0].answer(LYON)
    started.cancel()
    await asyncio.sleep(CONFIRM_S * 3)
    assert len(prober.asked) == 1  # not asked again
    assert receiver.results == [] and receiver.errors == []


async def test_a_cancel_while_asking_cancels_the_question() -> None:
    checks, _control, target = checks_for()
    prober, receiver = Prober(), Receiver()
    started = checks.starter(prober)(target, receiver)  # type: ignore[arg-type]
    started.cancel()
    assert prober.asked[0].cancelled
