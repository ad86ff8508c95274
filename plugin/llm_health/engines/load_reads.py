"""Engine saturation and admission from the engines' /metrics (docs/design.md §14.3,
§3.5): every ``engine_metrics.interval`` a read; a queue or KV cache at or over its
threshold limits the endpoint to DEGRADED ("engine" limit), and the admission counter is
the overload rule's evidence. Reads that fail or do not parse are no verdict; after 3 in
a row the last figures are dropped (a missing /metrics is not a dead engine)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from llm_health.core.control import BoardControl
from llm_health.engines.book import Book, EndpointState
from llm_health.engines.metrics import (
    MetricsOverrun,
    admission_counter,
    parse_load,
    saturation,
)
from llm_health.engines.schedule import SideReadSchedule, with_ttft
from llm_health.engines.settings import EngineMetricsConfig
from llm_health.engines.side_reads import READ_ERRORS, SideReads, read_error
from llm_health.engines.verdicts import note_admission, set_engine_limit
from llm_health.model.admission import Admission, after_read
from llm_health.model.engine_load import EngineLoad
from llm_health.probe.target import ProbeTarget

log = logging.getLogger("llm_health")
OnLoad = Callable[[ProbeTarget, EngineLoad], None]


class LoadReads:
    """One endpoint's /metrics read at a time (``read``), into its reading, the board's
    admission evidence and "engine" limit, ``on_load`` (passive health's TTFT), and the
    engine named for ``engine: auto``."""

    def __init__(
        self,
        control: BoardControl,
        book: Book,
        schedule: SideReadSchedule,
        on_load: OnLoad | None,
    ) -> None:
        self._control = control
        self._book = book
        self._schedule = schedule
        self._on_load = on_load

    async def read(
        self,
        reads: SideReads,
        target: ProbeTarget,
        metrics: EngineMetricsConfig,
        keeps: Callable[[ProbeTarget], bool],
    ) -> EngineLoad | None:
        """One read; its load (None: it failed or did not parse)."""
        assert metrics.path is not None  # in force (settings.in_force)
        state = self._book.endpoint(target.key)
        self._book.counters.metrics_reads_total += 1
        load: EngineLoad | None = None
        try:
            keep = keeps(target)
            document = await reads.metrics(target, metrics.path, metrics.interval, keep=keep)
            state.reads += 1
            load = parse_load(document, ttft=with_ttft(state.reads))
            state.reading = state.reading.read(load)
            self._note_admission(target, metrics, load)
            if self._on_load is not None:
                self._on_load(target, load)
            if load.engine is not None and target.engine == "auto":
                self._book.engines[target.key] = load.engine
        except READ_ERRORS as exc:
            self._book.counters.metrics_failures_total += 1
            # No admission evidence either (model.admission): what good reads saw ages out.
            state.reading = state.reading.failed(read_error(exc, target))
            if isinstance(exc, MetricsOverrun):
                self._overrun(target, state)
            load = None
        await self._apply_load(target, metrics, state)
        return load

    def _overrun(self, target: ProbeTarget, state: EndpointState) -> None:
        """A document past a read's bounds (docs/engines.md): ignored for this read like
        any failed read, counted, and logged once for the endpoint (it answers the same
        every read; /status shows the last error)."""
        self._book.counters.metrics_overruns_total += 1
        if state.overrun_logged:
            return
        state.overrun_logged = True
        log.warning(
            "engine /metrics past a read's bounds, ignored",
            extra={
                "cluster": target.cluster,
                "endpoint": target.address,
                "reason": state.reading.error,
            },
        )

    def _note_admission(
        self, target: ProbeTarget, metrics: EngineMetricsConfig, load: EngineLoad
    ) -> None:
        """The read's admission counter into the board's evidence (docs/design.md §3.5):
        what makes a slow or timed-out probe of a busy engine OVERLOADED, the same for
        ``serve`` and ``llm-health agent`` (both read /metrics here)."""
        counter, window = admission_counter(load.engine), metrics.window
        in_flight = in_engine(load)

        def update(admission: Admission, now: float) -> Admission:
            return after_read(admission, counter, load.admitted, now, window, in_flight)

        self._control.update_now(note_admission(target.cluster, target.address, update))

    async def _apply_load(
        self, target: ProbeTarget, metrics: EngineMetricsConfig, state: EndpointState
    ) -> None:
        load = state.reading.usable
        reason = (
            saturation(load, metrics.queue_threshold, metrics.kv_cache_threshold)
            if load is not None
            else None
        )
        if reason == state.limit:
            return
        state.limit = reason
        cluster, address = target.cluster, target.address
        transition = await self._control.update(
            set_engine_limit(cluster, address, reason), publish_when=lambda t: t is not None
        )
        if transition is not None and (transition.changed or transition.alert):
            self._control.notify(cluster, address, transition, None)
        fields = {"cluster": cluster, "endpoint": address, "reason": reason or "normal again"}
        log.info("engine saturated" if reason else "engine load normal", extra=fields)


def in_engine(load: EngineLoad) -> float | None:
    """Requests running and waiting in the engine as the read shows them (None: it
    exports neither): below ``admission.BUSY`` no advance excuses a wait."""
    if load.running is None and load.waiting is None:
        return None
    return (load.running or 0.0) + (load.waiting or 0.0)
