"""The prober's pool of kept HTTP/1.1 connections: opened per exchange (on the loop's
transport, or read by us with the kernel's stamps: ``stamped``), kept after an answer read
whole, closed when unused for ``IDLE_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import ssl
import time
from functools import partial

from llm_health.probe.http1.connection import ConnectFailed, Connection, Route
from llm_health.probe.http1.stamped import STAMPS, Connected, StampedConnect, address_family

MAX_IDLE_PER_ENDPOINT = 2  # kept connections per endpoint (one probe in flight, plus one)
IDLE_TIMEOUT_S = 15.0  # a kept connection unused this long is closed (aiohttp's default)
SWEEP_EVERY_S = 5.0  # a walk over every endpoint: not at every probe, nor every second


class Connections:
    """The prober's connections: opened per exchange, or taken from those kept after an
    answer read whole (``release(reuse=True)``), at most ``MAX_IDLE_PER_ENDPOINT`` per
    endpoint, each for at most ``IDLE_TIMEOUT_S`` unused. ``async with``: closes all."""

    def __init__(self, *, stamped: bool = False) -> None:
        # ``stamped``: plain-TCP connections to an IP address read through
        # ``StampedSocket`` (where the system can: ``STAMPS``), their bytes timed by the
        # kernel when they arrived; the probe's first token is timed so (docs/design.md
        # §16.10). Otherwise, and for TLS or a host name, the event loop's transport.
        self._stamped = stamped and STAMPS
        self._idle: dict[tuple[str, int, bool], list[Connection]] = {}
        # Taken and not released yet: an exchange's, closed with the rest by ``close`` (an
        # exchange reads its answer's tail after its result is out: docs/design.md §16.10).
        self._lent: set[Connection] = set()
        self._tls: ssl.SSLContext | None = None
        self._swept = 0.0
        self.opened = 0
        self.reused = 0

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    async def take(self, route: Route, *, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection to ``route`` and whether it was kept from an earlier exchange
        (``take_kept``, else ``open``)."""
        kept = self.take_kept(route, fresh=fresh)
        if kept is not None:
            return kept, True
        return await self.open(route), False

    def take_kept(self, route: Route, *, fresh: bool = False) -> Connection | None:
        """A connection to ``route`` kept from an earlier exchange, or None. ``fresh``:
        none, and the route's kept ones closed (one of them was just found dead: the
        others, kept as long, are as likely dead too)."""
        now = time.monotonic()
        if now - self._swept >= SWEEP_EVERY_S:
            self._sweep(now)
        if fresh:
            for connection in self._idle.pop(route.key, []):
                connection.close()
            return None
        idle = self._idle.get(route.key)
        while idle:
            connection = idle.pop()
            if not connection.lost:
                self.reused += 1
                self._lent.add(connection)
                return connection
        return None

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """After the exchange: kept when ``reuse`` and the connection is reusable."""
        connection.listener = None  # the exchange's: no cycle through it, no stale call
        self._lent.discard(connection)
        if not (reuse and connection.reusable):
            connection.close()
            return
        idle = self._idle.setdefault(connection.route.key, [])
        if len(idle) >= MAX_IDLE_PER_ENDPOINT:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        connection.rest()
        idle.append(connection)

    def close(self) -> None:
        """Close every connection: those kept and those an exchange still holds."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        lent, self._lent = self._lent, set()
        for connection in lent:
            connection.close()

    async def open(self, route: Route) -> Connection:
        """A new connection to ``route`` (``ConnectFailed`` if none can be had)."""
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[Connection] = loop.create_future()
        connecting = self.open_soon(route, partial(self._settle, opened))
        if connecting is not None:
            try:
                return await opened
            except asyncio.CancelledError:
                connecting.cancel()  # the socket being connected goes too
                if opened.done() and not opened.cancelled() and opened.exception() is None:
                    self.release(opened.result(), reuse=False)  # connected as it came
                raise
        connection = Connection(route)
        await self._connect_transport(loop, connection, route)
        self._opened(connection)
        return connection

    def open_soon(self, route: Route, done: Connected) -> StampedConnect | None:
        """``open`` without a task, where the connection is read by us (``STAMPS``, an IP
        address, no TLS): ``done(connection, None)`` once connected, ``done(None,
        ConnectFailed)`` if not, never after ``cancel``. Raises ``ConnectFailed`` if it
        fails at once. None: not here, ``open`` it. No task: a probe of an engine that closes
        after each answer (as llama.cpp's server does) opens a connection every time."""
        family = address_family(route.host) if self._stamped and not route.tls else None
        if family is None:
            return None
        loop = asyncio.get_running_loop()
        return StampedConnect(loop, family, route, partial(self._lend_opened, done))

    def _settle(
        self,
        opened: asyncio.Future[Connection],
        connection: Connection | None,
        failed: OSError | None,
    ) -> None:
        """``open``'s future, from ``open_soon``'s answer."""
        if opened.done():  # ``open`` was cancelled meanwhile
            if connection is not None:
                self.release(connection, reuse=False)
        elif connection is not None:
            opened.set_result(connection)
        else:
            assert failed is not None
            opened.set_exception(failed)

    def _lend_opened(
        self, done: Connected, connection: Connection | None, failed: OSError | None
    ) -> None:
        """``open_soon``'s ``done``, once the new connection is counted and lent."""
        if connection is not None:
            self._opened(connection)
        done(connection, failed)

    def _opened(self, connection: Connection) -> None:
        self.opened += 1
        self._lent.add(connection)

    async def _connect_transport(
        self, loop: asyncio.AbstractEventLoop, connection: Connection, route: Route
    ) -> None:
        """``connection`` on the loop's own transport (TLS, a host name, no stamps)."""
        tls = self._tls_context() if route.tls else None
        try:
            transport, _ = await loop.create_connection(
                lambda: connection, route.host, route.port, ssl=tls
            )
        except OSError as exc:
            raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
        connection.transport = transport  # uvloop may call connection_made after this returns

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # verified, as aiohttp's default
        return self._tls

    def _sweep(self, now: float) -> None:
        """Close kept connections unused for IDLE_TIMEOUT_S (or closed by the server)."""
        self._swept = now
        for key, idle in list(self._idle.items()):
            if not _any_stale(idle, now):
                continue  # the common case: nothing to close, nothing made
            kept = []
            for connection in idle:
                if connection.lost or now - connection.idle_since >= IDLE_TIMEOUT_S:
                    connection.close()
                else:
                    kept.append(connection)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]


def _any_stale(idle: list[Connection], now: float) -> bool:
    """Whether a kept connection is to be closed: lost, or unused for IDLE_TIMEOUT_S."""
    for connection in idle:  # a loop, not all(...): no generator made per endpoint
        if connection.lost or now - connection.idle_since >= IDLE_TIMEOUT_S:
            return True
    return False
