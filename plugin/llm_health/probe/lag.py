"""Event-loop lag monitor: how late the prober's own loop runs (docs/design.md §7).

A ticker sleeps ``tick_s`` and records how much later than asked it woke up. When the loop
is starved (CPU, GC, a blocking call), every TTFT measured at that time includes the lag:
such probes must not degrade endpoints. Samples are kept for ``window_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class LoopLagMonitor:
    def __init__(self, tick_s: float = 0.02, window_s: float = 30.0) -> None:
        self._tick_s = tick_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=int(window_s / tick_s) + 1)
        self.current_ms = 0.0
        self._last_tick = time.perf_counter()
        self._running = False
        self._handle: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        """Tick until cancelled. Run it in the app's TaskGroup. Each tick is a loop timer
        and its callback, not a task's sleep, whose future and task step would cost the
        prober's loop more at every tick."""
        loop = asyncio.get_running_loop()
        self._running = True
        self._last_tick = time.perf_counter()
        self._handle = loop.call_later(self._tick_s, self._tick, loop, loop.time())
        try:
            await asyncio.Future()  # ticks until cancelled
        finally:
            self._running = False
            if self._handle is not None:
                self._handle.cancel()

    def _tick(self, loop: asyncio.AbstractEventLoop, asked: float) -> None:
        """How much later than asked the timer fired; the next tick set."""
        woke = loop.time()
        self.record(time.perf_counter(), max(0.0, (woke - asked - self._tick_s) * 1000))
        self._handle = loop.call_later(self._tick_s, self._tick, loop, woke)

    def record(self, at: float, lag_ms: float) -> None:
        """A tick that woke at ``at`` (a perf_counter time) ``lag_ms`` late: what each tick
        records, and how a test replays a history of stalls."""
        self.current_ms = lag_ms
        self._last_tick = at
        self._samples.append((at, lag_ms))

    def max_since(self, start: float) -> float:
        """Worst lag (ms) since ``start`` (a perf_counter time), including right now.

        "Right now" matters: a stall that just delayed the probe's own wake-up has not been
        sampled yet, but shows as the ticker being overdue.
        """
        return self.over(start, None)[0]

    def over(self, start: float, end: float | None) -> tuple[float, float]:
        """``max_since(start)`` and ``stalled_within(start, end)`` (0 when ``end`` is
        None) in one pass over the samples: what a probe's result reads (the two readings
        are this one)."""
        now = time.perf_counter()
        worst = stalled = 0.0
        if self._running:
            due = self._last_tick + self._tick_s
            worst = max(0.0, (now - due) * 1000)
            if end is not None:
                stalled = max(0.0, min(end, now) - max(due, start))
        for at, lag in reversed(self._samples):
            if at < start:
                break
            if lag > worst:
                worst = lag
            if end is not None:
                part = min(at, end) - max(at - lag / 1000, start)
                if part > stalled:
                    stalled = part
        return worst, stalled * 1000

    def stalled_within(self, start: float, end: float) -> float:
        """The longest stretch (ms) of ``[start, end]`` (perf_counter times) the loop spent
        stalled. A sample of lag L taken at t says the loop was stalled over [t - L, t];
        the tick overdue right now, over [its due time, now]. Only the part inside the
        window counts: a stall after ``end`` (a probe's first token, timed when its bytes
        arrived) cannot have delayed what was timed at ``end``."""
        return self.over(start, end)[1]
