"""The engine checks component (docs/design.md §14): what a fast first token does not show.

- Known-answer probes: every ``verify.every`` one of an endpoint's scheduled probes is a
  known-answer probe (``Prober.start_verify``; its TTFT counts as any probe's). The answer is
  judged (``engines.verify.Verifier``) before the result is folded in; garbage holds the
  endpoint UNHEALTHY at once, ``unhealthy_after`` misses (re-checked after
  ``confirm_delay``, inside the same slot) likewise; a passing answer lifts the hold. The
  hold is the board's "verify" signal, so recovery then takes the usual hysteresis.
- Served model: at start and every ``verify.every``, ``GET /v1/models``; a cluster with a
  ``model`` its endpoint does not list is held UNHEALTHY ("model" signal).
- Engine saturation: every ``engine_metrics.interval``, the engine's /metrics; a queue or
  KV cache at or over its threshold limits the endpoint to DEGRADED ("engine" limit).
  Reads that fail or do not parse are no verdict; after 3 in a row the last figures are
  dropped (a missing /metrics is not a dead engine).
- Engine detection for ``engine: auto`` (the probe body's cache bypass): from the metric
  names, else from the engines' info endpoints (``engines.detect``).

The runtime probes through ``wrap`` and reads ``engines`` (``probe.client.ProbeWrapper``).
Only endpoints this replica probes (fleet mode: owns) are checked; other replicas adopt
the owner's verdict. Everything runs on the runtime's loop; every request is bounded in
time and size (``engines.side_reads``), and nothing an endpoint answers can raise out of
a loop.

Each feature is a module of its own (``known_answer``, ``load_reads``, ``model_check``,
``read_queue``, ``report``) sharing what is known per endpoint (``book``); this class
composes them for the runtime.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

from llm_health.core.control import BoardControl
from llm_health.engines import report
from llm_health.engines.book import Book, Checks
from llm_health.engines.bracket import bracketing
from llm_health.engines.known_answer import KnownAnswers
from llm_health.engines.load_reads import LoadReads, OnLoad
from llm_health.engines.read_queue import (
    MAX_PENDING_READS,
    Runner,
    SideRead,
    SideReadQueue,
    TaskRunner,
)
from llm_health.engines.schedule import SideReadSchedule
from llm_health.engines.verdicts import (
    ALL_SOURCES,
    ENGINE_LIMIT,
    MODEL_SIGNAL,
    VERIFY_SIGNAL,
    Endpoint,
    release,
)
from llm_health.probe.client import Prober
from llm_health.probe.signals import Starter
from llm_health.probe.target import ProbeTarget

__all__ = ["MAX_PENDING_READS", "Checks", "EngineChecks"]


class EngineChecks:
    """``set_targets``: the endpoints this replica probes (called on every reload,
    discovery change and fleet ownership move); ``checks``: their clusters' settings,
    read at each. ``engines``: detected engine per endpoint key, shared with the
    ``MicroProbe`` that builds request bodies. ``runner``: what runs the side reads
    (default: tasks of the running loop)."""

    name = "engines"

    def __init__(
        self,
        control: BoardControl,
        targets: list[ProbeTarget],
        checks: Checks,
        clock: Callable[[], float] = time.monotonic,
        on_load: OnLoad | None = None,
        *,
        runner: Runner | None = None,
    ) -> None:
        self._control = control
        self.book = Book(checks)
        self.engines = self.book.engines
        self.schedule = SideReadSchedule()
        self._known = KnownAnswers(control, self.book, clock)
        load = LoadReads(control, self.book, self.schedule, on_load)
        runner = runner if runner is not None else TaskRunner()
        self.side_reads = SideReadQueue(control, self.book, self.schedule, load, clock, runner)
        self.set_targets(targets)

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoints probed here changed. Verdicts this component set on endpoints it no
        longer checks (another replica owns them now, or a check was turned off) are
        released: a stale hold would outlive the check that set it."""
        book = self.book
        released = [(t.cluster, t.address) for t in book.targets] if book.targets else []
        book.reload(targets)
        self.side_reads.reset(targets)
        self.schedule.plan(sum(1 for t in targets if book.metrics(t) is not None))
        self._known.set_targets(targets)
        kept = {(t.cluster, t.address) for t in targets}
        stale = {key: ALL_SOURCES for key in released if key not in kept}
        stale.update({(t.cluster, t.address): off for t in targets if (off := self._off(t))})
        keys = {t.key for t in targets}
        book.forget(keys)
        self.schedule.forget(keys)
        self._known.forget(kept)
        for target in targets:
            if book.metrics(target) is None and target.key in book.endpoints:
                book.endpoints[target.key].limit = None
        if stale and _loop_running():  # no loop yet: nothing was set
            self.side_reads.start(SideRead("release", ""), self._release(stale))

    def _off(self, target: ProbeTarget) -> frozenset[str]:
        """The verdict sources of checks now turned off for this endpoint."""
        off = set()
        if self.book.verify(target) is None:
            off.add(VERIFY_SIGNAL)
        if not target.model or target.models_path is None:
            off.add(MODEL_SIGNAL)
        if self.book.metrics(target) is None:
            off.add(ENGINE_LIMIT)
        return frozenset(off)

    async def _release(self, stale: dict[Endpoint, frozenset[str]]) -> None:
        await self._control.update(release(stale), publish_when=bool)

    # --- the probe path (``engines.known_answer``) ---------------------------------------

    def starter(self, prober: Prober) -> Starter:
        """The scheduler's probe, started (``probe.signals``): a known-answer probe when
        one is due, else the plain probe; in no task of its own. A slow probe's wait is
        bracketed by two /metrics reads (``engines.bracket``: the overload rule)."""
        return bracketing(
            self._known.starter(prober),
            self.side_reads.read_now,
            self._reads,
            self.book.counters.bracketed,
        )

    def _reads(self, target: ProbeTarget) -> bool:
        return self.book.metrics(target) is not None

    # --- the side reads (``engines.read_queue``) and what they show ---------------------

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return [self.side_reads.run]

    def register(self, server: Any) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return report.status(self.book, self.schedule.stretch, self._known.status)

    def metrics(self) -> Iterator[Metric]:
        return report.metrics(self.book, self.schedule.stretch)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
