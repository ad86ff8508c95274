"""The engine checks' own HTTP client (docs/design.md §14): bounded GETs on an endpoint
beside the probes (/metrics, /v1/models, the engines' info endpoints), with the probe's
headers (its auth) and marker, over the prober's HTTP/1.1 exchange (``probe.http1``,
§16.10) but on connections of its own (``open_connections``), not the prober's: a slow
side read never holds a probe's connection. At most MAX_CONCURRENT_READS at once, each
within MAX_SIDE_TIMEOUT_S and a size bound (a longer body is cut at the bound and its
connection closed); what fails raises one of READ_ERRORS, whose text for /status is
``read_error``.

No ``Accept-Encoding`` is sent, so an engine answers uncompressed (the aiohttp session
these reads used before decompressed gzip itself). A request that dies on a kept
connection before any status line (the server had closed it while idle) is sent once
more on a new connection: the server never saw it, so that is no retry of a failed read.
"""

from __future__ import annotations

import asyncio
import json

from llm_health.engines.detect import INFO_PATHS, answers_as
from llm_health.engines.metrics import MAX_DOCUMENT, MetricsError, MetricsOverrun
from llm_health.engines.served_model import model_ids
from llm_health.errors import ProtocolError
from llm_health.model.redact import printable_line, redact_secrets
from llm_health.probe.client import PROBE_HEADER
from llm_health.probe.http1 import (
    Connection,
    ConnectionBroken,
    Connections,
    Route,
    request_head,
    route_of,
)
from llm_health.probe.target import ProbeTarget

MAX_SIDE_TIMEOUT_S = 2.0  # a /metrics or /v1/models request
MAX_MODELS_BODY = 1024 * 1024  # bytes read at most
MAX_INFO_BODY = 256 * 1024
MAX_CONCURRENT_READS = 64
READ_ERRORS = (MetricsError, ProtocolError, OSError, TimeoutError, UnicodeError, ValueError)


def open_connections() -> Connections:
    """The side reads' own connections: ``async with open_connections() as connections``
    (closes those kept when it ends)."""
    return Connections()


class SideReads:
    """The reads, over their own ``connections`` (``open_connections``)."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        self._limits = asyncio.Semaphore(MAX_CONCURRENT_READS)
        self.stale_resends = 0  # requests sent again after a kept connection had died

    async def metrics(
        self, target: ProbeTarget, path: str, interval_s: float, *, keep: bool = False
    ) -> str:
        """The engine's /metrics document (within its interval); MetricsError unless 200,
        MetricsOverrun when longer than MAX_DOCUMENT (refused whole: a document cut
        short would read a prefix's sums as the engine's). ``keep``: here and below,
        keep the connection for the endpoint's next read."""
        timeout = min(interval_s, MAX_SIDE_TIMEOUT_S)
        status, body, whole = await self._get(target, path, timeout, MAX_DOCUMENT, keep=keep)
        if status != 200:
            raise MetricsError(f"HTTP {status}")
        if not whole:
            raise MetricsOverrun(f"document over {MAX_DOCUMENT} bytes")
        return body.decode("utf-8", "replace")

    async def models(
        self, target: ProbeTarget, path: str, *, keep: bool = False
    ) -> tuple[str, ...]:
        """The model ids the endpoint's ``/v1/models`` lists, the endpoint's secrets
        removed (an id reaches the "model" signal's reason); ValueError unless 200."""
        limit = MAX_MODELS_BODY
        status, body, _ = await self._get(target, path, MAX_SIDE_TIMEOUT_S, limit, keep=keep)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return tuple(redact_secrets(i, target.secrets) for i in model_ids(json.loads(body)))

    async def engine(self, target: ProbeTarget, *, keep: bool = False) -> str | None:
        """The engine the first info endpoint that answers as its engine's says (in the
        order of ``detect.INFO_PATHS``), or None."""
        for path, engine, key in INFO_PATHS:
            try:
                status, body, _ = await self._get(
                    target, path, MAX_SIDE_TIMEOUT_S, MAX_INFO_BODY, keep=keep
                )
                if status != 200:
                    continue
                found = json.loads(body)
            except READ_ERRORS:
                continue
            if answers_as(found, key):
                return engine
        return None

    async def _get(
        self, target: ProbeTarget, path: str, within_s: float, limit: int, *, keep: bool = False
    ) -> tuple[int, bytes, bool]:
        """GET ``path`` on the endpoint with the probe's headers (its auth), bounded: the
        status, at most ``limit`` bytes of the body, and whether that is the whole body
        (not cut at ``limit``); the connection is kept after a whole answer if ``keep``."""
        route, request = self._request(target, path)
        async with self._limits, asyncio.timeout(within_s):
            answer = await self._exchange(route, request, limit, resend=False, keep=keep)
            if answer is None:
                self.stale_resends += 1
                answer = await self._exchange(route, request, limit, resend=True, keep=keep)
            assert answer is not None
            return answer

    def _request(self, target: ProbeTarget, path: str) -> tuple[Route, bytes]:
        """The GET of ``path`` with the probe's headers (its auth). Made for each read, a
        small part of the read's cost: kept per endpoint and path, they would hold memory
        for each (metrics, models, four detection paths) of every endpoint."""
        route = route_of(target.base_url + path)
        return route, request_head(route, {**target.headers, PROBE_HEADER: "true"}, None)

    async def _exchange(
        self, route: Route, request: bytes, limit: int, *, resend: bool, keep: bool
    ) -> tuple[int, bytes, bool] | None:
        """One request on a connection, released whatever happens (kept only after an
        answer read whole); None when it died on a kept connection before any status
        line and this is not already the resend (which goes on a new connection). The
        answer is read by the connection's callbacks (``_Body``): this waits once."""
        connection, kept = await self._connections.take(route, fresh=resend)
        body = _Body(connection, limit)
        try:
            connection.send(request)
            try:
                return await body.future
            except ConnectionBroken:
                if kept and not body.headed:  # never on the resend: a new connection
                    return None
                raise
        finally:
            reuse = keep and body.whole and connection.reusable
            self._connections.release(connection, reuse=reuse)


class _Body:
    """An answer read by its connection's callbacks (``Connection.listener``): its status
    and its body, cut at ``limit`` bytes (then not ``whole``: the connection is closed,
    never kept), into ``future`` (with ``whole``) once it ended, went past the limit or
    broke."""

    __slots__ = ("_connection", "_limit", "_parts", "_size", "future", "headed", "whole")

    def __init__(self, connection: Connection, limit: int) -> None:
        self._connection = connection
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.headed = False  # the status line and headers came
        self.whole = False
        self.future: asyncio.Future[tuple[int, bytes, bool]] = (
            asyncio.get_running_loop().create_future()
        )
        connection.listener = self._news

    def _news(self) -> None:
        connection, future = self._connection, self.future
        if future.done():
            return
        try:
            if not self.headed:
                if not connection.head_ready():
                    return
                self.headed = True
            while (chunk := connection.take_body()) is not None:
                if not chunk:
                    self.whole = True
                    self._done(b"".join(self._parts))
                    return
                self._parts.append(chunk)
                self._size += len(chunk)
                if self._size > self._limit:
                    self._done(b"".join(self._parts)[: self._limit])
                    return
        except (OSError, ProtocolError) as exc:
            # Kept without its traceback: the frames that read the bytes (their buffers,
            # the parser) would stay with it until the collector finds the cycle through
            # the awaiting coroutine; it gets the awaiter's when raised there.
            future.set_exception(exc.with_traceback(None))

    def _done(self, body: bytes) -> None:
        status = self._connection.status
        assert status is not None
        self._parts = []
        self.future.set_result((status, body, self.whole))


def read_error(exc: BaseException, target: ProbeTarget) -> str:
    """A failed read for /status: one line, the endpoint's secrets removed."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, MetricsError) else str(exc)
    return printable_line(redact_secrets(text, target.secrets), 200)
