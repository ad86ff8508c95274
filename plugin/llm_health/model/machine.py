"""The health state machine: ``(health, probe result, now, policy) -> Transition``.

Pure: no I/O, no clock of its own. Every state change carries a human-readable reason
and, set in the same place, a typed ``Cause`` (what metrics, alerts and /status read).
Rules (docs/design.md §3):
- STARTING: failures tolerated until ``startup_grace`` is over, then UNHEALTHY;
  ``qualify_after`` consecutive successes -> HEALTHY if all FAST, else DEGRADED.
  Endpoints known at boot (see ``initial_health``) were probably serving before the
  plugin (re)started: for them ``unhealthy_after`` consecutive failures -> UNHEALTHY,
  as from HEALTHY, instead of hiding a dead backend behind the startup grace.
- HEALTHY: FAST stays; SLOW, OVERLOADED or one TIMEOUT/ERROR -> DEGRADED.
- OVERLOADED is never counted toward ``unhealthy_after``: the engine said it is saturated
  (429, 503), or a SLOW/TIMEOUT probe waited while the engine demonstrably admitted new
  requests (``model.admission``, docs/design.md §3.5). Such an *excused* probe counts as
  a success that is not fast, as SLOW does (an UNHEALTHY endpoint under load recovers).
- DEGRADED: ``healthy_after`` consecutive FAST -> HEALTHY.
- HEALTHY/DEGRADED: ``unhealthy_after`` consecutive TIMEOUT/ERROR -> UNHEALTHY.
- UNHEALTHY: ``healthy_after`` consecutive successes -> HEALTHY if all FAST, else DEGRADED.
- FATAL, in any state but DRAINING -> UNHEALTHY at once, with an alert.
- In-flight silence (``silence``): a HEALTHY endpoint whose probe has had no first token
  for ``healthy_ttft`` is DEGRADED at that moment, provisionally; the probe's result then
  decides by the rules above, from HEALTHY (a late token that still counts FAST restores
  it, a SLOW or a first TIMEOUT keeps it DEGRADED).
- DRAINING: outcomes are counted but never change the state (only ``undrain`` does).
"""

from __future__ import annotations

from dataclasses import replace

from llm_health.model.causes import Cause, outcome_cause
from llm_health.model.outcome import FAILURES, Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State
from llm_health.model.value import value


@value
class Transition:
    """The machine's answer: ``from_state`` -> ``after`` (the endpoint's new health).

    ``changed``: the state differs from ``from_state``. ``alert``: an operator should hear
    of it (FATAL, or newly UNHEALTHY). ``cause``: why, as a label (``after.reason`` says it
    in words).
    """

    from_state: State
    after: EndpointHealth
    changed: bool
    alert: bool = False
    cause: Cause = Cause.OTHER

    @property
    def to_state(self) -> State:
        return self.after.state


def initial_health(now: float, policy: Policy, *, known_at_boot: bool = False) -> EndpointHealth:
    """A new endpoint in STARTING.

    ``known_at_boot``: the endpoint was in the config when the plugin (re)started. It is
    probably serving already; we are a new observer, not watching a new backend. One
    success then qualifies it, so a plugin restart never holds a healthy fleet out of
    Envoy for ``healthy_after`` intervals (docs/design.md §7, warm start).
    """
    qualify_after = 1 if known_at_boot else policy.healthy_after
    reason = "plugin started; awaiting first probe" if known_at_boot else "new endpoint"
    return EndpointHealth(State.STARTING, now, reason, now, qualify_after, known_at_boot)


def step(health: EndpointHealth, result: ProbeResult, now: float, policy: Policy) -> Transition:
    """Fold one probe result into ``health``. Callers own ordering (one probe at a time)."""
    if result.outcome is Outcome.FAST and health.state is State.HEALTHY:
        # Most probes: a FAST one on a HEALTHY endpoint, counted, no change (what
        # ``_count`` and ``_decide_healthy`` give, in fewer steps: docs/design.md §16.10).
        streak_fast = health.all_fast or health.successes == 0
        counted = _counted(health, health.successes + 1, streak_fast, health.fast_streak + 1)
        return Transition(State.HEALTHY, counted, changed=False, cause=Cause.OTHER)
    if health.silenced and health.state is State.DEGRADED:
        return _after_silence(health, result, now, policy)
    counted = _count(health, result.outcome, result.excused)
    if health.state is State.DRAINING:
        return Transition(health.state, counted, changed=False, cause=outcome_cause(result.outcome))
    if result.outcome is Outcome.FATAL:
        return _fatal(health, counted, result, now)
    decide = _DECIDERS[health.state]
    return decide(health, counted, result, now, policy)


def silence(health: EndpointHealth, now: float, silent_ms: float) -> Transition:
    """A probe in flight has had no first token for ``silent_ms`` (the caller decides when:
    at ``healthy_ttft``). A healthy engine's first token takes tens of milliseconds; a hang
    shows here one timeout before the probe can say TIMEOUT, so a HEALTHY endpoint is
    DEGRADED (reduced weight) at once, provisionally: its counters are left alone and the
    probe's own result decides (``step``). Any other state: no change."""
    if health.state is not State.HEALTHY:
        return Transition(health.state, health, changed=False, cause=Cause.SILENT)
    quiet = replace(
        health,
        state=State.DEGRADED,
        since=now,
        reason=f"silent for {silent_ms:.0f} ms",
        cause=Cause.SILENT,
        silenced=True,
    )
    return Transition(State.HEALTHY, quiet, changed=True, cause=Cause.SILENT)


def _after_silence(
    health: EndpointHealth, result: ProbeResult, now: float, policy: Policy
) -> Transition:
    """The result after a silence decides, by the normal rules from the HEALTHY the
    counters imply; the provisional DEGRADED is what it replaces."""
    decided = step(replace(health, state=State.HEALTHY, silenced=False), result, now, policy)
    after = decided.after
    if after.state is State.HEALTHY:  # a late token that still counts FAST
        token = f"{result.ttft_ms:.0f} ms" if result.ttft_ms is not None else "in time"
        back = replace(after, since=now, reason=f"recovered: first token {token} after all")
        back = replace(back, cause=Cause.RECOVERED)
        return Transition(State.DEGRADED, back, changed=True, cause=Cause.RECOVERED)
    if after.state is State.DEGRADED:  # SLOW, OVERLOADED or a first failure: as silenced
        kept = replace(after, since=health.since)
        return Transition(
            State.DEGRADED, kept, changed=False, alert=decided.alert, cause=decided.cause
        )
    return replace(decided, from_state=State.DEGRADED)


def drain(
    health: EndpointHealth, now: float, reason: str, cause: Cause = Cause.DRAINED
) -> Transition:
    """Take an endpoint out of rotation (operator: DRAINED; config removal: REMOVED).
    No-op if draining."""
    if health.state is State.DRAINING:
        return Transition(health.state, health, changed=False, cause=cause)
    drained = replace(
        health,
        state=State.DRAINING,
        since=now,
        reason=reason or "drained",
        cause=cause,
        silenced=False,
    )
    return Transition(health.state, drained, changed=True, cause=cause)


def undrain(health: EndpointHealth, now: float, policy: Policy) -> Transition:
    """Bring a drained endpoint back: it must qualify again like a new one.
    No-op for an endpoint that is not draining."""
    if health.state is not State.DRAINING:
        return Transition(health.state, health, changed=False, cause=Cause.UNDRAINED)
    fresh = replace(
        initial_health(now, policy),
        reason="undrained; awaiting healthy probes",
        cause=Cause.UNDRAINED,
    )
    return Transition(health.state, fresh, changed=True, cause=Cause.UNDRAINED)


def _count(health: EndpointHealth, outcome: Outcome, excused: bool = False) -> EndpointHealth:
    """Update the streak counters for one outcome (state untouched)."""
    if outcome is Outcome.FAST:
        streak_fast = health.all_fast or health.successes == 0
        return _counted(health, health.successes + 1, streak_fast, health.fast_streak + 1)
    if outcome is Outcome.SLOW:
        return _counted(health, health.successes + 1, False, 0, last=outcome)
    if outcome is Outcome.OVERLOADED and excused:
        # A probe that waited behind a queue the engine admits from (``admission.excused``):
        # the engine serves, so a success, not fast, as SLOW: an endpoint that went
        # UNHEALTHY before the evidence came (the onset of a peak, a plugin restart during
        # one) comes back DEGRADED after ``healthy_after`` of them (docs/design.md §3.5).
        return _counted(health, health.successes + 1, False, 0, last=outcome)
    if outcome is Outcome.OVERLOADED:
        # The engine answered: it is alive, so a failure run is broken too.
        return _counted(health, 0, True, 0, last=outcome)
    kinds = health.failure_kinds | {outcome}
    return _counted(health, 0, True, 0, health.failures + 1, kinds, outcome)


_NO_KINDS: frozenset[Outcome] = frozenset()


def _counted(
    health: EndpointHealth,
    successes: int,
    all_fast: bool,
    fast_streak: int,
    failures: int = 0,
    failure_kinds: frozenset[Outcome] = _NO_KINDS,
    last: Outcome = Outcome.FAST,
) -> EndpointHealth:
    """``health`` with new counters, built directly: ``dataclasses.replace`` costs four
    times as much, on every probe (docs/design.md §16.10)."""
    return EndpointHealth(
        health.state,
        health.since,
        health.reason,
        health.first_seen,
        health.qualify_after,
        health.known_at_boot,
        successes,
        all_fast,
        fast_streak,
        failures,
        failure_kinds,
        last,
        health.cause,
        health.silenced,
    )


def _move(
    before: EndpointHealth,
    after: EndpointHealth,
    state: State,
    reason: str,
    now: float,
    cause: Cause,
) -> Transition:
    moved = replace(after, state=state, since=now, reason=reason, cause=cause, silenced=False)
    alert = state is State.UNHEALTHY
    return Transition(before.state, moved, changed=True, alert=alert, cause=cause)


def _stay(before: EndpointHealth, after: EndpointHealth, result: ProbeResult) -> Transition:
    return Transition(before.state, after, changed=False, cause=outcome_cause(result.outcome))


def _fatal(
    before: EndpointHealth, after: EndpointHealth, result: ProbeResult, now: float
) -> Transition:
    reason = f"fatal engine error: {result.detail or 'fatal pattern matched'}"
    if before.state is State.UNHEALTHY:
        # Already out of rotation; keep `since`, refresh the reason, alert only on a new FATAL.
        fresh = before.last_outcome is not Outcome.FATAL
        refreshed = replace(after, reason=reason)
        return Transition(before.state, refreshed, changed=False, alert=fresh, cause=Cause.FATAL)
    return _move(before, after, State.UNHEALTHY, reason, now, Cause.FATAL)


def _qualified(after: EndpointHealth, needed: int) -> tuple[State, str] | None:
    """HEALTHY/DEGRADED once ``needed`` consecutive successes are in, else None."""
    if after.successes < needed:
        return None
    if after.successes == 1:
        fast = after.all_fast
        return (State.HEALTHY, "1 fast probe") if fast else (State.DEGRADED, "1 slow probe")
    if after.all_fast:
        return State.HEALTHY, f"{after.successes} consecutive fast probes"
    return State.DEGRADED, f"{after.successes} consecutive successes, not all fast"


def _decide_starting(
    before: EndpointHealth,
    after: EndpointHealth,
    result: ProbeResult,
    now: float,
    policy: Policy,
) -> Transition:
    ready = _qualified(after, before.qualify_after)
    if ready is not None and before.known_at_boot:
        kind = "fast" if ready[0] is State.HEALTHY else "slow"
        return _move(before, after, ready[0], f"ready: first probe {kind}", now, Cause.STARTUP)
    if ready is not None:
        return _move(before, after, ready[0], f"ready: {ready[1]}", now, Cause.STARTUP)
    if result.outcome in (Outcome.FAST, Outcome.SLOW):
        return _stay(before, after, result)
    if before.known_at_boot and after.failures >= policy.unhealthy_after:
        reason = f"{_failure_reason(after, policy)} since the plugin started"
        cause = outcome_cause(result.outcome)
        return _move(before, after, State.UNHEALTHY, reason, now, cause)
    if now - before.first_seen >= policy.startup_grace_s:
        grace = f"{policy.startup_grace_s:g}s"
        reason = f"never became ready within startup_grace ({grace}); last: {_describe(result)}"
        return _move(before, after, State.UNHEALTHY, reason, now, Cause.STARTUP_TIMEOUT)
    # Still starting: keep `since`, but say what the latest probe saw.
    return _stay(before, replace(after, reason=f"not ready yet: {_describe(result)}"), result)


def _decide_healthy(
    before: EndpointHealth,
    after: EndpointHealth,
    result: ProbeResult,
    now: float,
    policy: Policy,
) -> Transition:
    if result.outcome is Outcome.FAST:
        return _stay(before, after, result)
    cause = outcome_cause(result.outcome)
    if result.outcome in FAILURES and after.failures >= policy.unhealthy_after:
        return _move(before, after, State.UNHEALTHY, _failure_reason(after, policy), now, cause)
    return _move(before, after, State.DEGRADED, _describe(result), now, cause)


def _decide_degraded(
    before: EndpointHealth,
    after: EndpointHealth,
    result: ProbeResult,
    now: float,
    policy: Policy,
) -> Transition:
    if after.fast_streak >= policy.healthy_after:
        reason = f"recovered: {after.fast_streak} consecutive fast probes"
        return _move(before, after, State.HEALTHY, reason, now, Cause.RECOVERED)
    if result.outcome in FAILURES and after.failures >= policy.unhealthy_after:
        reason = _failure_reason(after, policy)
        return _move(before, after, State.UNHEALTHY, reason, now, outcome_cause(result.outcome))
    return _stay(before, after, result)


def _decide_unhealthy(
    before: EndpointHealth,
    after: EndpointHealth,
    result: ProbeResult,
    now: float,
    policy: Policy,
) -> Transition:
    ready = _qualified(after, policy.healthy_after)
    if ready is not None:
        return _move(before, after, ready[0], f"recovered: {ready[1]}", now, Cause.RECOVERED)
    return _stay(before, after, result)


_DECIDERS = {
    State.STARTING: _decide_starting,
    State.HEALTHY: _decide_healthy,
    State.DEGRADED: _decide_degraded,
    State.UNHEALTHY: _decide_unhealthy,
}


def _failure_reason(after: EndpointHealth, policy: Policy) -> str:
    """E.g. "2 consecutive timeouts (>800 ms)" or "3 consecutive failures (error, timeout)"."""
    n = after.failures
    if after.failure_kinds == {Outcome.TIMEOUT}:
        return f"{n} consecutive timeouts (>{policy.timeout_s * 1000:g} ms)"
    if after.failure_kinds == {Outcome.ERROR}:
        return f"{n} consecutive errors"
    kinds = ", ".join(sorted(k.value for k in after.failure_kinds))
    return f"{n} consecutive failures ({kinds})"


def _describe(result: ProbeResult) -> str:
    """One probe in words, for reasons: "slow first token: 450 ms", "timeout: ..."."""
    if result.outcome is Outcome.SLOW and result.ttft_ms is not None:
        return f"slow first token: {result.ttft_ms:.0f} ms"
    text = result.outcome.value
    return f"{text}: {result.detail}" if result.detail else text


TIMEOUT_LAG_SHARE = 0.1  # of the timeout: a longer stall may have hidden the first token


def trusted(result: ProbeResult, policy: Policy) -> bool:
    """False when a SLOW or TIMEOUT verdict may be the prober's fault: its own event loop
    lagged more than ``max_loop_lag`` while the probe ran (docs/design.md §7, measurement integrity).
    Such a probe must not degrade an endpoint. FAST, FATAL and ERROR are trusted: lag can
    only make a probe look slower, never faster, and cannot invent an engine error.

    A TIMEOUT may also bear a longer lag, up to a tenth of the timeout: with no stall
    longer than ``loop_lag_ms``, a first token that arrived before ``timeout -
    loop_lag_ms`` would have been read in time, so the engine took at least 90 % of the
    timeout. A 150 ms stall over a 5 s budget proves a real timeout; over 800 ms the
    absolute bound (100 ms) is the stricter one and still applies."""
    if result.outcome not in (Outcome.SLOW, Outcome.TIMEOUT):
        return True
    bound_ms = policy.max_loop_lag_s * 1000
    if result.outcome is Outcome.TIMEOUT:
        bound_ms = max(bound_ms, policy.timeout_s * 1000 * TIMEOUT_LAG_SHARE)
    return result.loop_lag_ms <= bound_ms


def force_unhealthy(
    health: EndpointHealth, now: float, reason: str, cause: Cause = Cause.SIGNAL
) -> Transition:
    """An outside signal (e.g. HDS: unreachable from the data plane; a known-answer probe:
    garbage output) takes the endpoint out. Success streaks are reset, so recovery goes
    through the normal hysteresis (``healthy_after`` successes once the signal clears).
    DRAINING is left alone."""
    if health.state is State.DRAINING:
        return Transition(health.state, health, changed=False, cause=cause)
    reset = replace(health, successes=0, all_fast=True, fast_streak=0, reason=reason, cause=cause)
    if health.state is State.UNHEALTHY:
        return Transition(health.state, reset, changed=False, cause=cause)
    return _move(health, reset, State.UNHEALTHY, reason, now, cause)


def cap(health: EndpointHealth, now: float, reason: str, cause: Cause) -> Transition:
    """An outside limit (the engine's own metrics: saturated) allows at most DEGRADED: a
    HEALTHY endpoint keeps ``degraded_weight`` of its traffic. Its fast streak is reset, so
    once the limit lifts it needs ``healthy_after`` fast probes, the usual hysteresis. A
    limit never takes an endpoint out: STARTING, UNHEALTHY and DRAINING are left as they
    are (the board caps them when they recover)."""
    if health.state is not State.HEALTHY:
        kept = replace(health, fast_streak=0) if health.state is State.DEGRADED else health
        return Transition(health.state, kept, changed=False, cause=cause)
    capped = replace(health, fast_streak=0)
    return _move(health, capped, State.DEGRADED, reason, now, cause)
