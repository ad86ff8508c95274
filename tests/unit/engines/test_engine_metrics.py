"""Engine load from /metrics (engines.metrics): names per engine, saturation, staleness."""

from __future__ import annotations

import pytest

from llm_health.engines.metrics import (
    STALE_AFTER,
    MetricsError,
    Reading,
    parse_load,
    saturation,
)
from llm_health.model.engine_load import EngineLoad


def gauge(name: str, value: float, labels: str = 'model_name="m"') -> str:
    return f"# TYPE {name} gauge\n{name}{{{labels}}} {value}\n"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            gauge("vllm:num_requests_waiting", 12)
            + gauge("vllm:num_requests_running", 3)
            + gauge("vllm:kv_cache_usage_perc", 0.42),
            EngineLoad("vllm", 12.0, 3.0, 0.42),
        ),
        (gauge("vllm:gpu_cache_usage_perc", 0.9), EngineLoad("vllm", None, None, 0.9)),
        (
            gauge("sglang:num_queue_reqs", 7) + gauge("sglang:token_usage", 0.5),
            EngineLoad("sglang", 7.0, None, 0.5),
        ),
        (gauge("tgi_queue_size", 4, 'a="b"'), EngineLoad("tgi", 4.0)),
        (
            "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n"
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 10\n",
            EngineLoad("llamacpp", 2.0, admitted=10.0),
        ),
    ],
)
def test_each_engine_is_read_by_its_names(document: str, expected: EngineLoad) -> None:
    assert parse_load(document) == expected


def test_ranks_add_up_for_the_queue_and_the_fullest_kv_cache_counts() -> None:
    document = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 4\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.3\nvllm:kv_cache_usage_perc{engine="1"} 0.85\n'
    )
    load = parse_load(document)
    assert load.waiting == 6 and load.kv_cache == 0.85


@pytest.mark.parametrize(
    ("junk", "why"),
    [
        ("{{{ junk", "no metric of a known engine"),
        ("# nothing here\nprocess_cpu_seconds_total 5\n", "no metric of a known engine"),
        ("vllm:num_requests_waiting{a=} nope\n", "not Prometheus text"),
    ],
)
def test_unreadable_documents_raise_a_metrics_error(junk: str, why: str) -> None:
    with pytest.raises(MetricsError, match=why):
        parse_load(junk)


def test_the_ttft_histogram_is_read_and_added_over_series() -> None:
    document = gauge("vllm:num_requests_waiting", 0) + (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 3\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 5\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 6\n'
        'vllm:time_to_first_token_seconds_count{engine="0"} 6\n'
        'vllm:time_to_first_token_seconds_sum{engine="0"} 2.5\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 1\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 6\n'
    )
    load = parse_load(document)
    assert load.ttft is not None
    assert load.ttft.bounds == (0.1, 1.0, float("inf")) and load.ttft.cumulative == (4, 6, 7)
    # Without the histogram (most reads: docs/design.md §16.5) the gauges are the same.
    light = parse_load(document, ttft=False)
    assert light.ttft is None and light.waiting == load.waiting == 0
    assert light.engine == load.engine == "vllm"


@pytest.mark.parametrize(
    ("load", "reason"),
    [
        (EngineLoad("vllm", 12.0, 1.0, 0.1), "12 waiting ≥ 5"),
        (EngineLoad("vllm", 5.0), "5 waiting ≥ 5"),
        (EngineLoad("vllm", 4.0, None, 0.95), "KV cache 95% used ≥ 80%"),
        (EngineLoad("vllm", 4.0, None, 0.79), None),
        (EngineLoad("tgi", None, None, None), None),
        (EngineLoad(None), None),
    ],
)
def test_saturation_reasons(load: EngineLoad, reason: str | None) -> None:
    assert saturation(load, 5, 0.8) == reason


def test_failed_reads_keep_the_last_figures_until_stale() -> None:
    busy = EngineLoad("vllm", 12.0)
    reading = Reading().read(busy)
    for _ in range(STALE_AFTER - 1):
        reading = reading.failed("HTTP 404")
        assert reading.usable == busy
    reading = reading.failed("timed out")
    assert reading.usable is None and reading.error == "timed out"
    assert reading.read(EngineLoad("vllm", 0.0)).usable == EngineLoad("vllm", 0.0)
    assert Reading().failed("HTTP 404").usable is None


def counter(name: str, value: float, labels: str = 'model_name="m"', typed: str = "") -> str:
    """A counter as the engine writes it (``typed``: the name on its TYPE line, if any)."""
    head = f"# TYPE {typed} counter\n" if typed else ""
    return f"{head}{name}{{{labels}}} {value}\n"


START = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\n"


@pytest.mark.parametrize(
    ("document", "completed", "started"),
    [
        (
            gauge("vllm:num_requests_waiting", 0)
            + counter("vllm:request_success_total", 4, 'finished_reason="stop"')
            + counter("vllm:request_success_total", 3, 'finished_reason="length"')
            + START,
            7.0,
            1.7e9,
        ),
        (  # requests the client gave up on are not progress
            counter("vllm:request_success_total", 2, 'finished_reason="length"')
            + counter("vllm:request_success_total", 50, 'finished_reason="abort"'),
            2.0,
            None,
        ),
        (
            counter("sglang:num_requests_total", 9, typed="sglang:num_requests_total") + START,
            9.0,
            1.7e9,
        ),
        (counter("tgi_request_success", 5, typed="tgi_request_success"), 5.0, None),  # typed
        (counter("tgi_request_success", 6) + gauge("tgi_queue_size", 0), 6.0, None),  # untyped
        (
            "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 80\n"
            "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
            "llamacpp:tokens_predicted_seconds_total 3\n",
            80.0,
            None,
        ),
        (gauge("vllm:num_requests_waiting", 1), None, None),  # not exported
    ],
)
def test_progress_and_process_start_by_engine(
    document: str, completed: float | None, started: float | None
) -> None:
    load = parse_load(document)
    assert (load.completed, load.process_started) == (completed, started)


def test_a_document_with_only_a_start_time_is_no_engine() -> None:
    with pytest.raises(MetricsError):
        parse_load(START)


@pytest.mark.parametrize(
    ("document", "admitted"),
    [
        (  # vLLM: prompt tokens prefilled, ranks added; decode and completions are not read
            counter("vllm:prompt_tokens_total", 5000, 'engine="0"')
            + counter("vllm:prompt_tokens_total", 120, 'engine="1"')
            + counter("vllm:generation_tokens_total", 9999)
            + counter("vllm:request_success_total", 77, 'finished_reason="stop"'),
            5120.0,
        ),
        (counter("sglang:prompt_tokens_total", 7, typed="sglang:prompt_tokens_total"), 7.0),
        (  # TGI: prefill batches only, not decode ones
            counter("tgi_batch_inference_count", 3, 'method="prefill"')
            + counter("tgi_batch_inference_count", 900, 'method="decode"')
            + gauge("tgi_queue_size", 0),
            3.0,
        ),
        (
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 33\n"
            "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 80\n",
            33.0,
        ),
        (  # gauges never count as admission, however busy
            gauge("vllm:num_requests_waiting", 20) + gauge("vllm:num_requests_running", 4),
            None,
        ),
    ],
)
def test_admission_counter_by_engine(document: str, admitted: float | None) -> None:
    """The evidence of the overload rule (docs/design.md §3.5, docs/engines.md)."""
    assert parse_load(document).admitted == admitted
