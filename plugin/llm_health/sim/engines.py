"""Engine flavours: what differs between vLLM, SGLang, TGI and llama.cpp as a client sees it.

The simulator speaks the same OpenAI API whichever engine it plays (all four serve
``/v1/completions`` and ``/v1/chat/completions``). What the ``engine`` setting changes is
what a discovery or load-reading client looks at: the names of the ``/metrics`` gauges,
and the one engine-specific info endpoint (only the chosen engine's exists; the others
answer 404, as on a real server). Per engine: the waiting, running and KV-cache usage
gauges, then the info endpoint:

- ``vllm``: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc``; ``GET /version``.
- ``sglang``: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``,
  ``sglang:token_usage``; ``GET /get_server_info``.
- ``tgi``: ``tgi_queue_size``, ``tgi_batch_current_size`` (no KV-cache gauge);
  ``GET /info``.
- ``llamacpp``: ``llamacpp:requests_deferred``, ``llamacpp:requests_processing``,
  ``llamacpp:kv_cache_usage_ratio``; ``GET /props``.

Each also exports a counter of requests finished (``completed_metric``: vLLM
``vllm:request_success_total``, SGLang ``sglang:num_requests_total``, TGI
``tgi_request_success``, llama.cpp ``llamacpp:tokens_predicted_total``; all of them count
the requests completed here), and an admission counter (``prompt_metric``: vLLM
``vllm:prompt_tokens_total``, SGLang ``sglang:prompt_tokens_total``, llama.cpp
``llamacpp:prompt_tokens_total``, prompt tokens of the requests admitted; TGI
``tgi_batch_inference_count{method="prefill"}``, one a request admitted:
:mod:`llm_health.sim.admission`); vLLM and SGLang also count tokens generated
(``generation_metric``), which grows while running requests decode.

vLLM and SGLang also export latency histograms, which the simulator fills with what it
really served (:mod:`llm_health.sim.histogram`): ``vllm:time_to_first_token_seconds`` /
``vllm:e2e_request_latency_seconds`` and ``sglang:time_to_first_token_seconds`` /
``sglang:e2e_request_latency_seconds``. TGI and llama.cpp get none: they export other
shapes (TGI ``tgi_request_*_duration`` histograms with no time-to-first-token one,
llama.cpp only running totals such as ``llamacpp:prompt_seconds_total``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENGINES", "ENGINE_NAMES", "Engine", "info_document"]

VLLM_VERSION = "0.11.0"
SGLANG_VERSION = "0.5.3"
TGI_VERSION = "3.3.6"
LLAMACPP_BUILD = "b6700-sim"


@dataclass(frozen=True)
class Engine:
    """One engine flavour: its gauge and histogram names and its info endpoint."""

    name: str
    waiting_metric: str
    running_metric: str
    kv_cache_metric: str | None
    info_path: str
    owned_by: str
    ttft_metric: str | None = None
    e2e_metric: str | None = None
    completed_metric: str | None = None
    #: The admission counter (docs/engines.md): prompt tokens prefilled, or for TGI
    #: prefill batches (one a request here), a series labelled ``prompt_labels``.
    prompt_metric: str | None = None
    prompt_labels: str = ""
    #: Tokens generated (decode): grows in a scheduler deadlock too.
    generation_metric: str | None = None

    @property
    def prompt_counts_requests(self) -> bool:
        """TGI counts prefill batches, not tokens."""
        return self.name == "tgi"


ENGINES: Mapping[str, Engine] = {
    "vllm": Engine(
        "vllm",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "/version",
        "vllm",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        generation_metric="vllm:generation_tokens_total",
    ),
    "sglang": Engine(
        "sglang",
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "/get_server_info",
        "sglang",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:num_requests_total",
        "sglang:prompt_tokens_total",
        generation_metric="sglang:generation_tokens_total",
    ),
    "tgi": Engine(
        "tgi",
        "tgi_queue_size",
        "tgi_batch_current_size",
        None,
        "/info",
        "text-generation-inference",
        completed_metric="tgi_request_success",
        prompt_metric="tgi_batch_inference_count",
        prompt_labels='method="prefill"',
    ),
    "llamacpp": Engine(
        "llamacpp",
        "llamacpp:requests_deferred",
        "llamacpp:requests_processing",
        "llamacpp:kv_cache_usage_ratio",
        "/props",
        "llamacpp",
        completed_metric="llamacpp:tokens_predicted_total",
        prompt_metric="llamacpp:prompt_tokens_total",
    ),
}

#: The accepted values of ``SimSettings.engine`` / ``--engine``.
ENGINE_NAMES = tuple(ENGINES)


def info_document(engine: str, served_model: str, capacity: int) -> dict[str, object]:
    """The JSON the engine's info endpoint answers (``served_model``: what is loaded)."""
    if engine == "vllm":
        return {"version": VLLM_VERSION}
    if engine == "sglang":
        return {
            "model_path": served_model,
            "tokenizer_path": served_model,
            "served_model_name": served_model,
            "max_running_requests": capacity,
            "version": SGLANG_VERSION,
        }
    if engine == "tgi":
        return {
            "model_id": served_model,
            "model_sha": None,
            "model_dtype": "torch.float16",
            "model_device_type": "cuda",
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": capacity,
            "max_input_tokens": 4095,
            "max_total_tokens": 4096,
            "router": "text-generation-router",
            "version": TGI_VERSION,
            "sha": None,
            "docker_label": None,
        }
    if engine == "llamacpp":
        settings = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "n_predict": -1}
        return {
            "default_generation_settings": {"id": 0, "n_ctx": 4096, "params": settings},
            "total_slots": capacity,
            "model_path": served_model,
            "chat_template": "",
            "build_info": LLAMACPP_BUILD,
        }
    raise ValueError(f"unknown engine {engine!r}")
