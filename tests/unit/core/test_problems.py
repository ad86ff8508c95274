"""The shared rate-limited problem log (core/problems.py): one line per key per quiet
time, the count of lines left out, and a bounded key table."""

from __future__ import annotations

import logging
import math
import threading

import pytest

from llm_health.core.problems import ProblemLog, peer_host


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "test.problems"]


def test_first_line_at_once_then_one_per_quiet_time_with_the_count_left_out(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert problems.report("peer-a", "refused", {"peer": "a"})
        for _ in range(5):
            clock.now += 1.0
            assert not problems.report("peer-a", "refused", {"peer": "a"})
        clock.now = 10.0
        assert problems.report("peer-a", "refused", {"peer": "a"})
    records = lines(caplog)
    assert [r.getMessage() for r in records] == ["refused", "refused"]
    assert [r.suppressed for r in records] == [0, 5]  # type: ignore[attr-defined]
    assert problems.unlogged_total == 5


def test_keys_are_limited_apart(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert problems.report("a", "x")
        assert problems.report("b", "x")
        assert not problems.report("a", "x")
    assert len(lines(caplog)) == 2


def test_a_peer_inventing_keys_cannot_grow_the_table_or_the_log(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0, max_keys=3, clock=clock)
    with caplog.at_level(logging.WARNING):
        written = sum(problems.report(f"key-{n}", "x") for n in range(1_000))
    assert written == 3
    assert len(lines(caplog)) == 3
    assert problems.unlogged_total == 997
    clock.now = 10.0  # the old keys' quiet time is over: room for new ones again
    assert problems.report("key-new", "x")


def test_peer_host_drops_the_port_only_for_ip_peers() -> None:
    assert peer_host("ipv4:10.0.0.5:51234") == "ipv4:10.0.0.5"
    assert peer_host("ipv6:[::1]:5000") == "ipv6:[::1]"
    assert peer_host("unix:/run/x.sock") == "unix:/run/x.sock"


def test_a_caller_names_the_count_field_and_passes_message_args(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    problems = ProblemLog(
        logging.getLogger("test.problems"), every_s=10.0, count_field="left_out", clock=clock
    )
    with caplog.at_level(logging.WARNING):
        problems.report("k", "from %s: %d%%", {"peer": "a"}, args=("a", 5))
        problems.report("k", "from %s: %d%%", args=("a", 6))
        clock.now = 10.0
        problems.report("k", "from %s: %d%%", args=("a", 7))
    records = lines(caplog)
    assert [r.msg for r in records] == ["from %s: %d%%"] * 2  # the template, as logged
    assert [r.getMessage() for r in records] == ["from a: 5%", "from a: 7%"]
    assert [r.left_out for r in records] == [0, 1]  # type: ignore[attr-defined]
    assert not hasattr(records[0], "suppressed")


def test_claim_decides_without_counting(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert problems.claim("k")
        assert not any(problems.claim("k") for _ in range(100))
        clock.now = 10.0
        assert problems.claim("k")
    assert lines(caplog) == []  # the caller writes its own line
    assert problems.unlogged_total == 0


def test_an_endless_quiet_time_logs_each_key_once(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    problems = ProblemLog(
        logging.getLogger("test.problems"), every_s=math.inf, max_keys=2, clock=clock
    )
    with caplog.at_level(logging.WARNING):
        for step in range(3):
            clock.now = step * 1e9
            for key in ("a", "b", "c"):
                problems.report(key, key)
    assert [r.getMessage() for r in lines(caplog)] == ["a", "b"]  # c: the table is full


def test_only_keys_whose_quiet_time_is_over_make_room(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0, max_keys=2, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert problems.report("a", "x")  # t=0
        clock.now = 5.0
        assert problems.report("b", "x")  # t=5
        clock.now = 10.0
        assert problems.report("a", "x")  # a again at t=10: now the newest
        assert not problems.report("c", "x")  # b (t=5) still quiet: no room
        clock.now = 15.0
        assert problems.report("c", "x")  # b's quiet time is over: its place is free
        assert not problems.report("a", "x")  # a logged at 10: still quiet


def test_threads_reporting_at_once_stay_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """The threaded ext_authz server refuses tokens on several threads at once."""
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=60.0, max_keys=50)
    written: list[bool] = []

    def flood(worker: int) -> None:
        written.extend(problems.report(f"host-{(worker * 7 + n) % 200}", "x") for n in range(2_000))

    with caplog.at_level(logging.WARNING):
        threads = [threading.Thread(target=flood, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sum(written) == len(lines(caplog)) == 50
    assert problems.unlogged_total == 8_000 - 50
