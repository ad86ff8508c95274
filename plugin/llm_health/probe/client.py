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

import asyncio
import json
import os
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

from llm_health.errors import ProtocolError
from llm_health.model.answer import Answer
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.alarms import Alarm, Alarms
from llm_health.probe.answer import AnswerReader, answer_request
from llm_health.probe.events import EventKind, error_message_from_body, interpret, loads
from llm_health.probe.http1 import (
    ConnectFailed,
    Connection,
    ConnectionBroken,
    Connections,
    ResponseError,
    Route,
    StampedConnect,
    request_head,
    route_of,
)
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.signals import (
    ProbeReceiver,
    Started,
    Starter,
    await_started,
)
from llm_health.probe.sse import SseDecoder, simple_event
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
    """The prober's connections (``probe.http1``): ``async with new_connections() as c``.
    Their bytes are timed by the kernel where the system can (``Connections``)."""
    return Connections(stamped=True)


@dataclass(slots=True)
class _Timing:
    start: float
    connected: float | None = None
    headers: float | None = None
    reused: bool = False  # sent on a pooled keep-alive connection
    first_token: float | None = None
    stamped: bool = False  # the first token timed by the kernel (``Connection.stamped``)

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

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """``probe`` without awaiting it (``probe.signals``)."""
        ...

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """``verify`` without awaiting it."""
        ...


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

    def starter(self, prober: Prober) -> Starter:
        """``wrap``'s probe, started (``probe.signals``): ``prober.start_probe`` itself when the
        feature has nothing to add to this probe."""
        ...


class MicroProbe:
    """Sends micro-probes over the prober's own HTTP/1.1 exchange (``probe.http1``).
    Task-safe: each call is independent.

    Each probe is an ``_Exchange`` driven by its connection's callbacks and one alarm:
    ``start_probe`` runs it with no task (the scheduler's way), ``probe`` and ``verify`` await it.

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
        self._alarms = Alarms()  # every probe's timeout and tail, on one loop timer
        self._requests = _Requests()

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """Probe once, telling ``receiver`` (``probe.signals``); its result comes within
        ``target.timeout_s`` (plus scheduling)."""
        return self._begin(target, None, receiver)

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """``verify``, told to ``receiver`` as ``start_probe`` tells its result."""
        return self._begin(target, question, receiver)

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
        """One exchange, awaited; cancelling the wait ends it (its connection closed;
        nothing once its result is out: its tail runs on)."""
        return await await_started(partial(self._begin, target, question))

    def _begin(
        self, target: ProbeTarget, question: Question | None, receiver: ProbeReceiver
    ) -> _Exchange:
        exchange = _Exchange(self, target, question, receiver)
        exchange.begin()
        return exchange

    def _result(
        self,
        target: ProbeTarget,
        timing: _Timing,
        wall: float,
        outcome: Outcome,
        status: int | None,
        detail: str,
        answer: Answer | None = None,
        interim: int = 0,
    ) -> ProbeResult:
        start, token = timing.start, timing.first_token
        ttft_ms = timing.ms(token)
        lag_ms = stalled_ms = 0.0
        if self._lag is not None:
            # A token the kernel timed holds none of our stalls: none is taken off it.
            lag_ms, stalled_ms = self._lag.over(start, None if timing.stamped else token)
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
            started_at=wall,
            ttft_ms=ttft_ms,
            connect_ms=timing.ms(timing.connected),
            headers_ms=timing.ms(timing.headers),
            total_ms=(time.perf_counter() - start) * 1000,
            status=status,
            detail=_shown(detail, target),
            loop_lag_ms=lag_ms,
            answer=answer,
            interim=interim,
        )


# The steps of an exchange (``_Exchange._phase``).
_IDLE, _CONNECTING, _HEAD, _TOKEN, _ERROR_BODY, _ANSWER, _TAIL, _OVER = range(8)
# What the endpoint (or the network) can do wrong: a result, never an exception.
ENDPOINT_FAULTS = (OSError, ProtocolError, UnicodeError, ValueError)


class _Exchange:
    """One probe: request, head, first token (and a known-answer probe's answer), then
    the answer's tail, driven by its connection's news (``Connection.listener``) and its
    alarms, with no task or coroutine of its own (docs/design.md §16.10). It tells its
    receiver the first token, then once its result; the result is out as soon as the
    verdict is known, and the tail (a one-token stream's finish, usage and ``[DONE]``)
    is read after it, within ``REUSE_GRACE_S``, to keep the connection.

    A request that fails before any answer on a *kept* connection the server had closed
    meanwhile (an idle timeout, a restart) is sent once more on a new connection: the
    engine never saw it, so that is no retry of a failed probe; it is counted
    (``MicroProbe.stale_resends``). Its timing starts with the resend."""

    __slots__ = (
        "_connection",
        "_deadline",
        "_decoder",
        "_grace",
        "_opening",
        "_owner",
        "_parts",
        "_phase",
        "_question",
        "_reader",
        "_received",
        "_receiver",
        "_resend",
        "_status",
        "_target",
        "_timing",
        "_wall",
    )

    def __init__(
        self,
        owner: MicroProbe,
        target: ProbeTarget,
        question: Question | None,
        receiver: ProbeReceiver,
    ) -> None:
        self._owner = owner
        self._target = target
        self._question = question
        self._receiver = receiver
        self._phase = _IDLE
        self._connection: Connection | None = None
        self._opening: asyncio.Task[None] | StampedConnect | None = None  # connecting
        self._deadline: Alarm | None = None
        self._grace: Alarm | None = None
        self._resend = False
        self._reader: AnswerReader | None = None
        self._decoder = _NO_DECODER
        self._received = 0
        self._status: int | None = None
        self._parts: list[bytes] = []

    # --- the steps ----------------------------------------------------------------------

    def begin(self, *, resend: bool = False) -> None:
        owner, target = self._owner, self._target
        self._resend = resend
        self._timing = _Timing(time.perf_counter())
        self._wall = time.time()
        if self._question is not None:
            self._reader = AnswerReader(target.api, target.secrets)
        deadline = time.monotonic() + target.timeout_s
        self._deadline = owner._alarms.at(deadline, _Exchange._timed_out, self)
        try:
            route = route_of(target.url)
            engine = owner.engine_of(target)
            if self._question is None:
                request = owner._requests.get(target, engine)
            else:
                request = probe_request(target, engine, route, new_nonce(), self._question)
        except ENDPOINT_FAULTS as exc:  # a header or URL that cannot be sent
            self._finish(Outcome.ERROR, None, _error_detail(exc))
            return
        connection = owner._connections.take_kept(route, fresh=resend)
        if connection is None:
            self._phase = _CONNECTING
            try:
                self._opening = owner._connections.open_soon(route, partial(self._opened, request))
            except ENDPOINT_FAULTS as exc:  # refused at once
                self._on_fault(exc)
                return
            if self._opening is None:  # TLS, a host name: the loop's transport, in a task
                self._opening = owner._alarms.loop().create_task(self._open(route, request))
        else:
            self._timing.reused = True
            self._send(connection, request)

    async def _open(self, route: Route, request: bytes) -> None:
        try:
            connection = await self._owner._connections.open(route)
        except ENDPOINT_FAULTS as exc:
            self._opening = None
            self._on_fault(exc)
            return
        except Exception as exc:  # the prober's own bug: to the receiver
            self._opening = None
            self._crash(exc)
            return
        self._opening = None
        if self._phase is not _CONNECTING:  # over meanwhile (its cancel came too late)
            connection.close()
            return
        self._send(connection, request)

    def _opened(
        self, request: bytes, connection: Connection | None, failed: OSError | None
    ) -> None:
        """``Connections.open_soon``'s answer (``_open`` without a task)."""
        self._opening = None
        try:
            if connection is None:
                assert failed is not None
                self._on_fault(failed)
            elif self._phase is not _CONNECTING:  # over meanwhile
                connection.close()
            else:
                self._send(connection, request)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _send(self, connection: Connection, request: bytes) -> None:
        self._connection = connection
        self._timing.connected = time.perf_counter()
        self._phase = _HEAD
        connection.listener = self._news
        connection.send(request)

    def _news(self) -> None:
        """The connection has something new (bytes, its end, a failure): the next steps."""
        connection = self._connection
        if connection is None:
            return
        try:
            phase = self._phase
            if phase is _HEAD:
                if not connection.head_ready():
                    return
                phase = self._headed(connection)
            if phase is _TOKEN:
                self._read_token(connection)
            elif phase is _ANSWER:
                self._read_answer(connection)
            elif phase is _ERROR_BODY:
                self._read_error(connection)
            elif phase is _TAIL:
                ended = connection.drained()
                if ended is not None:
                    self._release(reuse=ended)
        except ENDPOINT_FAULTS as exc:
            self._on_fault(exc)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _headed(self, connection: Connection) -> int:
        """The head came: its time and status; the phase that reads the body."""
        self._timing.headers = connection.head_at  # as the first token: when it came
        self._status = connection.status
        self._received = 0
        if self._status != 200:
            self._phase = _ERROR_BODY
        else:
            self._decoder = SseDecoder()
            self._phase = _TOKEN
        return self._phase

    def _read_token(self, connection: Connection) -> None:
        """Events until one carries a token; FAST here means "got a token" (the result
        splits FAST/SLOW by TTFT). A known-answer probe's reader is fed every event from
        the first token on, the rest of the chunk that carried it included."""
        while (chunk := connection.take_body()) is not None:
            if not chunk:
                last = self._decoder.close()
                verdict = self._verdict(last, connection) if last is not None else None
                self._token_verdict(
                    verdict or (Outcome.ERROR, "stream ended before the first token")
                )
                return
            self._received += len(chunk)
            if self._reader is None and self._decoder.idle:
                skimmed = self._skim(chunk, connection)
                if skimmed is None:
                    return
                chunk = skimmed
            payloads = self._decoder.feed(chunk)
            for index, payload in enumerate(payloads):
                verdict = self._verdict(payload, connection)
                if verdict is not None:
                    if self._reader is not None and verdict[0] is Outcome.FAST:
                        _feed_all(self._reader, payloads[index:])
                    self._token_verdict(verdict)
                    return
            if self._received > MAX_BYTES_BEFORE_TOKEN:
                detail = f"no token in the first {MAX_BYTES_BEFORE_TOKEN} bytes"
                self._finish(Outcome.ERROR, 200, detail)
                return

    def _skim(self, chunk: bytes, connection: Connection) -> bytes | None:
        """A plain probe's chunk read event by event while they have the common shape
        (``sse.simple_event``): the verdict of the first that has one (then None), else
        what is left for the decoder. The rest of a one-token stream (finish, usage,
        ``[DONE]``) is not decoded at all: it cannot change the verdict."""
        start = 0
        while (event := simple_event(chunk, start)) is not None:
            payload, start = event
            verdict = self._verdict(payload, connection)
            if verdict is not None:
                self._token_verdict(verdict)
                return None
        return chunk[start:] if start else chunk

    def _verdict(self, payload: str, connection: Connection) -> tuple[Outcome, str] | None:
        """What one event says: a token (timed when its bytes arrived,
        ``Connection.arrived``: not when we got to it a loop turn or more later; under
        load that wait is the prober's, not the engine's: docs/design.md §7.4; never
        before the bytes arrived, so a TTFT stays an upper bound), nothing yet (None), or
        the end of the probe without one."""
        target = self._target
        event = interpret(payload, target.api)
        kind = event.kind
        if kind is EventKind.TOKEN:
            timing = self._timing
            timing.first_token, timing.stamped = connection.arrived, connection.stamped
            self._receiver.set()
            return _GOT_TOKEN
        if kind is EventKind.NO_TOKEN:
            return None
        if kind is EventKind.ERROR or kind is EventKind.MALFORMED:
            event = interpret(redact_secrets(payload, target.secrets), target.api)
            kind = event.kind
        if kind is EventKind.DONE:
            return Outcome.ERROR, "stream ended ([DONE]) before the first token"
        if kind is EventKind.ERROR:
            return _classify_error_text(event.message, target, "error event in stream")
        return Outcome.ERROR, f"malformed stream: {event.message}"

    def _token_verdict(self, verdict: tuple[Outcome, str]) -> None:
        outcome, detail = verdict
        if self._reader is None or outcome is not Outcome.FAST:
            self._finish(outcome, 200, detail)
            return
        # A known-answer probe: one more timeout for the rest of its answer.
        self._cancel_alarms()
        deadline = time.monotonic() + self._target.timeout_s
        self._deadline = self._owner._alarms.at(deadline, _Exchange._timed_out, self)
        self._phase, self._received = _ANSWER, 0
        assert self._connection is not None
        self._read_answer(self._connection)

    def _read_answer(self, connection: Connection) -> None:
        """After the first token: the rest of a known-answer stream, until a finish
        reason, [DONE], the end of the body or MAX_ANSWER_BYTES."""
        reader = self._reader
        assert reader is not None
        while not reader.finished:
            chunk = connection.take_body()
            if chunk is None:
                return
            if not chunk:
                break
            self._received += len(chunk)
            if _feed_all(reader, self._decoder.feed(chunk)) or self._received > MAX_ANSWER_BYTES:
                break
        self._finish(Outcome.FAST, 200, "")

    def _read_error(self, connection: Connection) -> None:
        """A non-200 answer: at most MAX_ERROR_BODY of its body, then its class."""
        while self._received < MAX_ERROR_BODY:
            chunk = connection.take_body()
            if chunk is None:
                return
            if not chunk:
                break
            self._parts.append(chunk)
            self._received += len(chunk)
        raw = b"".join(self._parts)[:MAX_ERROR_BODY]
        assert self._status is not None
        self._finish(*_classify_status(raw, self._status, self._target))

    # --- endings ------------------------------------------------------------------------

    def _finish(self, outcome: Outcome, status: int | None, detail: str) -> None:
        """The verdict: the result to the receiver, then the tail (or the close)."""
        timing, reader, connection = self._timing, self._reader, self._connection
        answer = None
        if reader is not None and timing.first_token is not None:
            answer = reader.answer(complete=reader.finished)
        interim = 0 if connection is None else connection.interim
        result = self._owner._result(
            self._target, timing, self._wall, outcome, status, detail, answer, interim
        )
        self._cancel_alarms()
        self._after_verdict(status)
        try:
            self._receiver.done(result)
        except Exception as exc:  # the receiver's bug, not the endpoint's
            _report(exc, "a probe's receiver failed")

    def _after_verdict(self, status: int | None) -> None:
        """Keep the connection if the rest of the answer (a one-token stream's finish,
        usage and ``[DONE]``; an error body) arrives whole within REUSE_GRACE_S, at most
        MAX_TAIL_BYTES; else close it, which ends the engine's request (docs/design.md
        §2)."""
        connection = self._connection
        if connection is None or status is None or connection.lost:
            self._release(reuse=False)
            return
        self._phase = _TAIL
        try:
            ended = connection.drain(MAX_TAIL_BYTES)
        except ENDPOINT_FAULTS:
            ended = False
        if ended is not None:  # the rest came with the token: no wait, no alarm
            self._release(reuse=ended)  # kept only if reusable (Connections.release)
            return
        self._grace = self._owner._alarms.at(
            time.monotonic() + REUSE_GRACE_S, _Exchange._grace_over, self
        )

    def _on_fault(self, exc: Exception) -> None:
        """What the endpoint or the network did wrong: a result (or the resend)."""
        phase = self._phase
        if phase is _TAIL:
            self._release(reuse=False)
            return
        if phase is _OVER:
            return
        if not self._resend and _stale_connection(exc, self._timing, self._connection):
            self._release(reuse=False)
            self._cancel_alarms()
            self._owner.stale_resends += 1
            self.begin(resend=True)
            return
        outcome, status, detail = Outcome.ERROR, None, _error_detail(exc)
        if self._reader is not None and self._timing.first_token is not None:
            outcome, status, detail = Outcome.FAST, 200, f"answer cut: {_error_detail(exc)}"
        self._finish(outcome, status, detail)

    def _timed_out(self) -> None:
        """The deadline: no first token (or a known-answer probe's answer ran late)."""
        self._deadline = None
        phase = self._phase
        if phase is _TAIL or phase is _OVER:
            return
        timing = self._timing
        if phase is _HEAD and self._connection is not None:
            timing.headers = self._connection.head_at  # "no first token (headers after ...)"
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        outcome, status, detail = Outcome.TIMEOUT, None, _timeout_detail(self._target, timing)
        if self._reader is not None and timing.first_token is not None:
            outcome, status, detail = Outcome.FAST, 200, ""  # the answer ran late
        try:
            self._finish(outcome, status, detail)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _grace_over(self) -> None:
        self._grace = None
        if self._phase is _TAIL:
            self._release(reuse=False)

    def _crash(self, exc: Exception) -> None:
        """A bug of the prober's own (not the endpoint's doing): the receiver is told, as
        an awaiting caller got the exception, unless it has its result already."""
        told = self._phase is _TAIL or self._phase is _OVER
        self.cancel()
        self._phase = _OVER
        if told:
            raise exc
        self._receiver.failed(exc)

    def cancel(self) -> None:
        """End the probe before its result, its connection closed (the engine aborts);
        nothing once the result is out (its tail runs on to keep the connection)."""
        if self._phase is _TAIL or self._phase is _OVER:
            return
        self._cancel_alarms()
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        self._release(reuse=False)

    def _cancel_alarms(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _release(self, *, reuse: bool) -> None:
        """The connection back to the pool (kept when ``reuse``) or closed; the exchange
        is over."""
        connection, self._connection = self._connection, None
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        self._phase = _OVER
        if connection is not None:  # the drain ends here: ``send`` starts the next afresh
            self._owner._connections.release(connection, reuse=reuse)


_NO_DECODER = SseDecoder()  # before the head: never fed
_GOT_TOKEN = (Outcome.FAST, "")  # "got a token": the result splits FAST and SLOW by TTFT


def _report(exc: Exception, message: str) -> None:
    """A bug met in a callback: to the loop's exception handler (logged), as asyncio
    reports a failed callback, and never into the endpoint's verdict."""
    asyncio.get_running_loop().call_exception_handler({"message": message, "exception": exc})


def _shown(detail: str, target: ProbeTarget) -> str:
    """A result's detail as logs and /status show it: secret-free, one printable line
    (nothing to do for a FAST probe's empty detail: most probes)."""
    if not detail:
        return detail
    return printable_line(redact_secrets(detail, target.secrets), MAX_DETAIL)


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


def _feed_all(reader: AnswerReader, payloads: list[str]) -> bool:
    """Feed decoded events; True once the stream says it is done ([DONE])."""
    for payload in payloads:
        if payload.strip() == "[DONE]":
            reader.finished = True
            return True
        try:
            reader.feed(loads(payload))
        except ValueError:
            continue  # not JSON: the answer is judged on what could be read
    return reader.finished


def _classify_status(raw: bytes, status: int, target: ProbeTarget) -> tuple[Outcome, int, str]:
    """Non-200 (``raw``: the start of its body): FATAL on a fatal pattern, OVERLOADED on
    429 or an overloaded 503, else ERROR."""
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


def _stale_connection(exc: BaseException, timing: _Timing, connection: Connection | None) -> bool:
    """The request died on a kept connection before any response: the server had closed
    it (it disconnected before a status line; an interim 1xx is one: it saw the request)."""
    if not isinstance(exc, ConnectionBroken) or not timing.reused or timing.headers is not None:
        return False
    return connection is None or connection.interim == 0


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
