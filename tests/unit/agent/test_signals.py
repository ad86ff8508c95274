"""The kubelet's rules of ``llm-health agent`` (``agent.signals``; docs/agent.md).

Tables of cases, each row with its own expected answer (so every row can fail on its
own), event sequences for the startup rule, an oracle for the restart rule (the rule
restated as "is there an instant in the window that resets the wait", checked against
``live_answer`` over a grid of inputs), and the rules driven by the real state machine:
no sequence of SLOW, OVERLOADED and FAST probes ever turns /livez 503.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.agent import signals
from llm_health.agent.signals import Engine, Progress, Startup
from llm_health.model.causes import Cause
from llm_health.model.machine import initial_health, step
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State

T0 = 1000.0  # the fake monotonic clock starts here (not 0, so "since" bugs show)
RESTART = 300.0


def token(ttft_ms: float = 40.0, outcome: Outcome = Outcome.FAST) -> ProbeResult:
    return ProbeResult(outcome, 0.0, ttft_ms=ttft_ms, connect_ms=0.2, headers_ms=1.0)


REFUSED = ProbeResult(Outcome.ERROR, 0.0, detail="connect failed: Connect call failed")
HUNG = ProbeResult(Outcome.TIMEOUT, 0.0, connect_ms=0.2, detail="no response headers")
HUNG_NO_CONNECT = ProbeResult(Outcome.TIMEOUT, 0.0, detail="no connection within 800 ms")
HTTP_500 = ProbeResult(Outcome.ERROR, 0.0, connect_ms=0.2, headers_ms=1.0, status=500)
FATAL = ProbeResult(Outcome.FATAL, 0.0, connect_ms=0.2, headers_ms=1.0, status=500)
OVERLOADED = ProbeResult(Outcome.OVERLOADED, 0.0, connect_ms=0.2, headers_ms=1.0, status=429)
CUT_AFTER_HEADERS = ProbeResult(Outcome.ERROR, 0.0, connect_ms=0.2, headers_ms=1.0)


# --- startup ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "refused"),
    [
        (REFUSED, True),
        (HUNG, False),  # a hung engine still accepts connections
        (HUNG_NO_CONNECT, False),  # a full backlog: slow, not gone
        (HTTP_500, False),
        (FATAL, False),
        (OVERLOADED, False),
        (CUT_AFTER_HEADERS, False),
        (token(), False),
    ],
)
def test_only_a_probe_failing_before_any_connection_is_refused(
    result: ProbeResult, refused: bool
) -> None:
    assert signals.refused(result) is refused


# Events: "tok" a probe with a first token, "slow" a SLOW one, "ref" a refused probe,
# "hang" a timeout, "500" an HTTP error, "m:<n>" a /metrics read with process start n,
# "m:-" a read without one. Expected /startupz after each event (True: 200).
STARTUP_SEQUENCES = [
    ("first token", ["tok"], [True]),
    ("a slow token counts", ["slow"], [True]),
    ("refused while loading", ["ref", "ref", "tok"], [False, False, True]),
    ("errors before the first token", ["500", "hang", "tok", "500"], [False, False, True, True]),
    ("a hang never resets", ["tok", "hang", "hang", "hang"], [True, True, True, True]),
    ("gone, then back", ["tok", "ref", "ref", "tok"], [True, False, False, True]),
    ("same process", ["m:1", "tok", "m:1", "m:1"], [False, True, True, True]),
    ("a new process between probes", ["m:1", "tok", "m:2", "tok"], [False, True, False, True]),
    ("no start time: no news", ["tok", "m:-", "m:-"], [True, True, True]),
    ("first read is a baseline", ["tok", "m:5"], [True, True]),
    (
        "after refused, the next process's first read is its baseline",
        ["m:1", "tok", "ref", "m:2", "tok", "m:2"],
        [False, True, False, False, True, True],
    ),
]


def _fold(startup: Startup, event: str, now: float) -> Startup:
    if event.startswith("m:"):
        value = None if event == "m:-" else float(event[2:])
        return signals.after_metrics(startup, value)
    result = {
        "tok": token(),
        "slow": token(450.0, Outcome.SLOW),
        "ref": REFUSED,
        "hang": HUNG,
        "500": HTTP_500,
    }[event]
    return signals.after_probe(startup, result, now)


@pytest.mark.parametrize(
    ("events", "expected"),
    [pytest.param(e, x, id=name) for name, e, x in STARTUP_SEQUENCES],
)
def test_startup_follows_the_engine_process(events: list[str], expected: list[bool]) -> None:
    startup = Startup()
    seen = []
    for index, event in enumerate(events):
        now = T0 + index
        startup = _fold(startup, event, now)
        answer = signals.startup_answer(startup, now)
        assert answer.status == (200 if answer.ok else 503)
        seen.append(answer.ok)
    assert seen == expected


def test_restarts_count_engines_gone_after_their_first_token() -> None:
    startup = Startup()
    for event in ["ref", "ref", "tok", "ref", "ref", "tok", "m:1", "m:2", "tok", "ref"]:
        startup = _fold(startup, event, T0)
    # gone after a token: ref (3rd event's engine), m:2 (a new process), ref (the last)
    assert startup.restarts == 3


def test_the_first_token_time_is_kept_while_tokens_keep_coming() -> None:
    startup = signals.after_probe(Startup(), token(), T0)
    startup = signals.after_probe(startup, token(), T0 + 50)
    assert startup.first_token_at == T0
    assert signals.startup_answer(startup, T0 + 50).text == "started: first token 50 s ago"
    assert signals.startup_answer(Startup(), T0).text == (
        "starting: no first token from the engine yet"
    )


# --- ready --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "when_degraded", "ready"),
    [
        (State.HEALTHY, True, True),
        (State.HEALTHY, False, True),
        (State.DEGRADED, True, True),
        (State.DEGRADED, False, False),
        (State.UNHEALTHY, True, False),
        (State.UNHEALTHY, False, False),
        (State.STARTING, True, False),
        (State.DRAINING, True, False),
    ],
)
def test_ready_is_the_state_machines_verdict(
    state: State, when_degraded: bool, ready: bool
) -> None:
    assert signals.ready(state, when_degraded) is ready
    engine = Engine(state, T0, Cause.OTHER, "why")
    answer = signals.ready_answer(engine, when_degraded)
    assert (answer.ok, answer.status) == (ready, 200 if ready else 503)


@pytest.mark.parametrize(
    ("state", "last", "ready"),
    [
        (State.DEGRADED, Outcome.OVERLOADED, True),  # load, not health (docs/design.md §3.5)
        (State.DEGRADED, Outcome.TIMEOUT, False),
        (State.DEGRADED, Outcome.SLOW, False),
        (State.UNHEALTHY, Outcome.OVERLOADED, False),
        (State.STARTING, Outcome.OVERLOADED, False),
    ],
)
def test_overloaded_is_ready_even_when_degraded_is_not(
    state: State, last: Outcome, ready: bool
) -> None:
    """``agent.ready_when_degraded: false`` takes DEGRADED pods out, but never for load:
    under a peak every pod queues at once (the readiness snowball)."""
    assert signals.ready(state, False, last) is ready
    engine = Engine(state, T0, Cause.TIMEOUT, "overloaded: timed out behind a queue", last)
    assert signals.ready_answer(engine, False).ok is ready


@pytest.mark.parametrize(
    ("cause", "ready"),
    [
        (Cause.OVERLOADED, True),
        (Cause.SATURATED, True),  # the engine's own queue: load as well
        (Cause.SLOW, False),
        (Cause.SILENT, False),
        (Cause.QUALITY, False),
        (Cause.TIMEOUT, False),
    ],
)
def test_degraded_for_load_is_ready_by_its_cause(cause: Cause, ready: bool) -> None:
    engine = Engine(State.DEGRADED, T0, cause, "why", Outcome.FAST)
    assert signals.ready_answer(engine, False).ok is ready


def test_ready_body_is_state_then_reason() -> None:
    engine = Engine(State.UNHEALTHY, T0, Cause.TIMEOUT, "2 consecutive timeouts (>800 ms)")
    assert signals.ready_answer(engine, True).text == (
        "unhealthy: 2 consecutive timeouts (>800 ms)"
    )


# --- progress -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reads", "moved_at"),
    [
        ([5.0], None),  # a baseline is not progress
        ([5.0, 5.0, 5.0], None),
        ([5.0, 6.0], T0 + 1),
        ([5.0, 6.0, 6.0], T0 + 1),
        ([5.0, 6.0, 7.0], T0 + 2),
        ([9.0, 0.0], T0 + 1),  # reset (engine restarted): it did something
        ([None, 5.0], None),  # the first value after none is a baseline
        ([5.0, None, 5.0], None),
        ([5.0, 6.0, None, None], T0 + 1),  # reads without the counter keep the last move
        ([5.0, None, 6.0], None),  # a baseline again after a read without it
    ],
)
def test_the_completion_counter_moves(reads: list[float | None], moved_at: float | None) -> None:
    progress = Progress()
    for index, count in enumerate(reads):
        progress = signals.after_count(progress, count, T0 + index)
    assert progress.moved_at == moved_at
    assert progress.count == reads[-1]


# --- live ---------------------------------------------------------------------------------

STARTED = Startup(first_token_at=T0 - 1000)


def unhealthy(cause: Cause, last: Outcome | None, since: float = T0) -> Engine:
    return Engine(State.UNHEALTHY, since, cause, "2 consecutive timeouts (>800 ms)", last)


LIVE_CASES = [
    # (name, engine, startup, progress, restart_after, now - T0, live)
    (
        "hang, not yet",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        299.9,
        True,
    ),
    (
        "hang, long enough",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        300.0,
        False,
    ),
    (
        "fatal, long enough",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        STARTED,
        Progress(),
        RESTART,
        300.0,
        False,
    ),
    (
        "fatal, not yet",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        STARTED,
        Progress(),
        RESTART,
        10.0,
        True,
    ),
    (
        "fatal then hung",
        unhealthy(Cause.FATAL, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        301.0,
        False,
    ),
    (
        "hung then fatal",
        unhealthy(Cause.TIMEOUT, Outcome.FATAL),
        STARTED,
        Progress(),
        RESTART,
        301.0,
        False,
    ),
    ("restarts off", unhealthy(Cause.FATAL, Outcome.FATAL), STARTED, Progress(), None, 1e6, True),
    (
        "never before the first token",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        Startup(),
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "errors are not cured",
        unhealthy(Cause.ERROR, Outcome.ERROR),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "timeouts now erroring",
        unhealthy(Cause.TIMEOUT, Outcome.ERROR),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "garbage tokens",
        unhealthy(Cause.GARBAGE, Outcome.FAST),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "wrong model",
        unhealthy(Cause.WRONG_MODEL, Outcome.FAST),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "wrong answer",
        unhealthy(Cause.WRONG_ANSWER, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "held by a signal",
        unhealthy(Cause.SIGNAL, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "startup timeout",
        unhealthy(Cause.STARTUP_TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "slow",
        Engine(State.DEGRADED, T0, Cause.SLOW, "slow", Outcome.SLOW),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "overloaded",
        Engine(State.DEGRADED, T0, Cause.OVERLOADED, "429", Outcome.OVERLOADED),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "degraded by a timeout",
        Engine(State.DEGRADED, T0, Cause.TIMEOUT, "t", Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "saturated",
        Engine(State.DEGRADED, T0, Cause.SATURATED, "12 waiting", Outcome.FAST),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "starting",
        Engine(State.STARTING, T0, Cause.STARTUP, "s", Outcome.TIMEOUT),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "healthy",
        Engine(State.HEALTHY, T0, Cause.RECOVERED, "ok", Outcome.FAST),
        STARTED,
        Progress(),
        RESTART,
        1e6,
        True,
    ),
    (
        "hung, but requests complete",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(7.0, T0 + 200),
        RESTART,
        300.0,
        True,
    ),
    (
        "hung, completions stopped long ago",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(7.0, T0 + 200),
        RESTART,
        500.0,
        False,
    ),
    (
        "completions before the hang do not count",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(7.0, T0 - 50),
        RESTART,
        300.0,
        False,
    ),
    (
        "fatal ignores completions",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        STARTED,
        Progress(7.0, T0 + 200),
        RESTART,
        300.0,
        False,
    ),
    (
        "a restarted engine gets the whole wait",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        Startup(T0 + 100),
        Progress(),
        RESTART,
        300.0,
        True,
    ),
    (
        "... and no more",
        unhealthy(Cause.FATAL, Outcome.FATAL),
        Startup(T0 + 100),
        Progress(),
        RESTART,
        400.0,
        False,
    ),
    (
        "short restart_after",
        unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT),
        STARTED,
        Progress(),
        2.0,
        2.0,
        False,
    ),
]


@pytest.mark.parametrize(
    ("engine", "startup", "progress", "restart_after", "after", "live"),
    [pytest.param(*case[1:], id=case[0]) for case in LIVE_CASES],
)
def test_live_restarts_only_a_curable_engine_after_restart_after(
    engine: Engine,
    startup: Startup,
    progress: Progress,
    restart_after: float | None,
    after: float,
    live: bool,
) -> None:
    answer = signals.live_answer(engine, startup, progress, restart_after, T0 + after)
    assert (answer.ok, answer.status) == (live, 200 if live else 503)
    assert answer.text.startswith("live: " if live else "restart: ")


def test_the_restart_answer_says_why() -> None:
    engine = unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT)
    answer = signals.live_answer(engine, STARTED, Progress(), 2.0, T0 + 2.5)
    assert answer.text == "restart: unhealthy (timeout) for 2.5 s: 2 consecutive timeouts (>800 ms)"
    waiting = signals.live_answer(engine, STARTED, Progress(), 2.0, T0 + 0.5)
    assert waiting.text == "live: unhealthy (timeout) for 0.5 s of 2 s"


def _oracle_live(
    engine: Engine, startup: Startup, progress: Progress, restart_after: float | None, now: float
) -> bool:
    """The restart rule restated: restart iff restarts are on, the engine has started,
    it is UNHEALTHY for a curable cause (the state's cause and the last probe both FATAL
    or TIMEOUT), and no instant in the last ``restart_after`` seconds resets the wait: the
    start of the UNHEALTHY stretch, the first token, or (a hang, not a fatal error) a
    move of the completion counter."""
    if restart_after is None or startup.first_token_at is None:
        return True
    if engine.state is not State.UNHEALTHY:
        return True
    if engine.cause not in (Cause.FATAL, Cause.TIMEOUT):
        return True
    if engine.last_outcome not in (Outcome.FATAL, Outcome.TIMEOUT):
        return True
    resets = [engine.since, startup.first_token_at]
    if engine.last_outcome is Outcome.TIMEOUT and progress.moved_at is not None:
        resets.append(progress.moved_at)
    window_start = now - restart_after
    return any(instant > window_start for instant in resets)


def test_live_agrees_with_the_oracle_over_a_grid() -> None:
    states = [State.UNHEALTHY, State.DEGRADED, State.HEALTHY, State.STARTING]
    causes = [Cause.FATAL, Cause.TIMEOUT, Cause.ERROR, Cause.SLOW, Cause.GARBAGE]
    outcomes = [Outcome.FATAL, Outcome.TIMEOUT, Outcome.ERROR, Outcome.FAST, None]
    times = [T0 - 500, T0, T0 + 150, T0 + 299, T0 + 301]
    startups = [Startup(), Startup(T0 - 10), Startup(T0 + 150)]
    progresses = [Progress(), Progress(1.0, None), Progress(3.0, T0 + 100), Progress(3.0, T0 + 250)]
    checked = disagreements = 0
    for state, cause, last, since, startup, progress, restart_after, now in itertools.product(
        states, causes, outcomes, times[:3], startups, progresses, [RESTART, 2.0, None], times
    ):
        if now < since:
            continue
        engine = Engine(state, since, cause, "r", last)
        got = signals.live_answer(engine, startup, progress, restart_after, now).ok
        checked += 1
        disagreements += got != _oracle_live(engine, startup, progress, restart_after, now)
    assert checked > 10_000 and disagreements == 0


def test_the_oracle_can_disagree() -> None:
    """The oracle is not the function again: a rule change it does not share shows."""
    engine = unhealthy(Cause.TIMEOUT, Outcome.TIMEOUT)
    moved = Progress(3.0, T0 + 250)
    assert _oracle_live(engine, STARTED, moved, RESTART, T0 + 320) is True
    ignoring_progress = signals.live_answer(engine, STARTED, Progress(), RESTART, T0 + 320).ok
    assert ignoring_progress is False


# --- the rules driven by the real state machine -------------------------------------------

POLICY = Policy(healthy_ttft_s=0.2, timeout_s=0.8, healthy_after=3, unhealthy_after=2)
RESULTS = {
    "F": token(),
    "S": token(450.0, Outcome.SLOW),
    "O": OVERLOADED,
    "T": HUNG,
    "X": FATAL,
    "E": HTTP_500,
}


def _drive(codes: str, gap: float, restart_after: float) -> list[signals.Answer]:
    """Each code one probe ``gap`` seconds apart, folded by the machine; /livez after each."""
    health = initial_health(T0, POLICY, known_at_boot=True)
    startup = Startup()
    answers = []
    for index, code in enumerate(codes):
        now = T0 + index * gap
        result = RESULTS[code]
        health = step(health, result, now, POLICY).after
        startup = signals.after_probe(startup, result, now)
        engine = Engine(
            health.state, health.since, health.cause, health.reason, health.last_outcome
        )
        answers.append(signals.live_answer(engine, startup, Progress(), restart_after, now))
    return answers


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="FSO", min_size=1, max_size=60), st.floats(0.5, 120.0))
def test_slow_overloaded_and_fast_never_restart(codes: str, gap: float) -> None:
    assert all(answer.ok for answer in _drive(codes, gap, restart_after=1.0))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="FSOTXE", min_size=1, max_size=40), st.floats(0.5, 30.0))
def test_no_restart_before_the_first_token(codes: str, gap: float) -> None:
    answers = _drive(codes, gap, restart_after=1.0)
    first = next((i for i, c in enumerate(codes) if c in "FS"), len(codes))
    assert all(answer.ok for answer in answers[:first])


@pytest.mark.parametrize(
    ("codes", "restart_at"),
    [
        ("F" + "T" * 10, 3),  # UNHEALTHY at the 2nd timeout (probe 2): 1 s later, probe 3
        ("F" + "X" * 10, 2),  # UNHEALTHY at once (probe 1), restart at probe 2
        ("FX" + "T" * 10, 2),  # a fatal error, then hung
        ("F" + "E" * 10, None),  # errors: a restart would not cure them
        ("F" + "TTFFF" * 4, None),  # breaks in the stretch
        ("T" * 10, None),  # never started
    ],
)
def test_sequences_through_the_machine(codes: str, restart_at: int | None) -> None:
    answers = _drive(codes, gap=1.0, restart_after=1.0)
    failing = [i for i, answer in enumerate(answers) if not answer.ok]
    assert (failing[0] if failing else None) == restart_at


# --- the agent's own health ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("quiet", "ok"),
    [(0.0, True), (12.5, True), (12.7, False), (600.0, False)],
)
def test_healthz_is_the_prober_delivering_results(quiet: float, ok: bool) -> None:
    bound = signals.stall_bound(1.0, 0.8, 2)
    assert bound == pytest.approx(12.6)
    assert signals.healthz_answer(T0, T0 + quiet, bound).ok is ok


def test_the_stall_bound_has_a_floor() -> None:
    assert signals.stall_bound(0.1, 0.05, 1) == signals.MIN_STALL_S


def test_an_answer_is_200_or_503() -> None:
    assert signals.Answer(True, "x").status == 200
    assert replace(signals.Answer(True, "x"), ok=False).status == 503


@pytest.mark.parametrize("state", [State.HEALTHY, State.DEGRADED, State.UNHEALTHY])
def test_never_ready_while_the_engine_has_not_started(state: State) -> None:
    engine = Engine(state, T0, Cause.ERROR, "error: connect failed")
    answer = signals.ready_answer(engine, True, started=False)
    assert not answer.ok
    assert answer.text == f"{state.value}: error: connect failed"
