"""BoardKeeper: the runtime's ``BoardControl``. It owns the board, the snapshot hub and the
observers; every change of the board goes through it and is published by ``_publish``,
the one publish path (xDS streams, ext_authz and HDS wake on it).

Single-owner: everything runs on the runtime's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from llm_health.core.control import (
    ActionObserver,
    Mutation,
    Notice,
    NoticeObserver,
    OperatorAction,
    ProbeObserver,
    ProberStats,
    TransitionObserver,
)
from llm_health.core.hub import SnapshotHub
from llm_health.core.problems import ProblemLog
from llm_health.model.board import Board, HealthSnapshot
from llm_health.model.machine import Transition, trusted
from llm_health.model.outcome import FAILURES, Outcome, ProbeResult, timings
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

T = TypeVar("T")
ProbeNow = Callable[[str, str], Awaitable[ProbeResult]]  # (cluster, address) -> result
log = logging.getLogger("llm_health")
IGNORED_LOG_EVERY_S = 10.0
IGNORED_COUNT_FIELD = "also_ignored_since_last_line"


class BoardKeeper:
    def __init__(self, board: Board, clock: Callable[[], float], stats: ProberStats) -> None:
        self.board = board
        self.stats = stats
        self._clock = clock
        self.hub = SnapshotHub(board.snapshot())
        self._probe_observers: list[ProbeObserver] = []
        self._transition_observers: list[TransitionObserver] = []
        self._notice_observers: list[NoticeObserver] = []
        self._action_observers: list[ActionObserver] = []
        self._probe_now: ProbeNow | None = None
        self._publish_pending = False  # a publish asked for, in the next loop turn
        self._ignored = ProblemLog(
            log, every_s=IGNORED_LOG_EVERY_S, count_field=IGNORED_COUNT_FIELD, clock=clock
        )

    # --- reading ------------------------------------------------------------------------

    def snapshot(self) -> HealthSnapshot:
        return self.board.snapshot()

    def published(self) -> HealthSnapshot:
        return self.hub.current()

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        return await self.hub.wait_newer(revision)

    # --- changing -----------------------------------------------------------------------

    async def update(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        return self.update_now(mutate, publish_when=publish_when)

    def update_now(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        result = mutate(self.board, self._clock())
        if publish_when is None or publish_when(result):
            self._publish()
        return result

    async def fold_probe(self, cluster: str, address: str, result: ProbeResult) -> None:
        """Fold a scheduled (or probe-now) result in, and publish what it changed."""
        self.fold_result(cluster, address, result)
        self._publish_due()

    def fold_result(self, cluster: str, address: str, result: ProbeResult) -> None:
        """Fold a result in now (the scheduler's way: no task, no wait). When what Envoy
        sees may change (a state, or a cluster becoming warm), a publish follows in the
        next loop turn, one for every change folded before it: a first round's thousands
        of state changes cost a snapshot a turn, not a task each (two, with the
        scheduler's wait for it). A FAST probe on a HEALTHY endpoint wakes no xDS stream."""
        board = self.board
        if not board.has_endpoint(cluster, address):
            return None  # removed by a reload while this probe was in flight
        self.stats.probes_total += 1
        if not trusted(result, board.policy(cluster)):
            self.stats.probes_ignored_loop_lag += 1
            self._log_ignored(cluster, address, result)
            return None
        for observe in self._probe_observers:
            observe(cluster, address, result)
        was_warm = board.is_warm(cluster)
        transition = board.record(cluster, address, result, self._clock())
        if transition.changed or transition.alert:
            self.notify(cluster, address, transition, result)
        if transition.changed or (not was_warm and board.is_warm(cluster)):  # never unwarms
            self._publish_soon()
        return None

    def _publish_soon(self) -> None:
        if not self._publish_pending:
            self._publish_pending = True
            asyncio.get_running_loop().call_soon(self._publish_due)

    def _publish_due(self) -> None:
        """The publish ``_publish_soon`` asked for, unless done already."""
        if self._publish_pending:
            self._publish()

    def _log_ignored(self, cluster: str, address: str, result: ProbeResult) -> None:
        """At most one line per IGNORED_LOG_EVERY_S, with how many were left out: an
        overloaded prober ignores every probe, and a log line per probe would add to the
        load that made it lag (the counter has them all)."""
        fields = {"cluster": cluster, "endpoint": address, **timings(result)}
        self._ignored.report("probe ignored", "probe ignored: prober event loop lagged", fields)

    async def fold_silence(self, cluster: str, address: str, silent_ms: float) -> bool:
        """A probe of this endpoint is still silent in flight after ``silent_ms``: a HEALTHY
        endpoint goes DEGRADED now (``Board.silence``). Returns whether the scheduler should
        start the confirming probe now, beside the silent one: the endpoint was just
        silenced, or its last trusted probe already failed. Ignored while the loop lags
        beyond ``max_loop_lag`` (the silence may be ours)."""
        if not self.board.has_endpoint(cluster, address):
            return False
        if self.stats.lag_now_ms() > self.board.policy(cluster).max_loop_lag_s * 1000:
            self.stats.silences_ignored_loop_lag += 1
            return False
        transition = self.board.silence(cluster, address, self._clock(), silent_ms)
        if transition.changed:
            self.notify(cluster, address, transition, None)
            self._publish()
        health = self.board.health(cluster, address)
        # A DEGRADED endpoint whose probes were FAST (held there by a limit: saturated,
        # quality) falls silent as meaningfully as a HEALTHY one: confirm beside it too.
        fast_but_limited = health.state is State.DEGRADED and health.last_outcome is Outcome.FAST
        return transition.changed or fast_but_limited or health.last_outcome in FAILURES

    def _publish(self) -> None:
        self._publish_pending = False  # this one publishes every change before it
        self.hub.put(self.board.snapshot())

    # --- telling ------------------------------------------------------------------------

    def notify(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        if transition.changed:
            _log_transition(cluster, address, result, transition)
        for observe in self._transition_observers:
            observe(cluster, address, transition, result)

    def on_transition(self, observer: TransitionObserver) -> None:
        self._transition_observers.append(observer)

    def on_probe(self, observer: ProbeObserver) -> None:
        self._probe_observers.append(observer)

    def announce(self, notice: Notice) -> None:
        for observe in self._notice_observers:
            observe(notice)

    def on_notice(self, observer: NoticeObserver) -> None:
        self._notice_observers.append(observer)

    def share_action(self, action: OperatorAction) -> None:
        for observe in self._action_observers:
            observe(action)

    def on_action(self, observer: ActionObserver) -> None:
        self._action_observers.append(observer)

    # --- probing ------------------------------------------------------------------------

    def attach_prober(self, probe_now: ProbeNow | None) -> None:
        """Set (or clear, with None) what ``probe_now`` runs: the runtime's prober."""
        self._probe_now = probe_now

    async def probe_now(self, cluster: str, address: str) -> tuple[ProbeResult, bool]:
        if self._probe_now is None:
            raise RuntimeError("the prober is not running yet")
        result = await self._probe_now(cluster, address)
        await self.fold_probe(cluster, address, result)
        return result, trusted(result, self.board.policy(cluster))

    # --- for remediation

    def first_seen(self, cluster: str, address: str) -> float | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address).first_seen

    def policy(self, cluster: str) -> Policy:
        return self.board.policy(cluster)

    # --- for traffic

    def probe_state(self, cluster: str, address: str) -> State | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address).state

    # --- for fleet

    def endpoint_health(
        self, cluster: str, address: str
    ) -> tuple[EndpointHealth, ProbeResult | None] | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address), self.board.last_result(cluster, address)


def _log_transition(
    cluster: str, address: str, result: ProbeResult | None, transition: Transition
) -> None:
    fields: dict[str, Any] = {
        "cluster": cluster,
        "endpoint": address,
        "from": transition.from_state.value,
        "to": transition.to_state.value,
        "reason": transition.after.reason,
        "cause": transition.cause.value,
    }
    if result is not None:
        fields.update(timings(result))
    level = logging.WARNING if transition.alert else logging.INFO
    log.log(level, "state change", extra=fields)
