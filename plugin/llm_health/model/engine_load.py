"""An engine's own load as its /metrics shows it (docs/design.md §14.3). Pure data:
``engines.metrics`` reads it; the engine checks judge saturation from it and passive
health takes real traffic's TTFT from its histogram (docs/design.md §15.2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: upper bounds (ascending, the last +Inf) and the cumulative
    count at each."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """``engine``: recognised from the names (None: unknown). Figures are None when the
    engine does not export them."""

    engine: str | None
    waiting: float | None = None
    running: float | None = None
    kv_cache: float | None = None
    ttft: Histogram | None = None  # the engine's TTFT histogram, cumulative, all series added
    # Requests the engine has finished since it started (a counter, all series added): it
    # makes progress while this grows (docs/agent.md, the restart rule).
    completed: float | None = None
    # The engine process's start (epoch seconds, ``process_start_time_seconds``): a new
    # value is a new process.
    process_started: float | None = None
    # New requests the engine has admitted, a counter (vLLM: prompt tokens prefilled): it
    # admits new requests while this grows, the evidence of the overload rule
    # (docs/design.md §3.5). Not a gauge, not decode: those move in a deadlock too.
    admitted: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "waiting": self.waiting,
            "running": self.running,
            "kv_cache": self.kv_cache,
        }
