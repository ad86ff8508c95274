"""Known-answer probes after the first are placed by the endpoint's hash
(``schedule.next_after``): a fleet started together is not checked in one burst every
``verify.every`` ever after (docs/design.md §16.5)."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

from llm_health.config import parse_config
from llm_health.engines.component import EngineChecks
from llm_health.model.board import Board
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.client import Question
from llm_health.probe.signals import ProbeReceiver, Started, await_started
from llm_health.probe.target import ProbeTarget
from tests.fakes import Clock, FakeControl

EVERY_S = 30.0
COUNT = 200


class Answers:
    """A prober whose known-answer probes are answered at once (with no answer to judge)."""

    stale_resends = 0

    def __init__(self) -> None:
        self.asked: list[str] = []

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        raise NotImplementedError

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """Answered within the call."""
        self.asked.append(target.key)
        receiver.done(ProbeResult(Outcome.FAST, time.time(), ttft_ms=5.0))
        return Answered()


class Answered:
    def cancel(self) -> None:
        return None


async def test_known_answer_probes_after_the_first_are_spread_and_never_late() -> None:
    endpoints = ", ".join(f'{{address: "127.0.0.1:{9000 + i}"}}' for i in range(COUNT))
    config = parse_config(
        f"""
clusters:
  - name: c
    probe: {{engine_metrics: null, verify: {{every: {EVERY_S:g}s}}}}
    endpoints: [{endpoints}]
""",
        "test.yaml",
        {},
    )
    clock = Clock()
    control = FakeControl(Board(config.cluster_specs(), clock(), 0.0), clock)
    targets = config.probe_targets()
    checks = EngineChecks(control, targets, config.engine_checks, clock)
    prober = Answers()
    start = checks.starter(prober)
    for target in targets:  # the whole fleet's first probes, together
        await await_started(partial(start, target))
    assert len(prober.asked) == COUNT  # each first probe is a known-answer probe
    dues = [checks.book.endpoint(t.key).verify_due - clock() for t in targets]
    assert all(EVERY_S / 2 <= due < EVERY_S for due in dues)  # sooner, never later
    per_second = Counter(int(due) for due in dues)
    even = COUNT / (EVERY_S / 2)
    assert max(per_second.values()) <= 3 * even, per_second.most_common(3)
    # From the second on, every period: the places stay spread.
    target = targets[0]
    clock.now += dues[0]
    await await_started(partial(start, target))
    assert checks.book.endpoint(target.key).verify_due == clock() + EVERY_S
