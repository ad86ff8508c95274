"""The micro-probe (docs/design.md §2): one streamed, one-token request; TTFT on the first
token-bearing event; the stream closed right after it so the engine aborts the request.

Never raises for anything the endpoint does: every failure becomes a ProbeResult.
Cancellation (shutdown) is the only exception that propagates.

The engine checks (``llm_health.engines``, a feature above this package) take part in
probing through two small seams declared here, so that this package never imports them:
``ProbeWrapper`` (the runtime starts probes through ``starter(prober)``; the request body
reads the engine they detected, ``engines``), and ``Question`` (what a known-answer probe
asks, passed to ``Prober.start_verify``). A probe is started (``probe.signals``: a
``Starter`` tells a ``ProbeReceiver``); an awaiting caller uses ``await_started``.
What the exchange itself does stays here, as the probe's own concern: the request body
per engine (``probe_body``, docs/design.md §14.4) and the reading of a known-answer
stream (``probe.answer``), which run inside the exchange and its timeout, in a probe
worker process as in the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from llm_health.probe._exchange import (
    MAX_ANSWER_BYTES,
    MAX_BYTES_BEFORE_TOKEN,
    MAX_ERROR_BODY,
    MAX_TAIL_BYTES,
    REUSE_GRACE_S,
    Exchange,
    Shared,
)
from llm_health.probe.alarms import Alarms
from llm_health.probe.http1 import Connections
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.request import (
    PROBE_HEADER,
    Question,
    Requests,
    cache_bust_for,
    probe_body,
    probe_request,
)
from llm_health.probe.signals import (
    ProbeReceiver,
    Started,
    Starter,
)
from llm_health.probe.target import ProbeTarget

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_BYTES_BEFORE_TOKEN",
    "MAX_ERROR_BODY",
    "MAX_TAIL_BYTES",
    "PROBE_HEADER",
    "REUSE_GRACE_S",
    "Asked",
    "MicroProbe",
    "ProbeWrapper",
    "Prober",
    "Question",
    "cache_bust_for",
    "new_connections",
    "probe_body",
    "probe_request",
]


def new_connections() -> Connections:
    """The prober's connections (``probe.http1``): ``async with new_connections() as c``.
    Their bytes are timed by the kernel where the system can (``Connections``)."""
    return Connections(stamped=True)


class Asked(NamedTuple):
    """A ``Question`` as plain data: what crosses the pipe to a probe worker."""

    prompt: str
    max_tokens: int


class Prober(Protocol):
    """What runs probes: ``MicroProbe`` here, or ``pool.WorkerPool`` in worker processes."""

    @property
    def stale_resends(self) -> int: ...

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """Probe once, telling ``receiver`` (``probe.signals``)."""
        ...

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """A known-answer probe asking ``question``, telling ``receiver``."""
        ...


class ProbeWrapper(Protocol):
    """A feature that takes part in every scheduled probe (the engine checks: docs/design.md
    §14). The runtime is given it by ``app.assemble``."""

    @property
    def engines(self) -> Mapping[str, str]:
        """The engine detected per endpoint key, read by the request body of a target
        with ``engine: auto`` (its cache bypass: docs/design.md §14.4)."""
        ...

    def starter(self, prober: Prober) -> Starter:
        """The scheduler's probe, started through ``prober`` (``probe.signals``):
        ``prober.start_probe`` itself when the feature has nothing to add to this probe."""
        ...


class MicroProbe:
    """Sends micro-probes over the prober's own HTTP/1.1 exchange (``probe.http1``).
    Task-safe: each call is independent.

    Each probe is an ``_exchange.Exchange`` driven by its connection's callbacks and one
    alarm, with no task: ``start_probe``, or ``start_verify`` for a known-answer probe (its
    answer read within one more ``timeout`` after the first token).

    A connection is kept for the next probe only when the whole answer followed its first
    token within ``REUSE_GRACE_S`` (``max_tokens`` 1: the engine ends the stream at once);
    otherwise it is closed, so the engine aborts the request (docs/design.md §2).

    ``engines``: the engine detected per endpoint key (``ProbeTarget.key``), read when a
    target says ``engine: auto`` (the request body bypasses the prefix cache by engine).
    """

    def __init__(
        self,
        connections: Connections,
        lag: LoopLagMonitor | None = None,
        engines: Mapping[str, str] | None = None,
    ) -> None:
        engines = engines if engines is not None else {}
        self._shared = Shared(connections, Alarms(), Requests(), engines, lag)

    @property
    def stale_resends(self) -> int:
        """Requests sent again after a dead kept connection (``_exchange.Exchange``)."""
        return self._shared.stale_resends

    def start_probe(self, target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        """Probe once, telling ``receiver`` (``probe.signals``); its result comes within
        ``target.timeout_s`` (plus scheduling)."""
        return self._begin(target, None, receiver)

    def start_verify(
        self, target: ProbeTarget, question: Question, receiver: ProbeReceiver
    ) -> Started:
        """``verify``, told to ``receiver`` as ``start_probe`` tells its result."""
        return self._begin(target, question, receiver)

    def engine_of(self, target: ProbeTarget) -> str | None:
        return self._shared.engine_of(target)

    def _begin(
        self, target: ProbeTarget, question: Question | None, receiver: ProbeReceiver
    ) -> Exchange:
        exchange = Exchange(self._shared, target, question, receiver)
        exchange.begin()
        return exchange
