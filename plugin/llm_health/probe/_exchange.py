"""One micro-probe's exchange (docs/design.md §2, §16.10): request, head, first token
(and a known-answer probe's answer), then the answer's tail, driven by its connection's
callbacks and its alarms, with no task or coroutine of its own."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from llm_health.errors import ProtocolError
from llm_health.model.outcome import Outcome
from llm_health.model.redact import redact_secrets
from llm_health.probe.alarms import Alarm, Alarms
from llm_health.probe.answer import AnswerReader
from llm_health.probe.events import EventKind, interpret
from llm_health.probe.http1 import (
    Connection,
    ConnectionBroken,
    Connections,
    Route,
    StampedConnect,
    UnsendableRequest,
    route_of,
)
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.request import Question, Requests, new_nonce, probe_request
from llm_health.probe.signals import ProbeReceiver
from llm_health.probe.sse import SseDecoder, simple_event
from llm_health.probe.target import ProbeTarget
from llm_health.probe.verdict import (
    Timing,
    classify_error_text,
    classify_status,
    error_detail,
    result_of,
    timeout_detail,
)

MAX_ERROR_BODY = 64 * 1024
MAX_BYTES_BEFORE_TOKEN = 1024 * 1024
MAX_ANSWER_BYTES = 256 * 1024  # of a known-answer probe's stream after its first token
MAX_TAIL_BYTES = 64 * 1024  # read after the first token while waiting for the answer's end
REUSE_GRACE_S = 0.05  # how soon the rest of a one-token stream must follow its token


# What the endpoint (or the network, or the target's configuration) can do wrong: a
# result, never an exception. Anything else is a bug of ours: the receiver's ``failed``.
ENDPOINT_FAULTS = (OSError, ProtocolError, UnicodeError, UnsendableRequest)


class Phase(enum.Enum):
    """The steps of an exchange, in order (compared by identity)."""

    IDLE = enum.auto()  # made, not begun
    CONNECTING = enum.auto()  # no connection yet: opening one
    HEAD = enum.auto()  # the request sent: awaiting the status and the first body bytes
    TOKEN = enum.auto()  # a 200: reading events until one carries a token
    ERROR_BODY = enum.auto()  # not a 200: reading its body for its class
    ANSWER = enum.auto()  # a known-answer probe: its answer, after the first token
    TAIL = enum.auto()  # the result is out: the rest of the answer, to keep the connection
    OVER = enum.auto()  # the connection released or closed


@dataclass(eq=False, slots=True)
class Shared:
    """What the exchanges of one prober share (``MicroProbe`` holds it): its connections,
    its one loop timer for every timeout and tail, the requests kept made, the engine
    detected per endpoint key, the loop's lag, and how many requests were sent again
    after a dead kept connection."""

    connections: Connections
    alarms: Alarms
    requests: Requests
    engines: Mapping[str, str]
    lag: LoopLagMonitor | None = None
    stale_resends: int = 0

    def engine_of(self, target: ProbeTarget) -> str | None:
        """The engine the request body is for: detected, when the target says "auto"."""
        return self.engines.get(target.key) if target.engine == "auto" else target.engine


class Exchange:
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
        "_parts",
        "_phase",
        "_question",
        "_reader",
        "_received",
        "_receiver",
        "_resend",
        "_shared",
        "_status",
        "_target",
        "_timing",
    )

    def __init__(
        self,
        shared: Shared,
        target: ProbeTarget,
        question: Question | None,
        receiver: ProbeReceiver,
    ) -> None:
        self._shared = shared
        self._target = target
        self._question = question
        self._receiver = receiver
        self._phase = Phase.IDLE
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
        shared, target = self._shared, self._target
        self._resend = resend
        self._timing = Timing(time.perf_counter(), time.time())
        if self._question is not None:
            self._reader = AnswerReader(target.api, target.secrets)
        deadline = time.monotonic() + target.timeout_s
        self._deadline = shared.alarms.at(deadline, Exchange._timed_out, self)
        try:
            route = route_of(target.url)
            engine = shared.engine_of(target)
            if self._question is None:
                request = shared.requests.get(target, engine)
            else:
                request = probe_request(target, engine, route, new_nonce(), self._question)
        except ENDPOINT_FAULTS as exc:  # a header or URL that cannot be sent
            self._finish(Outcome.ERROR, None, error_detail(exc))
            return
        connection = shared.connections.take_kept(route, fresh=resend)
        if connection is None:
            self._phase = Phase.CONNECTING
            try:
                self._opening = shared.connections.open_soon(route, partial(self._opened, request))
            except ENDPOINT_FAULTS as exc:  # refused at once
                self._on_fault(exc)
                return
            if self._opening is None:  # TLS, a host name: the loop's transport, in a task
                self._opening = shared.alarms.loop().create_task(self._open(route, request))
        else:
            self._timing.reused = True
            self._send(connection, request)

    async def _open(self, route: Route, request: bytes) -> None:
        """``open_soon``'s work, in a task: TLS, or a host name the loop resolves."""
        try:
            connection = await self._shared.connections.open(route)
        except ENDPOINT_FAULTS as exc:  # an IDNA host name that cannot be encoded too
            self._opened(request, None, exc)
            return
        except Exception as exc:  # the prober's own bug: to the receiver
            self._opening = None
            self._crash(exc)
            return
        self._opened(request, connection, None)

    def _opened(
        self, request: bytes, connection: Connection | None, failed: Exception | None
    ) -> None:
        """``Connections.open_soon``'s answer (or ``_open``'s)."""
        self._opening = None
        try:
            if connection is None:
                assert failed is not None
                self._on_fault(failed)
            elif self._phase is not Phase.CONNECTING:  # over meanwhile (cancelled too late)
                connection.close()
            else:
                self._send(connection, request)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _send(self, connection: Connection, request: bytes) -> None:
        self._connection = connection
        self._timing.connected = time.perf_counter()
        self._phase = Phase.HEAD
        connection.listener = self._news
        connection.send(request)

    def _news(self) -> None:
        """The connection has something new (bytes, its end, a failure): the next steps."""
        connection = self._connection
        if connection is None:
            return
        try:
            phase = self._phase
            if phase is Phase.HEAD:
                if not connection.head_ready():
                    return
                phase = self._headed(connection)
            if phase is Phase.TOKEN:
                self._read_token(connection)
            elif phase is Phase.ANSWER:
                self._read_answer(connection)
            elif phase is Phase.ERROR_BODY:
                self._read_error(connection)
            elif phase is Phase.TAIL:
                ended = connection.drained()
                if ended is not None:
                    self._release(reuse=ended)
        except ENDPOINT_FAULTS as exc:
            self._on_fault(exc)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _headed(self, connection: Connection) -> Phase:
        """The head came: its time and status; the phase that reads the body."""
        self._timing.headers = connection.head_at  # as the first token: when it came
        self._status = connection.status
        self._received = 0
        if self._status != 200:
            self._phase = Phase.ERROR_BODY
        else:
            self._decoder = SseDecoder()
            self._phase = Phase.TOKEN
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
                        self._reader.feed_payloads(payloads[index:])
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
            return classify_error_text(event.message, target, "error event in stream")
        return Outcome.ERROR, f"malformed stream: {event.message}"

    def _token_verdict(self, verdict: tuple[Outcome, str]) -> None:
        outcome, detail = verdict
        if self._reader is None or outcome is not Outcome.FAST:
            self._finish(outcome, 200, detail)
            return
        # A known-answer probe: one more timeout for the rest of its answer.
        self._cancel_alarms()
        deadline = time.monotonic() + self._target.timeout_s
        self._deadline = self._shared.alarms.at(deadline, Exchange._timed_out, self)
        self._phase, self._received = Phase.ANSWER, 0
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
            if reader.feed_payloads(self._decoder.feed(chunk)) or self._received > MAX_ANSWER_BYTES:
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
        self._finish(*classify_status(raw, self._status, self._target))

    # --- endings ------------------------------------------------------------------------

    def _finish(self, outcome: Outcome, status: int | None, detail: str) -> None:
        """The verdict: the result to the receiver, then the tail (or the close)."""
        timing, reader, connection = self._timing, self._reader, self._connection
        answer = None
        if reader is not None and timing.first_token is not None:
            answer = reader.answer(complete=reader.finished)
        interim = 0 if connection is None else connection.interim
        result = result_of(
            self._shared.lag, self._target, timing, outcome, status, detail, answer, interim
        )
        self._cancel_alarms()
        self._after_verdict(status)
        try:
            self._receiver.done(result)
        except Exception as exc:  # the receiver's bug: logged (as asyncio reports a
            # failed callback), never the endpoint's verdict
            context = {"message": "a probe's receiver failed", "exception": exc}
            asyncio.get_running_loop().call_exception_handler(context)

    def _after_verdict(self, status: int | None) -> None:
        """Keep the connection if the rest of the answer (a one-token stream's finish,
        usage and ``[DONE]``; an error body) arrives whole within REUSE_GRACE_S, at most
        MAX_TAIL_BYTES; else close it, which ends the engine's request (docs/design.md
        §2)."""
        connection = self._connection
        if connection is None or status is None or connection.lost:
            self._release(reuse=False)
            return
        self._phase = Phase.TAIL
        try:
            ended = connection.drain(MAX_TAIL_BYTES)
        except ENDPOINT_FAULTS:
            ended = False
        if ended is not None:  # the rest came with the token: no wait, no alarm
            self._release(reuse=ended)  # kept only if reusable (Connections.release)
            return
        self._grace = self._shared.alarms.at(
            time.monotonic() + REUSE_GRACE_S, Exchange._grace_over, self
        )

    def _on_fault(self, exc: Exception) -> None:
        """What the endpoint or the network did wrong: a result (or the resend)."""
        phase = self._phase
        if phase is Phase.TAIL:
            self._release(reuse=False)
            return
        if phase is Phase.OVER:
            return
        if not self._resend and _stale_connection(exc, self._timing, self._connection):
            self._release(reuse=False)
            self._cancel_alarms()
            self._shared.stale_resends += 1
            self.begin(resend=True)
            return
        outcome, status, detail = Outcome.ERROR, None, error_detail(exc)
        if self._reader is not None and self._timing.first_token is not None:
            outcome, status, detail = Outcome.FAST, 200, f"answer cut: {error_detail(exc)}"
        self._finish(outcome, status, detail)

    def _timed_out(self) -> None:
        """The deadline: no first token (or a known-answer probe's answer ran late)."""
        self._deadline = None
        phase = self._phase
        if phase is Phase.TAIL or phase is Phase.OVER:
            return
        timing = self._timing
        if phase is Phase.HEAD and self._connection is not None:
            timing.headers = self._connection.head_at  # "no first token (headers after ...)"
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        outcome, status, detail = Outcome.TIMEOUT, None, timeout_detail(self._target, timing)
        if self._reader is not None and timing.first_token is not None:
            outcome, status, detail = Outcome.FAST, 200, ""  # the answer ran late
        try:
            self._finish(outcome, status, detail)
        except Exception as exc:  # the prober's own bug: to the receiver
            self._crash(exc)

    def _grace_over(self) -> None:
        self._grace = None
        if self._phase is Phase.TAIL:
            self._release(reuse=False)

    def _crash(self, exc: Exception) -> None:
        """A bug of the prober's own (not the endpoint's doing): the receiver is told, as
        an awaiting caller got the exception, unless it has its result already."""
        told = self._phase is Phase.TAIL or self._phase is Phase.OVER
        self.cancel()
        self._phase = Phase.OVER
        if told:
            raise exc
        self._receiver.failed(exc)

    def cancel(self) -> None:
        """End the probe before its result, its connection closed (the engine aborts);
        nothing once the result is out (its tail runs on to keep the connection)."""
        if self._phase is Phase.TAIL or self._phase is Phase.OVER:
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
        self._phase = Phase.OVER
        if connection is not None:  # the drain ends here: ``send`` starts the next afresh
            self._shared.connections.release(connection, reuse=reuse)


_NO_DECODER = SseDecoder()  # before the head: never fed
_GOT_TOKEN = (Outcome.FAST, "")  # "got a token": the result splits FAST and SLOW by TTFT


def _stale_connection(exc: BaseException, timing: Timing, connection: Connection | None) -> bool:
    """The request died on a kept connection before any response: the server had closed
    it (it disconnected before a status line; an interim 1xx is one: it saw the request)."""
    if not isinstance(exc, ConnectionBroken) or not timing.reused or timing.headers is not None:
        return False
    return connection is None or connection.interim == 0
