"""The config in force, shared by the runtime and the components that follow reloads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llm_health.config import Config


@dataclass(slots=True)
class LiveConfig:
    """The config in force; a reload replaces ``current``. Components that follow reloads
    read their section through it (e.g. ``lambda: live.current.authz``)."""

    current: Config
    path: Path | None = None
    reloads: dict[str, int] = field(default_factory=lambda: {"applied": 0, "rejected": 0})
