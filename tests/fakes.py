"""``FakeControl``: a ``core.control.BoardControl`` written for the tests, apart from the
runtime's ``app.keeper.BoardKeeper``. Components are built on it in
tests/unit/core/test_fake_control.py: that they work on it proves they need nothing
of the keeper (nor the runtime) beyond the protocol (docs/design.md §8.2).

It holds a real ``model.Board`` (the domain is not faked), publishes every update as a
snapshot it keeps in ``published_snapshots``, records what components tell it
(``notified``, ``announced``, ``shared``) and answers ``probe_now`` with ``probe_result``.
Single event loop, like the keeper.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from llm_health.core.control import (
    ActionObserver,
    Mutation,
    Notice,
    NoticeObserver,
    OperatorAction,
    ProbeObserver,
    TransitionObserver,
)
from llm_health.model.board import Board, HealthSnapshot
from llm_health.model.machine import Transition
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

T = TypeVar("T")


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeControl:
    board: Board
    clock: Callable[[], float] = field(default_factory=Clock)
    probe_result: ProbeResult = field(
        default_factory=lambda: ProbeResult(Outcome.FAST, started_at=0.0, ttft_ms=20.0)
    )
    published_snapshots: list[HealthSnapshot] = field(default_factory=list)
    notified: list[tuple[str, str, Transition]] = field(default_factory=list)
    announced: list[Notice] = field(default_factory=list)
    shared: list[OperatorAction] = field(default_factory=list)
    probed: list[tuple[str, str]] = field(default_factory=list)
    transition_observers: list[TransitionObserver] = field(default_factory=list)
    probe_observers: list[ProbeObserver] = field(default_factory=list)
    notice_observers: list[NoticeObserver] = field(default_factory=list)
    action_observers: list[ActionObserver] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.published_snapshots.append(self.board.snapshot())

    # --- reading

    def snapshot(self) -> HealthSnapshot:
        return self.board.snapshot()

    def published(self) -> HealthSnapshot:
        return self.published_snapshots[-1]

    async def wait_newer(self, revision: int) -> HealthSnapshot:
        while self.published().revision == revision:
            self._changed.clear()
            await self._changed.wait()
        return self.published()

    # --- changing

    async def update(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        return self.update_now(mutate, publish_when=publish_when)

    def update_now(
        self, mutate: Mutation[T], *, publish_when: Callable[[T], bool] | None = None
    ) -> T:
        value = mutate(self.board, self.clock())
        if publish_when is None or publish_when(value):
            self.published_snapshots.append(self.board.snapshot())
            self._changed.set()
        return value

    # --- telling

    def notify(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        self.notified.append((cluster, address, transition))
        for observe in self.transition_observers:
            observe(cluster, address, transition, result)

    def on_transition(self, observer: TransitionObserver) -> None:
        self.transition_observers.append(observer)

    def on_probe(self, observer: ProbeObserver) -> None:
        self.probe_observers.append(observer)

    def announce(self, notice: Notice) -> None:
        self.announced.append(notice)
        for observe in self.notice_observers:
            observe(notice)

    def on_notice(self, observer: NoticeObserver) -> None:
        self.notice_observers.append(observer)

    def share_action(self, action: OperatorAction) -> None:
        self.shared.append(action)
        for observe in self.action_observers:
            observe(action)

    def on_action(self, observer: ActionObserver) -> None:
        self.action_observers.append(observer)

    async def probe_now(self, cluster: str, address: str) -> tuple[ProbeResult, bool]:
        if not self.board.has_endpoint(cluster, address):
            raise KeyError(f"{cluster}/{address}")
        self.probed.append((cluster, address))
        return self.probe_result, True

    # --- reads added for features

    def first_seen(self, cluster: str, address: str) -> float | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address).first_seen

    def policy(self, cluster: str) -> Policy:
        return self.board.policy(cluster)

    def probe_state(self, cluster: str, address: str) -> State | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address).state

    def endpoint_health(
        self, cluster: str, address: str
    ) -> tuple[EndpointHealth, ProbeResult | None] | None:
        if not self.board.has_endpoint(cluster, address):
            return None
        return self.board.health(cluster, address), self.board.last_result(cluster, address)
