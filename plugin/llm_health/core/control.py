"""What a component may do to endpoint health, and nothing more.

A component (HDS, admin API, alerts, metrics, and every later source of verdicts) is
given a ``BoardControl`` and its own settings, never the runtime. Through it, it can read
the board (``snapshot``: now; ``published``: what xDS readers have; ``wait_newer``),
change it (``update``: one mutation, then one publish), report a state change it caused
(``notify``: one log line, every transition observer), subscribe (``on_transition``,
``on_probe``) and ask for a probe (``probe_now``). The runtime owns the only
implementation (``app.keeper.BoardKeeper``); tests may write their own.

Observers are plain callables run synchronously on the runtime's loop: O(1), never
blocking, never raising.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from llm_health.model.board import Board, HealthSnapshot
from llm_health.model.machine import Transition
from llm_health.model.outcome import ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Notice:
    """An event about a cluster that is not an endpoint's state change, for alerts and
    logs: e.g. ``discovery_failed`` / ``discovery_recovered`` (docs/design.md §11.3).
    ``kind`` is an alert event name (``alerts.webhooks[].on``)."""

    kind: str
    cluster: str
    reason: str


NoticeObserver = Callable[[Notice], None]


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """An operator's action through the admin API, after it was applied here, for
    components that share it (fleet mode: every replica's board). ``kind``: drain,
    undrain, force, clear; ``state`` and ``until`` (wall seconds) for force only."""

    kind: str
    cluster: str
    address: str
    reason: str = ""
    state: State | None = None
    until: float | None = None


ActionObserver = Callable[[OperatorAction], None]
ProbeObserver = Callable[[str, str, ProbeResult], None]  # (cluster, address, result)
TransitionObserver = Callable[[str, str, Transition, ProbeResult | None], None]
Mutation = Callable[[Board, float], T]  # (board, monotonic now) -> anything


class SnapshotSource(Protocol):
    """Where readers (xDS streams, ext_authz) get published snapshots."""

    def current(self) -> HealthSnapshot:
        """The latest published snapshot; never blocks."""
        ...

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        """The first published snapshot whose revision differs from ``revision``."""
        ...


class BoardControl(Protocol):
    def snapshot(self) -> HealthSnapshot:
        """The board as it is now (may be newer than ``published``: last probe results)."""
        ...

    def published(self) -> HealthSnapshot:
        """What xDS streams and ext_authz see."""
        ...

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        """The first published snapshot whose revision differs from ``revision``."""
        ...

    async def update(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        """Run ``mutate(board, now)`` on the loop, publish the new board (unless
        ``publish_when(value)`` says nothing changed), and return the value."""
        ...

    def update_now(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        """``update`` from a callback on the loop (no task to await it in): the same
        mutation and publish, done before it returns."""
        ...

    def notify(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        """Report a transition this caller made (log once, tell every observer)."""
        ...

    def on_transition(self, observer: TransitionObserver) -> None: ...

    def on_probe(self, observer: ProbeObserver) -> None: ...

    def announce(self, notice: Notice) -> None:
        """Tell every notice observer (alerts) of a cluster-level event."""
        ...

    def on_notice(self, observer: NoticeObserver) -> None: ...

    def share_action(self, action: OperatorAction) -> None:
        """An operator action was applied here: tell every action observer (fleet)."""
        ...

    def on_action(self, observer: ActionObserver) -> None: ...

    async def probe_now(self, cluster: str, address: str) -> tuple[ProbeResult, bool]:
        """Probe one endpoint at once, fold the result in like a scheduled one; returns
        (result, trusted). KeyError: not probed here; RuntimeError: no prober running."""
        ...

    # --- for remediation

    def first_seen(self, cluster: str, address: str) -> float | None:
        """When the endpoint was first seen (monotonic seconds, the board's clock; a plugin
        restart is a first sight too); None: not on the board."""
        ...

    def policy(self, cluster: str) -> Policy:
        """The cluster's health policy in force. KeyError: unknown cluster."""
        ...

    # --- for traffic

    def probe_state(self, cluster: str, address: str) -> State | None:
        """The probe state machine's verdict on this endpoint now (the board's, not the
        published snapshot's); None when it is not on the board."""
        ...

    # --- for fleet

    def endpoint_health(
        self, cluster: str, address: str
    ) -> tuple[EndpointHealth, ProbeResult | None] | None:
        """The state machine's own health of an endpoint (its counters: what a fleet
        verdict carries) and its last result; None: not on the board."""
        ...


class LagReader(Protocol):
    """How late the prober's event loop runs (``probe.lag.LoopLagMonitor``)."""

    current_ms: float

    def max_since(self, start: float) -> float: ...


@dataclass(slots=True)
class ProberStats:
    """The prober's counters, shared read-only with /status and /metrics."""

    lag: LagReader
    # The probe workers' lag as the runtime sees it (docs/design.md §16.2), when they run.
    worker_lag_ms: Callable[[], float] | None = None
    probes_total: int = 0  # results received for endpoints still on the board
    probes_ignored_loop_lag: int = 0  # SLOW/TIMEOUT not trusted (max_loop_lag)
    silences_ignored_loop_lag: int = 0  # in-flight silences not acted on (max_loop_lag)
    overlapping_confirms: int = 0  # confirming probes started beside a silent one

    def lag_now_ms(self) -> float:
        """How late the prober runs now: its own loop, or a probe worker's."""
        workers = self.worker_lag_ms() if self.worker_lag_ms is not None else 0.0
        return max(self.lag.current_ms, workers)

    def status(self, stale_resends: int) -> dict[str, int | float]:
        """/status's ``prober`` section. ``stale_resends``: requests sent again because a
        pooled keep-alive connection had been closed by the server before it answered
        (llama.cpp does that)."""
        return {
            "probes_total": self.probes_total,
            "probes_ignored_loop_lag": self.probes_ignored_loop_lag,
            "silences_ignored_loop_lag": self.silences_ignored_loop_lag,
            "overlapping_confirms": self.overlapping_confirms,
            "stale_connection_resends": stale_resends,
            "loop_lag_ms": round(self.lag.current_ms, 2),
        }


class ProberLag:
    """How late the prober runs, for the scheduler's silence checks: the runtime's loop,
    or a probe worker's (``ProberStats.lag_now_ms``)."""

    def __init__(self, stats: ProberStats) -> None:
        self._stats = stats

    @property
    def current_ms(self) -> float:
        return self._stats.lag_now_ms()
