"""Probe workers: the micro-probe run in child processes, one per core (docs/design.md §16.2).

One asyncio loop ends at about 1,000 probes a second on this class of machine: the HTTP
client's cost, the garbage collector on a large heap and everything else the runtime does
all land on the loop that times the first tokens. ``WorkerPool`` keeps the scheduling, the
silence checks and every verdict in the runtime and moves only the exchange (request,
first token, timing, the answer of a known-answer probe) into ``workers`` processes, each
with its own loop. It has ``MicroProbe``'s shape (``start_probe``, ``start_verify``,
``stale_resends``), so the scheduler and the engine checks do not know which they have.

- An endpoint always goes to the same worker (a hash of its key): its keep-alive
  connection stays warm there.
- The first token is told to the probe's receiver the moment the worker reads it (the
  scheduler's silence check waits for it as for an in-process probe).
- Cancelling a probe here cancels it in the worker (its connection is closed).
- A worker that dies is started again; its probes in flight are run again in-process
  (the engine's answer never reached us, so that is a new probe, not a retry), and so
  are its endpoints' probes until the new worker is up, or for good after
  ``MAX_RESTARTS`` within a minute.
- A worker that does not answer within twice the probe's budget gives a result that is
  not a verdict (``loop_lag_ms`` = the time waited: ``machine.trusted`` ignores it), and
  is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.client import Asked, MicroProbe, Question
from llm_health.probe.loop import child_env
from llm_health.probe.signals import ProbeReceiver, Started
from llm_health.probe.target import ProbeTarget
from llm_health.probe.wire import FrameError, Message, Outbox, read_messages

log = logging.getLogger("llm_health")
READ_CHUNK = 256 * 1024
MAX_RESTARTS = 5  # per worker within RESTART_WINDOW_S, then in-process
RESTART_WINDOW_S = 60.0
GRACE_S = 5.0  # beyond a probe's own longest time before a worker counts as stuck
STOP_GRACE_S = 2.0
READY_S = 10.0
HEARTBEAT_S = 0.02  # a worker says how late it runs this often (probe.worker)


class _Pending:
    """A probe sent to a worker (``Started``): its receiver is told what the worker says,
    or, when the worker died meanwhile, what the probe run again in-process says (this
    is its receiver then). ``cancel`` ends it where it runs; its receiver is not told."""

    __slots__ = (
        "fallback",
        "probe_id",
        "question",
        "receiver",
        "sent_at",
        "target",
        "timer",
        "worker",
    )

    def __init__(
        self,
        worker: _Worker,
        probe_id: int,
        target: ProbeTarget,
        question: Asked | None,
        receiver: ProbeReceiver,
    ) -> None:
        self.worker, self.probe_id = worker, probe_id
        self.target, self.question, self.receiver = target, question, receiver
        self.sent_at = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None  # the worker's time to answer
        self.fallback: Started | None = None  # run again in-process (its worker died)

    def cancel(self) -> None:
        if self.worker.pending.pop(self.probe_id, None) is not None:
            self.stop_timer()
            if self.worker.outbox is not None:
                self.worker.outbox.put(("cancel", self.probe_id))
        fallback, self.fallback = self.fallback, None
        if fallback is not None:
            fallback.cancel()

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # As the receiver of the probe run again in-process: its token was told already.

    def set(self) -> None:
        pass

    def done(self, result: ProbeResult) -> None:
        self.fallback = None
        self.receiver.done(result)

    def failed(self, error: Exception) -> None:
        self.fallback = None
        self.receiver.failed(error)


@dataclass(slots=True)
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    outbox: Outbox | None = None  # set once the worker said it is ready
    pipe: Outbox | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None
    targets: dict[str, ProbeTarget] = field(default_factory=dict)  # as sent to it
    pending: dict[int, _Pending] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    resends: int = 0
    broken: bool = False
    lag_ms: float = 0.0  # its loop's lag, as it last said
    heard_at: float = 0.0  # perf_counter of its last heartbeat


class WorkerPool:
    def __init__(
        self, workers: int, fallback: MicroProbe, engines: Mapping[str, str] | None = None
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self._workers = [_Worker(i) for i in range(workers)]
        self._fallback = fallback
        self._engines: Mapping[str, str] = engines if engines is not None else {}
        self._ids = 0
        self._closing = False
        self.restarts_total = 0

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def stale_resends(self) -> int:
        return self._fallback.stale_resends + sum(w.resends for w in self._workers)

    def lag_ms(self) -> float:
        """The worst lag among the workers in use, as far as this side can tell: what a
        worker last said, or how overdue its heartbeat is (a stalled worker cannot say
        so; a silence judged meanwhile would be ours, not the engine's)."""
        now, worst = time.perf_counter(), 0.0
        for worker in self._workers:
            if worker.outbox is None:
                continue
            overdue_ms = (now - worker.heard_at - HEARTBEAT_S) * 1000
            worst = max(worst, worker.lag_ms, overdue_ms)
        return worst

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    async def start(self, ready_within: float = READY_S) -> None:
        """Start the workers and wait (at most ``ready_within``) until they are ready; a
        worker not ready yet leaves its endpoints to in-process probing until it is (a
        probe queued behind a starting interpreter would read as silence)."""
        await asyncio.gather(*(self._spawn(w) for w in self._workers))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ready_within):
                await asyncio.gather(*(w.ready.wait() for w in self._workers))

    async def close(self) -> None:
        self._closing = True
        await asyncio.gather(*(self._stop(w) for w in self._workers))

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """Probe ``target`` in its worker (or in-process, its worker not up), telling
        ``receiver`` (``probe.signals``)."""
        return self._start(target, None, receiver)

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """A known-answer probe, as ``start_probe``."""
        return self._start(target, Asked(question.prompt, question.max_tokens), receiver)

    # --- one probe ----------------------------------------------------------------------

    def _start(
        self, target: ProbeTarget, question: Asked | None, receiver: ProbeReceiver
    ) -> Started:
        worker = self._workers[shard(target.key, len(self._workers))]
        if worker.broken or worker.outbox is None:
            return self._in_process(target, question, receiver)
        self._ids += 1
        pending = _Pending(worker, self._ids, target, question, receiver)
        worker.pending[pending.probe_id] = pending
        self._send(worker, target, pending)
        # A probe may take its timeout twice (a resend after a dead pooled connection),
        # a known-answer probe once more for the rest of its answer.
        budget = target.timeout_s * (4 if question is not None else 2) + GRACE_S
        pending.timer = asyncio.get_running_loop().call_later(budget, self._overdue, pending)
        return pending

    def _overdue(self, pending: _Pending) -> None:
        """The worker did not answer within the probe's budget: it is restarted, and the
        probe gives a result that is not a verdict."""
        pending.timer = None
        worker = pending.worker
        if worker.pending.pop(pending.probe_id, None) is None:
            return
        log.warning("probe worker did not answer: restarting it", extra={"worker": worker.index})
        self._kill(worker)
        _tell(pending.receiver, _not_measured(pending, "probe worker did not answer"))

    def _send(self, worker: _Worker, target: ProbeTarget, pending: _Pending) -> None:
        assert worker.outbox is not None
        if worker.targets.get(target.key) is not target:
            worker.targets[target.key] = target
            worker.outbox.put(("target", target.key, target))
        engine = self._engines.get(target.key) if target.engine == "auto" else None
        worker.outbox.put(("probe", pending.probe_id, target.key, engine, pending.question))

    # --- from the workers ---------------------------------------------------------------

    async def _read(self, worker: _Worker, stream: asyncio.StreamReader) -> None:
        try:
            async for message in read_messages(stream, READ_CHUNK):
                self._deliver(worker, message)
        except (FrameError, ValueError, EOFError) as exc:  # a worker bug: restart it
            log.error("probe worker wrote garbage", extra={"error": type(exc).__name__})
            self._kill(worker)
        if not self._closing:
            await self._restart(worker)

    def _deliver(self, worker: _Worker, message: Message) -> None:
        kind, probe_id = message[0], message[1]
        if kind == "ready":  # its loop and session are up: probes may go there now
            worker.outbox = worker.pipe
            worker.heard_at = time.perf_counter()
            worker.ready.set()
            return
        if kind == "lag":  # its heartbeat
            worker.lag_ms, worker.heard_at = float(probe_id), time.perf_counter()
            return
        pending = worker.pending.get(probe_id)
        if pending is None:
            return  # cancelled or timed out here meanwhile
        if kind == "token":
            pending.receiver.set()
            return
        worker.pending.pop(probe_id, None)
        pending.stop_timer()
        if kind == "result":
            worker.resends = message[3]
            _tell(pending.receiver, message[2])
        else:  # "failed": a bug in the worker, not the engine's doing
            _tell(pending.receiver, _not_measured(pending, f"probe worker error: {message[2]}"))

    # --- process lifecycle ----------------------------------------------------------------

    async def _spawn(self, worker: _Worker) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llm_health.probe.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=child_env(),
        )
        assert process.stdin is not None and process.stdout is not None
        worker.process = process
        worker.targets = {}
        worker.ready = asyncio.Event()
        worker.outbox, worker.pipe = None, Outbox(process.stdin.write)
        worker.reader = asyncio.create_task(self._read(worker, process.stdout))

    async def _restart(self, worker: _Worker) -> None:
        now = time.monotonic()
        worker.restarts = [t for t in worker.restarts if now - t < RESTART_WINDOW_S] + [now]
        worker.outbox = worker.pipe = None  # meanwhile its endpoints are probed in-process
        self._resend(worker)
        if worker.process is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
            await worker.process.wait()
        if len(worker.restarts) > MAX_RESTARTS:
            log.error(
                "probe worker keeps dying: its endpoints are probed in-process",
                extra={"worker": worker.index},
            )
            worker.broken = True
            return
        log.warning("probe worker exited: starting it again", extra={"worker": worker.index})
        self.restarts_total += 1
        await self._spawn(worker)

    def _resend(self, worker: _Worker) -> None:
        """Probes in flight on a worker that died: their answer never reached us, so each
        is run again in-process (a new probe with its own timing, not a retry). Their
        first-token events are set: the scheduler's silence clock started with the lost
        probe, so silence measured across the loss would be ours, not the engine's; the
        new probe's result still decides."""
        pendings, worker.pending = worker.pending, {}
        for pending in pendings.values():
            pending.stop_timer()
            pending.receiver.set()
            pending.fallback = self._in_process(pending.target, pending.question, pending)

    def _in_process(
        self, target: ProbeTarget, question: Asked | None, receiver: ProbeReceiver
    ) -> Started:
        """The probe run by the fallback ``MicroProbe``, on this loop."""
        if question is None:
            return self._fallback.start_probe(target, receiver)
        return self._fallback.start_verify(target, question, receiver)

    def _kill(self, worker: _Worker) -> None:
        if worker.process is not None and worker.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()

    async def _stop(self, worker: _Worker) -> None:
        process, worker.outbox, worker.pipe = worker.process, None, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the worker exits when its stdin closes
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            self._kill(worker)
            await process.wait()
        if worker.reader is not None:
            worker.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.reader


def shard(key: str, count: int) -> int:
    """The worker of ``count`` an endpoint's probes go to: always the same for its key."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def _not_measured(pending: _Pending, detail: str) -> ProbeResult:
    """A probe we could not time: TIMEOUT with the whole wait as our own lag, which the
    integrity guard (``machine.trusted``) never takes as a verdict."""
    waited_ms = (time.perf_counter() - pending.sent_at) * 1000
    return ProbeResult(Outcome.TIMEOUT, time.time(), detail=detail, loop_lag_ms=waited_ms)


def _tell(receiver: ProbeReceiver, result: ProbeResult) -> None:
    """A result to its receiver; a receiver's bug goes to the loop's exception handler
    (logged), never into the pipe's reader."""
    try:
        receiver.done(result)
    except Exception as exc:
        context = {"message": "a probe's receiver failed", "exception": exc}
        asyncio.get_running_loop().call_exception_handler(context)
