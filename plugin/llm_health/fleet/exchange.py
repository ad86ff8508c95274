"""What the fleet exchanges through Redis (docs/design.md §12): the verdicts of the
endpoints we own, published on every change; the verdicts of the others' endpoints,
adopted into the board only from their current owner (``verdicts``); the operators'
actions, shared and applied everywhere (``actions``). ``FleetComponent`` runs the
membership and owns this exchange: ``publisher`` and ``events`` are two of its tasks.

Everything read from Redis is decoded by ``fleet.wire`` (untrusted); a bad entry is
counted and logged (``problem``), never applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from llm_health.core.control import BoardControl, OperatorAction
from llm_health.fleet import actions
from llm_health.fleet.membership import Roster
from llm_health.fleet.ownership import endpoint_key, split_key
from llm_health.fleet.settings import FleetConfig
from llm_health.fleet.store import FleetStore, RedisFailure, failure_name, stop_if_cancelled
from llm_health.fleet.verdicts import (
    Ledger,
    acceptable,
    adopt,
    fresh,
    taken_as_is,
    takeover,
    verdict_of,
)
from llm_health.fleet.wire import (
    Action,
    Verdict,
    WireError,
    decode_action,
    decode_stored,
    verdict_body,
)
from llm_health.model.board import Board
from llm_health.model.machine import Transition

log = logging.getLogger("llm_health")


class Exchange:
    """Verdicts and operator actions between this replica's board and Redis. One owner
    (``FleetComponent``), on the event loop. ``counters``: the component's (``fleet.
    counters``), counted here; ``problem(kind, message)``: its rate-limited problem log;
    ``beat_soon``: heartbeat now (our member list or epoch is stale)."""

    def __init__(
        self,
        settings: FleetConfig,
        member: str,
        control: BoardControl,
        store: FleetStore,
        roster: Roster,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        counters: dict[str, int],
        problem: Callable[[str, str], None],
        beat_soon: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.me = member
        self._control = control
        self._store = store
        self._roster = roster
        self._clock = clock
        self._wall_clock = wall_clock
        self.counters = counters
        self._problem = problem
        self._beat_soon = beat_soon
        self.ledger = Ledger()
        self.synced_at = clock()
        self._pending: dict[str, None] = {}  # owned keys whose verdict is to publish
        self._publish_wake = asyncio.Event()

    def drop_pending(self) -> None:
        """Fallback: nothing of ours is to publish (we own nothing)."""
        self._pending.clear()

    # --- verdicts out ---------------------------------------------------------------------

    async def take_over(self, keys: frozenset[str]) -> None:
        """Endpoints now ours continue from their last stored verdict, then carry our
        name (docs/design.md §12.5)."""
        self.counters["takeovers_total"] += len(keys)
        stored = self._decode_all(await self._store.stored(sorted(keys)))
        plan = takeover(keys, stored, self._roster, self.ledger)
        await self._adopt_all(plan.adopt)
        for key in plan.publish:
            self._pending[key] = None
        self._publish_wake.set()
        log.info("fleet: took over endpoints", extra={"endpoints": len(keys)})

    def on_transition(self, cluster: str, address: str, transition: Any, result: Any) -> None:
        key = endpoint_key(cluster, address)
        if self._roster.owns(key):
            self._pending[key] = None
            self._publish_wake.set()

    def republish_owned(self) -> None:
        """After an outage: Redis may have lost what we published (a restart)."""
        for key in self._roster.owned:
            self._pending[key] = None
        self._publish_wake.set()

    async def publisher(self) -> None:
        while True:
            stop_if_cancelled()
            await self._publish_wake.wait()
            self._publish_wake.clear()
            epoch = self._roster.write_epoch
            if epoch is None:
                self._pending.clear()
                continue
            keys, self._pending = list(self._pending), {}
            items = [
                (k, verdict_body(v)) for k in keys if (v := self._verdict_of(k, epoch)) is not None
            ]
            try:
                statuses = await self._store.publish(epoch, items)
            except RedisFailure as exc:
                self.counters["redis_errors_total"] += 1
                self._problem("publish", f"fleet: publishing verdicts failed ({failure_name(exc)})")
                continue
            self.counters["verdicts_published_total"] += statuses.count("ok")
            self.counters["verdicts_fenced_total"] += statuses.count("fenced")
            self.counters["verdicts_not_owner_total"] += statuses.count("not_owner")
            if any(s != "ok" for s in statuses):
                self._beat_soon()  # our member list or epoch is stale: heartbeat now

    def _verdict_of(self, key: str, epoch: int) -> Verdict | None:
        cluster, address = split_key(key)
        found = self._control.endpoint_health(cluster, address)
        if found is None:
            return None
        health, last = found
        wall_offset = self._wall_clock() - self._clock()
        return verdict_of(
            cluster, address, health, last, owner=self.me, epoch=epoch, wall_offset=wall_offset
        )

    # --- verdicts in ----------------------------------------------------------------------

    async def events(self) -> None:
        while True:
            stop_if_cancelled()
            try:
                async for data in self._store.events():
                    stop_if_cancelled()
                    await self._on_event(data)
            except RedisFailure as exc:
                self._problem("events", f"fleet: event stream lost ({failure_name(exc)})")
            await asyncio.sleep(self.settings.heartbeat)
            if self._roster.sharing:
                with contextlib.suppress(*RedisFailure):
                    await self.sync(warm=False)  # what we may have missed meanwhile

    async def _on_event(self, data: bytes) -> None:
        kind, _, rest = data.partition(b"\n")
        try:
            if kind == b"v":
                key_bytes, _, stored = rest.partition(b"\n")
                key = key_bytes.decode()
                verdicts = [decode_stored(key, stored)]
                await self._adopt_all(acceptable(verdicts, self._roster, self.ledger))
            elif kind == b"a":
                await self._apply_action(decode_action(rest))
            elif kind == b"m":
                self._beat_soon()  # membership changed: learn it now, not in a second
        except (WireError, UnicodeDecodeError, ValueError, KeyError) as exc:
            self.counters["verdicts_rejected_total"] += 1
            self._problem("event", f"fleet: unusable event ({failure_name(exc)})")

    async def sync(self, *, warm: bool) -> None:
        """Read every stored verdict. ``warm``: at start, adopt every fresh one (younger
        than ``fresh``, whoever wrote it: it was the owner when it was written);
        otherwise only by the fencing rules."""
        stored = await self._store.verdicts()
        self.synced_at = self._clock()
        verdicts = self._decode_all(stored)
        if warm:
            now_ms = self._roster.server_now_ms(self._wall_clock())
            await self._adopt_all(
                fresh(verdicts, self._roster.members, now_ms, self.settings.fresh)
            )
            return
        await self._adopt_all(acceptable(verdicts, self._roster, self.ledger))

    async def _adopt_all(self, verdicts: Iterable[Verdict]) -> None:
        offered = list(verdicts)
        if not offered:
            return
        wall_now = self._wall_clock()

        def adopt_and_log(board: Board, now: float) -> list[tuple[Verdict, Transition]]:
            adopted = adopt(board, now, offered, wall_now)
            for verdict, transition in adopted:
                if transition.changed:
                    log.info(
                        "state change from the fleet",
                        extra={
                            "cluster": verdict.cluster,
                            "endpoint": verdict.address,
                            "from": transition.from_state.value,
                            "to": transition.to_state.value,
                            "reason": verdict.reason,
                            "owner": verdict.owner,
                        },
                    )
            return adopted

        adopted = await self._control.update(adopt_and_log, publish_when=bool)
        self.ledger.record(taken_as_is(adopted))
        self.counters["verdicts_applied_total"] += len(adopted)

    def _decode_all(self, stored: dict[str, bytes]) -> list[Verdict]:
        verdicts = []
        for key, text in stored.items():
            try:
                verdicts.append(decode_stored(key, text))
            except WireError as exc:
                self.counters["verdicts_rejected_total"] += 1
                self._problem("verdict", f"fleet: unusable stored verdict ({exc})")
        return verdicts

    # --- operator actions ------------------------------------------------------------------

    def on_action(self, action: OperatorAction) -> None:
        epoch = self._roster.write_epoch
        if epoch is None:
            log.warning(
                "fleet: operator action applied on this replica only (no Redis)",
                extra={"cluster": action.cluster, "endpoint": action.address, "kind": action.kind},
            )
            return
        shared = actions.shared(action, self.me)
        asyncio.get_running_loop().create_task(self._share(epoch, shared))

    async def _share(self, epoch: int, action: Action) -> None:
        try:
            status = await self._store.act(
                epoch, endpoint_key(action.cluster, action.address), action
            )
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            self._problem("act", f"fleet: sharing an operator action failed ({failure_name(exc)})")
            return
        if status == "ok":
            self.counters["actions_shared_total"] += 1

    async def apply_overrides(self) -> None:
        """At start: the operators' forced states still running in the fleet."""
        for text in (await self._store.overrides()).values():
            try:
                action = decode_action(text)
            except WireError as exc:
                self._problem("override", f"fleet: unusable stored override ({exc})")
                continue
            if actions.still_forced(action, self._wall_clock()):
                await self._apply_action(action, own_ok=True)

    async def _apply_action(self, action: Action, *, own_ok: bool = False) -> None:
        if action.sender == self.me and not own_ok:
            return
        cluster, address = action.cluster, action.address
        if self._control.endpoint_health(cluster, address) is None:
            return
        transition = await self._control.update(actions.mutation(action, self._wall_clock()))
        if transition is not None and transition.changed:
            self._control.notify(cluster, address, transition, None)
        self.counters["actions_applied_total"] += 1
        log.info(
            "operator action from the fleet",
            extra={
                "cluster": cluster,
                "endpoint": address,
                "kind": action.kind,
                "sender": action.sender,
            },
        )
