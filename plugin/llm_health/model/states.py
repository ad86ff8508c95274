"""Per-endpoint health state (docs/design.md §3)."""

from __future__ import annotations

import enum

from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome
from llm_health.model.value import value

EndpointKey = tuple[str, str]  # (cluster, address): names one endpoint everywhere


class State(enum.Enum):
    # A member is its own only instance: hashed by identity (C), not by enum's own
    # ``__hash__`` (Python code, run on every set or dict lookup: several a probe).
    __hash__ = object.__hash__

    STARTING = "starting"  # new endpoint, model loading or warming: not routed
    HEALTHY = "healthy"
    DEGRADED = "degraded"  # routed with a reduced weight
    UNHEALTHY = "unhealthy"  # not routed
    DRAINING = "draining"  # operator or discovery took it out; removed after drain_time


@value
class EndpointHealth:
    """Immutable state of one endpoint plus the streak counters the machine needs.

    ``successes``: consecutive FAST/SLOW probes; ``all_fast``: every one of them was FAST.
    ``fast_streak``: consecutive FAST probes. ``failures``: consecutive TIMEOUT/ERROR/FATAL;
    ``failure_kinds``: the outcomes in that run (for the reason text).
    ``qualify_after``: successes needed to leave STARTING (healthy_after, or 1 for endpoints
    that were already known when the plugin booted: see ``initial_health``).
    ``known_at_boot``: in the config when the plugin started (probably already serving).
    ``first_seen``/``since`` are seconds on the caller's clock. ``cause``: why the state
    last changed (the label of ``reason``). ``silenced``: DEGRADED only provisionally, by
    a probe still silent in flight (``machine.silence``): the state the counters imply is
    HEALTHY, and that probe's result decides.
    """

    state: State
    since: float
    reason: str
    first_seen: float
    qualify_after: int
    known_at_boot: bool = False
    successes: int = 0
    all_fast: bool = True
    fast_streak: int = 0
    failures: int = 0
    failure_kinds: frozenset[Outcome] = frozenset()
    last_outcome: Outcome | None = None
    cause: Cause = Cause.STARTUP
    silenced: bool = False
