"""Bytes timed by the kernel: a plain TCP connection read with ``recvmsg``, its bytes
handed to their ``Connection`` with the time the kernel received them (docs/design.md §7.4).

A first token's bytes reach the host long before this process may read them: behind a
busy loop, a collector pause, other processes on the cores. Timed when read, the TTFT
holds all of that (the prober's own lateness). With SO_TIMESTAMPNS the kernel stamps
every packet it receives, and ``recvmsg`` hands over the stamp of the latest packet a
read took in (so a TCP socket does too): the time the bytes arrived, whatever this
process did meanwhile. uvloop's transports read with ``read`` and drop it, so these
connections read their socket themselves (``StampedSocket``)."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import platform
import select
import socket
import struct
import sys
import time
from collections.abc import Callable

from llm_health.probe.http1.connection import ConnectFailed, Connection, Route


def _so_timestampns() -> int | None:
    """The option's number where it is known: Python's socket module does not name it;
    Linux's is 35 on x86-64 and arm64 (the generic number; with a 64-bit time_t the
    struct timespec of two int64). Elsewhere (another system or architecture, where the
    number or the struct may differ) nothing is stamped and the loop's transport reads."""
    if hasattr(socket, "SO_TIMESTAMPNS"):
        return int(socket.SO_TIMESTAMPNS)
    known = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "arm64")
    return 35 if known and struct.calcsize("@q") == 8 else None


SO_TIMESTAMPNS = _so_timestampns()  # None: nothing is stamped here
STAMPS = SO_TIMESTAMPNS is not None
READ_SIZE = 256 * 1024  # at most this much a read (uvloop's own read size)
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec
_TIMESPEC = struct.Struct("@qq")


def address_family(host: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 for an IP literal; None for a host name (resolved by the
    loop's transport, not here)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


Connected = Callable[["Connection | None", "OSError | None"], None]


def _stamped_socket(family: socket.AddressFamily) -> socket.socket:
    """A non-blocking TCP socket whose reads bear the kernel's receipt time."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loop's transports
        assert SO_TIMESTAMPNS is not None  # STAMPS
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError as exc:
        sock.close()
        raise ConnectFailed(exc.errno, exc.strerror or str(exc)) from exc
    return sock


class StampedConnect:
    """A non-blocking TCP connect driven by the loop's writer callback (what
    ``loop.sock_connect`` does, without its future and the task awaiting it): once the
    socket is writable, its error (``SO_ERROR``) says whether it connected. ``cancel``
    closes the socket; ``done`` is then never called."""

    __slots__ = ("_done", "_fd", "_loop", "_route", "_sock")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        family: socket.AddressFamily,
        route: Route,
        done: Connected,
    ) -> None:
        self._loop = loop
        self._route = route
        self._done = done
        sock = _stamped_socket(family)
        error = sock.connect_ex((route.host, route.port))
        if error not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EINTR):
            sock.close()
            raise ConnectFailed(error, os.strerror(error))
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._loop.remove_writer(self._fd)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            sock.close()
            self._done(None, ConnectFailed(error, os.strerror(error)))
            return
        connection = Connection(self._route)
        StampedSocket(self._loop, sock, connection)
        self._done(connection, None)

    def cancel(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_writer(self._fd)
            sock.close()


class StampedSocket:
    """A plain TCP connection read with ``recvmsg``, each read's bytes handed to its
    ``Connection`` with the kernel's receipt time (``Connection.data_stamped``), and
    written with ``send``: the part of ``asyncio.Transport`` the ``Connection`` uses
    (``write``, ``abort``, ``close``, ``is_closing``), with its callbacks' order:
    ``connection_made``, then bytes, then ``eof_received`` and ``connection_lost`` once."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Connection
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol: Connection | None = protocol  # None once closed: no cycle left
        self._pending = b""  # written and not sent yet (the socket's buffer was full)
        self._unread = select.poll()  # whether bytes wait unread (``write``)
        self._unread.register(self._fd, select.POLLIN)
        loop.add_reader(self._fd, self._readable)
        protocol.connection_made(self)  # type: ignore[arg-type]

    def _readable(self) -> None:
        sock, protocol = self._sock, self._protocol
        if sock is None or protocol is None:
            return
        try:
            data, ancillary, _flags, _address = sock.recvmsg(READ_SIZE, _STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        if not data:
            protocol.eof_received()
            self._lose(None)
            return
        protocol.data_stamped(data, arrival(ancillary))

    def write(self, data: bytes) -> None:
        """Send a request, unless bytes came before it and wait unread (this loop turn
        did not read them): they answer no request of ours, and a read that took them in
        with the answer would bear the answer's stamp (docs/design.md §7.4)."""
        sock = self._sock
        if sock is None:
            return  # closed: the connection has heard (connection_lost)
        if self._pending:
            self._pending += data
            return
        if self._unread.poll(0) and self._came_unasked(sock):
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lose(exc)
            return
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _came_unasked(self, sock: socket.socket) -> bool:
        """Whether bytes wait unread (then the connection fails: ``data_unasked``), or
        the connection is lost meanwhile (the server had closed a kept one: its request
        is sent again on a new one, as ever)."""
        protocol = self._protocol
        try:
            data = sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._lose(exc)
            return True
        if protocol is not None and data:
            protocol.data_unasked()
        elif protocol is not None:
            protocol.eof_received()
        self._lose(None)
        return True

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        self._pending = self._pending[sent:]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def is_closing(self) -> bool:
        return self._sock is None

    def abort(self) -> None:
        self._lose(None)

    def close(self) -> None:
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        """Close the socket once; ``connection_lost`` on the loop's next turn (as a
        transport calls it)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._loop.remove_reader(self._fd)
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending = b""
        sock.close()
        protocol, self._protocol = self._protocol, None  # the connection keeps its transport
        if protocol is not None:
            self._loop.call_soon(protocol.connection_lost, exc)


def arrival(ancillary: list[tuple[int, int, bytes]]) -> float:
    """When the latest packet read arrived, on ``time.perf_counter``'s clock: the
    kernel's stamp (CLOCK_REALTIME) moved by the two clocks' offset now. Never later than
    now; our own read's time when there is no stamp, or one from the future (the wall
    clock stepped back meanwhile). The wall clock is read first: a prober paused between
    the two reads (a busy machine) dates the bytes later by the pause, never earlier, so
    an answer is never taken for bytes sent before the request, nor a token for an
    earlier one (a TTFT too short: a false FAST)."""
    wall = time.time()
    now = time.perf_counter()
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            seconds, nanoseconds = _TIMESPEC.unpack_from(raw)
            ago = wall - (seconds + nanoseconds * 1e-9)
            return now - ago if ago >= 0 else now
    return now
