"""TCP ports on loopback for the servers tests start, safe when tests run in parallel.

A test picks a port, writes it into a config or a command line, and a server (a child
process, or one in this process) binds it a moment later. Two pickers must never hand
out the same number meanwhile, so:

- Ports come from below the kernel's ephemeral range (Linux default 32768-60999): no
  socket's automatic ``:0`` bind (a client connection, a server on port 0) can take one.
- Each pytest-xdist worker (``PYTEST_XDIST_WORKER`` = ``gw<N>``, of
  ``PYTEST_XDIST_WORKER_COUNT``) has a slice of that range to itself; outside xdist the
  whole range is this process's.
- Within a slice ports are handed out in turn (from a random start, so that two runs
  side by side rarely meet), not at random: one worker never gives out a number twice
  before it has gone round its whole slice. A port that does not bind now is passed over.

So a port from :func:`free_port` that the test never binds is also an address where
nothing listens (a dead backend, an unreachable webhook) for as long as the test runs.
"""

from __future__ import annotations

import os
import random
import socket

LOOPBACK = "127.0.0.1"
#: Where ports are picked (the first is included, the last is not).
RANGE = (20000, 32000)


def worker_slice(
    worker: str | None = None, count: str | None = None, span: tuple[int, int] = RANGE
) -> tuple[int, int]:
    """The part of ``span`` that belongs to this xdist worker (all of it outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "") if count is None else count
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return span
    index, workers = int(worker[2:]), max(int(count), 1)
    size = (span[1] - span[0]) // workers
    first = span[0] + (index % workers) * size
    return first, first + size


class _Picker:
    def __init__(self) -> None:
        self.first, self.end = worker_slice()
        self.next = random.randrange(self.first, self.end)

    def block(self, count: int) -> int:
        """First port of ``count`` consecutive ports that all bind now."""
        size = self.end - self.first
        if not 1 <= count <= size:
            raise ValueError(f"cannot hand out {count} consecutive ports from {size}")
        for _ in range(size):
            start = self.next
            if start + count > self.end:
                start = self.first
            self.next = start + count
            if all(_binds(port) for port in range(start, start + count)):
                return start
        raise RuntimeError(f"no {count} free consecutive ports in {self.first}-{self.end - 1}")


def _binds(port: int) -> bool:
    # No SO_REUSEADDR: a port with connections still in TIME_WAIT is passed over too.
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


_picker: _Picker | None = None


def _the_picker() -> _Picker:
    global _picker
    if _picker is None:  # made on first use: the xdist variables are set by then
        _picker = _Picker()
    return _picker


def free_port() -> int:
    """A port on 127.0.0.1 for a server to bind; see the module doc."""
    return _the_picker().block(1)


def free_port_block(count: int) -> int:
    """First of ``count`` consecutive free ports (e.g. ``llm-health sim --port-count``)."""
    return _the_picker().block(count)
