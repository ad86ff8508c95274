"""What ``remediation:`` and ``limits:`` configure, in domain form (no pydantic)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_health.model.causes import Cause
from llm_health.model.states import State


@dataclass(frozen=True, slots=True)
class Rule:
    """One hook: when an endpoint has been in ``state`` for ``for_s`` seconds (entered
    with one of ``causes``; empty: any), ``run`` an argv or POST to ``webhook``."""

    state: State
    for_s: float
    causes: frozenset[Cause] = frozenset()
    run: tuple[str, ...] = ()
    webhook: str | None = None
    timeout_s: float = 30.0

    @property
    def name(self) -> str:
        target = self.run[0] if self.run else "webhook"
        return f"{self.state.value}>{self.for_s:g}s:{target}"


@dataclass(frozen=True, slots=True)
class Limits:
    """Guardrails over every hook: at most ``max_concurrent_per_cluster`` running per
    cluster (and never more endpoints than the cluster's max_ejection_percent), one per
    endpoint per ``cooldown_s``, ``max_per_hour`` in all; ``dry_run``: log only."""

    max_concurrent_per_cluster: int = 1
    cooldown_s: float = 600.0
    max_per_hour: int = 6
    dry_run: bool = False
