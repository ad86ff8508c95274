"""The confirming read (docs/design.md §3.5): a probe that timed out on an endpoint whose
/metrics is read is told only after one more read, taken now.

A timeout is judged against the admission the engine showed during the probe's wait. The
scheduled reads come every ``engine_metrics.interval``, and an engine publishes its
counters after its own steps: at the onset of a peak the reads before the timeout may
still show the idle engine, and two timeouts made a busy engine UNHEALTHY before any
read saw it admit. The read taken now covers the whole wait, so the board folds the
timeout with the evidence of that wait. Bounded: the result is told after the read, or
after CONFIRM_WITHIN_S if the read takes longer (an engine whose /metrics hangs too is
judged on what was known); no read at all while the side reads are at their cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.probe.signals import ProbeReceiver, Started, Starter
from llm_health.probe.target import ProbeTarget

CONFIRM_WITHIN_S = 0.5  # the longest a timeout waits for its confirming read
ReadNow = Callable[[ProbeTarget, Callable[[], None]], bool]


def confirming(
    start: Starter, read_now: ReadNow, reads_metrics: Callable[[ProbeTarget], bool]
) -> Starter:
    """``start`` with each timeout told after a /metrics read of its endpoint:
    ``read_now(target, then)`` starts one and calls ``then`` when it is over (False: it
    could not start one); ``reads_metrics(target)``: the endpoint's /metrics is read."""

    def start_confirmed(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        if not reads_metrics(target):
            return start(target, receiver)
        confirm = _Confirm(target, receiver, read_now)
        confirm.probe = start(target, confirm)
        return confirm

    return start_confirmed


class _Confirm:
    """One probe's receiver and handle: its result passed on, a timeout after its
    confirming read (or CONFIRM_WITHIN_S); cancelled, nothing is told."""

    __slots__ = ("_held", "_read_now", "_receiver", "_target", "_timer", "probe")

    def __init__(self, target: ProbeTarget, receiver: ProbeReceiver, read_now: ReadNow) -> None:
        self._target = target
        self._receiver = receiver
        self._read_now = read_now
        self._held: ProbeResult | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.probe: Started | None = None

    def set(self) -> None:
        self._receiver.set()

    def done(self, result: ProbeResult) -> None:
        if result.outcome is not Outcome.TIMEOUT:
            self._receiver.done(result)
            return
        self._held = result
        if not self._read_now(self._target, self._tell):
            self._tell()
        elif self._held is not None:  # the read is under way
            self._timer = asyncio.get_running_loop().call_later(CONFIRM_WITHIN_S, self._tell)

    def failed(self, error: Exception) -> None:
        self._receiver.failed(error)

    def _tell(self) -> None:
        held, self._held = self._held, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if held is not None:
            self._receiver.done(held)

    def cancel(self) -> None:
        self._held = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.probe is not None:
            self.probe.cancel()
