"""The micro-probe (docs/design.md §2): one streamed, one-token request; TTFT on the first
token-bearing event; the stream closed right after it so the engine aborts the request.

Never raises for anything the endpoint does: every failure becomes a ProbeResult.
Cancellation (shutdown) is the only exception that propagates.

The engine checks (``llm_health.engines``, a feature above this package) take part in
probing through two small seams declared here, so that this package never imports them:
``ProbeWrapper`` (the runtime probes through ``wrap(prober)``; the request body reads the
engine they detected, ``engines``), and ``Question`` (what a known-answer probe asks, passed
to ``Prober.verify``). What the exchange itself does stays here, as the probe's own
concern: the request body per engine (``probe_body``, docs/design.md §14.4) and the
reading of a known-answer stream (``probe.answer``), which run inside the exchange and its
timeout, in a probe worker process as in the runtime.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from llm_health.errors import ProtocolError
from llm_health.model.answer import Answer
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.alarms import Alarms, Deadline
from llm_health.probe.answer import AnswerReader, answer_request
from llm_health.probe.events import EventKind, error_message_from_body, interpret
from llm_health.probe.http1 import (
    ConnectFailed,
    Connection,
    ConnectionBroken,
    Connections,
    ResponseError,
    Route,
    request_head,
    route_of,
)
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.signals import first_token_seen
from llm_health.probe.sse import SseDecoder
from llm_health.probe.target import ProbeTarget

MAX_ERROR_BODY = 64 * 1024
MAX_DETAIL = 500  # characters of a result's detail (one printable line: logs, /status)
MAX_BYTES_BEFORE_TOKEN = 1024 * 1024
MAX_ANSWER_BYTES = 256 * 1024  # of a known-answer probe's stream after its first token
OVERLOAD_WORDS = ("overload", "too many", "capacity", "busy", "queue", "rate limit", "throttl")
MAX_TAIL_BYTES = 64 * 1024  # read after the first token while waiting for the answer's end
REUSE_GRACE_S = 0.05  # how soon the rest of a one-token stream must follow its token
PROBE_HEADER = "X-LLM-Probe"
NONCE_BYTES = 6  # the cache bypass's nonce: 12 hex digits
# The nonce only has to differ from probe to probe (it keys no secret): a generator
# seeded once from the OS, not a system call for every probe as ``secrets`` makes.
_NONCES = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _NONCES.seed(os.urandom(16)))  # never shared
MAX_KEPT_REQUESTS = 20_000  # endpoints whose request is kept made (``_Requests``)
# Stands for the nonce in a kept request (``_Requests``): as long as a nonce, and written
# by JSON as it is, so the Content-Length is the same.
NONCE_MARK = "<nonce-mark>"


def new_connections() -> Connections:
    """The prober's connections (``probe.http1``): ``async with new_connections() as c``."""
    return Connections()


@dataclass(slots=True)
class _Held:
    """The connection of an attempt, released (kept or closed) whatever happens."""

    connection: Connection | None = None
    reuse: bool = False


@dataclass(slots=True)
class _Timing:
    start: float
    connected: float | None = None
    headers: float | None = None
    reused: bool = False  # sent on a pooled keep-alive connection
    first_token: float | None = None

    def ms(self, at: float | None) -> float | None:
        return None if at is None else (at - self.start) * 1000


class Question(Protocol):
    """What a known-answer probe asks (docs/design.md §14.1): ``prompt`` at temperature 0,
    for ``max_tokens`` tokens. The engine checks pass their ``probe.verify`` settings."""

    @property
    def prompt(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...


class Asked(NamedTuple):
    """A ``Question`` as plain data: what crosses the pipe to a probe worker."""

    prompt: str
    max_tokens: int


ProbeFn = Callable[[ProbeTarget], Coroutine[Any, Any, ProbeResult]]


class Prober(Protocol):
    """What runs probes: ``MicroProbe`` here, or ``pool.WorkerPool`` in worker processes."""

    @property
    def stale_resends(self) -> int: ...

    async def probe(self, target: ProbeTarget) -> ProbeResult: ...

    async def verify(self, target: ProbeTarget, question: Question) -> ProbeResult: ...


class ProbeWrapper(Protocol):
    """A feature that takes part in every scheduled probe (the engine checks: docs/design.md
    §14). The runtime is given it by ``app.assemble``."""

    @property
    def engines(self) -> Mapping[str, str]:
        """The engine detected per endpoint key, read by the request body of a target
        with ``engine: auto`` (its cache bypass: docs/design.md §14.4)."""
        ...

    def wrap(self, prober: Prober) -> ProbeFn:
        """The scheduler's probe function, probing through ``prober``."""
        ...


class MicroProbe:
    """Sends micro-probes over the prober's own HTTP/1.1 exchange (``probe.http1``).
    Task-safe: each call is independent.

    A connection is kept for the next probe only when the whole answer followed its first
    token within ``REUSE_GRACE_S`` (``max_tokens`` 1: the engine ends the stream at once);
    otherwise it is closed, so the engine aborts the request (docs/design.md §2).

    ``engines``: the engine detected per endpoint key (``ProbeTarget.key``), read when a
    target says ``engine: auto`` (the request body bypasses the prefix cache by engine).
    """

    def __init__(
        self,
        connections: Connections,
        lag: LoopLagMonitor | None = None,
        engines: Mapping[str, str] | None = None,
    ) -> None:
        self._connections = connections
        self._lag = lag
        self._engines: Mapping[str, str] = engines if engines is not None else {}
        self.stale_resends = 0  # requests sent again after a dead pooled connection
        self._alarms = Alarms()  # every probe's timeout, on one loop timer
        self._requests = _Requests()

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        """Probe once; the result arrives within ``target.timeout_s`` (plus scheduling)."""
        return await self._run(target, None)

    async def verify(self, target: ProbeTarget, question: Question) -> ProbeResult:
        """A known-answer probe asking ``question``: TTFT and outcome as ``probe``, then
        the rest of the answer (``ProbeResult.answer``), read within one more ``timeout``
        after the first token."""
        return await self._run(target, question)

    def engine_of(self, target: ProbeTarget) -> str | None:
        return self._engines.get(target.key) if target.engine == "auto" else target.engine

    async def _run(self, target: ProbeTarget, question: Question | None) -> ProbeResult:
        """One probe. A request that fails before any answer on a *kept* connection the
        server had closed meanwhile (an idle timeout, a restart) is sent once more on a new
        connection: the engine never saw it, so that is no retry of a failed probe; it is
        counted (``stale_resends``). Its timing starts with the resend."""
        result = await self._attempt(target, question)
        if result is None:
            self.stale_resends += 1
            result = await self._attempt(target, question, resend=True)
        assert result is not None
        return result

    async def _attempt(
        self, target: ProbeTarget, question: Question | None, *, resend: bool = False
    ) -> ProbeResult | None:
        timing = _Timing(time.perf_counter())
        wall = time.time()
        answer: Answer | None = None
        reader = AnswerReader(target.api, target.secrets) if question is not None else None
        held = _Held()
        try:
            try:
                async with Deadline(self._alarms, time.monotonic() + target.timeout_s) as limit:
                    outcome, status, detail = await self._exchange(
                        target, timing, held, question, reader, limit, resend=resend
                    )
            except TimeoutError:
                outcome, status, detail = Outcome.TIMEOUT, None, _timeout_detail(target, timing)
                if reader is not None and timing.first_token is not None:
                    outcome, status, detail = Outcome.FAST, 200, ""  # the answer ran late
            except (OSError, ProtocolError, UnicodeError, ValueError) as exc:
                if not resend and _stale_connection(exc, timing):
                    return None
                outcome, status, detail = Outcome.ERROR, None, _error_detail(exc)
                if reader is not None and timing.first_token is not None:
                    outcome, status, detail = Outcome.FAST, 200, f"answer cut: {_error_detail(exc)}"
            if reader is not None and timing.first_token is not None:
                answer = reader.answer(complete=reader.finished)
            result = self._result(target, timing, wall, outcome, status, detail, answer)
            held.reuse = status is not None and await self._rest_follows(held.connection)
            return result
        finally:
            if held.connection is not None:
                self._connections.release(held.connection, reuse=held.reuse)

    async def _exchange(
        self,
        target: ProbeTarget,
        timing: _Timing,
        held: _Held,
        question: Question | None = None,
        reader: AnswerReader | None = None,
        limit: Deadline | None = None,
        *,
        resend: bool = False,
    ) -> tuple[Outcome, int | None, str]:
        engine = self.engine_of(target)
        route = route_of(target.url)
        if question is None:
            request = self._requests.get(target, engine)
        else:
            request = probe_request(target, engine, route, new_nonce(), question)
        connection, timing.reused = await self._connections.take(route, fresh=resend)
        held.connection = connection
        timing.connected = time.perf_counter()
        connection.send(request)
        try:
            status = await connection.head()
        finally:  # a timeout too: "no first token (headers after ...)"
            timing.headers = connection.head_at  # as the first token: when the bytes came
        if status != 200:
            return await _classify_status(connection, status, target)
        decoder = SseDecoder()
        outcome, detail = await _read_first_token(connection, target, timing, decoder, reader)
        if reader is not None and outcome is Outcome.FAST and limit is not None:
            limit.reschedule(time.monotonic() + target.timeout_s)
            await _read_answer(connection, decoder, reader)
        return outcome, 200, detail

    def _result(
        self,
        target: ProbeTarget,
        timing: _Timing,
        wall: float,
        outcome: Outcome,
        status: int | None,
        detail: str,
        answer: Answer | None = None,
    ) -> ProbeResult:
        ttft_ms = timing.ms(timing.first_token)
        lag_ms = self._lag.max_since(timing.start) if self._lag else 0.0
        if outcome is Outcome.FAST and ttft_ms is not None and timing.first_token is not None:
            stalled_ms = (
                self._lag.stalled_within(timing.start, timing.first_token) if self._lag else 0.0
            )
            outcome = _fast_or_slow(ttft_ms, stalled_ms, target.healthy_ttft_s * 1000)
        return ProbeResult(
            outcome=outcome,
            started_at=wall,
            ttft_ms=ttft_ms,
            connect_ms=timing.ms(timing.connected),
            headers_ms=timing.ms(timing.headers),
            total_ms=(time.perf_counter() - timing.start) * 1000,
            status=status,
            detail=_shown(detail, target),
            loop_lag_ms=lag_ms,
            answer=answer,
        )

    async def _rest_follows(self, connection: Connection | None) -> bool:
        """After the verdict: does the rest of the answer (a one-token stream's finish,
        usage and ``[DONE]``; an error body) arrive whole within REUSE_GRACE_S, at most
        MAX_TAIL_BYTES? Then the connection can be kept. Never raises: a connection that
        breaks or dawdles is closed, which ends the engine's request (docs/design.md §2)."""
        if connection is None or connection.lost:
            return False
        try:
            if connection.complete:  # the rest came with the token: no wait, no timer
                return await connection.to_end(MAX_TAIL_BYTES) and connection.reusable
            async with Deadline(self._alarms, time.monotonic() + REUSE_GRACE_S):
                return await connection.to_end(MAX_TAIL_BYTES) and connection.reusable
        except (TimeoutError, OSError, ProtocolError):
            return False


def _shown(detail: str, target: ProbeTarget) -> str:
    """A result's detail as logs and /status show it: secret-free, one printable line
    (nothing to do for a FAST probe's empty detail: most probes)."""
    if not detail:
        return detail
    return printable_line(redact_secrets(detail, target.secrets), MAX_DETAIL)


def _fast_or_slow(ttft_ms: float, stalled_ms: float, healthy_ms: float) -> Outcome:
    """SLOW only if the first token was late even without the prober's own lateness.

    A starved event loop (another process burning the CPU, a GC pause) notices the token's
    bytes late by up to the longest stall between the probe's start and the moment they
    were taken in (``stalled_ms``: ``LoopLagMonitor.stalled_within``): that lateness is
    ours, not the engine's (docs/design.md §7.4). A stall after that moment is not in the
    TTFT (it is timed when the bytes arrived) and is not subtracted either, or a slow
    engine would read FAST behind a busy loop. A lag beyond max_loop_lag still makes the
    board ignore SLOW and TIMEOUT verdicts altogether (``ProbeResult.loop_lag_ms``: the
    worst lag of the whole probe).
    """
    return Outcome.FAST if ttft_ms - stalled_ms <= healthy_ms else Outcome.SLOW


# cache_bust "auto": what bypasses the prefix cache on each engine (docs/engines.md).
CACHE_BUST_BY_ENGINE = {"vllm": "salt", "sglang": "salt", "llamacpp": "cache_prompt"}


def cache_bust_for(target: ProbeTarget, engine: str | None) -> str:
    """The cache bypass in force: the configured one, or by engine for "auto" (a nonce
    prefix while the engine is unknown: it works on every engine)."""
    if target.cache_bust != "auto":
        return target.cache_bust
    return CACHE_BUST_BY_ENGINE.get(engine or "", "prefix")


def probe_body(
    target: ProbeTarget,
    engine: str | None = None,
    question: Question | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    """The request body: stream, 1 token, greedy; cache busting per ``target.cache_bust``.

    ``salt``: vLLM's and SGLang's ``cache_salt`` gives the probe its own prefix-cache
    namespace, so it neither hits nor pollutes users' cached prefixes. ``cache_prompt``:
    llama.cpp's ``"cache_prompt": false`` (it reuses a slot's cached prefix otherwise).
    ``prefix``: a random nonce in front of the prompt does the same on any engine (a few
    more prompt tokens). ``question``: the known-answer form: its prompt, ``max_tokens``,
    log-probabilities and token ids asked for; never a nonce prefix, which would change
    the answer (the salt and cache_prompt do not). ``nonce``: 12 hex digits (random when
    not given).
    """
    nonce = new_nonce() if nonce is None else nonce
    bust = cache_bust_for(target, engine)
    prompt = question.prompt if question is not None else target.prompt
    if bust == "prefix" and question is None:
        prompt = f"{nonce} {prompt}"
    max_tokens = question.max_tokens if question is not None else 1
    body: dict[str, Any] = {"stream": True, "max_tokens": max_tokens, "temperature": 0, "top_p": 1}
    if target.model:
        body["model"] = target.model
    if target.api == "openai-chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if bust == "salt":
        body["cache_salt"] = nonce
    elif bust == "cache_prompt":
        body["cache_prompt"] = False
    if question is not None:
        body.update(answer_request(target.api))
        if engine == "vllm":
            body["return_token_ids"] = True  # vLLM >= 0.10; ids show token-0 garbage
    return body


def new_nonce() -> str:
    """12 hex digits, new for every probe (the cache bypass: ``probe_body``)."""
    return f"{_NONCES.getrandbits(8 * NONCE_BYTES):0{2 * NONCE_BYTES}x}"


def probe_request(
    target: ProbeTarget,
    engine: str | None,
    route: Route,
    nonce: str,
    question: Question | None = None,
) -> bytes:
    """The whole request, head and body (``probe_body`` with this ``nonce``)."""
    body = json.dumps(probe_body(target, engine, question, nonce)).encode()
    headers = {**target.headers, PROBE_HEADER: "true", "Accept": "text/event-stream"}
    return request_head(route, headers, len(body)) + body


class _Requests:
    """A probe's request per endpoint, made once per target and engine: only the nonce
    differs from one probe to the next, and building the head and the JSON body each
    time was a tenth of the exchange's CPU (docs/design.md §16.10). A request whose
    nonce cannot be told apart (the prompt holds the mark) is built whole every time."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[ProbeTarget, str | None, tuple[bytes, ...] | None]] = {}

    def get(self, target: ProbeTarget, engine: str | None) -> bytes:
        made = self._made.get(target.key)
        if made is None or made[0] is not target or made[1] != engine:
            if made is None and len(self._made) >= MAX_KEPT_REQUESTS:
                self._made.clear()  # endpoints come and go (discovery): start afresh
            made = target, engine, _split_at_nonce(target, engine)
            self._made[target.key] = made
        parts = made[2]
        nonce = new_nonce()
        if parts is None:
            return probe_request(target, engine, route_of(target.url), nonce)
        return nonce.encode().join(parts)


def _split_at_nonce(target: ProbeTarget, engine: str | None) -> tuple[bytes, ...] | None:
    """The request in pieces around its nonce (one nonce or none), or None if the mark
    shows up elsewhere in it."""
    marked = probe_request(target, engine, route_of(target.url), NONCE_MARK)
    parts = tuple(marked.split(NONCE_MARK.encode()))
    expected = 1 if cache_bust_for(target, engine) in ("prefix", "salt") else 0
    return parts if len(parts) == expected + 1 else None


async def _read_first_token(
    response: Connection,
    target: ProbeTarget,
    timing: _Timing,
    decoder: SseDecoder,
    reader: AnswerReader | None = None,
) -> tuple[Outcome, str]:
    """Read events until one carries a token; FAST here means "got a token" (the caller
    splits FAST/SLOW by TTFT). ``reader``: also fed every event from the first token on,
    including the rest of the chunk that carried it."""
    received = 0
    while chunk := await response.read():
        received += len(chunk)
        payloads = decoder.feed(chunk)
        for index, payload in enumerate(payloads):
            verdict = _verdict(payload, target, timing, response.arrived)
            if verdict is not None:
                if reader is not None and verdict[0] is Outcome.FAST:
                    _feed_all(reader, payloads[index:])
                return verdict
        if received > MAX_BYTES_BEFORE_TOKEN:
            return Outcome.ERROR, f"no token in the first {MAX_BYTES_BEFORE_TOKEN} bytes"
    last = decoder.close()
    verdict = _verdict(last, target, timing, response.arrived) if last is not None else None
    return verdict or (Outcome.ERROR, "stream ended before the first token")


async def _read_answer(response: Connection, decoder: SseDecoder, reader: AnswerReader) -> None:
    """After the first token: the rest of a known-answer stream, until a finish reason,
    [DONE], the end of the body or MAX_ANSWER_BYTES."""
    received = 0
    while not reader.finished:
        chunk = await response.read()
        if not chunk:
            break
        received += len(chunk)
        if _feed_all(reader, decoder.feed(chunk)) or received > MAX_ANSWER_BYTES:
            break


def _feed_all(reader: AnswerReader, payloads: list[str]) -> bool:
    """Feed decoded events; True once the stream says it is done ([DONE])."""
    for payload in payloads:
        if payload.strip() == "[DONE]":
            reader.finished = True
            return True
        try:
            reader.feed(json.loads(payload))
        except ValueError:
            continue  # not JSON: the answer is judged on what could be read
    return reader.finished


def _verdict(
    payload: str, target: ProbeTarget, timing: _Timing, arrived: float
) -> tuple[Outcome, str] | None:
    """``arrived``: when the payload's bytes were received (``Connection.arrived``): the
    first token is timed there, not when this task got to it a loop turn or more later
    (under load, that wait is the prober's, not the engine's: docs/design.md §7.4). It
    is never before the token's bytes arrived, so a TTFT stays an upper bound."""
    event = interpret(payload, target.api)
    if event.kind is EventKind.ERROR or event.kind is EventKind.MALFORMED:
        event = interpret(redact_secrets(payload, target.secrets), target.api)
    if event.kind is EventKind.TOKEN:
        timing.first_token = arrived
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
    response: Connection, status: int, target: ProbeTarget
) -> tuple[Outcome, int, str]:
    """Non-200: FATAL on a fatal pattern, OVERLOADED on 429 or an overloaded 503, else ERROR."""
    raw = await _read_upto(response, MAX_ERROR_BODY)
    # Redact before anything clips the text: a clipped secret is a partial leak. The read
    # itself may have cut one: its start is redacted too (model.redact.MIN_PREFIX).
    text = redact_secrets(raw.decode("utf-8", "replace"), target.secrets)
    message = error_message_from_body(text)
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


async def _read_upto(response: Connection, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (fewer if it ends first)."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (chunk := await response.read()):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:limit]


def _stale_connection(exc: BaseException, timing: _Timing) -> bool:
    """The request died on a kept connection before any response: the server had closed
    it (it disconnected before a status line)."""
    return isinstance(exc, ConnectionBroken) and timing.reused and timing.headers is None


def _timeout_detail(target: ProbeTarget, timing: _Timing) -> str:
    limit = f"{target.timeout_s * 1000:g} ms"
    if timing.headers is not None:
        return f"no first token within {limit} (headers after {timing.ms(timing.headers):.0f} ms)"
    if timing.connected is not None:
        return f"no response headers within {limit}"
    return f"no connection within {limit}"


def _error_detail(exc: BaseException) -> str:
    """Short, secret-free text for a transport error (no URLs with credentials, no bodies)."""
    if isinstance(exc, ConnectFailed):
        return f"connect failed: {exc.strerror or exc}"
    if isinstance(exc, ConnectionBroken | ResponseError):
        return str(exc)
    if isinstance(exc, ProtocolError):
        return f"malformed stream: {exc}"
    return f"{type(exc).__name__}: {exc}"[:200]
