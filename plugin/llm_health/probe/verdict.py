"""A micro-probe's verdict as a ``ProbeResult`` (docs/design.md §2, §7.4): its timing,
the classes of a non-200 answer and of an error event, and the details logs and
/status show."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llm_health.errors import ProtocolError
from llm_health.model.answer import Answer
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.events import error_message_from_body
from llm_health.probe.http1 import ConnectFailed, ConnectionBroken, ResponseError
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.target import ProbeTarget

MAX_DETAIL = 500  # characters of a result's detail (one printable line: logs, /status)
OVERLOAD_WORDS = ("overload", "too many", "capacity", "busy", "queue", "rate limit", "throttl")


@dataclass(slots=True)
class Timing:
    """When an exchange's steps happened (perf_counter), from its start."""

    start: float
    wall: float  # the start on the wall clock (``ProbeResult.started_at``)
    connected: float | None = None
    headers: float | None = None
    reused: bool = False  # sent on a pooled keep-alive connection
    first_token: float | None = None
    stamped: bool = False  # the first token timed by the kernel (``Connection.stamped``)

    def ms(self, at: float | None) -> float | None:
        return None if at is None else (at - self.start) * 1000


def result_of(
    lag: LoopLagMonitor | None,
    target: ProbeTarget,
    timing: Timing,
    outcome: Outcome,
    status: int | None,
    detail: str,
    answer: Answer | None = None,
    interim: int = 0,
) -> ProbeResult:
    """The ``ProbeResult`` of a verdict: FAST split into FAST and SLOW by the first
    token's time, less the prober's own lateness (``lag``)."""
    start, token = timing.start, timing.first_token
    ttft_ms = timing.ms(token)
    lag_ms = stalled_ms = 0.0
    if lag is not None:
        # A token the kernel timed holds none of our stalls: none is taken off it.
        lag_ms, stalled_ms = lag.over(start, None if timing.stamped else token)
    # SLOW only if the first token was late even without the prober's own lateness.
    # A starved loop (another process burning the CPU, a GC pause) notices the
    # token's bytes late by up to the longest stall between the probe's start and the
    # moment they were taken in (``stalled_ms``): that is ours, not the engine's
    # (docs/design.md §7.4). A stall after that moment is not in the TTFT (timed when
    # the bytes arrived) and is not subtracted either, or a slow engine would read
    # FAST behind a busy loop. A lag beyond max_loop_lag still makes the board ignore
    # SLOW and TIMEOUT verdicts (``ProbeResult.loop_lag_ms``: the whole probe's worst).
    slow_ms = target.healthy_ttft_s * 1000
    if outcome is Outcome.FAST and ttft_ms is not None and ttft_ms - stalled_ms > slow_ms:
        outcome = Outcome.SLOW
    return ProbeResult(
        outcome=outcome,
        started_at=timing.wall,
        ttft_ms=ttft_ms,
        connect_ms=timing.ms(timing.connected),
        headers_ms=timing.ms(timing.headers),
        total_ms=(time.perf_counter() - start) * 1000,
        status=status,
        detail=shown(detail, target),
        loop_lag_ms=lag_ms,
        answer=answer,
        interim=interim,
    )


def shown(detail: str, target: ProbeTarget) -> str:
    """A result's detail as logs and /status show it: secret-free, one printable line
    (nothing to do for a FAST probe's empty detail: most probes)."""
    if not detail:
        return detail
    return printable_line(redact_secrets(detail, target.secrets), MAX_DETAIL)


def classify_status(raw: bytes, status: int, target: ProbeTarget) -> tuple[Outcome, int, str]:
    """Non-200 (``raw``: the start of its body): FATAL on a fatal pattern, OVERLOADED on
    429 or an overloaded 503, else ERROR."""
    # Redact before anything clips the text: a clipped secret is a partial leak. The read
    # itself may have cut one: its start is redacted too (model.redact.MIN_PREFIX).
    text = redact_secrets(raw.decode("utf-8", "replace"), target.secrets)
    message = error_message_from_body(text)
    outcome, detail = classify_error_text(message, target, f"HTTP {status}")
    if outcome is Outcome.FATAL:
        return outcome, status, detail
    if status == 429 or (status == 503 and _mentions_overload(message)):
        return Outcome.OVERLOADED, status, f"HTTP {status}: {message}"
    return Outcome.ERROR, status, detail


def classify_error_text(message: str, target: ProbeTarget, where: str) -> tuple[Outcome, str]:
    match = target.fatal_patterns.search(message) if target.fatal_patterns else None
    if match is not None:
        return Outcome.FATAL, f"{where}: {message}"
    return Outcome.ERROR, f"{where}: {message}"


def _mentions_overload(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in OVERLOAD_WORDS)


def timeout_detail(target: ProbeTarget, timing: Timing) -> str:
    limit = f"{target.timeout_s * 1000:g} ms"
    if timing.headers is not None:
        return f"no first token within {limit} (headers after {timing.ms(timing.headers):.0f} ms)"
    if timing.connected is not None:
        return f"no response headers within {limit}"
    return f"no connection within {limit}"


def error_detail(exc: BaseException) -> str:
    """Short, secret-free text for a transport error (no URLs with credentials, no bodies)."""
    if isinstance(exc, ConnectFailed):
        return f"connect failed: {exc.strerror or exc}"
    if isinstance(exc, ConnectionBroken | ResponseError):
        return str(exc)
    if isinstance(exc, ProtocolError):
        return f"malformed stream: {exc}"
    return f"{type(exc).__name__}: {exc}"[:200]
