"""The heartbeat's own thread (docs/design.md §12.2): a member's heartbeat must not wait
for the prober's loop.

A heartbeat on the loop goes out only when the loop gets to it. A burst of first probes
(a start, a takeover of a departed member's endpoints, a reload that adds many) can keep
the loop busy for seconds on a loaded machine; a heartbeat later than ``member_ttl``
evicts the member, which joins again and publishes everything it owns once more, and a
takeover burst could evict the member that took over in turn. Measured with
``bench/fleet.py --replicas 3 --endpoints 1000 --parts 1``: the first heartbeat after a
join reached Redis 2.4 s to more than 3 s after it while the loop worked through the
first round, and most runs had one eviction at start (docs/benchmarks.md, Fleet).

So the beat runs here, on a thread of its own with its own blocking Redis connection
(the interpreter hands the thread its turn within ``sys.getswitchinterval()`` however
busy the loop is). What it renews is still earned on the loop: each beat vouches only
while probe results of the endpoints we own come in (``Roster.vouches``, read here, set
there), so a loop that is stuck, not busy, still loses what it owns after ``fresh``;
and a paused process (SIGSTOP) pauses this thread too. Each answer goes to the loop,
which acts on it (a new member list, an eviction, a failure) as before.

Shared with the loop: the epoch to beat with and the wake-up, under one lock; answers go
the other way through ``call_soon_threadsafe``. The loop only reads ``Beat``s.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from llm_health.fleet.wire import Membership


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat's answer: the member list (None: Redis no longer knows us with
    ``epoch``: join again), or the failure; ``at``: when it came (the fleet's clock)."""

    epoch: int
    vouched: bool
    at: float
    membership: Membership | None = None
    error: BaseException | None = None


BeatFn = Callable[[int, bool], Membership | None]  # (epoch, vouch) -> answer; blocking


class Pulse:
    """Beats every ``period`` seconds with the epoch it follows (none: no beat), or at
    once when woken; hands each ``Beat`` to ``deliver`` on ``loop``."""

    def __init__(
        self,
        beat: BeatFn,
        vouches: Callable[[], bool],
        period: float,
        clock: Callable[[], float],
    ) -> None:
        self._beat = beat
        self._vouches = vouches
        self._period = period
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._epoch: int | None = None
        self._due = 0.0  # time.monotonic() of the next beat
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Beat], None]) -> None:
        """Start the thread (once; later calls do nothing)."""
        if self._thread is not None or self._stopped:
            return
        thread = threading.Thread(
            target=self._run, args=(loop, deliver), name="fleet-heartbeat", daemon=True
        )
        self._thread = thread
        thread.start()

    def follow(self, epoch: int | None) -> None:
        """Beat with ``epoch`` from now on (None: stop beating). A new epoch was just
        renewed by its join: its first beat is one period later."""
        with self._lock:
            if epoch != self._epoch and epoch is not None:
                self._due = time.monotonic() + self._period
            self._epoch = epoch
        self._changed.set()

    def wake(self) -> None:
        """Beat now (the member list changed, or Redis refused a write as stale)."""
        with self._lock:
            self._due = time.monotonic()
        self._changed.set()

    def stop(self) -> None:
        """No beat starts after this; the thread ends once a beat in flight is answered
        (bounded by its socket timeout). Its answer is dropped: the loop acts only on
        beats with the epoch it holds, and after ``leave`` Redis answers "gone" to it."""
        with self._lock:
            self._stopped = True
            self._epoch = None
        self._changed.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Beat], None]) -> None:
        while True:
            epoch = self._next_epoch()
            if epoch is None:
                return  # stopped
            beat = self._beat_once(epoch)
            try:
                loop.call_soon_threadsafe(deliver, beat)
            except RuntimeError:  # the loop is closed: the process is stopping
                return

    def _next_epoch(self) -> int | None:
        """Wait until a beat is due with an epoch to beat with; None once stopped."""
        while True:
            with self._lock:
                if self._stopped:
                    return None
                wait = self._due - time.monotonic()
                if self._epoch is not None and wait <= 0:
                    self._due = time.monotonic() + self._period
                    return self._epoch
                timeout = None if self._epoch is None else wait
                self._changed.clear()
            self._changed.wait(timeout)

    def _beat_once(self, epoch: int) -> Beat:
        vouched = self._vouches()
        try:
            membership = self._beat(epoch, vouched)
        except Exception as exc:  # handed to the loop, which counts it and may fall back
            return Beat(epoch, vouched, self._clock(), error=exc)
        return Beat(epoch, vouched, self._clock(), membership=membership)
