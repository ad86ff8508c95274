"""``AgentSurface``: what ``llm-health agent`` answers the kubelet and its operators
(docs/agent.md): ``/startupz``, ``/readyz``, ``/livez`` (the engine container's probes),
``/healthz`` (the agent's own), ``/metrics`` and ``/status``.

Every answer is computed from memory by the pure rules of ``agent.signals``, on the loop
that also runs the prober, without waiting on the engine: what the engine did reaches this
component beforehand, through the board (``BoardControl``: the state machine's verdict,
each probe result) and through the engine checks' /metrics reads (``on_engine_load``:
the admission counter and the process start time). The overload rule (docs/design.md
§3.5) reaches the board through the same reads, as in ``serve``: one rule on both
sides. A watch task re-evaluates the restart rule every second, so that ``/livez``
turning 503 is counted and logged once, whether or not the kubelet asked at that
moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from llm_health import __version__
from llm_health.agent import signals
from llm_health.agent.settings import AgentSettings
from llm_health.core.component import Component, Job
from llm_health.core.control import BoardControl, ProberStats
from llm_health.core.families import counter, gauge
from llm_health.model.engine_load import EngineLoad
from llm_health.model.outcome import ProbeResult
from llm_health.model.states import EndpointKey, State
from llm_health.ops.endpoint_series import TTFT_BUCKETS_S, EndpointCounter, EndpointHistogram
from llm_health.ops.secret_scrubbing import Secrets
from llm_health.ops.status_document import status_document
from llm_health.probe.target import ProbeTarget

WATCH_S = 1.0  # how often the restart rule and the prober's progress are looked at
log = logging.getLogger("llm_health")


class AgentSurface:
    """The agent's answers for the one engine ``engine`` (cluster, address) on the board.
    ``stats``: the prober's counters (its progress is the agent's own health);
    ``stall_s``: how long without a probe result the prober counts as stalled;
    ``parts``: the other components, in /status and /metrics (the engine checks)."""

    name = "agent"

    def __init__(
        self,
        control: BoardControl,
        settings: AgentSettings,
        engine: EndpointKey,
        stats: ProberStats,
        *,
        stall_s: float,
        secrets: Secrets,
        parts: Sequence[Component] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._control = control
        self._settings = settings
        self._key = engine
        self._stats = stats
        self._stall_s = stall_s
        self._secrets = secrets
        self._parts = tuple(parts)
        self._clock = clock
        self._startup = signals.Startup()
        self._progress = signals.Progress()
        self.engine_generation = 0  # engine processes seen gone, started or not
        self.model: str | None = None  # the model the probe names (/status)
        self._live_ok = True
        self._restarts_signalled = 0
        self._results_seen = stats.probes_total
        self._last_result_at = clock()
        self._ttft = EndpointHistogram(
            "llm_health_probe_ttft_seconds",
            "Probe time to first token, seconds from the request start, per endpoint.",
            TTFT_BUCKETS_S,
        )
        self._outcomes = EndpointCounter(
            "llm_health_probes_total",
            "Probes by outcome (fast, slow, overloaded, timeout, fatal, error); probes ignored "
            "for loop lag are not counted here (llm_health_probes_ignored_loop_lag_total).",
            "outcome",
        )
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Families(self.families))
        ProcessCollector(registry=self._registry)
        control.on_probe(self._on_probe)

    # --- what the engine did (observers: on the loop, O(1)) -----------------------------

    def _on_probe(self, cluster: str, address: str, result: ProbeResult) -> None:
        if (cluster, address) != self._key:
            return
        self._outcomes.inc(self._key, result.outcome.value)
        if result.ttft_ms is not None:
            self._ttft.observe(self._key, result.ttft_ms / 1000)
        self._set_startup(signals.after_probe(self._startup, result, self._clock()))

    def on_engine_load(self, target: ProbeTarget, load: EngineLoad) -> None:
        """A read of the engine's /metrics (the engine checks' ``on_load``)."""
        if (target.cluster, target.address) != self._key:
            return
        self._progress = signals.after_count(self._progress, load.admitted, self._clock())
        self._set_startup(signals.after_metrics(self._startup, load.process_started))

    def _set_startup(self, startup: signals.Startup) -> None:
        before = self._startup
        self._startup = startup
        if startup.done and not before.done:
            log.info("engine started: first token", extra={"endpoint": self._key[1]})
        elif _gone(before, startup):
            self.engine_generation += 1
            if before.done:
                log.warning("engine gone: startup starts over", extra={"endpoint": self._key[1]})

    # --- the answers --------------------------------------------------------------------

    def engine(self) -> signals.Engine | None:
        """The board's verdict on the engine now (None: not on the board)."""
        found = self._control.endpoint_health(*self._key)
        if found is None:
            return None
        health, _last = found
        return signals.Engine(
            health.state, health.since, health.cause, health.reason, health.last_outcome
        )

    def startup(self) -> signals.Answer:
        return signals.startup_answer(self._startup, self._clock())

    def ready(self) -> signals.Answer:
        engine = self.engine()
        if engine is None:
            return signals.Answer(False, "unknown: the engine is not on the board")
        return signals.ready_answer(
            engine, self._settings.ready_when_degraded, started=self._startup.done
        )

    def live(self) -> signals.Answer:
        engine = self.engine()
        if engine is None:
            return signals.Answer(True, "live: the engine is not on the board")
        answer = signals.live_answer(
            engine, self._startup, self._progress, self._settings.restart_after, self._clock()
        )
        self._note_live(answer)
        return answer

    def healthz(self) -> signals.Answer:
        return signals.healthz_answer(self._last_result_at, self._clock(), self._stall_s)

    def _note_live(self, answer: signals.Answer) -> None:
        """Count and log each change of the restart signal once."""
        if answer.ok == self._live_ok:
            return
        self._live_ok = answer.ok
        fields = {"endpoint": self._key[1], "reason": answer.text}
        if not answer.ok:
            self._restarts_signalled += 1
            log.warning("engine restart signalled: /livez answers 503", extra=fields)
        else:
            log.info("engine restart signal withdrawn: /livez answers 200", extra=fields)

    # --- HTTP ---------------------------------------------------------------------------

    def http_app(self) -> web.Application:
        """The routes, for ``ops.http_server.start_http`` (its limits guard them)."""
        app = web.Application()
        for path, answer in (
            ("/startupz", self.startup),
            ("/readyz", self.ready),
            ("/livez", self.live),
            ("/healthz", self.healthz),
        ):
            app.router.add_get(path, self._answering(answer))
        app.router.add_get("/metrics", self._metrics_handler)
        app.router.add_get("/status", self._status_handler)
        return app

    def _answering(
        self, answer: Callable[[], signals.Answer]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_request: web.Request) -> web.Response:
            found = answer()
            text: str = self._secrets.scrub(found.text)
            return web.Response(status=found.status, text=text + "\n", headers=_NO_STORE)

        return handler

    async def _metrics_handler(self, _request: web.Request) -> web.Response:
        body, content_type = self.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type, **_NO_STORE})

    async def _status_handler(self, _request: web.Request) -> web.Response:
        return web.json_response(self.document(), dumps=_dumps, headers=_NO_STORE)

    # --- the component ------------------------------------------------------------------

    def register(self, server: Any) -> None:
        return None

    def tasks(self) -> list[Job]:
        return [self._watch]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            self.watch_once()

    def watch_once(self) -> None:
        """The restart rule (counted on change) and the prober's progress, now."""
        if self._stats.probes_total != self._results_seen:
            self._results_seen = self._stats.probes_total
            self._last_result_at = self._clock()
        self.live()

    def status(self) -> dict[str, Any]:
        """The agent's part of /status: each path's answer, and what the rules read."""
        now, startup, progress = self._clock(), self._startup, self._progress
        return {
            "engine": self._key[1],
            "model": self.model,
            "answers": {name: _answer_json(answer) for name, answer in self._answers()},
            "settings": {
                "ready_when_degraded": self._settings.ready_when_degraded,
                "restart_after_s": self._settings.restart_after,
            },
            "startup": {
                "first_token_s_ago": _ago(now, startup.first_token_at),
                "process_started": startup.process_started,
                "engine_restarts": startup.restarts,
            },
            "progress": {
                "admitted": progress.count,
                "moved_s_ago": _ago(now, progress.moved_at),
            },
            "restarts_signalled": self._restarts_signalled,
        }

    def document(self) -> dict[str, Any]:
        """/status: the board, the agent, the prober and the other parts; scrubbed of
        secrets (a reason may quote what the engine answered)."""
        stats = self._stats
        extra = {
            "agent": self.status(),
            "prober": {
                "probes_total": stats.probes_total,
                "probes_ignored_loop_lag": stats.probes_ignored_loop_lag,
                "silences_ignored_loop_lag": stats.silences_ignored_loop_lag,
                "overlapping_confirms": stats.overlapping_confirms,
                "loop_lag_ms": round(stats.lag.current_ms, 2),
            },
            **{part.name: part.status() for part in self._parts},
        }
        document: dict[str, Any] = self._secrets.scrub(
            status_document(self._control.snapshot(), extra)
        )
        return document

    def _answers(self) -> list[tuple[str, signals.Answer]]:
        return [
            ("startup", self.startup()),
            ("ready", self.ready()),
            ("live", self.live()),
            ("healthz", self.healthz()),
        ]

    def metrics(self) -> Iterator[Metric]:
        answers = GaugeMetricFamily(
            "llm_health_agent_signal_ok",
            "1 while the path answers 200 (startup: /startupz, ready: /readyz, live: /livez, "
            "healthz: /healthz), else 0.",
            labels=["signal"],
        )
        for name, answer in self._answers():
            answers.add_metric([name], float(answer.ok))
        yield answers
        engine = self.engine()
        state = GaugeMetricFamily(
            "llm_health_agent_engine_state",
            "1 for the engine's state now (the state machine's verdict), 0 for the others.",
            labels=["state"],
        )
        for candidate in State:
            state.add_metric(
                [candidate.value], float(engine is not None and engine.state is candidate)
            )
        yield state
        yield counter(
            "llm_health_agent_restarts_signalled_total",
            "Times /livez turned 503: a restart of the engine container asked of the kubelet.",
            self._restarts_signalled,
        )
        yield counter(
            "llm_health_agent_engine_restarts_total",
            "Engine processes seen gone (connection refused) or replaced (a new "
            "process_start_time_seconds) after their first token.",
            self._startup.restarts,
        )
        yield gauge(
            "llm_health_loop_lag_seconds",
            "How late the prober's event loop runs now (its TTFTs include this).",
            self._stats.lag.current_ms / 1000,
        )
        yield counter(
            "llm_health_probes_completed_total", "Probe results received.", self._stats.probes_total
        )
        yield counter(
            "llm_health_probes_ignored_loop_lag_total",
            "SLOW/TIMEOUT verdicts ignored because the prober's loop lagged (max_loop_lag).",
            self._stats.probes_ignored_loop_lag,
        )
        info = GaugeMetricFamily(
            "llm_health_build_info", "Always 1; the version.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info

    def families(self) -> Iterator[Metric]:
        """These families and the parts', read at every scrape."""
        yield from self.metrics()
        for part in self._parts:
            yield from part.metrics()

    def exposition(self) -> tuple[bytes, str]:
        """The /metrics body: these families, the parts', the process's, and the probe's
        per-endpoint series. Small (one engine): rendered on the loop, in about a
        millisecond."""
        out: list[str] = []
        self._ttft.render(out)
        self._outcomes.render(out)
        return generate_latest(self._registry) + "".join(out).encode(), CONTENT_TYPE_LATEST


class _Families(Collector):
    """Families read at every scrape."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families()


def _gone(before: signals.Startup, after: signals.Startup) -> bool:
    """The engine process was seen gone (or replaced) between the two."""
    return after.first_token_at is None and (
        before.done
        or (before.process_started is not None and after.process_started != before.process_started)
    )


def _answer_json(answer: signals.Answer) -> dict[str, Any]:
    return {"status": answer.status, "text": answer.text}


def _ago(now: float, at: float | None) -> float | None:
    return None if at is None else round(now - at, 3)


_NO_STORE = {"Cache-Control": "no-store"}


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2)
