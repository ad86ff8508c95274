"""The simulator's ``/metrics`` document: Prometheus text with vLLM's gauge names.

Load balancers and autoscalers read ``vllm:num_requests_running``/``_waiting`` and
``vllm:kv_cache_usage_perc``; the simulator derives them from its in-flight gauges so
those consumers can be tested against it. Its own counters follow under
``llm_health_sim_*``.
"""

from __future__ import annotations

from llm_health.sim.state import SimState

__all__ = ["METRICS_CONTENT_TYPE", "render_metrics"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(state: SimState) -> str:
    """Render ``state`` as Prometheus text exposition (vLLM names, plus sim counters)."""
    label = f'model_name="{_escape_label(state.settings.model)}"'
    kv_usage = min(1.0, state.in_flight / max(1, state.settings.max_num_seqs))
    counters = state.counters
    series: list[tuple[str, str, str, float]] = [
        ("vllm:num_requests_running", "gauge", "Requests producing tokens.", state.running),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting for a first token.",
            state.waiting,
        ),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent.", kv_usage),
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
    ]
    lines: list[str] = []
    for name, kind, help_text, value in series:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.append(f"{name}{{{label}}} {float(value)!r}")
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    """Escape a Prometheus label value (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
