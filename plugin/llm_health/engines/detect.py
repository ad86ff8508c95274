"""Which engine serves an endpoint (docs/engines.md), for ``engine: auto``: the probe's
request body bypasses the prefix cache by engine (``probe.client.cache_bust_for``). Pure.

- From the metric names of its /metrics (``engines.metrics`` reads them on every read);
- else from the engines' own info endpoints (``INFO_PATHS``): /props (llama.cpp),
  /get_server_info (SGLang), /info (TGI), /version (vLLM), tried in that order.
"""

from __future__ import annotations

from collections.abc import Iterable

METRIC_PREFIXES = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("llamacpp:", "llamacpp"),
    ("tgi_", "tgi"),
    ("nv_trt_llm_", "trtllm"),
)
INFO_PATHS = (  # (path, engine, a key its JSON object has; None: any object)
    ("/props", "llamacpp", "default_generation_settings"),
    ("/get_server_info", "sglang", None),
    ("/info", "tgi", "model_id"),
    ("/version", "vllm", "version"),
)


def engine_of_names(names: Iterable[str]) -> str | None:
    """The engine the first metric name of a known engine says, or None."""
    for name in names:
        for prefix, engine in METRIC_PREFIXES:
            if name.startswith(prefix):
                return engine
    return None


def answers_as(found: object, key: str | None) -> bool:
    """Whether an info endpoint's decoded JSON is that engine's: an object, with ``key``."""
    return isinstance(found, dict) and (key is None or key in found)
