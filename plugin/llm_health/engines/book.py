"""What the engine checks know, shared by their features (docs/design.md §14): the
endpoints checked here, the checks in force for each, and per endpoint what was read and
decided (``/status`` shows it). Plain data and lookups; each feature module
(``known_answer``, ``load_reads``, ``model_check``, ``read_queue``) updates its own
fields."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from llm_health.engines.bracket import Evidence
from llm_health.engines.metrics import Reading
from llm_health.engines.settings import (
    NO_CHECKS,
    ClusterChecks,
    EngineMetricsConfig,
    VerifyConfig,
)
from llm_health.probe.target import ProbeTarget

# Per cluster, the checks in force (``settings.in_force``) of the config now in force.
Checks = Callable[[], Mapping[str, ClusterChecks]]


@dataclass(slots=True)
class EndpointState:
    """What the checks know of one endpoint (``/status`` shows it)."""

    reading: Reading = field(default_factory=Reading)
    reads: int = 0
    limit: str | None = None  # the "engine" limit the checks last set
    verify_due: float = 0.0  # monotonic; 0: the next probe is a known-answer probe
    last_answer: str | None = None
    last_verdict: str = ""
    models: tuple[str, ...] = ()
    model_error: str = ""
    overrun_logged: bool = False  # a /metrics document past a read's bounds was logged


@dataclass(slots=True)
class Counters:
    checks_total: int = 0
    garbage_total: int = 0
    misses_total: int = 0
    passes_total: int = 0
    metrics_reads_total: int = 0
    metrics_bracket_reads_total: int = 0
    metrics_failures_total: int = 0
    metrics_overruns_total: int = 0
    model_checks_total: int = 0
    model_failures_total: int = 0
    side_reads_deferred_total: int = 0
    # Per ``Evidence`` value: the timeouts whose wait was bracketed, by what the reads showed.
    bracketed_timeouts_total: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((e.value for e in Evidence), 0)
    )

    def bracketed(self, evidence: Evidence) -> None:
        self.bracketed_timeouts_total[evidence.value] += 1


class Book:
    """``targets``: the endpoints probed here; ``engines``: detected engine per endpoint
    key (the same dict for the checks' life: the ``MicroProbe`` reads it)."""

    def __init__(self, checks: Checks) -> None:
        self._checks_now = checks
        self.checks: Mapping[str, ClusterChecks] = {}
        self.targets: list[ProbeTarget] = []
        self.endpoints: dict[str, EndpointState] = {}
        self.engines: dict[str, str] = {}
        self.counters = Counters()

    def reload(self, targets: list[ProbeTarget]) -> None:
        """The endpoints probed here, and the checks in force read again."""
        self.targets = targets
        self.checks = self._checks_now()

    def verify(self, target: ProbeTarget) -> VerifyConfig | None:
        return self.checks.get(target.cluster, NO_CHECKS)[0]

    def metrics(self, target: ProbeTarget) -> EngineMetricsConfig | None:
        return self.checks.get(target.cluster, NO_CHECKS)[1]

    def endpoint(self, key: str) -> EndpointState:
        state = self.endpoints.get(key)
        if state is None:
            state = self.endpoints[key] = EndpointState()
        return state

    def forget(self, keys: Collection[str]) -> None:
        """Endpoints no longer probed here (removed, or owned by another replica)."""
        for key in [k for k in self.endpoints if k not in keys]:
            del self.endpoints[key]
            self.engines.pop(key, None)

    def saturated_now(self) -> int:
        return sum(1 for s in self.endpoints.values() if s.limit)
