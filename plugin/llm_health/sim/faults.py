"""Fault specifications for the simulator: which failure to inject, and its knobs.

A :class:`FaultSpec` is an immutable value. The server holds exactly one at a time and
swaps it atomically when ``POST /sim/fault`` arrives. Every spec is validated on
construction, so an invalid spec cannot exist; :meth:`FaultSpec.from_json` turns any bad
input into a ``ValueError`` whose message names the offending key.

JSON form (durations are strings, as everywhere in llm-health)::

    {"fault": "none", "ttft": "50ms", "ttft_jitter": "0ms", "tpot": "10ms",
     "fault_rate": 1.0, "startup_delay": "30s", "overload_status": 429,
     "load_ttft_per_request": "20ms", "hang_max": "3600s", "health": "ok",
     "answer": " Paris is a city", "top_alternatives": [" Lyon", " the", " a", " France"],
     "served_model": null, "metrics": "ok", "metrics_waiting": null,
     "metrics_kv_cache": null, "info": "ok", "affects": "all", "slots": null}
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
    "hang_after_first_token": "streams: send the first token, then nothing (a hang mid-body)",
    "http_500": "answer 500 with a generic error JSON",
    "http_500_echo": "answer 500 quoting every request header (a proxy that echoes secrets)",
    "cuda_error": "answer 500 with a vLLM CUDA illegal-memory-access / EngineDeadError body",
    "error_mid_stream": "200 SSE, then an error event carrying a CUDA error, then [DONE]",
    "overloaded": "answer 429 (or 503, see overload_status) with an overload message",
    "garbage_stream": "200 SSE carrying non-JSON junk lines, no token, then close",
    "close_after_headers": "send 200 + headers, then abort the TCP connection",
    "startup_delay": "503 'Model is still loading' until startup_delay after the fault was set",
    "slow_under_load": "TTFT grows by load_ttft_per_request per other in-flight request",
    "garbage_tokens": (
        "200 SSE at the normal TTFT whose tokens are all '!' (token id 0, NaN logprobs): "
        "vLLM's NaN-logits symptom"
    ),
    "frozen": (
        "a frozen engine core: every request hangs after headers, running ones stop, and "
        "/metrics keeps answering the figures of the moment it froze (stale busy gauges, "
        "counters that no longer move)"
    ),
    "deadlock": (
        "a scheduler deadlock: new requests hang after headers and are never admitted "
        "(prompt-token counter frozen) while running ones keep decoding and finishing"
    ),
}

#: Faults that keep the request open without answering (bounded by ``hang_max``).
HANG_FAULTS = frozenset(
    {"hang_before_headers", "hang_after_headers", "hang_after_role_chunk", "hang_after_first_token"}
)

#: Faults under which the engine admits no new request (``sim.admission``).
NOT_ADMITTING = frozenset({"frozen", "deadlock"})

#: Statuses ``overloaded`` may answer with.
OVERLOAD_STATUSES = (429, 503)

#: What ``GET /health`` does (the ``health`` knob, independent of ``fault``): "ok" = 200
#: always (a zombie looks like this); "http_503" = 503; "reset" = the connection is
#: aborted with no answer (a check path that is unreachable while inference still works,
#: e.g. for Envoy HDS HTTP checks).
HEALTH_MODES = ("ok", "http_503", "reset")

#: What ``GET /metrics`` does (the ``metrics`` knob): "ok" = the engine's Prometheus text;
#: "404" = 404 (metrics not exposed); "garbage" = 200 whose body is not Prometheus
#: exposition; "hang" = no answer until ``hang_max`` (then 504) or the client leaves;
#: "hostile" = 200 whose body is 4 MiB of line breaks, then more samples of one series
#: than any engine writes (``metrics.hostile_metrics``).
METRICS_MODES = ("ok", "404", "garbage", "hang", "hostile")

#: What ``GET /v1/models`` and the engines' info endpoints (``/version``,
#: ``/get_server_info``, ``/info``, ``/props``, whichever engine is played) do (the ``info``
#: knob): "ok" = answer (the played engine's own, 404 for the others'); "hang" = no answer
#: until ``hang_max`` (then 504) or the client leaves: a wedged server that accepts every
#: request and answers none (``/health`` and ``/metrics`` keep their own knobs).
INFO_MODES = ("ok", "hang")

#: Which inference requests the fault may apply to (the ``affects`` knob): "all" = every
#: one; "users" = only those without ``X-LLM-Probe: true`` (probes are served normally).
AFFECTS_MODES = ("all", "users")

#: The default ``answer``: the text generated, token by token (see :data:`FaultSpec`).
DEFAULT_ANSWER = " Paris is a city"
#: The default ``top_alternatives``: the runner-up tokens shown in ``top_logprobs``.
DEFAULT_TOP_ALTERNATIVES = (" Lyon", " the", " a", " France")
MAX_ANSWER_CHARS = 200
#: At most 19 alternatives: with the chosen token, the 20 ``top_logprobs`` vLLM allows.
MAX_TOP_ALTERNATIVES = 19
MAX_ALTERNATIVE_CHARS = 50
MAX_SERVED_MODEL_CHARS = 200

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
    - ``answer``: the generated text (1..200 characters, not only whitespace), split into
      tokens at word starts, each word with its leading whitespace (" Paris is a city"
      -> " Paris", " is", " a", " city"). The same at any ``temperature`` (nothing is
      sampled). A request for more tokens repeats the answer verbatim from its first
      token, so ``max_tokens`` tokens are always sent (``finish_reason`` "length").
    - ``top_alternatives``: up to 19 distinct non-empty strings (<= 50 characters each),
      the runner-up tokens of every step in ``top_logprobs``: the chosen token first
      (logprob -0.05), then these (-4.0, -5.0, ...), an alternative equal to the chosen
      token left out.
    - ``served_model``: the model the engine really serves (listed by ``/v1/models`` and
      the engine's info endpoint), or None for the configured model. Requests are still
      accepted under the configured name: wrong weights behind the right name.
    - ``metrics``: what ``GET /metrics`` does, one of :data:`METRICS_MODES`.
    - ``metrics_waiting``: if set (an integer >= 0), the waiting-requests gauge reports it
      instead of the live count (e.g. 12: a saturated engine).
    - ``metrics_kv_cache``: if set (0..1), the KV-cache usage gauge reports it instead of
      ``in_flight / max_num_seqs``.
    - ``info``: what ``GET /v1/models`` and the engines' info endpoints do, one of
      :data:`INFO_MODES`.
    - ``affects``: one of :data:`AFFECTS_MODES`. "all" (default): the fault applies to every
      inference request. "users": only to requests without ``X-LLM-Probe: true``; probes
      are served normally (no ``fault_rate`` draw, no ``slow_under_load`` extra TTFT): an
      engine whose failures only real traffic sees.
    - ``slots``: if set (an integer >= 1), at most this many inference requests are
      admitted at once (from prefill to their last token, as vLLM's ``--max-num-seqs``);
      the others, probes too, wait their turn in arrival order after their headers: a
      saturated engine with a queue, whose admission counter advances each time one
      finishes and the next starts. null: no limit.
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
    answer: str = DEFAULT_ANSWER
    top_alternatives: tuple[str, ...] = DEFAULT_TOP_ALTERNATIVES
    served_model: str | None = None
    metrics: str = "ok"
    metrics_waiting: int | None = None
    metrics_kv_cache: float | None = None
    info: str = "ok"
    affects: str = "all"
    slots: int | None = None

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
        if self.info not in INFO_MODES:
            raise ValueError(f'"info": must be one of {", ".join(INFO_MODES)}, got {self.info!r}')
        if self.affects not in AFFECTS_MODES:
            raise ValueError(
                f'"affects": must be one of {", ".join(AFFECTS_MODES)}, got {self.affects!r}'
            )
        slots = self.slots
        if slots is not None and (
            isinstance(slots, bool) or not isinstance(slots, int) or slots < 1
        ):
            raise ValueError(f'"slots": must be null or an integer >= 1, got {slots!r}')
        self._check_generation()
        self._check_metrics()

    def _check_generation(self) -> None:
        """Validate ``answer``, ``top_alternatives`` and ``served_model``."""
        answer = self.answer
        if not isinstance(answer, str) or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
            raise ValueError(
                f'"answer": must be a string of 1..{MAX_ANSWER_CHARS} characters, not only '
                f"whitespace, got {answer!r}"
            )
        alternatives = self.top_alternatives
        if isinstance(alternatives, list):  # a Python caller's list: keep the spec hashable
            alternatives = tuple(alternatives)
            object.__setattr__(self, "top_alternatives", alternatives)
        if not isinstance(alternatives, tuple) or len(alternatives) > MAX_TOP_ALTERNATIVES:
            raise ValueError(
                f'"top_alternatives": must be a list of at most {MAX_TOP_ALTERNATIVES} '
                f"strings, got {alternatives!r}"
            )
        for item in alternatives:
            if not isinstance(item, str) or not 1 <= len(item) <= MAX_ALTERNATIVE_CHARS:
                raise ValueError(
                    f'"top_alternatives": every entry must be a string of '
                    f"1..{MAX_ALTERNATIVE_CHARS} characters, got {item!r}"
                )
        if len(set(alternatives)) != len(alternatives):
            raise ValueError(f'"top_alternatives": entries must be distinct, got {alternatives!r}')
        served = self.served_model
        if served is not None and (
            not isinstance(served, str) or not served or len(served) > MAX_SERVED_MODEL_CHARS
        ):
            raise ValueError(
                f'"served_model": must be null or a string of 1..{MAX_SERVED_MODEL_CHARS} '
                f"characters, got {served!r}"
            )

    def _check_metrics(self) -> None:
        """Validate ``metrics``, ``metrics_waiting`` and ``metrics_kv_cache``."""
        if self.metrics not in METRICS_MODES:
            raise ValueError(
                f'"metrics": must be one of {", ".join(METRICS_MODES)}, got {self.metrics!r}'
            )
        waiting = self.metrics_waiting
        if waiting is not None and (
            isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 0
        ):
            raise ValueError(f'"metrics_waiting": must be null or an integer >= 0, got {waiting!r}')
        kv_cache = self.metrics_kv_cache
        if kv_cache is not None and (
            isinstance(kv_cache, bool)
            or not isinstance(kv_cache, int | float)
            or not 0.0 <= kv_cache <= 1.0
        ):
            raise ValueError(
                f'"metrics_kv_cache": must be null or a number between 0 and 1, got {kv_cache!r}'
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
            "answer": self.answer,
            "top_alternatives": list(self.top_alternatives),
            "served_model": self.served_model,
            "metrics": self.metrics,
            "metrics_waiting": self.metrics_waiting,
            "metrics_kv_cache": self.metrics_kv_cache,
            "info": self.info,
            "affects": self.affects,
            "slots": self.slots,
        }

    def draw_ttft(self, rng: random.Random) -> float:
        """Return one TTFT sample in seconds: ``ttft ± ttft_jitter``, never negative."""
        if self.ttft_jitter == 0:
            return self.ttft
        return max(0.0, self.ttft + rng.uniform(-self.ttft_jitter, self.ttft_jitter))


def _decode_field(key: object, value: object) -> object:
    """Decode one JSON field of a fault spec, or raise ValueError naming ``key``."""
    if key in ("fault", "health", "metrics", "answer", "info", "affects"):
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
    if key == "top_alternatives":
        if not isinstance(value, list):
            raise ValueError(f'"top_alternatives": must be a list of strings, got {value!r}')
        return tuple(value)  # entries checked by FaultSpec
    if key == "served_model":
        if value is not None and not isinstance(value, str):
            raise ValueError(f'"served_model": must be null or a string, got {value!r}')
        return value
    if key == "slots":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f'"slots": must be null or an integer >= 1, got {value!r}')
        return value
    if key == "metrics_waiting":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f'"metrics_waiting": must be null or an integer >= 0, got {value!r}')
        return value
    if key == "metrics_kv_cache":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f'"metrics_kv_cache": must be null or a number between 0 and 1, got {value!r}'
            )
        return float(value)
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
