"""The pure alerts code: which transitions are alerts, payloads, dedup, rate limits.

Table-driven, fake clocks (plain floats), no I/O.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llm_health.alerts import (
    AlertEvent,
    AlertKind,
    Deduplicator,
    RateLimiter,
    alert_event,
    classify,
    iso_time,
    payload,
)
from llm_health.alerts.ratelimit import MAX_SUMMARY_ENDPOINTS
from llm_health.model.causes import Cause, outcome_cause
from llm_health.model.machine import Transition, drain, force_unhealthy, initial_health, step
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State
from tests.unit.test_layers import PACKAGE, all_imports, under

U, R, F = AlertKind.UNHEALTHY, AlertKind.RECOVERED, AlertKind.FATAL
POLICY = Policy()


def health(state: State, **more: object) -> EndpointHealth:
    return replace(initial_health(0.0, POLICY), state=state, **more)  # type: ignore[arg-type]


def result(outcome: Outcome, **more: object) -> ProbeResult:
    return ProbeResult(outcome, started_at=1_700_000_000.0, **more)  # type: ignore[arg-type]


def moved(before: State, after: State, *, alert: bool = False) -> Transition:
    return Transition(before, health(after), changed=True, alert=alert)


# --------------------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("transition", "outcome", "kinds"),
    [
        (moved(State.HEALTHY, State.UNHEALTHY, alert=True), Outcome.TIMEOUT, {U}),
        (moved(State.DEGRADED, State.UNHEALTHY, alert=True), Outcome.ERROR, {U}),
        (moved(State.STARTING, State.UNHEALTHY, alert=True), Outcome.ERROR, {U}),
        (moved(State.HEALTHY, State.UNHEALTHY, alert=True), Outcome.FATAL, {U, F}),
        (moved(State.UNHEALTHY, State.HEALTHY), Outcome.FAST, {R}),
        (moved(State.UNHEALTHY, State.DEGRADED), Outcome.SLOW, {R}),
        # already UNHEALTHY, a fresh FATAL: an alert without a state change
        (
            Transition(State.UNHEALTHY, health(State.UNHEALTHY), changed=False, alert=True),
            Outcome.FATAL,
            {F},
        ),
        # not alerts
        (moved(State.HEALTHY, State.DEGRADED), Outcome.SLOW, set()),
        (moved(State.DEGRADED, State.HEALTHY), Outcome.FAST, set()),
        (moved(State.STARTING, State.HEALTHY), Outcome.FAST, set()),
        (moved(State.STARTING, State.DEGRADED), Outcome.SLOW, set()),
        (moved(State.UNHEALTHY, State.DRAINING), Outcome.FAST, set()),
        (moved(State.DRAINING, State.STARTING), Outcome.FAST, set()),
        (Transition(State.HEALTHY, health(State.HEALTHY), changed=False), Outcome.FAST, set()),
        # FATAL seen without the machine raising an alert (e.g. while DRAINING): nothing
        (Transition(State.DRAINING, health(State.DRAINING), changed=False), Outcome.FATAL, set()),
    ],
)
def test_classify(transition: Transition, outcome: Outcome, kinds: set[AlertKind]) -> None:
    # The machine sets the cause from the probe outcome where it writes the reason.
    transition = replace(transition, cause=outcome_cause(outcome))
    assert classify(transition, result(outcome)) == frozenset(kinds)


def test_classify_follows_the_real_state_machine() -> None:
    """Driven by ``step``: healthy -> 2 timeouts -> unhealthy -> 3 fast -> recovered,
    then a FATAL; and an outside signal (no probe result) is ``unhealthy`` only."""
    policy = Policy(healthy_after=3, unhealthy_after=2)
    h = replace(initial_health(0.0, policy), state=State.HEALTHY)
    seen: list[frozenset[AlertKind]] = []
    for t, outcome in enumerate([Outcome.TIMEOUT, Outcome.TIMEOUT, *[Outcome.FAST] * 3]):
        probe = result(outcome)
        transition = step(h, probe, float(t), policy)
        seen.append(classify(transition, probe))
        h = transition.after
    assert seen == [frozenset(), {U}, frozenset(), frozenset(), {R}]
    fatal = result(Outcome.FATAL, detail="CUDA error: an illegal memory access")
    assert classify(step(h, fatal, 9.0, policy), fatal) == {U, F}
    signal = force_unhealthy(h, 10.0, "HDS: unreachable from the data plane")
    assert classify(signal, None) == {U}
    assert classify(drain(h, 11.0, "operator"), None) == frozenset()


def test_primary_kind_is_the_most_specific() -> None:
    event = make_event(kinds={U, F})
    assert event.primary is F
    assert make_event(kinds={R}).primary is R


# --------------------------------------------------------------------------- payload


def test_payload_carries_what_the_issue_asks_for() -> None:
    probe = result(
        Outcome.TIMEOUT, connect_ms=0.41, headers_ms=3.456, total_ms=800.2, loop_lag_ms=1.0
    )
    transition = Transition(
        State.HEALTHY,
        health(State.UNHEALTHY, reason="2 consecutive timeouts (>800 ms)"),
        changed=True,
        alert=True,
        cause=Cause.TIMEOUT,
    )
    event = alert_event("id-1", "llama-70b", "10.0.0.11:8000", transition, probe, 1_700_000_001.5)
    assert event is not None
    body = payload(event)
    assert json.loads(json.dumps(body)) == body  # JSON-ready
    assert body == {
        "id": "id-1",
        "event": "unhealthy",
        "events": ["unhealthy"],
        "cluster": "llama-70b",
        "endpoint": "10.0.0.11:8000",
        "state": "unhealthy",
        "previous": "healthy",
        "reason": "2 consecutive timeouts (>800 ms)",
        "cause": "timeout",
        "time": "2023-11-14T22:13:21.500Z",
        "timings": {
            "outcome": "timeout",
            "started_at": "2023-11-14T22:13:20.000Z",
            "connect_ms": 0.41,
            "headers_ms": 3.46,
            "ttft_ms": None,
            "total_ms": 800.2,
            "loop_lag_ms": 1.0,
            "status": None,
            "detail": "",
        },
        "source": "llm-health",
    }


def test_no_alert_no_event() -> None:
    transition = moved(State.HEALTHY, State.DEGRADED)
    assert alert_event("x", "c", "a", transition, result(Outcome.SLOW), 0.0) is None


def test_signal_event_has_no_timings() -> None:
    event = make_event(kinds={U}, result=None)
    assert payload(event)["timings"] is None


def test_iso_time_is_utc_with_milliseconds() -> None:
    assert iso_time(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_time(86_400.123456) == "1970-01-02T00:00:00.123Z"


# --------------------------------------------------------------------------- dedup


def make_event(
    kinds: set[AlertKind] | None = None,
    endpoint: str = "10.0.0.1:8000",
    cluster: str = "c",
    at: float = 0.0,
    result: ProbeResult | None = None,
) -> AlertEvent:
    return AlertEvent(
        "id",
        frozenset(kinds or {U}),
        cluster,
        endpoint,
        State.UNHEALTHY,
        State.HEALTHY,
        "r",
        at,
        result,
    )


def test_same_event_same_endpoint_within_the_window_is_sent_once() -> None:
    dedup = Deduplicator(window_s=60.0)
    assert dedup.admit(make_event({F}), now=0.0)
    assert not dedup.admit(make_event({F}), now=1.0)
    assert not dedup.admit(make_event({F}), now=59.9)
    # the window counts from the last event let through, not from the last duplicate
    assert dedup.admit(make_event({F}), now=60.0)
    assert not dedup.admit(make_event({F}), now=119.0)


def test_other_endpoint_or_cluster_is_not_a_duplicate() -> None:
    dedup = Deduplicator(window_s=60.0)
    assert dedup.admit(make_event({U}, endpoint="10.0.0.1:8000"), now=0.0)
    assert dedup.admit(make_event({U}, endpoint="10.0.0.2:8000"), now=0.0)
    assert dedup.admit(make_event({U}, endpoint="10.0.0.1:8000", cluster="other"), now=0.0)
    assert not dedup.admit(make_event({U}, endpoint="10.0.0.2:8000"), now=1.0)


def test_a_change_of_kind_always_passes_so_the_latest_word_is_never_stale() -> None:
    dedup = Deduplicator(window_s=300.0)
    kinds = [{U}, {R}, {U}, {R}, {U, F}, {F}]
    admitted = [dedup.admit(make_event(k), now=float(i)) for i, k in enumerate(kinds)]
    # unhealthy/recovered alternate (all pass); {U,F} has primary fatal (new), then the
    # plain fatal right after is a duplicate of it
    assert admitted == [True, True, True, True, True, False]


def test_dedup_memory_is_pruned() -> None:
    dedup = Deduplicator(window_s=10.0)
    for i in range(5000):
        dedup.admit(make_event(endpoint=f"10.0.{i // 250}.{i % 250}:80"), now=float(i))
    assert len(dedup) < 2100  # old entries were dropped on the way


# --------------------------------------------------------------------------- rate limit


def test_rate_limit_lets_n_per_window_through_then_summarises() -> None:
    limiter = RateLimiter(limit=3, window_s=60.0)
    sent = [limiter.admit(make_event(at=100.0 + t), now=float(t)) for t in range(10)]
    assert sent == [True] * 3 + [False] * 7
    assert limiter.pending.count == 7
    # no free slot yet: no summary
    assert limiter.take_summary(now=59.0, wall_time=159.0, summary_id="s") is None
    summary = limiter.take_summary(now=60.0, wall_time=160.0, summary_id="s1")
    assert summary is not None
    assert summary["event"] == "rate_limited"
    assert summary["suppressed"] == 7
    assert summary["by_event"] == {"unhealthy": 7}
    assert summary["first_time"] == iso_time(103.0)
    assert summary["last_time"] == iso_time(109.0)
    assert summary["max_per_minute"] == 3
    assert limiter.pending.count == 0
    assert limiter.take_summary(now=60.0, wall_time=160.0, summary_id="s2") is None


def test_pending_summary_goes_before_new_events() -> None:
    """While a summary is pending, new events join it (they never overtake it)."""
    limiter = RateLimiter(limit=1, window_s=60.0)
    assert limiter.admit(make_event(), now=0.0)
    assert not limiter.admit(make_event(), now=1.0)
    # a slot is free again, but the summary is pending: the new event is held too
    assert not limiter.admit(make_event({R}), now=61.0)
    summary = limiter.take_summary(now=61.0, wall_time=0.0, summary_id="s")
    assert summary is not None
    assert summary["suppressed"] == 2
    assert summary["by_event"] == {"recovered": 1, "unhealthy": 1}
    # the summary used the slot
    assert not limiter.admit(make_event(), now=62.0)
    assert limiter.take_summary(now=121.0, wall_time=0.0, summary_id="s") is not None
    assert limiter.admit(make_event(), now=181.5)


def test_a_steady_storm_yields_at_most_the_limit_per_window() -> None:
    limiter = RateLimiter(limit=5, window_s=60.0)
    messages: list[float] = []
    for tick in range(600):  # ten minutes, one event a second, a summary check each tick
        now = float(tick)
        if limiter.admit(make_event(), now):
            messages.append(now)
        if limiter.take_summary(now, now, "s") is not None:
            messages.append(now)
    for start in range(0, 600):
        in_window = [m for m in messages if start <= m < start + 60]
        assert len(in_window) <= 5
    assert len(messages) >= 5 * 9  # and the limit is used, not starved


def test_summary_lists_a_bounded_number_of_endpoints() -> None:
    limiter = RateLimiter(limit=1, window_s=60.0)
    limiter.admit(make_event(), now=0.0)
    for i in range(MAX_SUMMARY_ENDPOINTS + 5):
        limiter.admit(make_event(endpoint=f"10.0.0.{i}:80"), now=1.0)
        limiter.admit(make_event(endpoint=f"10.0.0.{i}:80"), now=1.0)  # repeats count once
    summary = limiter.take_summary(now=61.0, wall_time=0.0, summary_id="s")
    assert summary is not None
    assert summary["suppressed"] == 2 * (MAX_SUMMARY_ENDPOINTS + 5)
    assert len(summary["endpoints"]) == MAX_SUMMARY_ENDPOINTS
    assert summary["more_endpoints"] == 5


# --------------------------------------------------------------------------- layering


def test_alerts_package_is_pure() -> None:
    """llm_health.alerts imports only the stdlib, the model and itself (no aiohttp,
    tenacity, grpc, pydantic), but for its settings (pydantic, core) and its component:
    delivery belongs to llm_health.alerts.component."""
    assert (PACKAGE / "alerts" / "events.py").is_file()
    edges = ("llm_health.alerts.settings", "llm_health.alerts.component")
    imports = [
        i
        for i in all_imports()
        if under(i.module, ("llm_health.alerts",)) and not under(i.module, edges)
    ]
    assert imports, "nothing scanned"
    allowed_own = ("llm_health.alerts", "llm_health.model")
    stdlib = ("__future__", "enum", "dataclasses", "datetime", "typing", "collections")
    stdlib = (*stdlib, "json", "urllib.parse")  # wire: the POSTed bytes, the webhook's origin
    bad = [
        i
        for i in imports
        if i.target != "llm_health"
        and not under(i.target, allowed_own)
        and not under(i.target, stdlib)
    ]
    assert not bad, [str(b) for b in bad]
    assert Path(PACKAGE / "alerts" / "__init__.py").is_file()
