"""The bounds of one /metrics read (``engines.metrics``; docs/engines.md, "Bounds of a
/metrics read"): a hostile document costs the prober's loop a bounded amount, whatever
its size, and a document past a bound is refused whole (MetricsOverrun), never read in
part. The costs are told by the Python lines ``engines.metrics`` runs (a count, not a
timing); a real engine's document, the largest vLLM writes, reads within every bound."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.engines import metrics
from llm_health.engines.metrics import (
    MAX_ASIDE,
    MAX_DOCUMENT,
    MAX_LABELS,
    MAX_LINE,
    MAX_LINES,
    MetricsError,
    MetricsOverrun,
    parse_load,
)

WAITING = "vllm:num_requests_waiting"
NO_ENGINE = "no metric of a known engine (vLLM, SGLang, TGI, llama.cpp)"
ASIDE = f"found over {MAX_ASIDE} times not beginning a name"


def steps(document: str) -> tuple[int, str]:
    """The lines of Python ``engines.metrics`` runs to read ``document``, and the outcome
    (the error's text, or the waiting figure)."""
    count = 0
    here = metrics.__file__

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return local if frame.f_code.co_filename == here else None

    sys.settrace(calls)
    try:
        outcome = f"waiting {parse_load(document).waiting}"
    except MetricsError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    finally:
        sys.settrace(None)
    return count, outcome


@pytest.mark.parametrize(
    ("line", "outcome"),
    [
        ("", f"MetricsError: {NO_ENGINE}"),  # blank lines
        ("a 1", f"MetricsError: {NO_ENGINE}"),
        ('x{a="vllm:"} 1', f"MetricsOverrun: vllm: {ASIDE}"),
        ("# HELP x about sglang: names", f"MetricsOverrun: sglang: {ASIDE}"),
    ],
)
def test_lines_that_are_no_series_read_cost_nothing_each(line: str, outcome: str) -> None:
    """The engine's names are searched for, not walked to: a hundred times the lines,
    the same steps."""
    few = steps(f"{line}\n" * 1_000)
    many = steps(f"{line}\n" * 100_000)
    assert few == many
    assert many[1] == outcome


def test_the_engine_is_the_first_lines_though_another_is_found_aside_first() -> None:
    aside = 'x{a="sglang:"} 1\n' * MAX_ASIDE
    document = f"{aside}# TYPE {WAITING} gauge\n{WAITING} 2\nsglang:num_queue_reqs 9\n"
    assert parse_load(document).engine == "vllm"
    assert parse_load(document).waiting == 2.0


def test_more_samples_of_the_series_read_than_any_engine_writes_are_refused() -> None:
    at_bound = f"{WAITING} 1\n" * MAX_LINES
    assert parse_load(at_bound).waiting == MAX_LINES
    with pytest.raises(MetricsOverrun, match=f"over {MAX_LINES} lines of the series read"):
        parse_load(at_bound + f"{WAITING} 1\n")


def test_a_million_duplicate_series_are_refused_at_the_bound() -> None:
    document = (f'{WAITING}{{engine="0"}} 1\n' * 1_000_000)[:MAX_DOCUMENT]
    with pytest.raises(MetricsOverrun, match=f"over {MAX_LINES} lines of the series read"):
        parse_load(document)


def test_lines_of_longer_names_count_as_examined() -> None:
    longer = f'{WAITING}_by_reason{{reason="capacity"}} 1\n' * MAX_LINES
    with pytest.raises(MetricsOverrun, match="lines of the series read"):
        parse_load(f"{WAITING} 3\n{longer}")


@pytest.mark.parametrize("size", [MAX_LINE + 1, MAX_DOCUMENT // 2])
def test_a_line_of_the_series_read_past_its_bound_is_refused(size: int) -> None:
    """One label of backslash escapes, as long as the document allows: refused at the
    line's length, its escapes never read."""
    head = f'{WAITING}{{model_name="'
    line = head + "\\\\" * ((size - len(head)) // 2 + 1) + '"} 1'
    assert len(line) > MAX_LINE
    count, outcome = steps(f"# TYPE {WAITING} gauge\n{line}\n")
    assert outcome == f"MetricsOverrun: a line of {WAITING} over {MAX_LINE} characters"
    assert count < 100


def test_a_long_line_of_another_series_is_not_examined() -> None:
    document = f'x{{a="{"y" * (MAX_DOCUMENT // 2)}"}} 1\n{WAITING} 4\n'
    assert parse_load(document).waiting == 4.0


@pytest.mark.parametrize(
    "unit",
    [
        '\\\\",a="',  # labels: a="\\",a="\\",...
        '\\\\\\"\\n',  # one label of escapes
        'a="",',  # plain labels
        ' a = "" ,',  # labels the general reading reads
    ],
)
def test_more_labels_and_escapes_than_the_bound_are_refused(unit: str) -> None:
    """Lines within their bound, each with as many labels or escapes as it holds."""
    head, tail = f'{WAITING}{{a="",', "} 1"
    if unit.startswith("\\"):
        head, tail = f'{WAITING}{{a="', '"} 1'
    line = head + unit * ((MAX_LINE - len(head) - len(tail)) // len(unit)) + tail
    marks = line.count("=") + line.count("\\")
    fits = MAX_LABELS // marks
    assert parse_load(f"{line}\n" * fits).waiting == fits
    with pytest.raises(MetricsOverrun, match=f"over {MAX_LABELS} labels and escapes in"):
        parse_load(f"{line}\n" * (fits + 1))


def test_a_document_past_the_size_read_is_refused() -> None:
    document = f"{WAITING} 1\n" + "\n" * MAX_DOCUMENT
    with pytest.raises(MetricsOverrun, match=f"document over {MAX_DOCUMENT} "):
        parse_load(document)
    assert parse_load(document[:MAX_DOCUMENT]).waiting == 1.0


def vllm_document(ranks: int) -> str:
    """What vLLM 0.32's own stat logger writes for one model on ``ranks`` data-parallel
    engines, for the series read here and the histograms beside them (not read: their
    bulk is what the searches skip): 23 TTFT buckets, five finish reasons, the waiting
    gauge and its longer by-reason name."""
    model = 'model_name="meta-llama/Llama-3.1-70B-Instruct"'
    ttft = "vllm:time_to_first_token_seconds"
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0]
    bounds += [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    les = [*map(str, bounds), "+Inf"]
    lines = [f"# HELP {ttft} Time to first token.", f"# TYPE {ttft} histogram"]
    for rank in range(ranks):
        labels = f'engine="{rank}",{model}'
        lines += [f'{ttft}_bucket{{{labels},le="{le}"}} {i}.0' for i, le in enumerate(les)]
        lines += [f"{ttft}_count{{{labels}}} 22.0", f"{ttft}_sum{{{labels}}} 3.5"]
        lines += [
            f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{le}"}} 0.0' for le in les
        ] * 12  # a dozen other histograms
        lines += [
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} 1.0'
            for reason in ("stop", "length", "abort", "error", "repetition")
        ]
        lines += [f"{WAITING}{{{labels}}} 1.0", f"vllm:num_requests_running{{{labels}}} 2.0"]
        lines += [f'{WAITING}_by_reason{{{labels},reason="{r}"}} 0.0' for r in ("a", "b")]
        lines += [f"vllm:kv_cache_usage_perc{{{labels}}} 0.25"]
    return "\n".join(lines) + "\n"


def test_the_largest_document_vllm_writes_reads_within_every_bound() -> None:
    """64 data-parallel engines (vLLM's whole document at 64 ranks is 3.5 MB, near the
    size bound): about half the lines and a third of the labels allowed."""
    document = vllm_document(64)
    assert len(document) < MAX_DOCUMENT
    load = parse_load(document)
    assert (load.waiting, load.running, load.kv_cache, load.completed) == (64, 128, 0.25, 256)
    assert load.ttft is not None and load.ttft.cumulative[-1] == 64 * 22


OLD_LABEL = re.compile(  # a label, one character at a time (the matcher before)
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|\})'
)
OLD_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def old_unescaped(value: str) -> str:
    return re.sub(r"\\.", lambda m: OLD_ESCAPES.get(m.group(), m.group()), value)


label_text = st.text(alphabet='\\"nx =,}\t\n', max_size=30)


@settings(max_examples=500, deadline=None)
@given(label_text)
def test_a_label_matches_as_it_did_one_character_at_a_time(text: str) -> None:
    line = f'a="{text}'
    old, new = OLD_LABEL.match(line), metrics._LABEL.match(line)
    assert (old and old.groups()) == (new and new.groups())


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='\\"nx', max_size=30))
def test_escapes_read_as_they_were_one_at_a_time(text: str) -> None:
    value = OLD_LABEL.match(f'a="{text}"}}')
    if value is not None:
        assert metrics._unescaped(value.group(2)) == old_unescaped(value.group(2))


def test_steps_are_counted() -> None:
    """The count the cost tests rely on counts: more lines of a series read, more steps."""
    assert steps(f"{WAITING} 1\n" * 10)[0] < steps(f"{WAITING} 1\n" * 100)[0]
