"""One inference request being served: its record, its accounting and its waits.

Contracts kept here:

- Every call that :func:`begin_call` counts is closed by exactly one :func:`end_call`,
  as ``completed``, ``failed`` or ``aborted`` (client went away before the response was
  fully sent), so ``requests == completed + failed + aborted + in_flight`` (until a
  stats reset).
- Every wait goes through :func:`pause`, which ends early when the client disconnects
  or the application shuts down: no handler outlives its client or blocks shutdown.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from llm_health.sim.faults import FaultSpec
from llm_health.sim.state import SimState
from llm_health.sim.wire import JSON_CONTENT_TYPE, SSE_HEADERS, Kind, Params

__all__ = [
    "Call",
    "ClientGone",
    "Outcome",
    "Stopping",
    "begin_call",
    "end_call",
    "open_response",
    "pause",
    "send_whole",
    "wait_for_client",
]

Outcome = Literal["completed", "failed", "aborted"]

#: How often a long wait re-checks that its client is still connected, for apps run
#: without ``handler_cancellation`` (ours cancel the handler on disconnect at once).
_DISCONNECT_POLL_S = 0.5
#: Longest string kept per field of a request in ``recent`` (bounds memory).
_MAX_RECORDED_CHARS = 2000
_MAX_RECORDED_MESSAGES = 20


class ClientGone(Exception):
    """The client closed the connection while the handler was waiting."""


class Stopping(Exception):
    """The application is shutting down; the handler must end now."""


@dataclass
class Call:
    """One inference request being served."""

    request: web.Request
    state: SimState
    kind: Kind
    params: Params
    spec: FaultSpec
    fault: str
    call_id: str
    is_probe: bool = False
    arrived: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    response: web.StreamResponse | None = None
    outcome: Outcome = "failed"
    is_running: bool = False
    first_token_seen: bool = False
    first_write_noted: bool = False
    admitted: bool = False  # holds an engine slot (``sim.admission``)

    def mark_running(self) -> None:
        """Move from 'waiting' to 'running' in the metrics (first token produced)."""
        if not self.is_running:
            self.is_running = True
            self.state.running += 1

    def mark_first_token(self) -> None:
        """Observe the call's TTFT (arrival to now) in the TTFT histogram, once."""
        if not self.first_token_seen:
            self.first_token_seen = True
            self.state.ttft.observe(time.monotonic() - self.arrived)

    def note_first_token_written(self) -> None:
        """Record, once, the wall-clock time the first token's bytes were written, for a
        probe and only with ``record_first_tokens`` on (per listening port)."""
        if self.first_write_noted or not self.is_probe:
            return
        written_at = time.time()
        self.first_write_noted = True
        if self.state.settings.record_first_tokens > 0:
            port = _local_port(self.request)
            if port is not None:
                self.state.record_first_token_write(port, written_at)

    def mark_completed(self) -> None:
        """The response was sent in full: outcome "completed", end-to-end latency observed."""
        self.outcome = "completed"
        self.state.e2e.observe(time.monotonic() - self.arrived)


def _local_port(request: web.Request) -> int | None:
    """The listening port the request came in on, or None (connection gone)."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2 and isinstance(sockname[1], int):
        return sockname[1]
    return None


# ------------------------------------------------------------ accounting


def begin_call(
    request: web.Request,
    state: SimState,
    kind: Kind,
    params: Params,
    arrived: float | None = None,
) -> Call:
    """Create the call, pick its fault, and count it (requests, probes, recent, in-flight).

    ``arrived`` is when the request arrived (``time.monotonic()``; default now): the
    start of its TTFT and end-to-end latency.
    """
    spec = state.fault
    probe_header = request.headers.get("X-LLM-Probe")
    is_probe = probe_header is not None and probe_header.strip().lower() == "true"
    fault = state.choose_fault(spec, is_probe)
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    call_id = prefix + uuid.uuid4().hex
    call = Call(request, state, kind, params, spec, fault, call_id, is_probe)
    if arrived is not None:
        call.arrived = arrived
    counters = state.counters
    counters.requests += 1
    counters.probe_requests += is_probe
    counters.faulted += fault != "none"
    counters.logprobs_requests += params.logprobs is not None
    state.in_flight += 1
    state.recent.append(_record(request, params, fault, probe_header, is_probe))
    return call


def end_call(call: Call) -> None:
    """Count the call's outcome and release its in-flight slot (exactly once)."""
    state = call.state
    state.in_flight -= 1
    if call.admitted:  # the slot is free (``sim.admission.release``, inlined: no cycle)
        call.admitted = False
        state.admitted -= 1
    if call.is_running:
        state.running -= 1
    counters = state.counters
    if call.outcome == "completed":
        counters.completed += 1
    elif call.outcome == "aborted":
        counters.aborted += 1
    else:
        counters.failed += 1


def _record(
    request: web.Request, params: Params, fault: str, probe_header: str | None, is_probe: bool
) -> dict[str, Any]:
    """The entry kept in ``recent`` for one inference request (strings clipped)."""
    return {
        "time": time.time(),
        "path": request.path,
        "probe": is_probe,
        "probe_header": probe_header,
        "authorization": "Authorization" in request.headers,
        "model": params.model,
        "stream": params.stream,
        "max_tokens": params.max_tokens,
        "prompt": _clip(params.prompt),
        "messages": _clip(params.messages),
        "cache_salt": params.cache_salt,
        "cache_prompt": params.cache_prompt,
        "logprobs": params.logprobs,
        "return_token_ids": params.return_token_ids,
        "temperature": params.temperature,
        "fault": fault,
    }


def _clip(value: object, depth: int = 0) -> object:
    """Copy a JSON value with long strings and lists cut short (bounded memory)."""
    if isinstance(value, str):
        return value[:_MAX_RECORDED_CHARS]
    if depth > 4:
        return None
    if isinstance(value, list):
        return [_clip(item, depth + 1) for item in value[:_MAX_RECORDED_MESSAGES]]
    if isinstance(value, dict):
        items = list(value.items())[:_MAX_RECORDED_MESSAGES]
        return {str(k): _clip(v, depth + 1) for k, v in items}
    return value


# ------------------------------------------------------------ waiting


def _client_gone(request: web.Request) -> bool:
    """True once the client's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def pause(call: Call, seconds: float) -> None:
    """Wait ``seconds``; raise ClientGone if the client leaves, Stopping at shutdown."""
    await wait_for_client(call.request, call.state, seconds)


async def wait_for_client(request: web.Request, state: SimState, seconds: float) -> None:
    """:func:`pause` for any request, counted as a call or not (e.g. a hung ``/metrics``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    stop = state.stop_signal()
    while True:
        if state.stopping:
            raise Stopping
        if _client_gone(request):
            raise ClientGone
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        await asyncio.wait((stop,), timeout=min(remaining, _DISCONNECT_POLL_S))


# ------------------------------------------------------------ responding


async def open_response(call: Call) -> web.StreamResponse:
    """Send 200 headers now (SSE for streams, JSON otherwise) and keep the response."""
    headers = SSE_HEADERS if call.params.stream else {"Content-Type": JSON_CONTENT_TYPE}
    response = web.StreamResponse(status=200, headers=headers)
    # Kept on the call so an abort after the headers answers with the response begun.
    call.response = response
    await response.prepare(call.request)
    return response


async def send_whole(call: Call, response: web.StreamResponse) -> web.StreamResponse:
    """Send a complete (non-streamed) response inside the handler, so failures are seen."""
    call.response = response
    await response.prepare(call.request)
    await response.write_eof()
    return response
