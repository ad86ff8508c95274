"""``make demo``'s table: every reason is shown whole, wrapped to the terminal's width
(continuation lines aligned under the reason column), never cut mid-word."""

from __future__ import annotations

from llm_health.demo import HEADER, MIN_LAST_COLUMN, table

REASON = "2 consecutive timeouts (>800 ms) since the plugin started probing this backend"
ROW = ["fast", "cuda", "UNHEALTHY", "0", "UNHEALTHY w=1", "-", "timeout", "  0.0 %", REASON]
OTHER = ["slow", "none", "DEGRADED", "40", "HEALTHY w=40", "912 ms", "slow", " 20.0 %", "slow"]


def reason_column(lines: list[str]) -> int:
    return lines[0].index("reason")


def test_without_a_terminal_every_row_is_one_line_with_the_whole_reason() -> None:
    lines = table([HEADER, ROW, OTHER], None)
    assert len(lines) == 3
    assert lines[1].endswith(REASON)
    assert lines[1].index(REASON) == reason_column(lines)


def test_a_long_reason_wraps_under_its_column_within_the_width() -> None:
    lines = table([HEADER, ROW, OTHER], 110)
    column = reason_column(lines)
    assert all(len(line) <= 110 for line in lines)
    assert len(lines) > 3  # the long reason took continuation lines
    continuation = lines[2 : len(lines) - 1]
    assert all(line[:column].strip() == "" for line in continuation)
    pieces = [lines[1][column:], *(line[column:] for line in continuation)]
    assert " ".join(pieces) == REASON  # whole words, nothing lost
    assert lines[-1].startswith("slow") and lines[-1].endswith("slow")


def test_a_narrow_terminal_keeps_a_readable_reason_column() -> None:
    lines = table([HEADER, ROW], 20)
    column = reason_column(lines)
    pieces = [line[column:] for line in lines[1:]]
    assert " ".join(pieces) == REASON
    assert all(len(piece) <= MIN_LAST_COLUMN for piece in pieces)


def test_the_columns_stay_aligned() -> None:
    lines = table([HEADER, ROW, OTHER], None)
    for name in ("state", "weight", "TTFT", "traffic"):
        at = lines[0].index(name)
        assert lines[1][at - 1] == " " and lines[2][at - 1] == " "
        assert lines[1][at] != " " or name == "traffic"
