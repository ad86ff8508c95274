"""ProbeTarget: everything needed to probe one endpoint, built once from config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_health.config import Config, ProbeSettings

API_PATHS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions"}


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One endpoint's probe. ``headers`` may hold secrets: repr hides them, never log them.

    Units: seconds. ``key`` ("cluster/address") identifies the endpoint everywhere.
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

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.address}"


def compile_fatal_patterns(patterns: tuple[str, ...] | list[str]) -> re.Pattern[str] | None:
    """One case-insensitive regex matching any of the literal patterns (None if empty)."""
    if not patterns:
        return None
    return re.compile("|".join(re.escape(p) for p in patterns), re.IGNORECASE)


def endpoint_url(scheme: str, address: str, api: str, path: str | None) -> str:
    return f"{scheme}://{address}{path or API_PATHS[api]}"


def targets_from_config(config: Config) -> list[ProbeTarget]:
    """One ProbeTarget per configured endpoint, with the cluster's effective settings."""
    targets = []
    for cluster in config.clusters:
        settings = config.probe_for(cluster)
        for endpoint in cluster.endpoints:
            targets.append(target_for(cluster.name, endpoint.address, settings))
    return targets


def target_for(cluster: str, address: str, settings: ProbeSettings) -> ProbeTarget:
    return ProbeTarget(
        cluster=cluster,
        address=address,
        url=endpoint_url(settings.scheme, address, settings.api, settings.path),
        api=settings.api,
        model=settings.model,
        prompt=settings.prompt,
        cache_bust=settings.cache_bust,
        timeout_s=settings.timeout,
        healthy_ttft_s=settings.healthy_ttft,
        interval_s=settings.interval,
        confirm_delay_s=settings.confirm_delay,
        unhealthy_after=settings.unhealthy_after,
        fatal_patterns=compile_fatal_patterns(settings.fatal_patterns),
        headers={k: v.get_secret_value() for k, v in settings.headers.items()},
    )
