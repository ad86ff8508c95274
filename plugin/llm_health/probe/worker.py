"""A probe worker process: ``python -m llm_health.probe.worker`` (docs/design.md §16.2).

Started by the runtime (``probe.pool.WorkerPool``), never by hand. It runs the same
micro-probe as the runtime would, on its own event loop and its own core, for the
endpoints the runtime hands it; the runtime keeps scheduling, the state machines, xDS and
everything else. A worker's loop does nothing but probes, so its lag (measured here and
carried in each result, as in-process) stays small, and its heap stays small, so garbage
collection pauses are short.

stdout is the result pipe: it is taken over at start, and ``sys.stdout`` points to stderr,
so a stray print can never corrupt a frame. The worker exits when its stdin closes (the
runtime stopped or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys

from llm_health.model.outcome import ProbeResult
from llm_health.probe.client import Asked, MicroProbe, new_connections
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.loop import WORKER_ENV
from llm_health.probe.loop import run as run_loop
from llm_health.probe.signals import Started
from llm_health.probe.target import ProbeTarget
from llm_health.probe.wire import Message, Outbox, open_pipes, read_messages

READ_CHUNK = 256 * 1024
HEARTBEAT_S = 0.02  # as probe.pool.HEARTBEAT_S
log = logging.getLogger("llm_health.worker")


class _Reply:
    """A probe's receiver (``probe.signals.ProbeReceiver``) across the pipe: its first
    token, then its result (or the prober's own failure), each one message."""

    __slots__ = ("_id", "_worker", "token", "told")

    def __init__(self, worker: Worker, probe_id: int) -> None:
        self._worker, self._id = worker, probe_id
        self.token = self.told = False

    def set(self) -> None:
        if not self.token:
            self.token = True
            self._worker.outbox.put(("token", self._id))

    def done(self, result: ProbeResult) -> None:
        self.told = True
        self._worker.finished(self._id, ("result", self._id, result, self._worker.resends))

    def failed(self, error: Exception) -> None:
        self.told = True
        log.error("probe failed inside the worker", exc_info=error)
        self._worker.finished(self._id, ("failed", self._id, type(error).__name__))


class Worker:
    """Runs the probes the runtime sends, each started (``MicroProbe.start_probe``) with
    a ``_Reply`` that writes its news to the pipe; ``cancel`` ends one."""

    def __init__(self, prober: MicroProbe, outbox: Outbox, engines: dict[str, str]) -> None:
        self._prober = prober
        self.outbox = outbox
        self._engines = engines
        self._targets: dict[str, ProbeTarget] = {}
        self._running: dict[int, Started] = {}

    @property
    def resends(self) -> int:
        return self._prober.stale_resends

    def handle(self, message: Message) -> None:
        kind = message[0]
        if kind == "target":
            self._targets[message[1]] = message[2]
        elif kind == "probe":
            _, probe_id, key, engine, question = message
            if engine is not None:
                self._engines[key] = engine
            self._start(probe_id, self._targets[key], question)
        elif kind == "cancel":
            running = self._running.pop(message[1], None)
            if running is not None:
                running.cancel()

    def finished(self, probe_id: int, message: Message) -> None:
        """A probe's last message: to the runtime, the probe forgotten here."""
        self._running.pop(probe_id, None)
        self.outbox.put(message)

    def _start(self, probe_id: int, target: ProbeTarget, question: Asked | None) -> None:
        reply = _Reply(self, probe_id)
        try:
            if question is not None:
                started = self._prober.start_verify(target, question, reply)
            else:
                started = self._prober.start_probe(target, reply)
        except Exception as exc:  # a bug here must not leave the runtime waiting
            reply.failed(exc)
            return
        if not reply.told:  # not over at once (a URL that cannot be sent is)
            self._running[probe_id] = started

    def cancel_all(self) -> None:
        running, self._running = self._running, {}
        for started in running.values():
            started.cancel()


async def serve(read_fd: int, write_fd: int) -> None:
    reader, transport = await open_pipes(read_fd, write_fd, READ_CHUNK)
    outbox = Outbox(transport.write)
    lag = LoopLagMonitor()
    ticker = asyncio.create_task(lag.run())
    engines: dict[str, str] = {}
    async with new_connections() as connections:
        worker = Worker(MicroProbe(connections, lag, engines=engines), outbox, engines)
        _settle_heap()  # before any probe: its pause can delay none
        outbox.put(("ready", 0))
        beat = asyncio.create_task(_heartbeat(outbox, lag))
        try:
            async for message in read_messages(reader, READ_CHUNK):
                worker.handle(message)
        finally:
            worker.cancel_all()
            for task in (ticker, beat):
                task.cancel()
            outbox.flush()


async def _heartbeat(outbox: Outbox, lag: LoopLagMonitor) -> None:
    """Say how late this loop runs, every HEARTBEAT_S: the runtime's silence checks must
    not take this worker's stall for an engine's silence (``WorkerPool.lag_ms``)."""
    while True:
        outbox.put(("lag", lag.current_ms))
        await asyncio.sleep(HEARTBEAT_S)


def _settle_heap() -> None:
    """Start-up objects (imports, the connections) out of the collector's way; see the
    runtime's own ``settle_heap`` (docs/design.md §16.4)."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    del argv
    write_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print goes to stderr
    sys.stdout = sys.stderr
    read_fd = os.dup(sys.stdin.fileno())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        run_loop(serve(read_fd, write_fd), os.environ.get(WORKER_ENV, "asyncio"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
