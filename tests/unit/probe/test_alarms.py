"""Many timers on one loop timer (probe.alarms): order, cancellation, the loop timer moved
only for an earlier alarm, one alarm's failure reported without losing the others."""

from __future__ import annotations

import asyncio
import random
import time

from llm_health.probe.alarms import Alarms


def run(main: object) -> None:
    asyncio.run(main)  # type: ignore[arg-type]


def test_alarms_fire_in_time_order_never_early_and_cancelled_ones_never() -> None:
    """Random times, some cancelled: each live one fires once, in order of its time
    (ties in the order set), not before its time; a cancelled one never fires."""
    fired: list[tuple[float, int]] = []
    rng = random.Random(7)

    async def main() -> None:
        alarms = Alarms()
        start = time.monotonic()
        plans = [(start + rng.choice([0.01, 0.02, 0.03, 0.05, 0.08]), i) for i in range(60)]
        handles = {}
        for when, i in plans:

            def note(at: float, i: int = i) -> None:
                assert time.monotonic() >= at - 0.002  # the loop's millisecond, no more
                fired.append((at, i))

            handles[i] = alarms.at(when, note, when)
        cancelled = set(rng.sample(range(60), 20))
        for i in cancelled:
            handles[i].cancel()
        await asyncio.sleep(0.15)
        expected = sorted((when, i) for when, i in plans if i not in cancelled)
        assert fired == expected
        assert len(alarms) == 0  # all fired or dropped

    run(main())


def test_one_loop_timer_for_many_alarms_moved_only_for_an_earlier_one() -> None:
    """The loop's timer is set for the earliest alarm only: alarms after it add no loop
    timer; an earlier one moves it."""

    class CountingLoop(asyncio.SelectorEventLoop):
        timers = 0

        def call_at(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            CountingLoop.timers += 1
            return super().call_at(*args, **kwargs)

    async def main() -> None:
        alarms = Alarms()
        now = time.monotonic()
        for i in range(100):  # later and later: one loop timer in all
            alarms.at(now + 0.05 + i * 0.001, lambda _: None)
        assert CountingLoop.timers == 1
        alarms.at(now + 0.01, lambda _: None)  # earlier: moved once
        assert CountingLoop.timers == 2
        await asyncio.sleep(0.2)

    loop = CountingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_alarms_within_a_millisecond_fire_together_in_the_order_set_never_early() -> None:
    """A start tick's probes set their alarms microseconds apart: they share one heap
    entry and one loop timer, fire on one wake-up (one pass of the loop), in the order
    set, none before its time (the latest of them decides when)."""

    class CountingLoop(asyncio.SelectorEventLoop):
        timers = 0
        passes = 0

        def call_at(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            CountingLoop.timers += 1
            return super().call_at(*args, **kwargs)

        def _run_once(self) -> None:
            CountingLoop.passes += 1
            super()._run_once()  # type: ignore[misc]

    fired: list[tuple[int, float, float, int]] = []

    async def main() -> None:
        alarms = Alarms()
        base = round(time.monotonic() * 1000) / 1000 + 0.05  # a millisecond's middle
        whens = [base - 0.0004 + i * 0.00001 for i in range(50)]  # 10 µs apart
        for i, when in reversed(list(enumerate(whens))):  # set latest first

            def note(at: float, i: int = i) -> None:
                fired.append((i, at, time.monotonic(), CountingLoop.passes))

            alarms.at(when, note, when)
        assert CountingLoop.timers == 1
        await asyncio.sleep(0.1)
        assert len(alarms) == 0

    loop = CountingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert [i for i, _, _, _ in fired] == list(reversed(range(50)))  # the order set
    assert all(now >= at - 0.002 for _, at, now, _ in fired)  # the loop's millisecond, no more
    assert len({passes for _, _, _, passes in fired}) == 1  # one wake-up


def test_alarms_of_a_closed_loop_are_dropped_on_the_next() -> None:
    """The same Alarms used by a second loop (tests, ``asyncio.run`` twice): the first
    loop's pending alarms belong to tasks that are gone; the second loop's fire."""
    alarms = Alarms()
    fired: list[str] = []

    async def first() -> None:
        alarms.at(time.monotonic() + 5, lambda _: fired.append("first"))

    async def second() -> None:
        alarms.at(time.monotonic() + 0.01, lambda _: fired.append("second"))
        await asyncio.sleep(0.05)

    run(first())
    run(second())
    assert fired == ["second"]


def test_an_alarm_that_fails_is_reported_and_the_others_of_its_turn_still_fire() -> None:
    """Every probe's alarms share one loop timer: a callback's bug (an exception) goes to
    the loop's exception handler, as a failed callback does, and the alarms due with it
    still fire."""
    alarms = Alarms()
    fired: list[int] = []
    reported: list[BaseException] = []

    def fail(_: object) -> None:
        raise RuntimeError("a bug")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
        when = time.monotonic() + 0.01
        alarms.at(when, fired.append, 1)
        alarms.at(when, fail)
        alarms.at(when, fired.append, 2)
        await asyncio.sleep(0.05)

    run(main())
    assert fired == [1, 2]
    assert [type(e) for e in reported] == [RuntimeError]
