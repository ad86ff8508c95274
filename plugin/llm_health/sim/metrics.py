"""The simulator's ``/metrics`` document: Prometheus text with the engine's gauge names.

Load balancers and autoscalers read the engine's waiting/running gauges and its KV-cache
usage (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``, …: the names depend on
``SimSettings.engine``, see :mod:`llm_health.sim.engines`). The simulator derives them
from its in-flight gauges, unless the fault spec's ``metrics_waiting`` /
``metrics_kv_cache`` knobs pin them (a saturated engine). Its own counters follow under
``llm_health_sim_*``, then, for vLLM and SGLang, the engine's time-to-first-token and
end-to-end latency histograms (:mod:`llm_health.sim.histogram`), filled with what the
simulator really served. What ``GET /metrics`` answers instead of this document (404,
junk, a hang, a hostile document) is the ``metrics`` knob, handled by the application.
"""

from __future__ import annotations

import functools

from llm_health.sim.engines import ENGINES
from llm_health.sim.faults import NOT_ADMITTING
from llm_health.sim.state import SimState

__all__ = ["METRICS_CONTENT_TYPE", "METRICS_GARBAGE", "hostile_metrics", "render_metrics"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The body of ``/metrics`` under ``"metrics": "garbage"``: served as Prometheus text,
#: but binary junk and unbalanced braces that no exposition parser accepts.
METRICS_GARBAGE = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\xfd\n"
    b"{{{ not prometheus {{{\n"
    b'vllm:num_requests_waiting{model_name="\x00\xff 12 {{{\n'
)


@functools.cache
def hostile_metrics() -> bytes:
    """The body under ``"metrics": "hostile"``: 4 MiB, the most an engine check reads, of
    line breaks (a reader that walks the lines pays four million steps for nothing), then
    10,000 samples of vLLM's waiting gauge, more lines of one series than any engine
    writes (docs/engines.md, "Bounds of a /metrics read"). Made at the first use."""
    tail = b"vllm:num_requests_waiting 1\n" * 10_000
    return b"\n" * (4 * 1024 * 1024 - len(tail)) + tail


def render_metrics(state: SimState) -> str:
    """Render ``state`` as Prometheus text exposition (engine gauges, sim counters, then
    the engine's latency histograms if it has them)."""
    label = f'model_name="{_escape_label(state.settings.model)}"'
    engine = ENGINES[state.settings.engine]
    spec = state.fault
    # As vLLM counts them: up to max_num_seqs requests are scheduled (running: in prefill
    # or decoding); only those beyond wait in its queue. A request between arrival and its
    # first token is running, not waiting, on an engine with room.
    capacity = state.settings.max_num_seqs
    running = min(state.in_flight, capacity)
    queued = max(0, state.in_flight - capacity)
    if spec.slots is not None or spec.fault in NOT_ADMITTING:
        # Admission decides (``sim.admission``): running holds a slot, the rest wait.
        running, queued = state.admitted, state.in_flight - state.admitted
    waiting = spec.metrics_waiting if spec.metrics_waiting is not None else queued
    kv_usage = (
        spec.metrics_kv_cache
        if spec.metrics_kv_cache is not None
        else min(1.0, state.in_flight / max(1, state.settings.max_num_seqs))
    )
    counters = state.counters
    series: list[tuple[str, str, str, float]] = [
        (engine.running_metric, "gauge", "Requests scheduled (prefill or decode).", running),
        (engine.waiting_metric, "gauge", "Requests queued beyond max_num_seqs.", waiting),
    ]
    if engine.kv_cache_metric is not None:
        help_text = "KV-cache usage. 1 means 100 percent."
        series.append((engine.kv_cache_metric, "gauge", help_text, kv_usage))
    if engine.completed_metric is not None:
        help_text = "Requests finished."
        series.append((engine.completed_metric, "counter", help_text, counters.completed))
    if engine.generation_metric is not None:
        help_text = "Number of generation tokens processed."
        series.append((engine.generation_metric, "counter", help_text, state.generation_tokens))
    series += [
        ("llm_health_sim_requests_total", "counter", "Inference requests.", counters.requests),
        (
            "llm_health_sim_probe_requests_total",
            "counter",
            "Probe requests.",
            counters.probe_requests,
        ),
        ("llm_health_sim_completed_total", "counter", "Completed requests.", counters.completed),
        ("llm_health_sim_failed_total", "counter", "Failed requests.", counters.failed),
        (
            "llm_health_sim_aborted_total",
            "counter",
            "Requests aborted by the client.",
            counters.aborted,
        ),
        (
            "llm_health_sim_logprobs_requests_total",
            "counter",
            "Inference requests that asked for logprobs.",
            counters.logprobs_requests,
        ),
    ]
    lines: list[str] = []
    for name, kind, help_text, value in series:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.append(f"{name}{{{label}}} {float(value)!r}")
    if engine.prompt_metric is not None:
        lines += _admission_lines(state, label)
    if engine.ttft_metric is not None:
        help_text = "Histogram of time to first token in seconds."
        lines += state.ttft.render(engine.ttft_metric, help_text, label)
    if engine.e2e_metric is not None:
        help_text = "Histogram of e2e request latency in seconds."
        lines += state.e2e.render(engine.e2e_metric, help_text, label)
    return "\n".join(lines) + "\n"


def _admission_lines(state: SimState, label: str) -> list[str]:
    """The engine's admission counter (``sim.admission``; docs/engines.md)."""
    engine = ENGINES[state.settings.engine]
    name = engine.prompt_metric
    value = state.admissions if engine.prompt_counts_requests else state.prompt_tokens
    labels = f"{label},{engine.prompt_labels}" if engine.prompt_labels else label
    return [
        f"# HELP {name} Prompt tokens prefilled (TGI: prefill batches).",
        f"# TYPE {name} counter",
        f"{name}{{{labels}}} {float(value)!r}",
    ]


def _escape_label(value: str) -> str:
    """Escape a Prometheus label value (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
