"""The kubelet's rules (pure: typed inputs, one decision each, the clock passed in;
docs/agent.md). What each path of ``llm-health agent`` answers:

- **startup** (``/startupz``): 503 until the engine produced a first token through the
  probe (the model is loaded and the inference path works), then 200 until the engine
  process is gone: a probe refused before any connection (nothing listens on its port
  in the pod), or a new ``process_start_time_seconds`` in its /metrics. Then it starts
  over, as the kubelet runs the startup probe again for a restarted container. A hung
  engine that still accepts connections does not reset it.
- **ready** (``/readyz``): the state machine's verdict, the gateway side's (docs/design.md
  §3): HEALTHY, and DEGRADED unless ``agent.ready_when_degraded`` is false; DEGRADED by
  load (the last probe OVERLOADED: the engine said so, or it waited behind a queue the
  engine demonstrably admits from, docs/design.md §3.5; or the engine's own queue or KV
  cache over its threshold, cause SATURATED) always: under a traffic peak
  every pod queues at once, and taking them out of their Service one by one would send
  the whole peak to the last ones standing. Never while the startup rule says the engine
  has not (re)started.
- **live** (``/livez``): the restart signal for the engine's container. 503 only once
  the engine has been UNHEALTHY without a break for ``agent.restart_after``, for a cause
  a restart can cure: a fatal engine error, or timeouts while the engine's own admission
  counter (``Progress``: new requests prefilled) did not move. Decode and completions are
  no progress here: in a scheduler deadlock running requests finish while none starts. Never while starting, never for SLOW, OVERLOADED,
  DEGRADED or any other cause: liveness asks "is the process alive", and restarting a
  slow GPU only makes it slower.
- **healthz** (``/healthz``): the agent's own loop and prober are alive: a probe result
  came within ``stall_bound``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.states import State

CURABLE_CAUSES = frozenset({Cause.FATAL, Cause.TIMEOUT})
CURABLE_OUTCOMES = frozenset({Outcome.FATAL, Outcome.TIMEOUT})
# DEGRADED for load: Ready whatever ``ready_when_degraded`` says (docs/design.md §3.5).
LOAD_CAUSES = frozenset({Cause.OVERLOADED, Cause.SATURATED})
MIN_STALL_S = 10.0


@dataclass(frozen=True, slots=True)
class Answer:
    """One path's answer: 200 or 503, and its one-line body."""

    ok: bool
    text: str

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


@dataclass(frozen=True, slots=True)
class Startup:
    """What the startup rule knows. ``first_token_at``: when the engine's first token came
    (monotonic), None since the engine (re)started; ``process_started``: the engine's
    ``process_start_time_seconds`` last read (None: unknown, or the process is gone);
    ``restarts``: engine processes seen gone after they had started."""

    first_token_at: float | None = None
    process_started: float | None = None
    restarts: int = 0

    @property
    def done(self) -> bool:
        return self.first_token_at is not None


def refused(result: ProbeResult) -> bool:
    """The probe failed before a connection was made: in the pod, on loopback, nothing
    listens on the engine's port (a connection that is only slow ends as TIMEOUT)."""
    return result.outcome is Outcome.ERROR and result.connect_ms is None


def after_probe(startup: Startup, result: ProbeResult, now: float) -> Startup:
    """A probe result: a first token (FAST, SLOW, a known-answer probe's) completes the
    startup; a refused probe means the engine process is gone."""
    if result.ttft_ms is not None:
        return startup if startup.done else replace(startup, first_token_at=now)
    if refused(result):
        return _gone(startup, process_started=None)
    return startup


def after_metrics(startup: Startup, process_started: float | None) -> Startup:
    """A read of the engine's /metrics: a start time other than the one last read is a
    new process (restarted between two probes). None (not exported): no news."""
    if process_started is None:
        return startup
    known = startup.process_started
    if known is not None and process_started != known:
        return _gone(startup, process_started=process_started)
    return replace(startup, process_started=process_started)


def _gone(startup: Startup, *, process_started: float | None) -> Startup:
    """The engine process is gone: startup starts over. The start time is forgotten when
    nothing answers (the next process's first read is its baseline, not a restart)."""
    restarts = startup.restarts + 1 if startup.done else startup.restarts
    return Startup(None, process_started, restarts)


def startup_answer(startup: Startup, now: float) -> Answer:
    if startup.first_token_at is None:
        return Answer(False, "starting: no first token from the engine yet")
    return Answer(True, f"started: first token {now - startup.first_token_at:.0f} s ago")


@dataclass(frozen=True, slots=True)
class Engine:
    """What the board says of the engine now: its state, since when (monotonic, the
    board's clock), why (``cause``, and ``reason`` in words) and the last probe's outcome."""

    state: State
    since: float
    cause: Cause
    reason: str
    last_outcome: Outcome | None = None


def ready(
    state: State,
    ready_when_degraded: bool,
    last: Outcome | None = None,
    cause: Cause | None = None,
) -> bool:
    """HEALTHY is ready; DEGRADED too unless ``ready_when_degraded`` is false, and always
    when it is load, not health (docs/design.md §3.5): the last probe OVERLOADED, or the
    state's cause OVERLOADED or SATURATED (the engine's own queue or KV cache)."""
    if state is State.HEALTHY:
        return True
    load = last is Outcome.OVERLOADED or cause in LOAD_CAUSES
    return state is State.DEGRADED and (ready_when_degraded or load)


def ready_answer(engine: Engine, ready_when_degraded: bool, started: bool = True) -> Answer:
    """The body is the state and the board's reason, e.g. ``unhealthy: 2 consecutive
    timeouts (>800 ms)``, always. Never ready while the engine has not started
    (``started``: the startup rule's): a process seen gone is not ready, whatever its
    last verdict (/startupz then says why)."""
    text = f"{engine.state.value}: {engine.reason}"
    verdict = ready(engine.state, ready_when_degraded, engine.last_outcome, engine.cause)
    return Answer(started and verdict, text)


@dataclass(frozen=True, slots=True)
class Progress:
    """The engine's admission counter (``EngineLoad.admitted``) as last read (None: not
    exported, or no read yet), and when it last moved (monotonic; None: not seen
    moving)."""

    count: float | None = None
    moved_at: float | None = None


def after_count(progress: Progress, count: float | None, now: float) -> Progress:
    """A read of the counter. The first value is a baseline, not progress; any change
    after it is (a decrease too: the counter was reset, the engine did something)."""
    if count is None or progress.count is None:
        return Progress(count, progress.moved_at)
    if count != progress.count:
        return Progress(count, now)
    return progress


def curable(engine: Engine) -> Outcome | None:
    """What a restart could cure, by the cause of the state and the last probe: FATAL (a
    dead GPU or engine core) or TIMEOUT (a hang); None for anything else."""
    if engine.cause not in CURABLE_CAUSES or engine.last_outcome not in CURABLE_OUTCOMES:
        return None
    return engine.last_outcome


def live_answer(
    engine: Engine,
    startup: Startup,
    progress: Progress,
    restart_after: float | None,
    now: float,
) -> Answer:
    """The restart rule (module docstring). The wait runs from the latest of: the start of
    the UNHEALTHY stretch, the engine's first token (a restarted engine gets the whole
    wait again) and, for timeouts, the last move of the admission counter."""
    if restart_after is None:
        return Answer(True, "live: restarts are off (agent.restart_after: null)")
    if startup.first_token_at is None:
        return Answer(True, "live: starting")
    if engine.state is not State.UNHEALTHY:
        return Answer(True, f"live: {engine.state.value}")
    kind = curable(engine)
    if kind is None:
        return Answer(True, f"live: unhealthy ({engine.cause.value}): a restart would not cure it")
    quiet_since = max(engine.since, startup.first_token_at)
    if kind is Outcome.TIMEOUT and progress.moved_at is not None:
        quiet_since = max(quiet_since, progress.moved_at)
    waited = now - quiet_since
    if waited < restart_after:
        return Answer(
            True, f"live: unhealthy ({kind.value}) for {waited:.1f} s of {restart_after:g} s"
        )
    return Answer(False, f"restart: unhealthy ({kind.value}) for {waited:.1f} s: {engine.reason}")


def stall_bound(interval_s: float, timeout_s: float, unhealthy_after: int) -> float:
    """How long the prober may go without a result and still be alive: three of its
    longest rounds (a known-answer probe and its re-checks: ``unhealthy_after`` answers,
    each up to twice the timeout), at least MIN_STALL_S."""
    return max(MIN_STALL_S, 3 * (interval_s + 2 * timeout_s * unhealthy_after))


def healthz_answer(last_result_at: float, now: float, stall_s: float) -> Answer:
    """The agent itself: its loop answers (this is computed on it) and its prober
    delivered a result within ``stall_s`` (since the start, before the first)."""
    quiet = now - last_result_at
    if quiet > stall_s:
        return Answer(False, f"prober stalled: no probe result for {quiet:.0f} s")
    return Answer(True, "ok")
