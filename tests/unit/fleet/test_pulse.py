"""The heartbeat's thread (``fleet.pulse``): it beats with the epoch it follows, every
period or at once when woken, hands every answer (or failure) to the loop, and stops."""

from __future__ import annotations

import asyncio
import time

from llm_health.fleet.pulse import Beat, Pulse
from llm_health.fleet.wire import Member, Membership
from tests.polling import wait_until_async

PERIOD_S = 0.05


class Beats:
    """The blocking heartbeat the pulse calls (Redis's place), and what reached the loop."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[int, bool, float]] = []
        self.came: list[Beat] = []
        self.fail = fail

    def beat(self, epoch: int, vouch: bool) -> Membership:
        self.sent.append((epoch, vouch, time.monotonic()))
        if self.fail:
            raise ConnectionError("refused")
        return Membership(0, {"me": Member(epoch, 0)})


def started(beats: Beats, vouch: bool = True) -> Pulse:
    pulse = Pulse(beats.beat, lambda: vouch, PERIOD_S, time.monotonic)
    pulse.start(asyncio.get_running_loop(), beats.came.append)
    return pulse


async def test_it_beats_each_period_with_the_epoch_it_follows_and_not_without_one() -> None:
    beats = Beats()
    pulse = started(beats)
    try:
        await asyncio.sleep(3 * PERIOD_S)
        assert beats.sent == []  # no epoch yet
        followed = time.monotonic()
        pulse.follow(7)
        await wait_until_async(lambda: len(beats.came) >= 3, 5, "three beats")
        assert beats.sent[0][2] - followed >= PERIOD_S * 0.9  # the join just renewed it
        assert {(e, v) for e, v, _ in beats.sent} == {(7, True)}
        assert all(b.epoch == 7 and b.membership is not None for b in beats.came)
        pulse.follow(None)
        await asyncio.sleep(PERIOD_S)  # a beat in flight may still land
        count = len(beats.sent)
        await asyncio.sleep(4 * PERIOD_S)
        assert len(beats.sent) == count
    finally:
        pulse.stop()
    await wait_until_async(lambda: not pulse.alive, 5, "the thread ended")


async def test_a_wake_beats_at_once_and_a_failure_reaches_the_loop() -> None:
    beats = Beats(fail=True)
    pulse = Pulse(beats.beat, lambda: False, 10.0, time.monotonic)  # a long period
    pulse.start(asyncio.get_running_loop(), beats.came.append)
    try:
        pulse.follow(3)
        await asyncio.sleep(0.1)
        assert beats.sent == []
        pulse.wake()
        await wait_until_async(lambda: len(beats.came) == 1, 5, "the woken beat")
        (beat,) = beats.came
        assert beat.epoch == 3 and not beat.vouched and beat.membership is None
        assert isinstance(beat.error, ConnectionError)
    finally:
        pulse.stop()
    await wait_until_async(lambda: not pulse.alive, 5, "the thread ended")


async def test_it_beats_while_the_loop_is_blocked() -> None:
    beats = Beats()
    pulse = started(beats)
    try:
        pulse.follow(1)
        time.sleep(10 * PERIOD_S)  # noqa: ASYNC251 - the loop cannot run; the thread beats
        assert len(beats.sent) >= 5
        assert beats.came == []  # answers wait for the loop
        await wait_until_async(lambda: len(beats.came) >= 5, 5, "answers handed over")
    finally:
        pulse.stop()
    await wait_until_async(lambda: not pulse.alive, 5, "the thread ended")
