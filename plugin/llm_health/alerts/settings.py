"""What ``alerts:`` configures (docs/design.md §5.5): the section itself and its webhooks,
the types the alerts component receives."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from llm_health.core.settings import Duration, Frozen, Headers, Int

AlertEventName = Literal[
    "unhealthy",
    "recovered",
    "fatal",
    "added",
    "removed",
    "discovery_failed",
    "discovery_recovered",
    "fleet_fallback",
    "fleet_recovered",
    "remediation",
]


class WebhookConfig(Frozen):
    """One alert receiver. ``url`` and ``headers`` may hold secrets (a Slack-style URL
    carries its token in the path): only scheme://host:port is ever logged or shown."""

    url: str = Field(max_length=2000)
    on: tuple[AlertEventName, ...] = Field(("unhealthy", "recovered", "fatal"), min_length=1)
    headers: Headers = Field(default_factory=dict)
    timeout: Duration = 5.0

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML) reads the bare key ``on`` as the boolean true."""
        if isinstance(data, dict) and True in data and "on" not in data:
            return {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value


class AlertsConfig(Frozen):
    """Webhook alerts; no webhooks (the default): nothing is sent."""

    webhooks: tuple[WebhookConfig, ...] = Field((), max_length=100)
    dedup_window: Duration = 300.0
    max_per_minute: Int = Field(30, ge=1, le=10_000)
    max_attempts: Int = Field(5, ge=1, le=20)
    retry_backoff: Duration = 0.5
    max_retry_time: Duration = 120.0
    queue_size: Int = Field(1000, ge=1, le=100_000)
