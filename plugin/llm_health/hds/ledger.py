"""Folding HDS reports into one verdict per endpoint: quorum, expiry, first-check grace.

Rules (docs/design.md §5, §7):
- Each Envoy's latest word on an endpoint is kept with its time. It counts while it is
  younger than ``ttl_s``: an Envoy that went away or stopped reporting is *unknown*, not
  healthy, and after the TTL its old word no longer counts either way.
- An endpoint's *electors* are the Envoys assigned to check it now, plus any Envoy whose
  word on it still counts (e.g. one that just went away). It is down when at least
  ``quorum`` electors (default: a majority; never more than there are electors) say
  UNHEALTHY or TIMEOUT. Electors that have not reported yet count as "not down".
- Envoy creates every newly assigned host as failed and reports it UNHEALTHY until its
  first check has run (health_discovery_service.cc, ``updateHosts``); so for
  ``grace_s`` after an assignment, UNHEALTHY from that Envoy about that endpoint is
  ignored unless it has already reported it HEALTHY since.
- A report about an endpoint the Envoy is not assigned to (a race with a new specifier)
  is ignored; an Envoy still connected but no longer assigned an endpoint loses its word
  on it at once.

Pure and synchronous; one owner; times are monotonic seconds passed in by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from llm_health.hds.assign import EMPTY, Assignment
from llm_health.model.redact import printable
from llm_health.model.states import EndpointKey

# A node id in a down reason: the reason is logged, shown and sent with every state change
# it makes, and a node id is the peer's text (docs/design.md §10).
MAX_NAMED_CHARS = 100


class Said(enum.Enum):
    """One Envoy's word on one endpoint (from envoy.config.core.v3.HealthStatus)."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"  # UNKNOWN, DRAINING, ...: no verdict to count


DOWN = frozenset({Said.UNHEALTHY, Said.TIMEOUT})


class Counted(enum.Enum):
    """What became of one report entry."""

    COUNTED = "counted"
    UNASSIGNED = "unassigned"  # the Envoy is not (or no longer) assigned this endpoint
    FIRST_CHECK = "first_check"  # UNHEALTHY within the first-check grace: not counted
    NO_VERDICT = "no_verdict"  # Said.UNKNOWN


@dataclass(frozen=True, slots=True)
class Verdict:
    said: Said
    at: float


@dataclass(frozen=True, slots=True)
class Reporter:
    """One elector of an endpoint, for /status. ``said`` None: nothing counted yet."""

    node: str
    said: Said | None
    age_s: float | None
    assigned: bool


def majority(electors: int) -> int:
    return electors // 2 + 1


class Ledger:
    """Every Envoy's latest counted word on every endpoint, and the quorum rule."""

    def __init__(self, *, quorum: int | None, ttl_s: float, grace_s: float) -> None:
        self._quorum = quorum
        self._ttl_s = ttl_s
        self._grace_s = grace_s
        self._assignment = EMPTY
        self._assigned_at: dict[tuple[EndpointKey, str], float] = {}
        self._confirmed: set[tuple[EndpointKey, str]] = set()  # HEALTHY since assignment
        self._verdicts: dict[EndpointKey, dict[str, Verdict]] = {}

    @property
    def assignment(self) -> Assignment:
        return self._assignment

    def reassign(self, assignment: Assignment, connected: Collection[str], now: float) -> None:
        """Adopt a new assignment. New (endpoint, node) pairs start their first-check
        grace; connected nodes lose their word on endpoints they no longer check; words
        on endpoints that no longer exist are dropped."""
        pairs = {(e, n) for e, nodes in assignment.by_endpoint.items() for n in nodes}
        for pair in pairs - self._assigned_at.keys():
            self._assigned_at[pair] = now
        for pair in self._assigned_at.keys() - pairs:
            del self._assigned_at[pair]
            self._confirmed.discard(pair)
            endpoint, node = pair
            if node in connected:
                self._verdicts.get(endpoint, {}).pop(node, None)
        for endpoint in self._verdicts.keys() - assignment.by_endpoint.keys():
            del self._verdicts[endpoint]
        self._assignment = assignment

    def record(self, node: str, endpoint: EndpointKey, said: Said, now: float) -> Counted:
        """Fold one report entry in (see the module rules)."""
        pair = (endpoint, node)
        assigned_at = self._assigned_at.get(pair)
        if assigned_at is None:
            return Counted.UNASSIGNED
        if said is Said.UNKNOWN:
            return Counted.NO_VERDICT
        if said is Said.HEALTHY:
            self._confirmed.add(pair)
        elif pair not in self._confirmed and now < assigned_at + self._grace_s:
            return Counted.FIRST_CHECK
        self._verdicts.setdefault(endpoint, {})[node] = Verdict(said, now)
        return Counted.COUNTED

    def expire(self, now: float) -> int:
        """Forget words older than the TTL; returns how many were dropped."""
        dropped = 0
        for endpoint, words in list(self._verdicts.items()):
            for node, verdict in list(words.items()):
                if now - verdict.at > self._ttl_s:
                    del words[node]
                    dropped += 1
            if not words:
                del self._verdicts[endpoint]
        return dropped

    def says_down(self) -> bool:
        """Whether any Envoy's word on any endpoint is down (fresh or not): when none is,
        every ``decide`` is None."""
        return any(v.said in DOWN for words in self._verdicts.values() for v in words.values())

    def decide(self, endpoint: EndpointKey, now: float) -> str | None:
        """The down reason ("unreachable from gw-2, gw-3 (timeout)") or None."""
        fresh = self._fresh(endpoint, now)
        electors = set(self._assignment.checkers_of(endpoint)) | fresh.keys()
        if not electors:
            return None
        down = sorted(node for node, verdict in fresh.items() if verdict.said in DOWN)
        need = min(self._quorum or majority(len(electors)), len(electors))
        if len(down) < need:
            return None
        named = [_named(n) + (" (timeout)" if fresh[n].said is Said.TIMEOUT else "") for n in down]
        return "unreachable from " + ", ".join(named)

    def reporters(self, endpoint: EndpointKey, now: float) -> tuple[Reporter, ...]:
        fresh = self._fresh(endpoint, now)
        assigned = self._assignment.checkers_of(endpoint)
        nodes = sorted(set(assigned) | fresh.keys())
        return tuple(self._reporter(node, fresh.get(node), node in assigned, now) for node in nodes)

    def _fresh(self, endpoint: EndpointKey, now: float) -> dict[str, Verdict]:
        words = self._verdicts.get(endpoint, {})
        return {n: v for n, v in words.items() if now - v.at <= self._ttl_s}

    @staticmethod
    def _reporter(node: str, verdict: Verdict | None, assigned: bool, now: float) -> Reporter:
        if verdict is None:
            return Reporter(node, None, None, assigned)
        return Reporter(node, verdict.said, round(now - verdict.at, 3), assigned)


def _named(node: str) -> str:
    return printable(node, MAX_NAMED_CHARS)
