"""ProbeTarget: everything needed to probe one endpoint (built from the config by
``config.ProbeSettings.to_target``; the probe package never reads the config itself)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Engine error text that means the GPU or engine is gone for good (FATAL: out at once).
DEFAULT_FATAL_PATTERNS = (
    "CUDA error",
    "CUDA out of memory",
    "illegal memory access",
    "out of memory",
    "NCCL",
    "Xid",
    "EngineDeadError",
    "device-side assert",
    "cuDNN error",
)
API_PATHS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# Engines llm-health knows by name (docs/engines.md); "auto": detected from the endpoint.
ENGINES = ("vllm", "sglang", "tgi", "trtllm", "llamacpp", "openai")


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One endpoint's probe. ``headers`` may hold secrets: repr hides them, never log them.
    ``secrets``: every configured secret value (``model.redact.secret_forms``), removed
    from whatever the backend answers before it becomes a result's ``detail``.

    Units: seconds. ``key`` ("cluster/address") identifies the endpoint everywhere.
    The engine checks' own settings (``probe.verify``, ``probe.engine_metrics``) are not
    here: they reach the checks per cluster (``engines.settings``), and a known-answer
    probe is asked its question by them (``probe.client.Question``).
    """

    cluster: str
    address: str
    url: str
    api: str
    model: str | None
    prompt: str
    cache_bust: str
    timeout_s: float
    healthy_ttft_s: float
    interval_s: float
    confirm_delay_s: float
    unhealthy_after: int
    fatal_patterns: re.Pattern[str] | None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    secrets: frozenset[str] = field(default=frozenset(), repr=False)
    act_on_silence: bool = True  # see ``silence_after_s``
    silence_degrade: float | None = None
    engine: str = "auto"  # one of ENGINES, or "auto" (detected: probe.engine)
    models_path: str | None = "/v1/models"  # the served-model check (None: never)
    # "cluster/address", made once: it is read several times for every probe.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.cluster}/{self.address}")

    @property
    def base_url(self) -> str:
        """scheme://host:port of the endpoint (no path)."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{self.address}" if rest else self.url

    def silence_after_s(self, recent_ttft_s: float | None) -> float | None:
        """When a probe still without a first token counts as silent (None: never).
        ``healthy_ttft`` by default; with ``silence_degrade``, that multiple of the
        endpoint's recent TTFT, kept within [20 ms, 3/4 of the timeout]."""
        if not self.act_on_silence:
            return None
        if self.silence_degrade is None or recent_ttft_s is None:
            return self.healthy_ttft_s
        return min(max(self.silence_degrade * recent_ttft_s, 0.02), 0.75 * self.timeout_s)

    def confirm_after_s(self) -> float:
        """How long a silent probe must stay silent before the confirming probe starts
        beside it: twice ``healthy_ttft`` (within half the timeout). A hang is confirmed
        one timeout later; an engine that is only slow or jittery has answered by then."""
        return min(2 * self.healthy_ttft_s, 0.5 * self.timeout_s)


def compile_fatal_patterns(patterns: tuple[str, ...] | list[str]) -> re.Pattern[str] | None:
    """One case-insensitive regex matching any of the literal patterns (None if empty)."""
    if not patterns:
        return None
    return re.compile("|".join(re.escape(p) for p in patterns), re.IGNORECASE)


def endpoint_url(scheme: str, address: str, api: str, path: str | None) -> str:
    return f"{scheme}://{address}{path or API_PATHS[api]}"
