"""Many timers on one of the loop's (docs/design.md §16.10, "Timers").

Every probe needs three timers: the wait for its slot, its silence point and its
timeout. Each loop timer is an object of the event loop's (uvloop: a libuv timer and two
Python objects), made and cancelled for every probe, and almost none of them fires: the
first token comes before the silence point, the answer before the timeout. ``Alarms`` keeps its timers in a heap and holds one
loop timer, for the earliest; a cancelled alarm is only marked (it leaves the heap when
it comes to the top), and the loop timer is moved only when an earlier alarm is added.
Probes started on one tick share their wake-up.

The heap holds one entry per millisecond that has alarms (a *bucket*: the loop's timer
resolution under uvloop), not one per alarm: the probes a start tick gathers set their
slot, silence and timeout alarms within a millisecond of each other, so one entry pushed
and popped serves them all, where an entry per alarm would be pushed and popped for
each, mostly cancelled (docs/benchmarks.md). A bucket fires once its latest alarm is
due, so an alarm is never early and at most a millisecond late; alarms fire in time
order to the millisecond, and within one in the order they were set.

A callback that raises is reported to the loop's exception handler (as a failed
callback is) and the alarms due with it still fire.

Clock: the one given (``time.monotonic`` by default). An alarm fires when the loop fires
the timer set for it, as ``asyncio.sleep`` wakes (uvloop keeps its timers to the
millisecond). Task safety: one loop.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from typing import Any


class Alarm:
    """One pending alarm: ``cancel`` it, or it calls ``callback(arg)`` once at its time."""

    __slots__ = ("arg", "callback")

    def __init__(self, callback: Callable[[Any], object], arg: Any) -> None:
        self.callback: Callable[[Any], object] | None = callback
        self.arg = arg

    def cancel(self) -> None:
        self.callback = None
        self.arg = None


class _Bucket:
    """The alarms of one millisecond, in the order set; due once ``latest`` is. No link
    back from an alarm: a cancel only marks it (no reference cycle to collect)."""

    __slots__ = ("alarms", "latest")

    def __init__(self, when: float) -> None:
        self.alarms: list[Alarm] = []
        self.latest = when

    def live(self) -> bool:
        for alarm in self.alarms:  # noqa: SIM110 - a loop: no generator made each time
            if alarm.callback is not None:
                return True
        return False


_FAR_S = 1e15  # beyond this, times share one bucket (``round`` cannot take infinity)
_FAR_BUCKET = 2**62


class Alarms:
    """Alarms at times of ``clock``, on one loop timer (see the module's docstring).
    Bound to the running loop of its first use; a closed loop's alarms are dropped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: list[int] = []  # a heap of the buckets' milliseconds
        self._buckets: dict[int, _Bucket] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._armed = math.inf  # when the loop timer fires

    def __len__(self) -> int:
        """Alarms held, cancelled ones not yet dropped included."""
        return sum(len(bucket.alarms) for bucket in self._buckets.values())

    def at(self, when: float, callback: Callable[[Any], object], arg: Any = None) -> Alarm:
        """``callback(arg)`` at ``when`` (at once, on the loop's next turn, if past)."""
        self.loop()  # bound to the running loop
        alarm = Alarm(callback, arg)
        # The bucket: the millisecond nearest ``when`` (not the one it falls in: times a
        # whole number of milliseconds apart, give or take a rounding error, keep buckets
        # of their own); far-off and infinite times share the last.
        key = round(when * 1000) if -_FAR_S < when < _FAR_S else _FAR_BUCKET
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(when)
            heapq.heappush(self._keys, key)
        elif when > bucket.latest:
            bucket.latest = when
        bucket.alarms.append(alarm)
        if bucket.latest < self._armed:
            self._arm(bucket.latest)
        return alarm

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the alarms run on (the running one, at first use). Kept: asking
        asyncio for it costs a system call (``getpid``) every time."""
        if self._loop is None or self._loop.is_closed():
            self._bind()
        assert self._loop is not None
        return self._loop

    def _bind(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._keys.clear()  # a closed loop's alarms: their tasks are gone
        self._buckets.clear()
        self._handle = None
        self._armed = math.inf

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._armed = when
        self._handle = self._loop.call_later(max(0.0, when - self._clock()), self._fire)

    def _fire(self) -> None:
        """Call every alarm of the buckets now due, drop the buckets at the top whose
        alarms were all cancelled, and set the loop timer for the next live one."""
        # What the loop timer was set for is due, even if the loop fired it a little
        # early by our clock (uvloop keeps timers to the millisecond): asyncio.sleep's
        # rule. Anything else waits for its own time.
        due = max(self._armed, self._clock())
        self._handle, self._armed = None, math.inf
        keys, buckets = self._keys, self._buckets
        while keys:
            bucket = buckets[keys[0]]
            if bucket.latest > due and bucket.live():
                break
            del buckets[heapq.heappop(keys)]  # out first: a callback may set new alarms
            for alarm in bucket.alarms:
                callback, arg = alarm.callback, alarm.arg
                if callback is not None:
                    alarm.cancel()
                    try:
                        callback(arg)
                    except Exception as exc:  # one alarm's bug must not lose the others'
                        self._report(exc, callback)
        if keys:
            self._arm(buckets[keys[0]].latest)

    def _report(self, exc: Exception, callback: Callable[[Any], object]) -> None:
        """As the loop reports a failed callback (its exception handler logs it)."""
        assert self._loop is not None
        context = {"message": f"alarm {callback!r} failed", "exception": exc}
        self._loop.call_exception_handler(context)
