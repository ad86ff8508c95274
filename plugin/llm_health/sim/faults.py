"""Fault specifications for the simulator: which failure to inject, and its knobs.

A :class:`FaultSpec` is an immutable value. The server holds exactly one at a time and
swaps it atomically when ``POST /sim/fault`` arrives. Every spec is validated on
construction, so an invalid spec cannot exist; :meth:`FaultSpec.from_json` turns any bad
input into a ``ValueError`` whose message names the offending key.

JSON form (durations are strings, as everywhere in llm-health)::

    {"fault": "none", "ttft": "50ms", "ttft_jitter": "0ms", "tpot": "10ms",
     "fault_rate": 1.0, "startup_delay": "30s", "overload_status": 429,
     "load_ttft_per_request": "20ms", "hang_max": "3600s"}
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_health.errors import DurationError
from llm_health.model.durations import format_duration, parse_duration

#: Every fault the simulator can inject, with a one-line description (used by docs/help).
FAULTS: Mapping[str, str] = {
    "none": "normal service: wait ttft ± jitter, then stream tokens every tpot",
    "hang_before_headers": "accept the request, never send response headers",
    "hang_after_headers": "send 200 + headers, then nothing",
    "hang_after_role_chunk": "chat streams: send the role delta, then nothing",
    "http_500": "answer 500 with a generic error JSON",
    "http_500_echo": "answer 500 quoting every request header (a proxy that echoes secrets)",
    "cuda_error": "answer 500 with a vLLM CUDA illegal-memory-access / EngineDeadError body",
    "error_mid_stream": "200 SSE, then an error event carrying a CUDA error, then [DONE]",
    "overloaded": "answer 429 (or 503, see overload_status) with an overload message",
    "garbage_stream": "200 SSE carrying non-JSON junk lines, no token, then close",
    "close_after_headers": "send 200 + headers, then abort the TCP connection",
    "startup_delay": "503 'Model is still loading' until startup_delay after the fault was set",
    "slow_under_load": "TTFT grows by load_ttft_per_request per other in-flight request",
}

#: Faults that keep the request open without answering (bounded by ``hang_max``).
HANG_FAULTS = frozenset({"hang_before_headers", "hang_after_headers", "hang_after_role_chunk"})

#: Statuses ``overloaded`` may answer with.
OVERLOAD_STATUSES = (429, 503)

#: What ``GET /health`` does (the ``health`` knob, independent of ``fault``): "ok" = 200
#: always (a zombie looks like this); "http_503" = 503; "reset" = the connection is
#: aborted with no answer (a check path that is unreachable while inference still works,
#: e.g. for Envoy HDS HTTP checks).
HEALTH_MODES = ("ok", "http_503", "reset")

_DURATION_KEYS = ("ttft", "ttft_jitter", "tpot", "startup_delay", "load_ttft_per_request")


@dataclass(frozen=True)
class FaultSpec:
    """The fault being injected and its knobs. All durations are in seconds.

    - ``fault``: one of :data:`FAULTS`.
    - ``ttft`` / ``ttft_jitter``: time to first token, drawn uniformly from
      ``ttft ± ttft_jitter`` (clamped at 0). Applies to every fault that streams.
    - ``tpot``: time between tokens (and before the closing ``[DONE]``).
    - ``fault_rate``: fraction (0..1) of inference requests the fault applies to; the
      others are served normally. Drawn from the server's seeded RNG.
    - ``startup_delay``: for ``startup_delay``, how long after the fault was set the
      server keeps answering 503.
    - ``overload_status``: 429 or 503, for ``overloaded``.
    - ``load_ttft_per_request``: for ``slow_under_load``, extra TTFT per other in-flight
      inference request.
    - ``hang_max``: upper bound of every hang, after which the request is ended.
    - ``health``: what ``GET /health`` does, one of :data:`HEALTH_MODES`.
    """

    fault: str = "none"
    ttft: float = 0.05
    ttft_jitter: float = 0.0
    tpot: float = 0.01
    fault_rate: float = 1.0
    startup_delay: float = 30.0
    overload_status: int = 429
    load_ttft_per_request: float = 0.02
    hang_max: float = 3600.0
    health: str = "ok"

    def __post_init__(self) -> None:
        """Reject any invalid field with a ValueError naming it."""
        if self.fault not in FAULTS:
            raise ValueError(f'"fault": unknown fault {self.fault!r} (known: {", ".join(FAULTS)})')
        for key in (*_DURATION_KEYS, "hang_max"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f'"{key}": must be a non-negative duration, got {value!r}')
        if self.hang_max <= 0:
            raise ValueError(f'"hang_max": must be positive, got {self.hang_max!r}')
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f'"fault_rate": must be between 0 and 1, got {self.fault_rate!r}')
        if self.overload_status not in OVERLOAD_STATUSES:
            raise ValueError(f'"overload_status": must be 429 or 503, got {self.overload_status!r}')
        if self.health not in HEALTH_MODES:
            raise ValueError(
                f'"health": must be one of {", ".join(HEALTH_MODES)}, got {self.health!r}'
            )

    @classmethod
    def from_json(cls, data: object, base: FaultSpec | None = None) -> FaultSpec:
        """Build a spec from decoded JSON; keys left out keep their value from ``base``.

        ``base`` defaults to the default spec. Raises ValueError naming the bad key for an
        unknown key, a wrong type, or an out-of-range value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"fault spec must be a JSON object, got {type(data).__name__}")
        changes: dict[str, Any] = {}
        for key, value in data.items():
            changes[key] = _decode_field(key, value)
        return dataclasses.replace(base if base is not None else cls(), **changes)

    def to_json(self) -> dict[str, object]:
        """Return the JSON form: durations as strings, the rest as numbers/strings."""
        return {
            "fault": self.fault,
            "ttft": format_duration(self.ttft),
            "ttft_jitter": format_duration(self.ttft_jitter),
            "tpot": format_duration(self.tpot),
            "fault_rate": self.fault_rate,
            "startup_delay": format_duration(self.startup_delay),
            "overload_status": self.overload_status,
            "load_ttft_per_request": format_duration(self.load_ttft_per_request),
            "hang_max": format_duration(self.hang_max),
            "health": self.health,
        }

    def draw_ttft(self, rng: random.Random) -> float:
        """Return one TTFT sample in seconds: ``ttft ± ttft_jitter``, never negative."""
        if self.ttft_jitter == 0:
            return self.ttft
        return max(0.0, self.ttft + rng.uniform(-self.ttft_jitter, self.ttft_jitter))


def _decode_field(key: object, value: object) -> object:
    """Decode one JSON field of a fault spec, or raise ValueError naming ``key``."""
    if key in ("fault", "health"):
        if not isinstance(value, str):
            raise ValueError(f'"{key}": must be a string, got {value!r}')
        return value
    if key in _DURATION_KEYS or key == "hang_max":
        return _decode_duration(str(key), value)
    if key == "fault_rate":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f'"fault_rate": must be a number between 0 and 1, got {value!r}')
        return float(value)
    if key == "overload_status":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f'"overload_status": must be 429 or 503, got {value!r}')
        return value
    known = ", ".join(f.name for f in dataclasses.fields(FaultSpec))
    raise ValueError(f"{key!r}: unknown key in fault spec (known: {known})")


def _decode_duration(key: str, value: object) -> float:
    """Parse a duration string such as ``"800ms"``; bare numbers are refused (ambiguous)."""
    if not isinstance(value, str):
        raise ValueError(f'"{key}": must be a duration string such as "800ms", got {value!r}')
    try:
        return parse_duration(value)
    except DurationError as exc:
        raise ValueError(f'"{key}": {exc}') from exc
