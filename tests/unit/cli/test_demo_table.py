"""``make demo``'s table: every reason is shown whole, never cut mid-word. One that does not
fit the rest of its row (the terminal's width) goes onto the lines below the row, wrapped
at spaces; without a terminal every row is one line."""

from __future__ import annotations

from llm_health.demo.show import HEADER, REASON_INDENT, table

REASON = "2 consecutive timeouts (>800 ms) since the plugin started probing this backend"
LONG = (
    "fatal engine error: HTTP 500: EngineCore encountered an issue. "
    "vllm.v1.engine.exceptions.EngineDeadError: RuntimeError: CUDA error: an illegal memory "
    "access was encountered"
)
ROW = ["zombie", "hang", "UNHEALTHY", "0", "UNHEALTHY w=1", "-", "timeout", "  0.0 %", REASON]
SHORT = ["slow", "none", "DEGRADED", "40", "HEALTHY w=40", "912 ms", "slow", " 20.0 %", "slow"]
FATAL = ["fast", "cuda", "UNHEALTHY", "0", "UNHEALTHY w=1", "-", "fatal", "  0.0 %", LONG]


def below(lines: list[str], row: int) -> list[str]:
    """The reason lines under ``lines[row]``."""
    found = []
    for line in lines[row + 1 :]:
        if not line.startswith(REASON_INDENT):
            break
        found.append(line.removeprefix(REASON_INDENT))
    return found


def test_without_a_terminal_every_row_is_one_line_with_the_whole_reason() -> None:
    lines = table([HEADER, ROW, SHORT, FATAL], None)
    assert len(lines) == 4
    column = lines[0].index("reason")
    for line, reason in zip(lines[1:], (REASON, "slow", LONG), strict=True):
        assert line[column:] == reason


def test_a_reason_that_fits_stays_in_its_column() -> None:
    lines = table([HEADER, ROW, SHORT], 200)
    assert len(lines) == 3
    assert lines[1].endswith(REASON) and lines[2].endswith("slow")
    assert lines[1].index(REASON) == lines[0].index("reason")


def test_a_long_reason_goes_whole_below_its_row_within_the_width() -> None:
    lines = table([HEADER, ROW, SHORT, FATAL], 100)
    assert all(len(line) <= 100 for line in lines)
    assert lines[1].startswith("zombie") and lines[1].rstrip().endswith("0.0 %")
    assert " ".join(below(lines, 1)) == REASON  # whole words, nothing lost
    short = next(i for i, line in enumerate(lines) if line.startswith("slow"))
    assert lines[short].endswith("slow") and below(lines, short) == []
    fatal = next(i for i, line in enumerate(lines) if line.startswith("fast"))
    assert len(below(lines, fatal)) > 1
    assert " ".join(below(lines, fatal)) == LONG


def test_a_word_longer_than_the_line_is_not_broken() -> None:
    lines = table([HEADER, FATAL], 20)
    fatal = next(i for i, line in enumerate(lines) if line.startswith("fast"))
    words = " ".join(below(lines, fatal)).split()
    assert "vllm.v1.engine.exceptions.EngineDeadError:" in words


def test_the_columns_stay_aligned() -> None:
    lines = table([HEADER, ROW, SHORT], None)
    for name in ("state", "weight", "TTFT", "last probe"):
        at = lines[0].index(name)
        assert lines[1][at - 1] == " " and lines[2][at - 1] == " "
        assert lines[1][at] != " " and lines[2][at] != " "
