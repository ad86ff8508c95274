"""The micro-probe (docs/design.md §2): one streamed, one-token request; TTFT on the first
token-bearing event; the stream closed right after it so the engine aborts the request.

Never raises for anything the endpoint does: every failure becomes a ProbeResult.
Cancellation (shutdown) is the only exception that propagates.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp

from llm_health.errors import ProtocolError
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.events import EventKind, error_message_from_body, interpret
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.signals import first_token_seen
from llm_health.probe.sse import SseDecoder
from llm_health.probe.target import ProbeTarget

MAX_ERROR_BODY = 64 * 1024
MAX_DETAIL = 500  # characters of a result's detail (one printable line: logs, /status)
MAX_BYTES_BEFORE_TOKEN = 1024 * 1024
OVERLOAD_WORDS = ("overload", "too many", "capacity", "busy", "queue", "rate limit", "throttl")
PROBE_HEADER = "X-LLM-Probe"


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    """The prober's HTTP client. ``limit=0``: no pool cap (one probe per endpoint anyway).
    The trace hook records when the TCP connection was made (connect timing)."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(_on_connected)
    trace.on_connection_reuseconn.append(_on_connected)
    connector = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=30, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector, trace_configs=[trace], auto_decompress=False, trust_env=False
    )


async def _on_connected(_session: Any, ctx: SimpleNamespace, _params: Any) -> None:
    timing = ctx.trace_request_ctx
    if isinstance(timing, _Timing) and timing.connected is None:
        timing.connected = time.perf_counter()


@dataclass(slots=True)
class _Timing:
    start: float
    connected: float | None = None
    headers: float | None = None
    first_token: float | None = None

    def ms(self, at: float | None) -> float | None:
        return None if at is None else (at - self.start) * 1000


class MicroProbe:
    """Sends micro-probes over one shared aiohttp session. Task-safe: each call is independent."""

    def __init__(self, session: aiohttp.ClientSession, lag: LoopLagMonitor | None = None) -> None:
        self._session = session
        self._lag = lag

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        """Probe once; the result arrives within ``target.timeout_s`` (plus scheduling)."""
        timing = _Timing(time.perf_counter())
        wall = time.time()
        try:
            async with asyncio.timeout(target.timeout_s):
                outcome, status, detail = await self._exchange(target, timing)
        except TimeoutError:
            outcome, status, detail = Outcome.TIMEOUT, None, _timeout_detail(target, timing)
        except (aiohttp.ClientError, OSError, ProtocolError, UnicodeError, ValueError) as exc:
            outcome, status, detail = Outcome.ERROR, None, _error_detail(exc)
        return self._result(target, timing, wall, outcome, status, detail)

    async def _exchange(
        self, target: ProbeTarget, timing: _Timing
    ) -> tuple[Outcome, int | None, str]:
        body = probe_body(target)
        headers = {**target.headers, PROBE_HEADER: "true", "Accept": "text/event-stream"}
        async with self._session.post(
            target.url, json=body, headers=headers, trace_request_ctx=timing
        ) as response:
            timing.headers = time.perf_counter()
            if response.status != 200:
                return await _classify_status(response, target)
            outcome, detail = await _read_first_token(response, target, timing)
            response.close()  # abort the stream: the engine stops decoding (docs/design.md §2)
            return outcome, 200, detail

    def _result(
        self,
        target: ProbeTarget,
        timing: _Timing,
        wall: float,
        outcome: Outcome,
        status: int | None,
        detail: str,
    ) -> ProbeResult:
        ttft_ms = timing.ms(timing.first_token)
        lag_ms = self._lag.max_since(timing.start) if self._lag else 0.0
        if outcome is Outcome.FAST and ttft_ms is not None:
            outcome = _fast_or_slow(ttft_ms, lag_ms, target.healthy_ttft_s * 1000)
        return ProbeResult(
            outcome=outcome,
            started_at=wall,
            ttft_ms=ttft_ms,
            connect_ms=timing.ms(timing.connected),
            headers_ms=timing.ms(timing.headers),
            total_ms=(time.perf_counter() - timing.start) * 1000,
            status=status,
            detail=printable_line(redact_secrets(detail, target.secrets), MAX_DETAIL),
            loop_lag_ms=lag_ms,
        )


def _fast_or_slow(ttft_ms: float, lag_ms: float, healthy_ms: float) -> Outcome:
    """SLOW only if the first token was late even without the prober's own lateness.

    A starved event loop (another process burning the CPU, a GC pause) notices the token
    late by up to the worst lag seen while the probe ran: that lateness is ours, not the
    engine's (docs/design.md §7.4). Lag can only delay, never hasten, so the corrected
    TTFT is a lower bound and a FAST verdict stays honest; a lag beyond max_loop_lag still
    makes the board ignore SLOW and TIMEOUT verdicts altogether.
    """
    return Outcome.FAST if ttft_ms - lag_ms <= healthy_ms else Outcome.SLOW


def probe_body(target: ProbeTarget) -> dict[str, Any]:
    """The request body: stream, 1 token, greedy; cache busting per ``target.cache_bust``.

    ``salt``: vLLM's ``cache_salt`` gives the probe its own prefix-cache namespace, so it
    neither hits nor pollutes users' cached prefixes. ``prefix``: a random nonce in front of
    the prompt does the same on engines without cache_salt (a few more prompt tokens).
    """
    nonce = secrets.token_hex(6)
    prompt = f"{nonce} {target.prompt}" if target.cache_bust == "prefix" else target.prompt
    body: dict[str, Any] = {"stream": True, "max_tokens": 1, "temperature": 0, "top_p": 1}
    if target.model:
        body["model"] = target.model
    if target.api == "openai-chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if target.cache_bust == "salt":
        body["cache_salt"] = nonce
    return body


async def _read_first_token(
    response: aiohttp.ClientResponse, target: ProbeTarget, timing: _Timing
) -> tuple[Outcome, str]:
    """Read events until one carries a token; FAST here means "got a token" (the caller
    splits FAST/SLOW by TTFT)."""
    decoder, received = SseDecoder(), 0
    async for chunk in response.content.iter_any():
        received += len(chunk)
        for payload in decoder.feed(chunk):
            verdict = _verdict(payload, target, timing)
            if verdict is not None:
                return verdict
        if received > MAX_BYTES_BEFORE_TOKEN:
            return Outcome.ERROR, f"no token in the first {MAX_BYTES_BEFORE_TOKEN} bytes"
    last = decoder.close()
    verdict = _verdict(last, target, timing) if last is not None else None
    return verdict or (Outcome.ERROR, "stream ended before the first token")


def _verdict(payload: str, target: ProbeTarget, timing: _Timing) -> tuple[Outcome, str] | None:
    event = interpret(payload, target.api)
    if event.kind is EventKind.ERROR or event.kind is EventKind.MALFORMED:
        event = interpret(redact_secrets(payload, target.secrets), target.api)
    if event.kind is EventKind.TOKEN:
        timing.first_token = time.perf_counter()
        first_token_seen()
        return Outcome.FAST, ""
    if event.kind is EventKind.NO_TOKEN:
        return None
    if event.kind is EventKind.DONE:
        return Outcome.ERROR, "stream ended ([DONE]) before the first token"
    if event.kind is EventKind.ERROR:
        return _classify_error_text(event.message, target, "error event in stream")
    return Outcome.ERROR, f"malformed stream: {event.message}"


async def _classify_status(
    response: aiohttp.ClientResponse, target: ProbeTarget
) -> tuple[Outcome, int, str]:
    """Non-200: FATAL on a fatal pattern, OVERLOADED on 429 or an overloaded 503, else ERROR."""
    raw = await response.content.read(MAX_ERROR_BODY)
    # Redact before anything clips the text: a clipped secret is a partial leak.
    text = redact_secrets(raw.decode("utf-8", "replace"), target.secrets)
    message = error_message_from_body(text)
    status = response.status
    outcome, detail = _classify_error_text(message, target, f"HTTP {status}")
    if outcome is Outcome.FATAL:
        return outcome, status, detail
    if status == 429 or (status == 503 and _mentions_overload(message)):
        return Outcome.OVERLOADED, status, f"HTTP {status}: {message}"
    return Outcome.ERROR, status, detail


def _classify_error_text(message: str, target: ProbeTarget, where: str) -> tuple[Outcome, str]:
    match = target.fatal_patterns.search(message) if target.fatal_patterns else None
    if match is not None:
        return Outcome.FATAL, f"{where}: {message}"
    return Outcome.ERROR, f"{where}: {message}"


def _mentions_overload(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in OVERLOAD_WORDS)


def _timeout_detail(target: ProbeTarget, timing: _Timing) -> str:
    limit = f"{target.timeout_s * 1000:g} ms"
    if timing.headers is not None:
        return f"no first token within {limit} (headers after {timing.ms(timing.headers):.0f} ms)"
    if timing.connected is not None:
        return f"no response headers within {limit}"
    return f"no connection within {limit}"


def _error_detail(exc: BaseException) -> str:
    """Short, secret-free text for a transport error (no URLs with credentials, no bodies)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connect failed: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "connection broke mid-stream"
    if isinstance(exc, ProtocolError):
        return f"malformed stream: {exc}"
    return f"{type(exc).__name__}: {exc}"[:200]
