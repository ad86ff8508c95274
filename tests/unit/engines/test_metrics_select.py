"""The lines /metrics is read from (``engines.metrics._select``), found by ``str.find``:
an oracle against the line-by-line selection it replaced, on generated documents, and
the edges of a name found whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.engines import metrics
from llm_health.engines.detect import engine_of_names
from llm_health.engines.metrics import MetricsError, parse_load
from llm_health.model.engine_load import EngineLoad

READ = sorted({n for names in metrics._READ.values() for n in names})
OTHERS = [
    "process_cpu_seconds_total",
    "llm_health_sim_requests_total",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "nv_trt_llm_request_metrics",
]
LONGER = [f"{name}_extra" for name in READ[:6]] + [f"{name}:x" for name in READ[6:10]]
LABELS = [
    "",
    '{model_name="m"}',
    '{engine="1"}',
    '{le="0.1"}',
    '{le="+Inf",engine="0"}',
    '{finished_reason="abort"}',
    '{a="x\\"y"}',
]
VALUES = ["0", "1.5", "3", "NaN", "+Inf", "7e2"]


def old_select(text: str, *, ttft: bool = True) -> tuple[str | None, list[str]]:
    """The selection before: every line looked at in Python (kept here as the oracle)."""
    wanted = tuple(
        sorted(
            {
                n
                for (_, with_ttft), names in metrics._READ.items()
                if with_ttft == ttft
                for n in names
            }
        )
    )
    engine: str | None = None
    lines = []
    for line in text.splitlines():
        name = line[7:] if line.startswith(("# TYPE ", "# HELP ")) else line
        if engine is None:
            engine = engine_of_names((name,))
        if name.startswith(wanted):
            lines.append(line)
    return engine, lines


def sample_line(name: str, labels: str, value: str) -> str:
    return f"{name}{labels} {value}"


lines = st.one_of(
    st.builds(
        sample_line,
        st.sampled_from(READ + OTHERS + LONGER),
        st.sampled_from(LABELS),
        st.sampled_from(VALUES),
    ),
    st.builds(
        lambda n, kind: f"# {kind} {n} gauge",
        st.sampled_from(READ + OTHERS),
        st.sampled_from(["TYPE", "HELP"]),
    ),
    st.just(""),
)


def load_or_error(text: str, ttft: bool) -> EngineLoad | str:
    try:
        return parse_load(text, ttft=ttft)
    except MetricsError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=40), st.booleans(), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_the_same_load_as_the_line_by_line_selection(
    body: list[str], ttft: bool, newline: str, trailing: bool
) -> None:
    text = newline.join(body) + (newline if trailing else "")
    found = load_or_error(text, ttft)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics, "_select", old_select)
        expected = load_or_error(text, ttft)
    assert found == expected


@pytest.mark.parametrize(
    ("document", "waiting"),
    [
        ("vllm:num_requests_waiting 4", 4.0),  # first line, no line break at all
        ('vllm:num_requests_waiting 4\nvllm:num_requests_waiting{r="1"} 2\n', 6.0),
        ("# TYPE x gauge\nvllm:num_requests_waiting\t5\n", 5.0),  # a tab after the name
        ("vllm:num_requests_waiting_total 9\nvllm:num_requests_running 1\n", None),  # longer
        ("x 1\n  vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n", None),  # indented
    ],
)
def test_a_series_is_found_by_its_whole_name_at_a_line_start(
    document: str, waiting: float | None
) -> None:
    assert parse_load(document).waiting == waiting


def test_a_broken_line_of_a_series_read_is_still_an_error() -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_load("vllm:num_requests_running 1\nvllm:num_requests_waiting\n")
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_load("vllm:num_requests_running 1\nvllm:num_requests_waiting")


def test_only_the_series_of_the_engine_found_are_read() -> None:
    # The engine is the first one named; another engine's series are not its load.
    document = "sglang:num_queue_reqs 3\nvllm:num_requests_waiting 8\n"
    assert parse_load(document) == EngineLoad("sglang", 3.0)
