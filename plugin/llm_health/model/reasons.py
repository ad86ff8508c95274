"""Reason classes: a small fixed vocabulary for *why* a state changed (metrics labels,
alert routing). The free-text reason ("2 consecutive timeouts (>800 ms)") is for humans
and logs; as a label it would be unbounded. Pure functions, no I/O.
"""

from __future__ import annotations

from llm_health.model.outcome import Outcome
from llm_health.model.states import State

REASON_CLASSES = (
    "startup",  # STARTING -> HEALTHY/DEGRADED: became ready
    "startup_timeout",  # STARTING -> UNHEALTHY: never became ready within startup_grace
    "recovered",  # back to HEALTHY, or UNHEALTHY -> DEGRADED
    "slow",
    "overloaded",
    "timeout",
    "error",
    "fatal",
    "signal",  # an outside source (e.g. HDS) holds it down
    "drained",  # an operator drained it
    "removed",  # removed from the config (hot reload): draining out
    "undrained",
    "other",
)

_BY_OUTCOME = {
    Outcome.SLOW: "slow",
    Outcome.OVERLOADED: "overloaded",
    Outcome.TIMEOUT: "timeout",
    Outcome.ERROR: "error",
    Outcome.FATAL: "fatal",
}
_ROUTED = (State.HEALTHY, State.DEGRADED)
REMOVED_REASON = "removed from config"  # machine/board wording of a reload removal


def reason_class(before: State, after: State, reason: str, outcome: Outcome | None) -> str:
    """Classify one transition ``before -> after``. ``outcome``: the probe that caused it,
    None when something else did (operator, reload, outside signal)."""
    if after is State.DRAINING:
        return "removed" if reason == REMOVED_REASON else "drained"
    if before is State.DRAINING:
        return "undrained"
    if outcome is None:
        return "signal" if after is State.UNHEALTHY else "other"
    if outcome is Outcome.FATAL:
        return "fatal"
    return _probe_class(before, after, reason, outcome)


def _probe_class(before: State, after: State, reason: str, outcome: Outcome) -> str:
    if before is State.STARTING:
        if after in _ROUTED:
            return "startup"
        if "startup_grace" in reason:  # machine._decide_starting's grace expiry
            return "startup_timeout"
    if after is State.HEALTHY or (before is State.UNHEALTHY and after is State.DEGRADED):
        return "recovered"
    return _BY_OUTCOME.get(outcome, "other")
