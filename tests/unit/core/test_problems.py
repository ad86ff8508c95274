"""The shared rate-limited problem log (core/problems.py): one line per key per quiet
time, the count of lines left out, and a bounded key table."""

from __future__ import annotations

import logging

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
