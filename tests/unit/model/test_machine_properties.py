"""Property tests of the state machine and the Envoy view (docs/design.md §3, §4).

The machine is driven by random policies and random operation sequences (probe outcomes
with random time gaps, plus the odd drain/undrain). The test keeps its own history of
what happened (outcomes, when the endpoint was first seen, how many successes it needs
to qualify) and checks every transition against rules written from docs/design.md §3, never
against the machine's own counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.model.envoy_view import EnvoyHealth, envoy_view
from llm_health.model.machine import Transition, drain, initial_health, step, undrain
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

FAILURE_KINDS = {Outcome.TIMEOUT, Outcome.ERROR}
SUCCESS_KINDS = {Outcome.FAST, Outcome.SLOW}
ALL_STATES = list(State)

shares = st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_nan=False)
base_weights = st.integers(min_value=1, max_value=1_000_000)

policies = st.builds(
    Policy,
    healthy_after=st.integers(1, 5),
    unhealthy_after=st.integers(1, 5),
    degraded_weight=shares,
    startup_grace_s=st.sampled_from([5.0, 30.0, 600.0]),
)

gaps = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)
# A run of one outcome (streaks are what the machine counts), each probe `gap` s apart.
probe_runs = st.tuples(st.sampled_from(list(Outcome)), st.integers(1, 6), gaps).map(
    lambda r: [("probe", r[0], r[2])] * r[1]
)
admin_ops = st.tuples(st.sampled_from(["drain", "undrain"]), st.none(), gaps).map(lambda r: [r])
operations = st.lists(st.one_of(*[probe_runs] * 9, admin_ops), max_size=20).map(
    lambda groups: [op for group in groups for op in group]
)
# Outcome-only sequences biased towards runs: (outcome, run length) pairs.
runs = st.lists(st.tuples(st.sampled_from(list(Outcome)), st.integers(1, 6)), max_size=15)

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)


def result(outcome: Outcome) -> ProbeResult:
    ttft = {Outcome.FAST: 50.0, Outcome.SLOW: 500.0}.get(outcome)
    return ProbeResult(outcome, started_at=0.0, ttft_ms=ttft, detail=f"test {outcome.value}")


@dataclass
class Record:
    """One step as the test saw it, with the independent history up to and including it."""

    op: str
    outcome: Outcome | None
    now: float
    transition: Transition
    history: list[Outcome]  # every probe outcome so far, oldest first
    first_seen: float  # when the endpoint was (re)created: boot or last undrain
    qualify_after: int  # successes STARTING needs, by the test's own reckoning
    boot: bool  # still the endpoint known at boot (no undrain since)


@dataclass
class Trace:
    policy: Policy
    records: list[Record] = field(default_factory=list)


def drive(
    policy: Policy, known_at_boot: bool, ops: list[tuple[str, Outcome | None, float]]
) -> Trace:
    now = 100.0
    health: EndpointHealth = initial_health(now, policy, known_at_boot=known_at_boot)
    first_seen = now
    qualify_after = 1 if known_at_boot else policy.healthy_after
    boot = known_at_boot
    history: list[Outcome] = []
    trace = Trace(policy)
    for op, outcome, gap in ops:
        now += gap
        if op == "probe":
            assert outcome is not None
            history.append(outcome)
            transition = step(health, result(outcome), now, policy)
        elif op == "drain":
            transition = drain(health, now, "test drain")
        else:
            if health.state is not State.DRAINING:
                continue  # undrain is an operator action on a drained endpoint only
            transition = undrain(health, now, policy)
            first_seen, qualify_after, boot = now, policy.healthy_after, False
        trace.records.append(
            Record(op, outcome, now, transition, list(history), first_seen, qualify_after, boot)
        )
        health = transition.after
    return trace


def outcome_ops(pairs: list[tuple[Outcome, int]]) -> list[tuple[str, Outcome | None, float]]:
    return [("probe", o, 1.0) for o, n in pairs for _ in range(n)]


def tail(history: list[Outcome], n: int) -> list[Outcome]:
    return history[-n:] if len(history) >= n else []


# --- (a), (b): the Envoy view ------------------------------------------------------------


@given(state=st.sampled_from(ALL_STATES), base=base_weights, share=shares)
@settings(max_examples=400, deadline=None)
def test_envoy_weight_is_never_below_one(state: State, base: int, share: float) -> None:
    view = envoy_view(state, base, share)
    assert isinstance(view.weight, int)
    assert view.weight >= 1


@given(state=st.sampled_from(ALL_STATES), base=base_weights, share=shares)
@settings(max_examples=400, deadline=None)
def test_envoy_view_table(state: State, base: int, share: float) -> None:
    view = envoy_view(state, base, share)
    if state is State.DEGRADED:
        exact = base * share
        assert view.health is EnvoyHealth.HEALTHY
        assert view.weight == max(1, round(exact))
        # Independently of round(): the nearest integer, clamped to >= 1, never above base.
        assert abs(view.weight - exact) <= 0.5 or (view.weight == 1 and exact < 0.5)
        assert 1 <= view.weight <= base
        assert view.lb_label == "degraded"
    elif state is State.HEALTHY:
        assert (view.health, view.weight, view.lb_label) == (EnvoyHealth.HEALTHY, base, "healthy")
    elif state in (State.STARTING, State.UNHEALTHY):
        assert view.health is EnvoyHealth.UNHEALTHY
        assert view.weight == base
        assert view.lb_label is None
    else:
        assert (view.health, view.weight, view.lb_label) == (EnvoyHealth.DRAINING, base, None)


# --- (c)-(f): transitions ----------------------------------------------------------------


def check_unhealthy_entries(trace: Trace) -> None:
    """(c) UNHEALTHY is entered only by a FATAL, by `unhealthy_after` consecutive
    TIMEOUT/ERROR from HEALTHY/DEGRADED (or from STARTING for an endpoint known at boot),
    or from STARTING after startup_grace."""
    policy = trace.policy
    for rec in trace.records:
        t = rec.transition
        if t.after.state is not State.UNHEALTHY or t.from_state is State.UNHEALTHY:
            continue
        assert rec.op == "probe", f"{rec.op} moved the endpoint to UNHEALTHY"
        assert t.alert, "a new UNHEALTHY must alert"
        if rec.outcome is Outcome.FATAL:
            continue
        last = tail(rec.history, policy.unhealthy_after)
        failure_run = bool(last) and all(o in FAILURE_KINDS for o in last)
        if t.from_state in (State.HEALTHY, State.DEGRADED):
            assert failure_run, (
                f"{t.from_state.value} -> unhealthy after {rec.history[-policy.unhealthy_after :]}"
                f" (unhealthy_after={policy.unhealthy_after})"
            )
        elif t.from_state is State.STARTING:
            assert rec.outcome not in SUCCESS_KINDS, "a success ejected a starting endpoint"
            grace_over = rec.now - rec.first_seen >= policy.startup_grace_s
            assert grace_over or (rec.boot and failure_run), (
                f"ejected {rec.now - rec.first_seen:g}s after first seen, grace is "
                f"{policy.startup_grace_s:g}s, known at boot: {rec.boot}, "
                f"last outcomes {rec.history[-policy.unhealthy_after :]}"
            )
        else:
            raise AssertionError(f"UNHEALTHY entered from {t.from_state.value}")


def check_failures_do_eject(trace: Trace) -> None:
    """(c, converse) HEALTHY/DEGRADED (or STARTING, known at boot) then `unhealthy_after`
    consecutive TIMEOUT/ERROR: UNHEALTHY."""
    k = trace.policy.unhealthy_after
    records = trace.records
    for i in range(len(records) - k + 1):
        window = records[i : i + k]
        if not all(r.op == "probe" and r.outcome in FAILURE_KINDS for r in window):
            continue
        before = window[0].transition.from_state
        if before in (State.HEALTHY, State.DEGRADED) or (
            before is State.STARTING and window[0].boot
        ):
            assert window[-1].transition.after.state is State.UNHEALTHY


def check_reasons(trace: Trace) -> None:
    """(d) every change has a non-empty reason; `before`/`changed` tell the truth."""
    previous: State | None = None
    for rec in trace.records:
        t = rec.transition
        if previous is not None:
            assert t.from_state is previous
        assert t.changed is (t.after.state is not t.from_state)
        if t.changed:
            assert t.after.reason.strip(), f"empty reason for {t.from_state} -> {t.after.state}"
            assert t.after.since == rec.now
        previous = t.after.state


def check_healthy_entries(trace: Trace) -> None:
    """(e) HEALTHY only after enough consecutive FAST probes."""
    policy = trace.policy
    for rec in trace.records:
        t = rec.transition
        if t.after.state is not State.HEALTHY or t.from_state is State.HEALTHY:
            continue
        assert rec.op == "probe" and rec.outcome is Outcome.FAST, f"HEALTHY entered by {rec}"
        assert t.from_state is not State.DRAINING
        needed = rec.qualify_after if t.from_state is State.STARTING else policy.healthy_after
        last = tail(rec.history, needed)
        assert last and all(o is Outcome.FAST for o in last), (
            f"{t.from_state.value} -> healthy after {rec.history[-needed:]} (needed {needed} FAST)"
        )


def check_recovery_from_unhealthy(trace: Trace) -> None:
    """(e, converse) UNHEALTHY, then `healthy_after` consecutive successes starting a fresh
    streak: UNHEALTHY until the last one, then HEALTHY if all FAST, else DEGRADED."""
    n = trace.policy.healthy_after
    records = trace.records
    for i in range(1, len(records) - n + 1):
        window = records[i : i + n]
        if window[0].transition.from_state is not State.UNHEALTHY:
            continue
        if records[i - 1].outcome in SUCCESS_KINDS:
            continue  # the streak began earlier
        if not all(r.op == "probe" and r.outcome in SUCCESS_KINDS for r in window):
            continue
        all_fast = all(r.outcome is Outcome.FAST for r in window)
        want = State.HEALTHY if all_fast else State.DEGRADED
        assert [r.transition.after.state for r in window[:-1]] == [State.UNHEALTHY] * (n - 1)
        assert window[-1].transition.after.state is want


def check_draining_is_sticky(trace: Trace) -> None:
    """(f) `step` never leaves DRAINING; only undrain does."""
    for rec in trace.records:
        t = rec.transition
        if t.from_state is State.DRAINING and rec.op == "probe":
            assert t.after.state is State.DRAINING
            assert not t.changed and not t.alert


def check_alerts(trace: Trace) -> None:
    """Alerts only for FATAL or a new UNHEALTHY."""
    for rec in trace.records:
        t = rec.transition
        if t.alert:
            assert rec.outcome is Outcome.FATAL or (
                t.changed and t.after.state is State.UNHEALTHY
            ), f"unexpected alert: {t.from_state} -> {t.after.state} on {rec.outcome}"


ALL_CHECKS = (
    check_unhealthy_entries,
    check_failures_do_eject,
    check_reasons,
    check_healthy_entries,
    check_recovery_from_unhealthy,
    check_draining_is_sticky,
    check_alerts,
)


@given(policy=policies, known_at_boot=st.booleans(), ops=operations)
@PROPERTY_SETTINGS
def test_random_operations(
    policy: Policy, known_at_boot: bool, ops: list[tuple[str, Outcome | None, float]]
) -> None:
    trace = drive(policy, known_at_boot, ops)
    for check in ALL_CHECKS:
        check(trace)


@given(policy=policies, known_at_boot=st.booleans(), pairs=runs)
@PROPERTY_SETTINGS
def test_random_outcome_runs(
    policy: Policy, known_at_boot: bool, pairs: list[tuple[Outcome, int]]
) -> None:
    """Same checks on streak-heavy sequences without drains, 1 s apart."""
    trace = drive(policy, known_at_boot, outcome_ops(pairs))
    for check in ALL_CHECKS:
        check(trace)


@given(policy=policies, pairs=runs)
@PROPERTY_SETTINGS
def test_draining_never_left_by_step(policy: Policy, pairs: list[tuple[Outcome, int]]) -> None:
    health = drain(initial_health(0.0, policy), 0.0, "test").after
    now = 0.0
    for outcome, count in pairs:
        for _ in range(count):
            now += 50.0  # far past any startup_grace
            transition = step(health, result(outcome), now, policy)
            assert transition.after.state is State.DRAINING
            assert not transition.changed and not transition.alert
            health = transition.after


@given(policy=policies, pairs=runs)
@PROPERTY_SETTINGS
def test_starting_within_grace_never_alerts(
    policy: Policy, pairs: list[tuple[Outcome, int]]
) -> None:
    """TIMEOUT/ERROR/OVERLOADED inside startup_grace are tolerated silently: STARTING stays."""
    health = initial_health(0.0, policy)
    budget = policy.startup_grace_s * 0.99
    tolerated = (Outcome.TIMEOUT, Outcome.ERROR, Outcome.OVERLOADED)
    ops = [o for o, n in pairs for _ in range(n) if o in tolerated]
    for i, outcome in enumerate(ops):
        now = budget * (i + 1) / (len(ops) + 1)
        transition = step(health, result(outcome), now, policy)
        assert transition.after.state is State.STARTING
        assert not transition.alert and not transition.changed
        health = transition.after
