"""One endpoint's record on the board, and the rules that fold outside holds into it.

``model/board.py`` owns these records (one task, synchronous) and applies the rules; here
they are pure: an outside signal holds an endpoint UNHEALTHY, a limit holds it at most
DEGRADED (docs/design.md §7.3), an override changes what readers see.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from llm_health.model.admission import NO_ADMISSION, Admission
from llm_health.model.causes import Cause
from llm_health.model.envoy_view import envoy_view
from llm_health.model.machine import Transition, initial_health
from llm_health.model.outcome import FAILURES, ProbeResult
from llm_health.model.snapshot import ClusterSpec, EndpointSnapshot, EndpointSpec
from llm_health.model.states import EndpointHealth, State


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's forced state (maintenance) until ``until`` (monotonic seconds)."""

    state: State
    until: float
    reason: str


@dataclass(frozen=True, slots=True)
class Hold:
    """One outside source's say on an endpoint: why, and the cause label it carries.
    ``reported``: it came from outside reports (``Board.report``), so it counts against
    the cap on what those may hold out."""

    reason: str
    cause: Cause
    reported: bool = False


@dataclass(slots=True)
class Entry:
    """One endpoint on the board: its health and what holds it (mutable, the board's)."""

    spec: EndpointSpec
    health: EndpointHealth
    last: ProbeResult | None = None
    signals: dict[str, Hold] = field(default_factory=dict)  # held UNHEALTHY
    limits: dict[str, Hold] = field(default_factory=dict)  # allowed at most DEGRADED
    override: Override | None = None
    removing_at: float | None = None  # removed from config: gone after drain_time
    ejected_by_failure: bool = False  # UNHEALTHY by TIMEOUT/ERROR probes, or a fleet verdict
    admission: Admission = NO_ADMISSION  # the engine admitting requests (model.admission)


@dataclass(slots=True)
class BoardCluster:
    """One cluster on the board and its endpoints by address, in order."""

    spec: ClusterSpec
    entries: dict[str, Entry] = field(default_factory=dict)
    warm: bool = False
    removing_at: float | None = None
    known_at_boot: bool = False  # in the board the plugin (re)started with


def endpoint_snapshot(
    name: str, entry: Entry, share: float, wall_offset: float
) -> EndpointSnapshot:
    """How ``entry`` of cluster ``name`` looks to readers (an override wins); ``share``:
    the cluster's ``degraded_weight``; ``wall_offset``: as ``Board``'s."""
    health, override = entry.health, entry.override
    state = override.state if override else health.state
    reason = f"override: {override.reason}" if override else health.reason
    return EndpointSnapshot(
        cluster=name,
        spec=entry.spec,
        state=state,
        reason=reason,
        cause=Cause.OVERRIDE if override else health.cause,
        since=health.since + wall_offset,
        view=envoy_view(state, entry.spec.weight, share),
        last=entry.last,
        probe_state=health.state,
        signals=MappingProxyType({k: v.reason for k, v in entry.signals.items()}),
        limits=MappingProxyType({k: v.reason for k, v in entry.limits.items()}),
        override_until=override.until + wall_offset if override else None,
        removing=entry.removing_at is not None,
    )


def outside_allowed(total: int, max_ejection_percent: int) -> int:
    """How many of a cluster's ``total`` endpoints unauthenticated outside reports may hold
    out: ⌊total × max_ejection_percent / 100⌋, and never all of them (1 → 0, 2 at 50 % → 1,
    3 at 50 % → 1). Unlike the probe cap (``Board._cap_ejection``, at least one), the last
    endpoint of a small cluster stays in: a forged report must not blank it."""
    return max(0, min(total * max_ejection_percent // 100, total - 1))


def out_of_service(entry: Entry) -> bool:
    """Counted against ``outside_allowed``: held down by any signal, UNHEALTHY by probe, or
    limited by an outside report."""
    return (
        bool(entry.signals)
        or entry.health.state is State.UNHEALTHY
        or any(hold.reported for hold in entry.limits.values())
    )


def ejects_by_failure(transition: Transition, result: ProbeResult) -> bool:
    """Taken out by TIMEOUT/ERROR probes (not FATAL, not a newcomer's expired grace)."""
    newcomer = transition.from_state is State.STARTING and not transition.after.known_at_boot
    return (
        transition.changed
        and transition.after.state is State.UNHEALTHY
        and result.outcome in FAILURES
        and not newcomer
    )


def held_by_signals(entry: Entry, transition: Transition) -> Transition:
    """Held down by an outside signal: probes are counted (failures, FATAL alerts) but no
    success streak builds up, so recovery starts only once every signal has cleared."""
    cause = next(iter(entry.signals.values())).cause
    held = replace(
        transition.after,
        state=State.UNHEALTHY,
        since=entry.health.since,
        reason="; ".join(hold.reason for hold in entry.signals.values()),
        cause=cause,
        successes=0,
        all_fast=True,
        fast_streak=0,
    )
    return Transition(State.UNHEALTHY, held, changed=False, alert=transition.alert, cause=cause)


def still_limited(entry: Entry, lifted: Hold) -> EndpointHealth:
    """A limit lifted while others hold: a DEGRADED endpoint that was so for the lifted
    one now says why it still is (the state does not change)."""
    health = entry.health
    if not entry.limits or health.state is not State.DEGRADED or health.cause is not lifted.cause:
        return health
    first = next(iter(entry.limits.values()))
    reason = "; ".join(hold.reason for hold in entry.limits.values())
    return replace(health, reason=reason, cause=first.cause)


def held_by_limits(entry: Entry, transition: Transition, now: float) -> Transition:
    """A limit holds: a result that would make the endpoint HEALTHY leaves it DEGRADED with
    the limit's reason, and no fast streak builds up (recovery begins once the limit
    lifts)."""
    if transition.after.state is State.DEGRADED:
        after = replace(transition.after, fast_streak=0)
        return replace(transition, after=after)
    first = next(iter(entry.limits.values()))
    stays = transition.from_state is State.DEGRADED
    capped = replace(
        transition.after,
        state=State.DEGRADED,
        since=entry.health.since if stays else now,
        reason="; ".join(hold.reason for hold in entry.limits.values()),
        cause=first.cause,
        fast_streak=0,
        silenced=False,
    )
    return Transition(transition.from_state, capped, changed=not stays, cause=first.cause)


def new_cluster(spec: ClusterSpec, now: float, *, known_at_boot: bool) -> BoardCluster:
    cluster = BoardCluster(spec, known_at_boot=known_at_boot)
    for endpoint in spec.endpoints:
        health = initial_health(now, spec.policy, known_at_boot=known_at_boot)
        cluster.entries[endpoint.address] = Entry(endpoint, health)
    return cluster
