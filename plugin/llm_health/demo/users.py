"""Streamed chat users against one engine, for the demo's saturated server: ``users``
threads, each sending a streamed ``/v1/chat/completions`` request, reading it to
``[DONE]`` and sending the next, for at most ``seconds`` (and MAX_REQUESTS), on loopback
only. Run in a process of its own (``python -m llm_health.demo.users``, at a lower
priority: they stand for clients on other machines); SIGTERM ends it early. Prints what it
counted as one JSON line at the end."""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass

MAX_REQUESTS = 100_000
REQUEST_TIMEOUT_S = 30.0


@dataclass
class Counted:
    completed: int = 0
    errors: int = 0


class Users:
    def __init__(self, port: int, users: int, seconds: float, model: str, max_tokens: int):
        self.port, self.users, self.seconds = port, users, seconds
        self.body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
                "stream": True,
                "ignore_eos": True,  # vLLM: run to max_tokens whatever the weights say
            }
        ).encode()
        self.counted = Counted()
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._started = time.monotonic()

    def run(self) -> Counted:
        threads = [threading.Thread(target=self._user, daemon=True) for _ in range(self.users)]
        for thread in threads:
            thread.start()
        self.stopped.wait(self.seconds)
        self.stopped.set()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_S + 5.0)
        return self.counted

    def _take_turn(self) -> bool:
        with self._lock:
            over = time.monotonic() - self._started >= self.seconds
            if self.stopped.is_set() or over or self._sent >= MAX_REQUESTS:
                return False
            self._sent += 1
            return True

    def _user(self) -> None:
        while self._take_turn():
            completed = self._one_request()
            with self._lock:
                if completed:
                    self.counted.completed += 1
                else:
                    self.counted.errors += 1

    def _one_request(self) -> bool:
        """True for a stream read to ``[DONE]``."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            connection.request(
                "POST",
                "/v1/chat/completions",
                self.body,
                {"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            response = connection.getresponse()
            if response.status != 200:
                return False
            return any(line.strip() == b"data: [DONE]" for line in response)
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_health.demo.users")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--users", type=int, default=24)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    users = Users(args.port, args.users, args.seconds, args.model, args.max_tokens)
    signal.signal(signal.SIGTERM, lambda *_: users.stopped.set())
    print(json.dumps(asdict(users.run())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
