"""When the side reads start (docs/design.md §16.5): a queue of each endpoint's soonest
read (``DueQueue``), looked at every MAX_TICK_S, and at most MAX_PENDING_READS reads
started and not done. Each read started is named by a ``SideRead`` (its kind and
endpoint) and handed to a ``Runner``: ``TaskRunner`` runs it as a task of the loop."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from llm_health.core.control import BoardControl
from llm_health.engines.book import Book
from llm_health.engines.load_reads import LoadReads
from llm_health.engines.model_check import check_model, detect
from llm_health.engines.schedule import MAX_TICK_S, MODELS_EVERY_S, SideReadSchedule
from llm_health.engines.settings import NO_CHECKS
from llm_health.engines.side_reads import (
    MAX_CONCURRENT_READS,
    SideReads,
    open_connections,
)
from llm_health.model.engine_load import EngineLoad
from llm_health.probe.http1 import IDLE_TIMEOUT_S
from llm_health.probe.target import ProbeTarget

# Side reads started and not done (running, or waiting for one of the
# MAX_CONCURRENT_READS slots) at most; due reads beyond wait in the queue for a later tick.
MAX_PENDING_READS = 4 * MAX_CONCURRENT_READS

Job = Coroutine[Any, Any, object]


@dataclass(frozen=True, slots=True)
class SideRead:
    """What a job started by the checks is: a read of an endpoint (``key``), or the
    release of verdicts of checks turned off (``key`` empty)."""

    kind: Literal["metrics", "models", "detect", "release"]
    key: str


class Runner(Protocol):
    """Runs the jobs started; its length: those started and not done; ``cancel``: the
    checks stop."""

    def start(self, read: SideRead, job: Job) -> None: ...

    def __len__(self) -> int: ...

    def cancel(self) -> None: ...


class TaskRunner:
    """Each job a task of the running loop, held until done (and cancelled with
    ``cancel``)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def start(self, read: SideRead, job: Job) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


class DueQueue:
    """The endpoints by the time of their soonest side read: a heap with one live entry
    per endpoint (``_at``); an entry replaced or dropped stays in the heap until it comes
    up and is skipped, and the heap is rebuilt when those outnumber the live ones."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._at: dict[str, float] = {}
        self._targets: dict[str, ProbeTarget] = {}

    def reset(self, targets: list[ProbeTarget]) -> None:
        """Exactly ``targets``, each due at once (what is in force may have changed)."""
        self._targets = {t.key: t for t in targets}
        self._at = dict.fromkeys(self._targets, 0.0)
        self._heap = [(0.0, key) for key in self._at]
        heapq.heapify(self._heap)

    def due(self, now: float) -> Iterator[ProbeTarget]:
        """The endpoints due at ``now``, each taken out (``put`` queues it again)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            if self._at.get(key) != at:
                continue  # replaced or dropped
            del self._at[key]
            yield self._targets[key]

    def put(self, target: ProbeTarget, at: float | None) -> None:
        if at is None:
            return
        self._at[target.key] = at
        heapq.heappush(self._heap, (at, target.key))
        if len(self._heap) > 4 * len(self._at) + 64:
            self._heap = [(time, key) for key, time in self._at.items()]
            heapq.heapify(self._heap)


class SideReadQueue:
    """Starts each endpoint's due reads: /metrics (``LoadReads``), the served-model check
    and engine detection (``model_check``)."""

    def __init__(
        self,
        control: BoardControl,
        book: Book,
        schedule: SideReadSchedule,
        load: LoadReads,
        clock: Callable[[], float],
        runner: Runner,
    ) -> None:
        self._control = control
        self._book = book
        self._schedule = schedule
        self._load = load
        self._clock = clock
        self._runner = runner
        self._due = DueQueue()
        self._reads: SideReads | None = None  # while ``run`` runs

    def reset(self, targets: list[ProbeTarget]) -> None:
        self._due.reset(targets)

    def start(self, read: SideRead, job: Job) -> None:
        self._runner.start(read, job)

    async def run(self) -> None:
        async with open_connections() as connections:
            reads = self._reads = SideReads(connections)
            try:
                while True:
                    self.tick(reads)
                    await asyncio.sleep(MAX_TICK_S)
            finally:
                self._reads = None
                self._runner.cancel()

    def read_now(self, target: ProbeTarget, then: Callable[[EngineLoad | None], None]) -> bool:
        """Start a /metrics read of ``target`` now, out of its schedule (a probe's wait
        bracketed: ``engines.bracket``), ``then`` told its load once it is over; False, and
        nothing started, while the reads are not running, the endpoint's /metrics is not
        read or MAX_PENDING_READS are already under way."""
        metrics, reads = self._book.metrics(target), self._reads
        if reads is None or metrics is None or len(self._runner) >= MAX_PENDING_READS:
            return False
        self._book.counters.metrics_bracket_reads_total += 1

        async def read_then() -> None:
            load = None
            try:
                load = await self._load.read(reads, target, metrics, self.keeps)
            finally:
                then(load)

        self.start(SideRead("metrics", target.key), read_then())
        return True

    def tick(self, reads: SideReads) -> None:
        """Start the reads now due: only the endpoints whose soonest read is due are
        looked at (``DueQueue``), not every endpoint every tick (docs/design.md §16.5)."""
        now = self._clock()
        checked: list[ProbeTarget] = []
        for target in self._due.due(now):
            if len(self._runner) >= MAX_PENDING_READS:
                # Earlier reads have not kept up (a loop saturated by a start's burst or
                # by more endpoints than it can probe): this endpoint and the rest wait
                # for a later tick instead of piling up as tasks (5,000 endpoints: 10,000
                # waiting after 25 s and growing, the process's memory with them).
                self._due.put(target, now)
                self._book.counters.side_reads_deferred_total += 1
                break
            self.check(reads, target, now)
            checked.append(target)
        for target in checked:  # queued again after: none comes up twice in one tick
            self._due.put(target, self._next_check(target))

    def check(self, reads: SideReads, target: ProbeTarget, now: float) -> None:
        """Start the endpoint's reads that are due at ``now`` (each ``*_due`` that answers
        True books the next)."""
        book, key = self._book, target.key
        state = book.endpoint(key)
        verify, metrics = book.checks.get(target.cluster, NO_CHECKS)
        if metrics is not None and self._schedule.metrics_due(key, metrics.interval, now):
            job = self._load.read(reads, target, metrics, self.keeps)
            self.start(SideRead("metrics", key), job)
        if target.model and target.models_path:
            every = verify.every if verify is not None else MODELS_EVERY_S
            if self._schedule.models_due(key, every, now):
                job = check_model(reads, target, book, self._control, self.keeps)
                self.start(SideRead("models", key), job)
        unknown = target.engine == "auto" and key not in book.engines
        # Booked even when not tried now: while /metrics reads neither failed nor
        # answered yet, they may still name the engine.
        if (
            unknown
            and self._schedule.detect_due(key, now)
            and (metrics is None or state.reading.failures or state.reading.load)
        ):
            self.start(SideRead("detect", key), detect(reads, target, book, self.keeps))

    def _next_check(self, target: ProbeTarget) -> float | None:
        """When the endpoint's soonest read in force is due; None: none is. What is in
        force changes only with ``reset`` (which queues every endpoint again) and with
        the engine detected (which only takes detection out)."""
        return self._schedule.next_due(
            target.key,
            metrics=self._book.metrics(target) is not None,
            models=bool(target.model and target.models_path),
            detect=target.engine == "auto" and target.key not in self._book.engines,
        )

    def keeps(self, target: ProbeTarget) -> bool:
        """Whether a side read keeps its connection for the endpoint's next: only while
        its /metrics is read more often than IDLE_TIMEOUT_S. The served-model check and
        detection come every 30 s, a /metrics read stretched to the budget every 50 s at
        5,000 endpoints: a connection kept for them held ~1.5 KiB and a file descriptor
        until the idle sweep closed it."""
        metrics = self._book.metrics(target)
        if metrics is None:
            return False
        return max(metrics.interval, self._schedule.stretch) < IDLE_TIMEOUT_S
