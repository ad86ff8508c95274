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

The runtime probes through ``starter`` and reads ``engines`` (``probe.client.ProbeWrapper``).
Only endpoints this replica probes (fleet mode: owns) are checked; other replicas adopt
the owner's verdict. Everything runs on the runtime's loop; every request is bounded in
time and size (``engines.side_reads``), and nothing an endpoint answers can raise out of
a loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llm_health.core.control import BoardControl
from llm_health.core.families import counter, gauge
from llm_health.engines.metrics import (
    MetricsOverrun,
    Reading,
    admission_counter,
    parse_load,
    saturation,
)
from llm_health.engines.schedule import (
    MAX_TICK_S,
    MODELS_EVERY_S,
    SideReadSchedule,
    next_after,
    with_ttft,
)
from llm_health.engines.served_model import wrong_model
from llm_health.engines.settings import (
    NO_CHECKS,
    ClusterChecks,
    EngineMetricsConfig,
    VerifyConfig,
)
from llm_health.engines.side_reads import (
    MAX_CONCURRENT_READS,
    READ_ERRORS,
    SideReads,
    open_connections,
    read_error,
)
from llm_health.engines.verdicts import (
    ALL_SOURCES,
    ENGINE_LIMIT,
    MODEL_SIGNAL,
    VERIFY_SIGNAL,
    Changes,
    Endpoint,
    note_admission,
    release,
    set_engine_limit,
    set_signals,
    verify_change,
)
from llm_health.engines.verify import Judgement, Verdict, Verifier
from llm_health.model.admission import Admission, after_read
from llm_health.model.causes import Cause
from llm_health.model.engine_load import EngineLoad
from llm_health.model.outcome import ProbeResult
from llm_health.model.redact import printable_line
from llm_health.probe.client import Prober
from llm_health.probe.http1 import IDLE_TIMEOUT_S
from llm_health.probe.signals import ProbeReceiver, Started, Starter
from llm_health.probe.target import ProbeTarget

log = logging.getLogger("llm_health")
# Per cluster, the checks in force (``settings.in_force``) of the config now in force.
Checks = Callable[[], Mapping[str, ClusterChecks]]


# Side reads started and not done (running, or waiting for one of the
# MAX_CONCURRENT_READS slots) at most; due reads beyond wait in the queue for a later tick.
MAX_PENDING_READS = 4 * MAX_CONCURRENT_READS


@dataclass(slots=True)
class _Endpoint:
    """What the checks know of one endpoint (``/status`` shows it)."""

    reading: Reading = field(default_factory=Reading)
    reads: int = 0
    limit: str | None = None  # the "engine" limit this component last set
    verify_due: float = 0.0  # monotonic; 0: the next probe is a known-answer probe
    last_answer: str | None = None
    last_verdict: str = ""
    models: tuple[str, ...] = ()
    model_error: str = ""
    overrun_logged: bool = False  # a /metrics document past a read's bounds was logged


@dataclass(slots=True)
class _Counters:
    checks_total: int = 0
    garbage_total: int = 0
    misses_total: int = 0
    passes_total: int = 0
    metrics_reads_total: int = 0
    metrics_failures_total: int = 0
    metrics_overruns_total: int = 0
    model_checks_total: int = 0
    model_failures_total: int = 0
    side_reads_deferred_total: int = 0


class EngineChecks:
    """``set_targets``: the endpoints this replica probes (called on every reload,
    discovery change and fleet ownership move); ``checks``: their clusters' settings,
    read at each. ``engines``: detected engine per endpoint key, shared with the
    ``MicroProbe`` that builds request bodies."""

    name = "engines"

    def __init__(
        self,
        control: BoardControl,
        targets: list[ProbeTarget],
        checks: Checks,
        clock: Callable[[], float] = time.monotonic,
        on_load: Callable[[ProbeTarget, EngineLoad], None] | None = None,
    ) -> None:
        self._control = control
        self._checks_now = checks
        self._checks: Mapping[str, ClusterChecks] = {}
        self._on_load = on_load
        self._clock = clock
        self._targets: list[ProbeTarget] = []
        self._members: dict[str, set[str]] = {}
        self.engines: dict[str, str] = {}
        self._verifier = Verifier()
        self._schedule = SideReadSchedule()
        self._endpoints: dict[str, _Endpoint] = {}
        self._counters = _Counters()
        self._reads: set[asyncio.Task[None]] = set()
        self._queue = _Queue()
        self.set_targets(targets)

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoints probed here changed. Verdicts this component set on endpoints it no
        longer checks (another replica owns them now, or a check was turned off) are
        released: a stale hold would outlive the check that set it."""
        released = [(t.cluster, t.address) for t in self._targets] if self._targets else []
        self._targets = targets
        self._queue.reset(targets)
        self._checks = self._checks_now()
        self._schedule.plan(sum(1 for t in targets if self._metrics(t) is not None))
        self._members = {}
        for target in targets:
            self._members.setdefault(target.cluster, set()).add(target.address)
        kept = {(t.cluster, t.address) for t in targets}
        stale = {key: ALL_SOURCES for key in released if key not in kept}
        stale.update({(t.cluster, t.address): off for t in targets if (off := self._off(t))})
        self._forget({t.key for t in targets}, kept)
        for target in targets:
            if self._metrics(target) is None and target.key in self._endpoints:
                self._endpoints[target.key].limit = None
        if stale and _loop_running():  # no loop yet: nothing was set
            self._spawn(self._release(stale))

    def _verify_settings(self, target: ProbeTarget) -> VerifyConfig | None:
        return self._checks.get(target.cluster, NO_CHECKS)[0]

    def _metrics(self, target: ProbeTarget) -> EngineMetricsConfig | None:
        return self._checks.get(target.cluster, NO_CHECKS)[1]

    def _off(self, target: ProbeTarget) -> frozenset[str]:
        """The verdict sources of checks now turned off for this endpoint."""
        off = set()
        if self._verify_settings(target) is None:
            off.add(VERIFY_SIGNAL)
        if not target.model or target.models_path is None:
            off.add(MODEL_SIGNAL)
        if self._metrics(target) is None:
            off.add(ENGINE_LIMIT)
        return frozenset(off)

    async def _release(self, stale: dict[Endpoint, frozenset[str]]) -> None:
        await self._control.update(release(stale), publish_when=bool)

    # --- the probe path -----------------------------------------------------------------

    def starter(self, prober: Prober) -> Starter:
        """The scheduler's probe, started (``probe.signals``): the plain probe through
        ``prober.start_probe``, a known-answer probe when one is due through
        ``_KnownAnswer``; neither in a task of its own (every endpoint's first probe is a
        known-answer probe: at 5,000 endpoints, thousands at once)."""

        def start(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
            verify = self._verify_due(target)
            if verify is None:
                return prober.start_probe(target, receiver)
            return _KnownAnswer(self, prober, target, verify, receiver)

        return start

    def _verify_due(self, target: ProbeTarget) -> VerifyConfig | None:
        """The endpoint's ``probe.verify`` when its next probe is a known-answer probe."""
        verify = self._verify_settings(target)
        if verify is None or self._clock() < self._endpoint(target.key).verify_due:
            return None
        return verify

    def _verify_begins(self, target: ProbeTarget, verify: VerifyConfig) -> None:
        """A known-answer probe of ``target`` starts: the next one is due ``verify.every``
        later (the first, sooner by the endpoint's hash: no burst)."""
        state = self._endpoint(target.key)
        first = state.verify_due == 0.0
        state.verify_due = self._clock() + next_after(target.key, verify.every, first=first)

    def _judge(self, target: ProbeTarget, verify: VerifyConfig, result: ProbeResult) -> bool:
        """Judge ``result``'s answer and apply the verdicts; True if this endpoint's own
        answer asks for a re-check now."""
        if result.answer is None:
            return False
        self._counters.checks_total += 1
        members = self._members.get(target.cluster, set())
        judgements = self._verifier.judge(
            target.cluster,
            target.address,
            result.answer,
            verify,
            target.unhealthy_after,
            self._clock(),
            members,
        )
        self._endpoint(target.key).last_answer = printable_line(result.answer.text, 200)
        self._apply_judgements(target, judgements)
        return any(j.address == target.address and j.recheck for j in judgements)

    def _apply_judgements(self, target: ProbeTarget, judgements: list[Judgement]) -> None:
        changes: Changes = {}
        for judgement in judgements:
            self._count(judgement)
            key = f"{target.cluster}/{judgement.address}"
            self._endpoint(key).last_verdict = f"{judgement.verdict.value}: {judgement.reason}"
            if judgement.recheck and judgement.address != target.address:
                self._endpoint(key).verify_due = 0.0  # its next probe re-checks
            change = verify_change(judgement)
            if change is not None:
                changes[judgement.address] = change
            if judgement.down:
                log.warning(
                    "known-answer check failed",
                    extra={
                        "cluster": target.cluster,
                        "endpoint": judgement.address,
                        "reason": judgement.reason,
                    },
                )
        self._signal(target.cluster, VERIFY_SIGNAL, changes)

    def _count(self, judgement: Judgement) -> None:
        if judgement.verdict is Verdict.GARBAGE:
            self._counters.garbage_total += 1
        elif judgement.verdict is Verdict.MISS:
            self._counters.misses_total += 1
        elif judgement.verdict is Verdict.PASS:
            self._counters.passes_total += 1

    def _signal(self, cluster: str, source: str, changes: Changes) -> None:
        """Set or clear ``source``'s signal on the endpoints in ``changes``, one publish
        for the batch; the state changes it makes are reported."""
        applied = self._control.update_now(set_signals(cluster, source, changes), publish_when=bool)
        for address, transition in applied.items():
            if transition.changed or transition.alert:
                self._control.notify(cluster, address, transition, None)

    # --- side reads: /metrics, /v1/models, detection ------------------------------------

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return [self._run]

    def register(self, server: Any) -> None:
        return None

    async def _run(self) -> None:
        async with open_connections() as connections:
            reads = SideReads(connections)
            try:
                while True:
                    self._tick(reads)
                    await asyncio.sleep(MAX_TICK_S)
            finally:
                for task in self._reads:
                    task.cancel()

    def _tick(self, reads: SideReads) -> None:
        """Start the reads now due: only the endpoints whose soonest read is due are
        looked at (``_Queue``), not every endpoint every tick (docs/design.md §16.5)."""
        now = self._clock()
        checked: list[ProbeTarget] = []
        for target in self._queue.due(now):
            if len(self._reads) >= MAX_PENDING_READS:
                # Earlier reads have not kept up (a loop saturated by a start's burst or
                # by more endpoints than it can probe): this endpoint and the rest wait
                # for a later tick instead of piling up as tasks (5,000 endpoints: 10,000
                # waiting after 25 s and growing, the process's memory with them).
                self._queue.put(target, now)
                self._counters.side_reads_deferred_total += 1
                break
            self._check(reads, target, now)
            checked.append(target)
        for target in checked:  # queued again after: none comes up twice in one tick
            self._queue.put(target, self._next_check(target))

    def _check(self, reads: SideReads, target: ProbeTarget, now: float) -> None:
        """Start the endpoint's reads that are due at ``now`` (each ``*_due`` that answers
        True books the next)."""
        state, key = self._endpoint(target.key), target.key
        verify, metrics = self._checks.get(target.cluster, NO_CHECKS)
        if metrics is not None and self._schedule.metrics_due(key, metrics.interval, now):
            self._spawn(self._read_metrics(reads, target, metrics))
        if target.model and target.models_path:
            every = verify.every if verify is not None else MODELS_EVERY_S
            if self._schedule.models_due(key, every, now):
                self._spawn(self._check_model(reads, target))
        unknown = target.engine == "auto" and key not in self.engines
        # Booked even when not tried now: while /metrics reads neither failed nor
        # answered yet, they may still name the engine.
        if (
            unknown
            and self._schedule.detect_due(key, now)
            and (metrics is None or state.reading.failures or state.reading.load)
        ):
            self._spawn(self._detect(reads, target))

    def _next_check(self, target: ProbeTarget) -> float | None:
        """When the endpoint's soonest read in force is due; None: none is. What is in
        force changes only with ``set_targets`` (which queues every endpoint again) and
        with the engine detected (which only takes detection out)."""
        return self._schedule.next_due(
            target.key,
            metrics=self._metrics(target) is not None,
            models=bool(target.model and target.models_path),
            detect=target.engine == "auto" and target.key not in self.engines,
        )

    def _keeps(self, target: ProbeTarget) -> bool:
        """Whether a side read keeps its connection for the endpoint's next: only while
        its /metrics is read more often than IDLE_TIMEOUT_S. The served-model check and
        detection come every 30 s, a /metrics read stretched to the budget every 50 s at
        5,000 endpoints: a connection kept for them held ~1.5 KiB and a file descriptor
        until the idle sweep closed it."""
        metrics = self._metrics(target)
        if metrics is None:
            return False
        return max(metrics.interval, self._schedule.stretch) < IDLE_TIMEOUT_S

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def _read_metrics(
        self, reads: SideReads, target: ProbeTarget, metrics: EngineMetricsConfig
    ) -> None:
        assert metrics.path is not None  # in force (settings.in_force)
        state = self._endpoint(target.key)
        self._counters.metrics_reads_total += 1
        try:
            keep = self._keeps(target)
            document = await reads.metrics(target, metrics.path, metrics.interval, keep=keep)
            state.reads += 1
            load = parse_load(document, ttft=with_ttft(state.reads))
            state.reading = state.reading.read(load)
            self._note_admission(target, metrics, load)
            if self._on_load is not None:
                self._on_load(target, load)
            if load.engine is not None and target.engine == "auto":
                self.engines[target.key] = load.engine
        except READ_ERRORS as exc:
            self._counters.metrics_failures_total += 1
            # No admission evidence either (model.admission): what good reads saw ages out.
            state.reading = state.reading.failed(read_error(exc, target))
            if isinstance(exc, MetricsOverrun):
                self._overrun(target, state)
        await self._apply_load(target, metrics, state)

    def _overrun(self, target: ProbeTarget, state: _Endpoint) -> None:
        """A document past a read's bounds (docs/engines.md): ignored for this read like
        any failed read, counted, and logged once for the endpoint (it answers the same
        every read; /status shows the last error)."""
        self._counters.metrics_overruns_total += 1
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
        counter, window = admission_counter(load.engine), metrics.window(self._schedule.stretch)

        def update(admission: Admission, now: float) -> Admission:
            return after_read(admission, counter, load.admitted, now, window)

        self._control.update_now(note_admission(target.cluster, target.address, update))

    async def _apply_load(
        self, target: ProbeTarget, metrics: EngineMetricsConfig, state: _Endpoint
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

    async def _check_model(self, reads: SideReads, target: ProbeTarget) -> None:
        assert target.model is not None and target.models_path is not None
        state = self._endpoint(target.key)
        self._counters.model_checks_total += 1
        try:
            served = await reads.models(target, target.models_path, keep=self._keeps(target))
        except READ_ERRORS as exc:
            self._counters.model_failures_total += 1
            state.model_error = read_error(exc, target)
            return  # no verdict: an endpoint that cannot list its models is not judged
        state.models, state.model_error = served, ""
        wrong = wrong_model(served, target.model)
        self._signal(target.cluster, MODEL_SIGNAL, {target.address: (wrong, Cause.WRONG_MODEL)})

    async def _detect(self, reads: SideReads, target: ProbeTarget) -> None:
        engine = await reads.engine(target, keep=self._keeps(target))
        if engine is not None:
            self.engines[target.key] = engine

    # --- bookkeeping --------------------------------------------------------------------

    def _endpoint(self, key: str) -> _Endpoint:
        state = self._endpoints.get(key)
        if state is None:
            state = self._endpoints[key] = _Endpoint()
        return state

    def _forget(self, keys: set[str], pairs: set[tuple[str, str]]) -> None:
        """Endpoints no longer probed here (removed, or owned by another replica)."""
        for key in [k for k in self._endpoints if k not in keys]:
            del self._endpoints[key]
            self.engines.pop(key, None)
        self._schedule.forget(keys)
        self._verifier.forget(pairs)

    def status(self) -> dict[str, Any]:
        clusters = sorted({key.split("/", 1)[0] for key in self._endpoints})
        return {
            **dataclasses.asdict(self._counters),
            "saturated_now": sum(1 for s in self._endpoints.values() if s.limit),
            # Each endpoint's /metrics is read at most this often (the configured interval,
            # stretched to fit MAX_METRICS_READS_PER_S across all endpoints).
            "metrics_min_interval_s": round(self._schedule.stretch, 3),
            "consensus": {name: self._verifier.status(name) for name in clusters},
            "endpoints": {
                key: _endpoint_status(key, s, self) for key, s in sorted(self._endpoints.items())
            },
        }

    def metrics(self) -> Iterator[Metric]:
        counters = self._counters
        yield counter(
            "llm_health_engines_checks_total",
            "Known-answer probe answers judged.",
            counters.checks_total,
        )
        yield counter(
            "llm_health_engines_garbage_total",
            "Known-answer verdicts: garbage (held UNHEALTHY at once).",
            counters.garbage_total,
        )
        yield counter(
            "llm_health_engines_misses_total", "Known-answer verdicts: miss.", counters.misses_total
        )
        yield counter(
            "llm_health_engines_passes_total", "Known-answer verdicts: pass.", counters.passes_total
        )
        yield counter(
            "llm_health_engines_metrics_reads_total",
            "Reads of the engines' /metrics.",
            counters.metrics_reads_total,
        )
        yield counter(
            "llm_health_engines_metrics_failures_total",
            "Engine /metrics reads that failed or did not parse (no verdict).",
            counters.metrics_failures_total,
        )
        yield counter(
            "llm_health_engines_metrics_overruns_total",
            "Engine /metrics reads refused for a document past a read's bounds (size, lines, "
            "labels: docs/engines.md); also counted as failures.",
            counters.metrics_overruns_total,
        )
        yield counter(
            "llm_health_engines_model_checks_total",
            "Served-model checks (GET /v1/models).",
            counters.model_checks_total,
        )
        yield counter(
            "llm_health_engines_model_failures_total",
            "Served-model checks that could not read the model list (no verdict).",
            counters.model_failures_total,
        )
        yield counter(
            "llm_health_engines_side_reads_deferred_total",
            "Times due side reads waited for a later tick: MAX_PENDING_READS were already "
            "running or waiting.",
            counters.side_reads_deferred_total,
        )
        yield gauge(
            "llm_health_engines_saturated_now",
            "Endpoints an engine threshold holds at DEGRADED now.",
            sum(1 for s in self._endpoints.values() if s.limit),
        )
        yield gauge(
            "llm_health_engines_metrics_min_interval_s",
            "Seconds between two reads of one endpoint's /metrics, at least (the interval, "
            "stretched to the read budget).",
            round(self._schedule.stretch, 3),
        )
        if self._endpoints:
            yield from _load_families(sorted(self._endpoints.items()), self.engines)


class _Queue:
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


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _load_families(
    endpoints: list[tuple[str, _Endpoint]], engines: Mapping[str, str]
) -> Iterator[Metric]:
    """The engines' own load as each endpoint's /metrics reports it (docs/design.md §14.3),
    and whether it counts as saturated: one series per endpoint checked here."""
    labels = ["cluster", "endpoint", "engine"]
    waiting = GaugeMetricFamily(
        "llm_health_engine_requests_waiting", "Requests the engine has queued.", labels=labels
    )
    running = GaugeMetricFamily(
        "llm_health_engine_requests_running", "Requests the engine is running.", labels=labels
    )
    kv_cache = GaugeMetricFamily(
        "llm_health_engine_kv_cache_usage", "KV cache used, 0 to 1.", labels=labels
    )
    saturated = GaugeMetricFamily(
        "llm_health_engine_saturated",
        "1 while a queue or KV-cache threshold holds the endpoint at DEGRADED.",
        labels=labels,
    )
    for key, state in endpoints:
        cluster, _, address = key.partition("/")
        names = [cluster, address, engines.get(key) or "unknown"]
        saturated.add_metric(names, 1 if state.limit else 0)
        load = state.reading.load
        if load is None:
            continue
        for family, value in (
            (waiting, load.waiting),
            (running, load.running),
            (kv_cache, load.kv_cache),
        ):
            if value is not None:
                family.add_metric(names, float(value))
    yield from (waiting, running, kv_cache, saturated)


def _endpoint_status(key: str, state: _Endpoint, checks: EngineChecks) -> dict[str, Any]:
    load: EngineLoad | None = state.reading.load
    return {
        "engine": checks.engines.get(key),
        "load": load.to_json() if load is not None else None,
        "metrics_failures": state.reading.failures,
        "metrics_error": state.reading.error,
        "saturated": state.limit,
        "last_answer": state.last_answer,
        "last_verdict": state.last_verdict,
        "served_models": list(state.models),
        "models_error": state.model_error,
    }


class _Asking:
    """``_KnownAnswer._asking`` while ``start_verify`` runs."""

    def cancel(self) -> None:
        return None


_ASKING = _Asking()


class _KnownAnswer:
    """One known-answer probe (started by ``EngineChecks.starter``, awaited by
    ``_verify``): asked through ``Prober.start_verify``, judged when its result comes,
    asked again after ``confirm_delay`` while a miss may still decide (at most
    ``unhealthy_after`` answers per slot), then its last result to the receiver. Driven by
    the answers' callbacks and one timer: no task, no coroutine frames held while the
    engine answers."""

    __slots__ = ("_asking", "_checks", "_left", "_prober", "_receiver", "_target", "_verify")

    def __init__(
        self,
        checks: EngineChecks,
        prober: Prober,
        target: ProbeTarget,
        verify: VerifyConfig,
        receiver: ProbeReceiver,
    ) -> None:
        self._checks = checks
        self._prober = prober
        self._target = target
        self._verify = verify
        self._receiver = receiver
        self._left = target.unhealthy_after - 1  # re-checks allowed in this slot
        self._asking: Started | asyncio.TimerHandle | _Asking | None = None
        checks._verify_begins(target, verify)
        self._ask()

    def _ask(self) -> None:
        self._asking = _ASKING
        started = self._prober.start_verify(self._target, self._verify, self)
        if self._asking is _ASKING:  # else its result came already, within the call
            self._asking = started

    # --- ProbeReceiver: what the known-answer probe in flight tells -------------------

    def set(self) -> None:
        self._receiver.set()  # each answer's first token: the scheduler's silence watch

    def done(self, result: ProbeResult) -> None:
        self._asking = None
        try:
            again = self._checks._judge(self._target, self._verify, result)
        except Exception as error:  # a bug of ours: the scheduler's to report
            self._receiver.failed(error)
            return
        if again and self._left > 0:
            self._left -= 1
            loop = asyncio.get_running_loop()
            self._asking = loop.call_later(self._target.confirm_delay_s, self._ask)
            return
        self._receiver.done(result)

    def failed(self, error: Exception) -> None:
        self._asking = None
        self._receiver.failed(error)

    # --- Started --------------------------------------------------------------------------

    def cancel(self) -> None:
        asking, self._asking = self._asking, None
        if asking is not None:
            asking.cancel()
