"""A bounded load generator for the real-engine tests: ``users`` concurrent streamed chat
users against one engine on loopback, for at most ``seconds`` (and ``max_requests``).

Each user sends a streamed ``/v1/chat/completions`` request, reads it to ``[DONE]``, and
sends the next, until the time is up. Counted: requests completed (``[DONE]`` read),
errors (a non-200 status, a connection refused or reset, a stream that ended before
``[DONE]``, a request over ``request_timeout``), and the tokens' events read. Threads and
blocking sockets: a test calls :func:`run_load` (or runs a :class:`Load` beside its
checks: ``with Load(...) as load: ...``), and every thread is joined before it returns.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MAX_REQUESTS = 100_000  # a hard bound on top of the time bound


@dataclass
class LoadResult:
    completed: int = 0
    errors: int = 0
    events: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


class Load:
    """``users`` threads, each streaming chat requests to ``host:port`` until
    ``seconds`` have passed or :meth:`stop` is called; :attr:`result` once joined."""

    def __init__(
        self,
        port: int,
        *,
        users: int,
        seconds: float,
        model: str,
        max_tokens: int = 16,
        prompt: str = "hi",
        host: str = "127.0.0.1",
        request_timeout: float = 30.0,
        max_requests: int = MAX_REQUESTS,
    ) -> None:
        if not host.startswith("127.") and host not in ("localhost", "::1"):
            raise ValueError(f"loopback only, not {host}")
        self.host, self.port, self.users, self.seconds = host, port, users, seconds
        self.request_timeout, self.max_requests = request_timeout, max_requests
        self.body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "stream": True,
                "ignore_eos": True,  # vLLM: run to max_tokens whatever the weights say
            }
        ).encode()
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sent = 0
        self._threads: list[threading.Thread] = []
        self._started = 0.0

    def start(self) -> Load:
        self._started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._user, name=f"load-user-{i}", daemon=True)
            for i in range(self.users)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> LoadResult:
        """Stop sending and wait for every user (at most one request timeout)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.request_timeout + 5.0)
        self.result.seconds = time.monotonic() - self._started
        return self.result

    def _take_turn(self) -> bool:
        with self._lock:
            if self._stop.is_set() or time.monotonic() - self._started >= self.seconds:
                return False
            if self._sent >= self.max_requests:
                return False
            self._sent += 1
            return True

    def _user(self) -> None:
        while self._take_turn():
            kind, events = self._one_request()
            with self._lock:
                self.result.events += events
                if kind is None:
                    self.result.completed += 1
                else:
                    self.result.error(kind)

    def _one_request(self) -> tuple[str | None, int]:
        """(None, events) for a completed stream, else (what went wrong, events)."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.request_timeout)
        events = 0
        try:
            connection.request(
                "POST",
                "/v1/chat/completions",
                self.body,
                {"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            response = connection.getresponse()
            if response.status != 200:
                response.read()
                return f"http {response.status}", 0
            for line in response:
                if not line.startswith(b"data:"):
                    continue
                if line[5:].strip() == b"[DONE]":
                    return None, events
                events += 1
            return "ended before [DONE]", events
        except TimeoutError:
            return "timeout", events
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__, events
        finally:
            connection.close()

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def run_load(port: int, *, users: int, seconds: float, model: str, **options: object) -> LoadResult:
    """Run the load to its end and return what it counted."""
    load = Load(port, users=users, seconds=seconds, model=model, **options)  # type: ignore[arg-type]
    load.start()
    time.sleep(seconds)
    return load.stop()


class LoadProcess:
    """A :class:`Load` in a process of its own: the users' threads then share no
    interpreter lock with the test that samples ``serve``, the agent and Envoy beside
    them. ``stop`` (SIGTERM) ends it early; :attr:`result` once stopped."""

    def __init__(
        self, port: int, *, users: int, seconds: float, model: str, max_tokens: int = 16
    ) -> None:
        self.args = [str(port), str(users), str(seconds), model, str(max_tokens)]
        self.seconds = seconds
        self.result = LoadResult()
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> LoadProcess:
        root = Path(__file__).resolve().parents[2]
        command = [sys.executable, "-m", "tests.engine.load", *self.args]
        # The users stand for clients on other machines: at a lower priority their threads
        # do not take the CPU that serve, the agent and Envoy need on this shared machine.
        self._process = subprocess.Popen(
            command, cwd=root, stdout=subprocess.PIPE, preexec_fn=lambda: os.nice(10)
        )
        return self

    def stop(self) -> LoadResult:
        process = self._process
        assert process is not None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=self.seconds + 60.0)
        self.result = LoadResult(**json.loads(out))
        return self.result

    def __enter__(self) -> LoadProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> None:
    port, users, seconds, model, max_tokens = argv
    load = Load(int(port), users=int(users), seconds=float(seconds), model=model,
                max_tokens=int(max_tokens))  # fmt: skip
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    load.start()
    done.wait(float(seconds))
    result = load.stop()
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
