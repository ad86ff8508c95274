"""What ``remediation:`` and ``limits:`` configure (docs/design.md §13): the config
sections themselves, the types the guardrails (``decide``) and the component receive.

A rule keeps the file's words: ``when.state`` and ``when.causes`` are the names of
``State`` and ``Cause`` values, compared by value in ``decide.is_due``.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from llm_health.core.settings import Duration, Frozen, Int

CauseName = Literal[
    "startup_timeout", "slow", "silent", "overloaded", "timeout", "error", "fatal", "signal"
]  # fmt: skip


class WhenConfig(Frozen):
    """``remediation[].when``: the endpoint has been in ``state`` for ``for`` (entered for
    one of ``causes``; empty: any cause)."""

    state: Literal["unhealthy", "degraded"]
    for_: Duration = Field(alias="for", ge=1.0, le=86_400.0)
    causes: tuple[CauseName, ...] = Field((), max_length=20)


class RemediationConfig(Frozen):
    """One remediation hook: ``run`` (an argv, no shell; ``{cluster}`` ``{address}``
    ``{host}`` ``{port}`` ``{state}`` ``{cause}`` are filled in) or ``webhook`` (POSTed a
    JSON body). ``timeout``: a hook still running then is killed (or the POST given up)."""

    when: WhenConfig
    run: tuple[Annotated[str, Field(min_length=1, max_length=4096)], ...] | None = Field(
        None, min_length=1, max_length=64
    )
    webhook: str | None = Field(None, max_length=2000)
    timeout: Duration = Field(30.0, le=3600.0)

    @field_validator("run")
    @classmethod
    def _absolute_program(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value[0].startswith("/"):
            raise ValueError(f'"{value[0]}": the program must be an absolute path (no PATH lookup)')
        return value

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @model_validator(mode="after")
    def _one_action(self) -> RemediationConfig:
        if (self.run is None) == (self.webhook is None):
            raise ValueError("give exactly one of run (an argv) and webhook")
        return self

    @property
    def name(self) -> str:
        """How logs, /status and the ledger name the rule, e.g. "unhealthy>120s:/bin/x"."""
        target = self.run[0] if self.run else "webhook"
        return f"{self.when.state}>{self.when.for_:g}s:{target}"


class LimitsConfig(Frozen):
    """``limits:``: guardrails over every remediation hook: at most
    ``max_concurrent_per_cluster`` running per cluster (and never more endpoints than the
    cluster's max_ejection_percent), one per endpoint and rule per ``cooldown``,
    ``max_per_hour`` in all; ``dry_run``: decide and audit, run nothing."""

    max_concurrent_per_cluster: Int = Field(1, ge=1, le=1000)
    cooldown: Duration = Field(600.0, le=7 * 86_400.0)
    max_per_hour: Int = Field(6, ge=1, le=10_000)
    dry_run: bool = False
