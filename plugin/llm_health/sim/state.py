"""The simulator's state: its fixed settings, current fault, counters and gauges.

One :class:`SimState` exists per application and every port served shares it; there is
no module-level mutable state. Nothing here knows about HTTP: the aiohttp application
(:mod:`llm_health.sim.app`) and the per-request accounting (:mod:`llm_health.sim.call`)
read and update it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from llm_health.sim.engines import ENGINE_NAMES
from llm_health.sim.faults import FaultSpec
from llm_health.sim.histogram import E2E_BUCKETS, TTFT_BUCKETS, LatencyHistogram

__all__ = ["SimCounters", "SimSettings", "SimState"]


@dataclass(frozen=True)
class SimSettings:
    """Fixed settings of one simulator application.

    - ``model``: the only model name served (``/v1/models``, responses, metric labels).
    - ``fault``: the fault spec in force when the server starts.
    - ``seed``: seed of the RNG behind ``ttft_jitter`` and ``fault_rate`` (None: random).
    - ``max_num_seqs``: capacity used to derive ``vllm:kv_cache_usage_perc``.
    - ``accept_any_model``: if False, a request naming another model gets 404 (as vLLM).
    - ``api_key``: if set, ``/v1/*`` requires ``Authorization: Bearer <api_key>`` (401).
    - ``recent_size``: how many recent inference requests ``/sim/stats`` keeps.
    - ``engine``: the engine flavour played, one of
      :data:`~llm_health.sim.engines.ENGINE_NAMES` ("vllm", "sglang", "tgi", "llamacpp"):
      its ``/metrics`` gauge names and its info endpoint (:mod:`llm_health.sim.engines`).
    - ``record_first_tokens``: if N > 0, keep per listening port the wall-clock times
      (``time.time()``) of the last N first-token writes of probe requests, shown in
      ``/sim/stats`` as ``first_token_writes`` (0: off, the key is absent).
    """

    model: str = "sim-model"
    fault: FaultSpec = field(default_factory=FaultSpec)
    seed: int | None = None
    max_num_seqs: int = 256
    accept_any_model: bool = False
    api_key: str | None = None
    recent_size: int = 100
    engine: str = "vllm"
    record_first_tokens: int = 0

    def __post_init__(self) -> None:
        """Reject settings no simulator can run with (ValueError naming the field)."""
        if not self.model:
            raise ValueError("model: must not be empty")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be at least 1, got {self.max_num_seqs}")
        if self.recent_size < 0:
            raise ValueError(f"recent_size: must not be negative, got {self.recent_size}")
        if self.record_first_tokens < 0:
            value = self.record_first_tokens
            raise ValueError(f"record_first_tokens: must not be negative, got {value}")
        if self.engine not in ENGINE_NAMES:
            known = ", ".join(ENGINE_NAMES)
            raise ValueError(f"engine: must be one of {known}, got {self.engine!r}")


@dataclass
class SimCounters:
    """Counters shown by ``/sim/stats``; all zeroed by ``POST /sim/stats/reset``."""

    requests: int = 0
    probe_requests: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    faulted: int = 0
    bad_requests: int = 0
    unauthorized: int = 0
    logprobs_requests: int = 0


class SimState:
    """Mutable state of one simulator: current fault, counters, in-flight gauges and the
    latency histograms of ``/metrics`` (``ttft``: arrival to first token; ``e2e``: arrival
    to the end of a completed response).

    Single-threaded by design (the asyncio loop); shared by every port of the app.
    """

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.fault = settings.fault
        self.fault_set_at = time.monotonic()
        self.started_at = time.monotonic()
        self.rng = random.Random(settings.seed)
        self.counters = SimCounters()
        self.paths: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=settings.recent_size)
        self.ttft = LatencyHistogram(TTFT_BUCKETS)
        self.e2e = LatencyHistogram(E2E_BUCKETS)
        #: listening port -> wall-clock times of recent probe first-token writes
        #: (``record_first_tokens``; empty while it is 0).
        self.first_token_writes: dict[int, deque[float]] = {}
        self.in_flight = 0
        self.running = 0
        #: The engine's own counters, never reset (``/metrics``): prompt tokens prefilled
        #: (admission, ``sim.admission``) and tokens generated (decode).
        self.prompt_tokens = 0
        self.admissions = 0
        self.generation_tokens = 0
        #: Requests admitted and not finished (holding one of ``FaultSpec.slots``), and
        #: those waiting for admission, in arrival order.
        self.admitted = 0
        self.admission_queue: deque[object] = deque()
        #: ``/metrics`` as it was when the engine froze (fault "frozen"), else None.
        self.frozen_metrics: str | None = None
        self.stopping = False
        self._stop_signal: asyncio.Future[None] | None = None

    @property
    def waiting(self) -> int:
        """In-flight inference requests that have not produced a token yet."""
        return self.in_flight - self.running

    @property
    def served_model(self) -> str:
        """The model the engine really serves: the ``served_model`` knob, else ``model``."""
        return self.fault.served_model or self.settings.model

    @property
    def last_request(self) -> dict[str, Any] | None:
        """The record of the most recent inference request, or None."""
        return self.recent[-1] if self.recent else None

    def set_fault(self, spec: FaultSpec) -> None:
        """Make ``spec`` the current fault; restarts the ``startup_delay`` clock. Leaving
        "frozen" thaws the engine's /metrics."""
        if spec.fault != "frozen":
            self.frozen_metrics = None
        self.fault = spec
        self.fault_set_at = time.monotonic()

    def choose_fault(self, spec: FaultSpec, is_probe: bool = False) -> str:
        """Return the fault to apply to one new request under ``spec`` ("none" if spared).

        With ``affects`` "users" a probe is always spared (and draws nothing from the RNG,
        so probes do not shift which user requests ``fault_rate`` picks). ``fault_rate``
        decides with the seeded RNG; ``startup_delay`` is spared once its delay since
        :meth:`set_fault` has passed.
        """
        if spec.fault == "none" or (is_probe and spec.affects == "users"):
            return "none"
        if spec.fault_rate < 1.0 and self.rng.random() >= spec.fault_rate:
            return "none"
        if spec.fault == "startup_delay" and self.startup_elapsed(spec):
            return "none"
        return spec.fault

    def startup_elapsed(self, spec: FaultSpec) -> bool:
        """True once ``spec.startup_delay`` has passed since the fault was set."""
        return time.monotonic() - self.fault_set_at >= spec.startup_delay

    def record_first_token_write(self, port: int, written_at: float) -> None:
        """Keep ``written_at`` (``time.time()``) in ``port``'s ring of the last
        ``record_first_tokens`` probe first-token writes (nothing if that is 0)."""
        size = self.settings.record_first_tokens
        if size <= 0:
            return
        ring = self.first_token_writes.get(port)
        if ring is None:
            ring = self.first_token_writes[port] = deque(maxlen=size)
        ring.append(written_at)

    def reset_stats(self) -> None:
        """Zero counters, histograms, path counts and the recent-request log (gauges stay);
        empty the first-token write rings."""
        self.counters = SimCounters()
        self.first_token_writes.clear()
        self.ttft.reset()
        self.e2e.reset()
        self.paths.clear()
        self.recent.clear()

    def stop_signal(self) -> asyncio.Future[None]:
        """A future of the running loop, resolved when the application shuts down."""
        if self._stop_signal is None:
            self._stop_signal = asyncio.get_running_loop().create_future()
            if self.stopping:
                self._stop_signal.set_result(None)
        return self._stop_signal

    def begin_shutdown(self) -> None:
        """Release every pending wait: called from the application's on_shutdown."""
        self.stopping = True
        if self._stop_signal is not None and not self._stop_signal.done():
            self._stop_signal.set_result(None)

    def stats(self) -> dict[str, Any]:
        """The JSON document served by ``GET /sim/stats`` (``first_token_writes`` only
        with ``record_first_tokens`` on)."""
        document: dict[str, Any] = {
            **asdict(self.counters),
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "running": self.running,
            "admitted": self.admitted,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "paths": dict(self.paths),
            "fault": self.fault.to_json(),
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "last_request": self.last_request,
            "recent": list(self.recent),
        }
        if self.settings.record_first_tokens > 0:
            writes = self.first_token_writes.items()
            document["first_token_writes"] = {str(port): list(ring) for port, ring in writes}
        return document
