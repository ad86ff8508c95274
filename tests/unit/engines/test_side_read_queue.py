"""The engine checks' side reads are started from a queue of each endpoint's soonest
read (``engines.read_queue.DueQueue``), not by looking at every endpoint every tick: an
oracle against the loop over every endpoint it replaced, through reloads, target
changes, engine detection and read outcomes."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from llm_health.config import parse_config
from llm_health.engines.component import MAX_PENDING_READS, EngineChecks
from llm_health.engines.metrics import Reading
from llm_health.engines.read_queue import Job, SideRead
from llm_health.engines.schedule import MAX_TICK_S, MODELS_EVERY_S
from llm_health.engines.settings import NO_CHECKS
from llm_health.model.board import Board
from llm_health.model.engine_load import EngineLoad
from tests.fakes import Clock, FakeControl

CONFIG = """
clusters:
  - name: plain
    endpoints: [{address: "127.0.0.1:9001"}, {address: "127.0.0.1:9002"}]
  - name: auto
    probe: {engine: auto, engine_metrics: {interval: 2s}}
    endpoints: [{address: "127.0.0.1:9003"}, {address: "127.0.0.1:9004"}]
  - name: served
    model: m
    probe: {engine_metrics: null, verify: {every: 20s}}
    endpoints: [{address: "127.0.0.1:9005"}, {address: "127.0.0.1:9006"}]
  - name: detect
    probe: {engine: auto, engine_metrics: null}
    endpoints: [{address: "127.0.0.1:9007"}]
"""
RELOADED = CONFIG.replace("interval: 2s", "interval: 5s").replace(
    "engine_metrics: null, verify", "engine_metrics: {interval: 1s}, verify"
)


def old_tick(checks: EngineChecks, runner: Recorder, now: float) -> None:
    """The tick before: every endpoint looked at (kept here as the oracle)."""
    book, schedule = checks.book, checks.schedule
    for target in book.targets:
        state, key = book.endpoint(target.key), target.key
        verify, metrics = book.checks.get(target.cluster, NO_CHECKS)
        if metrics is not None and schedule.metrics_due(key, metrics.interval, now):
            runner.started.append(SideRead("metrics", key))
        if target.model and target.models_path:
            every = verify.every if verify is not None else MODELS_EVERY_S
            if schedule.models_due(key, every, now):
                runner.started.append(SideRead("models", key))
        unknown = target.engine == "auto" and key not in checks.engines
        if (
            unknown
            and schedule.detect_due(key, now)
            and (metrics is None or state.reading.failures or state.reading.load)
        ):
            runner.started.append(SideRead("detect", key))


class Recorder:
    """A runner that writes down the reads started and never runs them; ``held``: those
    started and not done, as the test says."""

    def __init__(self) -> None:
        self.started: list[SideRead] = []
        self.held: set[object] = set()
        self.hold = False

    def start(self, read: SideRead, job: Job) -> None:
        self.started.append(read)
        job.close()
        if self.hold:
            self.held.add(object())  # started, never done until the test says so

    def __len__(self) -> int:
        return len(self.held)

    def cancel(self) -> None:
        return None


class Recorded:
    """An ``EngineChecks`` whose started reads are written down (and never run)."""

    def __init__(self, clock: Clock, configs: dict[str, Any]) -> None:
        self.configs = configs
        self.clock = clock
        targets = configs["now"].probe_targets()
        config = configs["now"]
        control = FakeControl(Board(config.cluster_specs(), clock(), 0.0), clock)
        self.runner = Recorder()
        self.checks = EngineChecks(
            control,
            targets,
            lambda: configs["now"].engine_checks(),
            clock,
            runner=self.runner,
        )

    def tick(self, *, old: bool) -> Counter[tuple[str, str]]:
        self.runner.started = []
        if old:
            old_tick(self.checks, self.runner, self.clock())
        else:
            self.checks.side_reads.tick(None)  # type: ignore[arg-type]
        return Counter((read.kind, read.key) for read in self.runner.started)


@pytest.mark.parametrize("seed", range(12))
def test_the_same_reads_start_on_the_same_ticks_as_looking_at_every_endpoint(seed: int) -> None:
    chance = random.Random(seed)
    configs = {
        "now": parse_config(CONFIG, "test.yaml", {}),
        "other": parse_config(RELOADED, "test.yaml", {}),
    }
    clock_new, clock_old = Clock(), Clock()
    new, old = Recorded(clock_new, dict(configs)), Recorded(clock_old, dict(configs))
    every = configs["now"].probe_targets() + configs["other"].probe_targets()
    started = 0
    for step in range(int(120 / MAX_TICK_S)):
        for clock in (clock_new, clock_old):
            clock.now += MAX_TICK_S
        event = chance.random()
        if event < 0.02:  # a reload: other settings, then the target set again
            configs["now"], configs["other"] = configs["other"], configs["now"]
            targets = configs["now"].probe_targets()
            for side in (new, old):
                side.configs["now"] = configs["now"]
                side.checks.set_targets(targets)
        elif event < 0.05:  # discovery or ownership: a subset of the endpoints
            keep = [t for t in configs["now"].probe_targets() if chance.random() < 0.7]
            for side in (new, old):
                side.checks.set_targets(keep)
        elif event < 0.08:  # an engine named (by a /metrics read or detection)
            key = chance.choice(every).key
            for side in (new, old):
                side.checks.engines[key] = "vllm"
        elif event < 0.12:  # a read came back, well or not
            key = chance.choice(every).key
            reading = Reading(EngineLoad("vllm")) if chance.random() < 0.5 else Reading(None, 1)
            for side in (new, old):
                side.checks.book.endpoint(key).reading = reading
        found, expected = new.tick(old=False), old.tick(old=True)
        assert found == expected, f"step {step}"
        started += sum(expected.values())
    assert started > 100  # reads of each kind did start


def test_a_tick_looks_only_at_the_endpoints_due() -> None:
    configs = {"now": parse_config(CONFIG, "test.yaml", {})}
    clock = Clock()
    side = Recorded(clock, configs)
    side.tick(old=False)  # every endpoint's first placement
    looked: list[str] = []
    check = side.checks.side_reads.check
    side.checks.side_reads.check = lambda reads, target, now: (
        looked.append(target.key),
        check(reads, target, now),
    )  # type: ignore[method-assign,func-returns-value]
    clock.now += MAX_TICK_S
    side.tick(old=False)
    assert len(looked) < len(configs["now"].probe_targets())


def test_reads_that_do_not_keep_up_hold_back_the_next_ones_instead_of_piling_up() -> None:
    """At most MAX_PENDING_READS side reads are started and not done; the endpoints due
    beyond wait for a later tick, in turn, and every one is read once the reads before it
    are done (5,000 endpoints on a saturated loop had 10,000 reads waiting after 25 s)."""
    addresses = [f"127.0.0.{1 + i // 250}:{9000 + i % 250}" for i in range(1000)]
    text = "clusters:\n  - name: auto\n    model: m\n    probe: {engine: auto}\n    endpoints:\n"
    text += "".join(f'      - {{address: "{a}"}}\n' for a in addresses)
    configs = {"now": parse_config(text, "test.yaml", {})}
    clock = Clock()
    side = Recorded(clock, configs)
    checks = side.checks
    waiting = side.runner.held
    side.runner.hold = True
    read: set[tuple[str, str]] = set()  # (read, endpoint)
    for _ in range(3):
        read |= set(side.tick(old=False))
        assert len(waiting) <= MAX_PENDING_READS + 2  # one endpoint starts up to three
        clock.now += MAX_TICK_S
    assert checks.status()["side_reads_deferred_total"] == 3
    models = {key for name, key in read if name == "models"}
    assert 0 < len(models) < len(addresses)  # the first tick only; the next two waited
    for _ in range(100):  # the reads end; the endpoints left come in turn
        waiting.clear()
        started = side.tick(old=False)
        assert not read & set(started)  # none of them started twice meanwhile
        read |= set(started)
        clock.now += 0.001
        models = {key for name, key in read if name == "models"}
        if len(models) == len(addresses):
            break
    assert len(models) == len(addresses)


@pytest.mark.parametrize(
    ("count", "metrics", "kept"), [(100, True, True), (5000, True, False), (100, False, False)]
)
def test_side_reads_keep_a_connection_only_for_a_read_due_before_the_idle_sweep(
    count: int, metrics: bool, kept: bool
) -> None:
    """/metrics read every second at 100 endpoints: kept (the served-model check on it
    too); stretched to every 50 s at 5,000, or not read at all: nothing comes before the
    idle sweep, so nothing is kept."""
    section = "{}" if metrics else "null"
    text = f"clusters:\n  - name: c\n    model: m\n    probe: {{engine_metrics: {section}}}\n"
    text += "    endpoints:\n" + "".join(
        f'      - {{address: "127.0.{i // 250}.1:{9000 + i % 250}"}}\n' for i in range(count)
    )
    configs = {"now": parse_config(text, "test.yaml", {})}
    checks = Recorded(Clock(), configs).checks
    assert {checks.side_reads.keeps(t) for t in configs["now"].probe_targets()} == {kept}
