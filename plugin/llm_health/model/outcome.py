"""What one micro-probe found (docs/design.md §2)."""

from __future__ import annotations

import enum

from llm_health.model.answer import Answer
from llm_health.model.value import value


class Outcome(enum.Enum):
    """The six classifications of one probe."""

    # A member is its own only instance: hashed by identity (C), not by enum's own
    # ``__hash__`` (Python code, run on every set or dict lookup: several a probe).
    __hash__ = object.__hash__

    FAST = "fast"  # first token within healthy_ttft
    SLOW = "slow"  # first token after healthy_ttft, within timeout
    OVERLOADED = "overloaded"  # the engine says it is saturated (429, 503 + overload text)
    TIMEOUT = "timeout"  # no first token within timeout
    FATAL = "fatal"  # an engine-fatal error (CUDA, NCCL, Xid, ...)
    ERROR = "error"  # anything else: refused, reset, other non-2xx, malformed, no token


def round_ms(value: float | None) -> float | None:
    """A timing for humans and JSON: 0.01 ms resolution (None stays None)."""
    return None if value is None else round(value, 2)


SUCCESSES = frozenset({Outcome.FAST, Outcome.SLOW})
FAILURES = frozenset({Outcome.TIMEOUT, Outcome.ERROR})


@value
class ProbeResult:
    """One probe's outcome and timings, all in milliseconds from the request start.

    ``connect_ms``/``headers_ms``/``ttft_ms`` are None when that phase was not reached.
    ``loop_lag_ms`` is the worst event-loop lag seen while the probe ran: when it is large
    the timings are the prober's fault, not the engine's (docs/design.md §7).
    ``detail`` is a short human text (never a secret, never a whole body).
    ``answer``: set on a known-answer probe that got a first token (its TTFT counts too).
    ``interim``: interim (1xx) responses read past before the answer (RFC 9110 §15.2).
    ``excused``: a SLOW or TIMEOUT probe the overload rule made OVERLOADED (it waited
    behind a queue the engine admits from: ``model.admission``, docs/design.md §3.5).
    ``admission``: what the engine admitted during this probe's wait, as two reads taken
    after it was sent showed it (``engines.bracket``); "" when none was seen.
    """

    outcome: Outcome
    started_at: float  # wall-clock seconds (time.time()) when the request was sent
    ttft_ms: float | None = None
    connect_ms: float | None = None
    headers_ms: float | None = None
    total_ms: float = 0.0
    status: int | None = None
    detail: str = ""
    loop_lag_ms: float = 0.0
    answer: Answer | None = None  # a known-answer probe's answer (docs/design.md §14)
    interim: int = 0
    excused: bool = False
    admission: str = ""


def timings(result: ProbeResult) -> dict[str, object]:
    """A probe result's log fields (milliseconds, rounded)."""
    return {
        "outcome": result.outcome.value,
        "ttft_ms": round_ms(result.ttft_ms),
        "connect_ms": round_ms(result.connect_ms),
        "headers_ms": round_ms(result.headers_ms),
        "loop_lag_ms": round_ms(result.loop_lag_ms),
        "detail": result.detail,
    }
