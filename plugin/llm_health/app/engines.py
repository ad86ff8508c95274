"""The engine checks component (docs/design.md §14): what a fast first token does not show.

- Known-answer probes: every ``verify.every`` one of an endpoint's scheduled probes is a
  known-answer probe (``MicroProbe.verify``; its TTFT counts as any probe's). The answer
  is judged (``probe.verify.Verifier``) before the result is folded in; garbage holds the
  endpoint UNHEALTHY at once, ``unhealthy_after`` misses (re-checked after
  ``confirm_delay``, inside the same slot) likewise; a passing answer lifts the hold. The
  hold is the board's "verify" signal, so recovery then takes the usual hysteresis.
- Served model: at start and every ``verify.every``, ``GET /v1/models``; a cluster with a
  ``model`` its endpoint does not list is held UNHEALTHY ("model" signal).
- Engine saturation: every ``engine_metrics.interval``, the engine's /metrics; a queue or
  KV cache at or over its threshold limits the endpoint to DEGRADED ("engine" limit).
  Reads that fail or do not parse are no verdict; after 3 in a row the last figures are
  dropped (a missing /metrics is not a dead engine).
- Engine detection for ``engine: auto`` (the probe body's cache bypass): from the
  metric names, else from /props (llama.cpp), /get_server_info (SGLang), /info (TGI),
  /version (vLLM), tried in that order at most every DETECT_RETRY_S.

Only endpoints this replica probes (fleet mode: owns) are checked; other replicas adopt
the owner's verdict. Everything runs on the runtime's loop; every request is bounded in
time and size, and nothing an endpoint answers can raise out of a loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llm_health.core.control import BoardControl
from llm_health.model.board import Board
from llm_health.model.causes import Cause
from llm_health.model.machine import Transition
from llm_health.model.outcome import ProbeResult
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.client import PROBE_HEADER, Prober
from llm_health.probe.engine_metrics import (
    MAX_DOCUMENT,
    EngineLoad,
    MetricsError,
    Reading,
    parse_load,
    saturation,
)
from llm_health.probe.target import ProbeTarget
from llm_health.probe.verify import Judgement, Verdict, Verifier

log = logging.getLogger("llm_health")
VERIFY_SIGNAL = "verify"
MODEL_SIGNAL = "model"
ENGINE_LIMIT = "engine"
ALL_SOURCES = frozenset({VERIFY_SIGNAL, MODEL_SIGNAL, ENGINE_LIMIT})
MODELS_EVERY_S = 30.0  # served-model check when verify is off
DETECT_RETRY_S = 30.0
MAX_SIDE_TIMEOUT_S = 2.0  # a /metrics or /v1/models request
MAX_MODELS_BODY = 1024 * 1024
MAX_CONCURRENT_READS = 64
MAX_TICK_S = 0.25
# /metrics reads a second, all endpoints together (docs/design.md §16.5). Reading and
# parsing one engine's document costs about 1-2 ms of the loop that also times the
# probes (prometheus-client's parser, ~60 µs a line); at 1 s per endpoint that alone would
# take a whole core at 1,000 endpoints. Beyond this budget each endpoint is read less
# often than ``engine_metrics.interval`` (the effective interval is in /status).
MAX_METRICS_READS_PER_S = 100.0
TTFT_HISTOGRAM_EVERY = 5  # reads: the TTFT histogram (most of the lines) every 5th read
DETECTION = (  # (path, engine, a key its JSON object has)
    ("/props", "llamacpp", "default_generation_settings"),
    ("/get_server_info", "sglang", None),
    ("/info", "tgi", "model_id"),
    ("/version", "vllm", "version"),
)
ProbeFn = Callable[[ProbeTarget], Coroutine[Any, Any, ProbeResult]]


@dataclass(slots=True)
class _Endpoint:
    """What the checks know of one endpoint (``/status`` shows it)."""

    reading: Reading = field(default_factory=Reading)
    reading_due: float | None = None  # None: not scheduled yet (placed by its phase)
    reads: int = 0
    limit: str | None = None  # the "engine" limit this component last set
    verify_due: float = 0.0  # monotonic; 0: the next probe is a known-answer probe
    last_answer: str | None = None
    last_verdict: str = ""
    models: tuple[str, ...] = ()
    model_error: str = ""
    model_due: float = 0.0
    detect_due: float = 0.0


@dataclass(slots=True)
class _Counters:
    checks_total: int = 0
    garbage_total: int = 0
    misses_total: int = 0
    passes_total: int = 0
    metrics_reads_total: int = 0
    metrics_failures_total: int = 0
    model_checks_total: int = 0
    model_failures_total: int = 0


class EngineChecks:
    """``set_targets``: the endpoints this replica probes, with their settings (called on
    every reload, discovery change and fleet ownership move). ``engines``: detected engine
    per endpoint key, shared with the ``MicroProbe`` that builds request bodies."""

    name = "engines"

    def __init__(
        self,
        control: BoardControl,
        targets: list[ProbeTarget],
        clock: Callable[[], float] = time.monotonic,
        on_load: Callable[[ProbeTarget, EngineLoad], None] | None = None,
    ) -> None:
        self._control = control
        self._on_load = on_load
        self._clock = clock
        self._targets: list[ProbeTarget] = []
        self._stretch = 0.0
        self._members: dict[str, set[str]] = {}
        self.engines: dict[str, str] = {}
        self._verifier = Verifier()
        self._endpoints: dict[str, _Endpoint] = {}
        self._counters = _Counters()
        self._reads: set[asyncio.Task[None]] = set()
        self.set_targets(targets)

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoints probed here changed. Verdicts this component set on endpoints it no
        longer checks (another replica owns them now, or a check was turned off) are
        released: a stale hold would outlive the check that set it."""
        released = [(t.cluster, t.address) for t in self._targets] if self._targets else []
        self._targets = targets
        self._stretch = sum(1 for t in targets if t.metrics is not None) / MAX_METRICS_READS_PER_S
        self._members = {}
        for target in targets:
            self._members.setdefault(target.cluster, set()).add(target.address)
        kept = {(t.cluster, t.address) for t in targets}
        stale = {key: ALL_SOURCES for key in released if key not in kept}
        stale.update({(t.cluster, t.address): _sources_off(t) for t in targets if _sources_off(t)})
        self._forget({t.key for t in targets}, kept)
        for target in targets:
            if target.metrics is None and target.key in self._endpoints:
                self._endpoints[target.key].limit = None
        if stale and _loop_running():  # no loop yet: nothing was set
            self._spawn(self._release(stale))

    async def _release(self, stale: dict[tuple[str, str], frozenset[str]]) -> None:
        def apply(board: Board, now: float) -> int:
            released = 0
            held = {
                (c.name, e.spec.address): (set(e.signals), set(e.limits))
                for c in board.snapshot().clusters.values()
                for e in c.endpoints
                if e.signals or e.limits
            }
            for key, sources in stale.items():
                signals, limits = held.get(key, (set(), set()))
                for source in sorted(sources & signals & {VERIFY_SIGNAL, MODEL_SIGNAL}):
                    board.set_signal(*key, source, None, now)
                    released += 1
                if ENGINE_LIMIT in sources and ENGINE_LIMIT in limits:
                    board.set_limit(*key, ENGINE_LIMIT, None, now)
                    released += 1
            return released

        await self._control.update(apply, publish_when=bool)

    # --- the probe path -----------------------------------------------------------------

    def wrap(self, prober: Prober) -> ProbeFn:
        """The scheduler's probe function: a known-answer probe when one is due, else the
        plain probe."""

        async def probe(target: ProbeTarget) -> ProbeResult:
            if not self._verify_due(target):
                return await prober.probe(target)
            return await self._verify(prober, target)

        return probe

    def _verify_due(self, target: ProbeTarget) -> bool:
        if target.verify is None:
            return False
        return self._clock() >= self._endpoint(target.key).verify_due

    async def _verify(self, prober: Prober, target: ProbeTarget) -> ProbeResult:
        """One known-answer probe, judged and applied; a miss that does not yet decide is
        re-checked after ``confirm_delay`` (at most ``unhealthy_after`` answers per slot)."""
        assert target.verify is not None
        state = self._endpoint(target.key)
        state.verify_due = self._clock() + target.verify.every_s
        result = await prober.verify(target)
        for _ in range(target.unhealthy_after - 1):
            if not await self._judge(target, result):
                return result
            await asyncio.sleep(target.confirm_delay_s)
            result = await prober.verify(target)
        await self._judge(target, result)
        return result

    async def _judge(self, target: ProbeTarget, result: ProbeResult) -> bool:
        """Judge ``result``'s answer and apply the verdicts; True if this endpoint's own
        answer asks for a re-check now."""
        if result.answer is None or target.verify is None:
            return False
        self._counters.checks_total += 1
        members = self._members.get(target.cluster, set())
        judgements = self._verifier.judge(
            target.cluster,
            target.address,
            result.answer,
            target.verify,
            target.unhealthy_after,
            self._clock(),
            members,
        )
        self._endpoint(target.key).last_answer = printable_line(result.answer.text, 200)
        await self._apply_judgements(target, judgements)
        return any(j.address == target.address and j.recheck for j in judgements)

    async def _apply_judgements(self, target: ProbeTarget, judgements: list[Judgement]) -> None:
        changes: dict[str, tuple[str | None, Cause]] = {}
        for judgement in judgements:
            self._count(judgement)
            key = f"{target.cluster}/{judgement.address}"
            self._endpoint(key).last_verdict = f"{judgement.verdict.value}: {judgement.reason}"
            if judgement.recheck and judgement.address != target.address:
                self._endpoint(key).verify_due = 0.0  # its next probe re-checks
            if judgement.down:
                cause = (
                    Cause.GARBAGE if judgement.verdict is Verdict.GARBAGE else Cause.WRONG_ANSWER
                )
                changes[judgement.address] = (judgement.reason, cause)
                log.warning(
                    "known-answer check failed",
                    extra={
                        "cluster": target.cluster,
                        "endpoint": judgement.address,
                        "reason": judgement.reason,
                    },
                )
            elif judgement.verdict is Verdict.PASS:
                changes[judgement.address] = (None, Cause.WRONG_ANSWER)
        await self._signal(target.cluster, VERIFY_SIGNAL, changes)

    def _count(self, judgement: Judgement) -> None:
        if judgement.verdict is Verdict.GARBAGE:
            self._counters.garbage_total += 1
        elif judgement.verdict is Verdict.MISS:
            self._counters.misses_total += 1
        elif judgement.verdict is Verdict.PASS:
            self._counters.passes_total += 1

    async def _signal(
        self, cluster: str, source: str, changes: dict[str, tuple[str | None, Cause]]
    ) -> None:
        """Set or clear ``source``'s signal on the endpoints in ``changes`` (only where it
        differs from the board's), one publish for the batch."""

        def apply(board: Board, now: float) -> dict[str, Transition]:
            # Only the endpoints in ``changes`` are looked at: a whole-cluster view per
            # known-answer probe was O(endpoints) each (docs/design.md §16.1).
            done: dict[str, Transition] = {}
            for address, (reason, cause) in changes.items():
                if not board.has_endpoint(cluster, address):
                    continue
                if board.signal(cluster, address, source) == reason:
                    continue
                done[address] = board.set_signal(cluster, address, source, reason, now, cause)
            return done

        applied = await self._control.update(apply, publish_when=bool)
        for address, transition in applied.items():
            if transition.changed or transition.alert:
                self._control.notify(cluster, address, transition, None)

    # --- side reads: /metrics, /v1/models, detection ------------------------------------

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        return [self._run]

    def register(self, server: Any) -> None:
        return None

    async def _run(self) -> None:
        limits = asyncio.Semaphore(MAX_CONCURRENT_READS)
        timeout = aiohttp.ClientTimeout(total=MAX_SIDE_TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=MAX_CONCURRENT_READS, enable_cleanup_closed=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False, auto_decompress=True
        ) as session:
            try:
                while True:
                    await self._tick(session, limits)
                    await asyncio.sleep(MAX_TICK_S)
            finally:
                for task in self._reads:
                    task.cancel()

    async def _tick(self, session: aiohttp.ClientSession, limits: asyncio.Semaphore) -> None:
        now = self._clock()
        stretch = self._metrics_stretch()
        for target in self._targets:
            state = self._endpoint(target.key)
            if target.metrics is not None:
                every = max(target.metrics.interval_s, stretch)
                if state.reading_due is None:  # first reads spread within the budget
                    spread = stretch if stretch > MAX_TICK_S else 0.0  # else all at once
                    state.reading_due = now + _phase(target.key) * spread
                if now >= state.reading_due:
                    state.reading_due = max(state.reading_due + every, now)
                    self._spawn(self._read_metrics(session, limits, target))
            if target.model and target.models_path and now >= state.model_due:
                every = target.verify.every_s if target.verify is not None else MODELS_EVERY_S
                state.model_due = now + every
                self._spawn(self._check_model(session, limits, target))
            if (
                target.engine == "auto"
                and target.key not in self.engines
                and now >= state.detect_due
            ):
                state.detect_due = now + DETECT_RETRY_S
                if target.metrics is None or state.reading.failures or state.reading.load:
                    self._spawn(self._detect(session, limits, target))

    def _metrics_stretch(self) -> float:
        """The shortest interval at which every endpoint's /metrics fits the budget
        (counted once per target change, not per tick)."""
        return self._stretch

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def _read_metrics(
        self, session: aiohttp.ClientSession, limits: asyncio.Semaphore, target: ProbeTarget
    ) -> None:
        assert target.metrics is not None
        state = self._endpoint(target.key)
        self._counters.metrics_reads_total += 1
        timeout = min(target.metrics.interval_s, MAX_SIDE_TIMEOUT_S)
        try:
            async with limits:
                status, body = await _get(
                    session, target, target.metrics.path, timeout, MAX_DOCUMENT
                )
            if status != 200:
                raise MetricsError(f"HTTP {status}")
            state.reads += 1
            with_ttft = state.reads % TTFT_HISTOGRAM_EVERY == 1
            load = parse_load(body.decode("utf-8", "replace"), ttft=with_ttft)
            state.reading = state.reading.read(load)
            if self._on_load is not None:
                self._on_load(target, load)
            if load.engine is not None and target.engine == "auto":
                self.engines[target.key] = load.engine
        except (
            MetricsError,
            aiohttp.ClientError,
            OSError,
            TimeoutError,
            UnicodeError,
            ValueError,
        ) as exc:
            self._counters.metrics_failures_total += 1
            state.reading = state.reading.failed(_side_error(exc, target))
        await self._apply_load(target, state)

    async def _apply_load(self, target: ProbeTarget, state: _Endpoint) -> None:
        assert target.metrics is not None
        load = state.reading.usable
        reason = (
            saturation(load, target.metrics.queue_threshold, target.metrics.kv_cache_threshold)
            if load is not None
            else None
        )
        if reason == state.limit:
            return
        state.limit = reason
        cluster, address = target.cluster, target.address

        def apply(board: Board, now: float) -> Transition | None:
            if not board.has_endpoint(cluster, address):
                return None
            return board.set_limit(cluster, address, ENGINE_LIMIT, reason, now, Cause.SATURATED)

        transition = await self._control.update(apply, publish_when=lambda t: t is not None)
        if transition is not None and (transition.changed or transition.alert):
            self._control.notify(cluster, address, transition, None)
        fields = {"cluster": cluster, "endpoint": address, "reason": reason or "normal again"}
        log.info("engine saturated" if reason else "engine load normal", extra=fields)

    async def _check_model(
        self, session: aiohttp.ClientSession, limits: asyncio.Semaphore, target: ProbeTarget
    ) -> None:
        assert target.model is not None and target.models_path is not None
        state = self._endpoint(target.key)
        self._counters.model_checks_total += 1
        try:
            async with limits:
                status, body = await _get(
                    session, target, target.models_path, MAX_SIDE_TIMEOUT_S, MAX_MODELS_BODY
                )
            if status != 200:
                raise ValueError(f"HTTP {status}")
            served = model_ids(json.loads(body))
        except (aiohttp.ClientError, OSError, TimeoutError, UnicodeError, ValueError) as exc:
            self._counters.model_failures_total += 1
            state.model_error = _side_error(exc, target)
            return  # no verdict: an endpoint that cannot list its models is not judged
        state.models, state.model_error = served, ""
        wrong = None
        if target.model not in served:
            listed = ", ".join(served[:5]) or "no model"
            wrong = printable_line(f"wrong model: serves {listed}, expected {target.model}", 300)
        await self._signal(
            target.cluster, MODEL_SIGNAL, {target.address: (wrong, Cause.WRONG_MODEL)}
        )

    async def _detect(
        self, session: aiohttp.ClientSession, limits: asyncio.Semaphore, target: ProbeTarget
    ) -> None:
        for path, engine, key in DETECTION:
            try:
                async with limits:
                    status, body = await _get(session, target, path, MAX_SIDE_TIMEOUT_S, 256 * 1024)
                if status != 200:
                    continue
                found = json.loads(body)
            except (aiohttp.ClientError, OSError, TimeoutError, UnicodeError, ValueError):
                continue
            if isinstance(found, dict) and (key is None or key in found):
                self.engines[target.key] = engine
                return

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
        self._verifier.forget(pairs)

    def status(self) -> dict[str, Any]:
        clusters = sorted({key.split("/", 1)[0] for key in self._endpoints})
        return {
            **dataclasses.asdict(self._counters),
            "saturated_now": sum(1 for s in self._endpoints.values() if s.limit),
            # Each endpoint's /metrics is read at most this often (the configured interval,
            # stretched to fit MAX_METRICS_READS_PER_S across all endpoints).
            "metrics_min_interval_s": round(self._metrics_stretch(), 3),
            "consensus": {name: self._verifier.status(name) for name in clusters},
            "endpoints": {
                key: _endpoint_status(key, s, self) for key, s in sorted(self._endpoints.items())
            },
        }


def _phase(key: str) -> float:
    """A stable place in [0, 1) for an endpoint: reads spread evenly, stay put."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _sources_off(target: ProbeTarget) -> frozenset[str]:
    """The verdict sources of checks now turned off for this endpoint."""
    off = set()
    if target.verify is None:
        off.add(VERIFY_SIGNAL)
    if not target.model or target.models_path is None:
        off.add(MODEL_SIGNAL)
    if target.metrics is None:
        off.add(ENGINE_LIMIT)
    return frozenset(off)


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


def model_ids(document: object) -> tuple[str, ...]:
    """The ids an OpenAI ``/v1/models`` answer lists (``data[].id``, and vLLM's ``root``
    for a served alias); ValueError if it is not that shape."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list (no data array)")
    ids: list[str] = []
    for entry in data[:100]:
        if isinstance(entry, dict):
            ids.extend(v for v in (entry.get("id"), entry.get("root")) if isinstance(v, str))
    return tuple(dict.fromkeys(i[:300] for i in ids))


async def _get(
    session: aiohttp.ClientSession, target: ProbeTarget, path: str, within_s: float, limit: int
) -> tuple[int, bytes]:
    """GET ``path`` on the endpoint with the probe's headers (its auth), bounded."""
    headers = {**target.headers, PROBE_HEADER: "true"}
    async with asyncio.timeout(within_s):
        async with session.get(target.base_url + path, headers=headers) as response:
            body = await response.content.read(limit)
            return response.status, body


def _side_error(exc: BaseException, target: ProbeTarget) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, MetricsError) else str(exc)
    return printable_line(redact_secrets(text, target.secrets), 200)
