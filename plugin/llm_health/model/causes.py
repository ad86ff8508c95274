"""Causes: the small fixed vocabulary of *why* a state changed (metric labels, alert
routing, /status). Set by the code that writes the free-text reason, in the same place,
so rewording a reason ("2 consecutive timeouts (>800 ms)") can never change a label.
Pure, no I/O.
"""

from __future__ import annotations

import enum

from llm_health.model.outcome import Outcome


class Cause(enum.Enum):
    # A member is its own only instance: hashed by identity (C), not by enum's own
    # ``__hash__`` (Python code, run on every set or dict lookup: several a probe).
    __hash__ = object.__hash__

    STARTUP = "startup"  # STARTING -> HEALTHY/DEGRADED: became ready
    STARTUP_TIMEOUT = "startup_timeout"  # STARTING -> UNHEALTHY: not ready within startup_grace
    RECOVERED = "recovered"  # back to HEALTHY, or UNHEALTHY -> DEGRADED
    SLOW = "slow"
    SILENT = "silent"  # a probe in flight has had no first token for healthy_ttft
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    ERROR = "error"
    FATAL = "fatal"
    SIGNAL = "signal"  # an outside source (e.g. HDS) holds it down
    GARBAGE = "garbage_output"  # a known-answer probe got degenerate output (NaN logits)
    WRONG_ANSWER = "wrong_answer"  # known-answer misses: regex or the cluster's consensus
    WRONG_MODEL = "wrong_model"  # /v1/models does not list the cluster's model
    SATURATED = "saturated"  # the engine's own metrics: queue or KV cache over a threshold
    QUALITY = "quality"  # real traffic (access logs, engine TTFT): errors or p95 TTFT over limits
    DRAINED = "drained"  # an operator drained it
    REMOVED = "removed"  # removed from the config (hot reload) or gone from DNS: draining out
    ADDED = "added"  # a new endpoint (hot reload, DNS): STARTING (not a state change)
    UNDRAINED = "undrained"
    OVERRIDE = "override"  # an operator forces the state for a while (not a transition)
    OTHER = "other"  # nothing above: a probe that changed nothing (e.g. one more FAST)


_BY_OUTCOME = {
    Outcome.SLOW: Cause.SLOW,
    Outcome.OVERLOADED: Cause.OVERLOADED,
    Outcome.TIMEOUT: Cause.TIMEOUT,
    Outcome.ERROR: Cause.ERROR,
    Outcome.FATAL: Cause.FATAL,
}


def outcome_cause(outcome: Outcome) -> Cause:
    """The cause a probe outcome gives a change (FAST names none: OTHER)."""
    return _BY_OUTCOME.get(outcome, Cause.OTHER)
