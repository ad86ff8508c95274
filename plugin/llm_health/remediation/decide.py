"""Which endpoints a hook is due for, and which of them the limits let through. Pure: the
caller passes the time (monotonic seconds) and keeps the ``Ledger``.

Guardrails (docs/design.md §13), in the order they are checked:
- never for STARTING, never while the endpoint is within ``startup_grace`` (a model may
  still be loading), only after ``for`` seconds in the rule's state, only for the rule's
  causes;
- one run per endpoint and rule at a time, and not again within ``cooldown``;
- at most ``max_per_hour`` runs in all (every rule, every endpoint);
- per cluster, at most ``max_concurrent_per_cluster`` running at once, and never more
  endpoints than the cluster's ``max_ejection_percent`` allows (at least one): a
  restart takes capacity away, like an ejection.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llm_health.model.causes import Cause
from llm_health.model.states import EndpointKey, State
from llm_health.remediation.settings import LimitsConfig, RemediationConfig

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint as the remediation ticker sees it."""

    cluster: str
    address: str
    state: State
    cause: Cause
    in_state_s: float  # seconds in ``state``
    in_grace: bool  # within startup_grace of its first sight
    cluster_size: int
    max_ejection_percent: int

    @property
    def key(self) -> EndpointKey:
        return self.cluster, self.address


@dataclass(slots=True)
class Ledger:
    """What ran: per (endpoint, rule) the last start, the starts of the last hour, and
    what is running now."""

    last: dict[tuple[EndpointKey, str], float] = field(default_factory=dict)
    hour: deque[float] = field(default_factory=deque)
    running: set[tuple[EndpointKey, str]] = field(default_factory=set)

    def running_in(self, cluster: str) -> int:
        return len({key for (key, _rule) in self.running if key[0] == cluster})

    def start(self, key: EndpointKey, rule: RemediationConfig, now: float) -> None:
        self.last[(key, rule.name)] = now
        self.hour.append(now)
        self.running.add((key, rule.name))

    def finish(self, key: EndpointKey, rule: RemediationConfig) -> None:
        self.running.discard((key, rule.name))

    def forget_before(self, now: float) -> None:
        while self.hour and self.hour[0] <= now - HOUR_S:
            self.hour.popleft()


def is_due(rule: RemediationConfig, candidate: Candidate) -> bool:
    when = rule.when  # the file's words: state and cause names, compared by value
    return (
        candidate.state.value == when.state
        and candidate.state is not State.STARTING
        and not candidate.in_grace
        and candidate.in_state_s >= when.for_
        and (not when.causes or candidate.cause.value in when.causes)
    )


def refusal(
    ledger: Ledger, candidate: Candidate, rule: RemediationConfig, limits: LimitsConfig, now: float
) -> str | None:
    """Why a due hook must not run now (None: run it). Call ``ledger.forget_before(now)``
    first."""
    key = (candidate.key, rule.name)
    if key in ledger.running:
        return "already running"
    last = ledger.last.get(key)
    if last is not None and now - last < limits.cooldown:
        return f"cooldown ({limits.cooldown:g} s)"
    if len(ledger.hour) >= limits.max_per_hour:
        return f"max_per_hour ({limits.max_per_hour})"
    running = ledger.running_in(candidate.cluster)
    if running >= limits.max_concurrent_per_cluster:
        return f"max_concurrent_per_cluster ({limits.max_concurrent_per_cluster})"
    allowed = max(1, math.floor(candidate.cluster_size * candidate.max_ejection_percent / 100))
    if running + 1 > allowed:
        return (
            f"max_ejection_percent ({candidate.max_ejection_percent} % of {candidate.cluster_size})"
        )
    return None
