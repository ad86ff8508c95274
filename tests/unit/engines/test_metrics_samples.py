"""Sample lines of /metrics read in one match where they are plain
(``engines.metrics._PLAIN``): an oracle against the general reading (``_sample``, the
one every line went through before) on generated lines, broken ones included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.engines import metrics

NAMES = ["vllm:num_requests_waiting", "x_bucket", "a", "_:b", "9bad", ""]
LABELS = [
    "",
    "{}",
    '{le="0.1"}',
    '{le="+Inf",model_name="m"}',
    '{le="0.1",}',
    '{a="x\\"y"}',
    '{a="x\\\\"}',
    '{ a="1"}',
    '{a = "1"}',
    '{a="1" ,b="2"}',
    '{a="1"b="2"}',
    "{,}",
    '{a="1",,b="2"}',
    '{a="}"}',
    '{a="é"}',
    '{a="1"',
    "{a=1}",
    "{ }",
]
BLANKS = [" ", "\t", "  ", "", " \t"]
VALUES = ["1", "0.0", "NaN", "+Inf", "-inf", "7e2", "1_000", "abc", "1 2", "1\r", "１", "", "1 "]


def reading(line: str) -> tuple[str, dict[str, str], str] | str:
    """What ``_samples`` makes of one line: the sample (its value as text, so NaN compares),
    an error, or nothing (skipped)."""
    try:
        found = list(metrics._samples([line]))
    except ValueError as exc:
        return f"error: {exc}"
    if not found:
        return "skipped"
    name, labels, value = found[0]
    return name, labels, repr(value)


def general(line: str) -> tuple[str, dict[str, str], str] | str:
    if not line or line.startswith("#"):
        return "skipped"
    try:
        name, labels, value = metrics._sample(line)
    except ValueError as exc:
        return f"error: {exc}"
    return name, labels, repr(value)


lines = st.one_of(
    st.builds(
        lambda n, lb, b, v: f"{n}{lb}{b}{v}",
        st.sampled_from(NAMES),
        st.sampled_from(LABELS),
        st.sampled_from(BLANKS),
        st.sampled_from(VALUES),
    ),
    st.text(alphabet='ab_:{}=",.1 \t\\\r#+', max_size=30),
)


@settings(max_examples=1000, deadline=None)
@given(lines)
def test_a_line_reads_as_the_general_reading_reads_it(line: str) -> None:
    expected = general(line)
    found = reading(line)
    if isinstance(expected, str) and expected.startswith("error"):
        assert isinstance(found, str) and found.startswith("error"), (line, found)
    else:
        assert found == expected, line


@pytest.mark.parametrize(
    "line",
    [
        'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="sim-model"} 0.0',
        'vllm:num_requests_waiting{model_name="m"} 3',
        "process_start_time_seconds 1.7e9",
    ],
)
def test_the_lines_engines_write_take_the_single_match(line: str) -> None:
    assert metrics._PLAIN.fullmatch(line) is not None
    assert reading(line) == general(line)
