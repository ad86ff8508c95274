"""The ``fleet`` component: this replica as one member of a fleet sharing one probe per
endpoint through Redis (docs/design.md §12).

- Membership: join (a new epoch), heartbeat every ``heartbeat``; the heartbeat's answer
  is the live member list, from which every endpoint's owner follows (rendezvous).
- Probing: the catalog's probe filter lets the prober probe only the endpoints this
  replica owns; a takeover adopts the last stored verdict and probes at once.
- Verdicts: every state change of an owned endpoint is published (fenced in Redis); the
  verdicts of endpoints owned by others are adopted into the board (``Board.adopt``),
  only from the endpoint's current owner's current epoch and newer than the last one.
- Fallback: Redis unreachable for ``member_ttl`` (or at start): probe everything here,
  say so (log, /status, metric, alert); when Redis answers, join again, republish what
  we own, and go back to sharing.
- Operator actions taken here are shared with every replica (and applied when received).

Everything read from Redis is decoded by ``fleet.wire`` (untrusted); a bad entry is
counted and logged at most once per minute, never applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

import grpc
from prometheus_client.metrics_core import Metric
from redis.exceptions import RedisError

from llm_health.app.endpoints import EndpointCatalog
from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import Notice, OperatorAction
from llm_health.core.families import counter, gauge
from llm_health.fleet.ownership import endpoint_key, owner_of, split_key
from llm_health.fleet.settings import FleetSettings
from llm_health.fleet.store import FleetStore
from llm_health.fleet.wire import (
    Action,
    Member,
    Membership,
    Verdict,
    WireError,
    decode_action,
    decode_stored,
    rejection,
    verdict_body,
)
from llm_health.model.board import Board
from llm_health.model.outcome import FAILURES, ProbeResult
from llm_health.model.states import EndpointHealth, State

PROBLEM_LOG_EVERY_S = 60.0  # bad Redis entries: one log line per kind per minute
LEAVE_BUDGET_S = 0.3
FOLLOW_UP_BUDGET_S = 10.0  # takeover reads and full syncs after one heartbeat
FULL_SYNC_EVERY_S = 30.0  # read every stored verdict this often even if no event was lost
log = logging.getLogger("llm_health")
Job = Callable[[], Coroutine[Any, Any, None]]
RedisFailure = (RedisError, OSError, TimeoutError, WireError)
# ``FleetComponent.counters`` on /metrics: (series, key of the counter, what).
_FLEET_COUNTERS = (
    (
        "llm_health_fleet_verdicts_published_total",
        "verdicts_published_total",
        "Verdicts of owned endpoints published to Redis.",
    ),
    (
        "llm_health_fleet_verdicts_applied_total",
        "verdicts_applied_total",
        "Verdicts of the endpoints' owners adopted here.",
    ),
    (
        "llm_health_fleet_verdicts_rejected_total",
        "verdicts_rejected_total",
        "Verdicts and events read from Redis and refused (unusable).",
    ),
    (
        "llm_health_fleet_verdicts_fenced_total",
        "verdicts_fenced_total",
        "Verdicts Redis refused: not a live member with our epoch.",
    ),
    (
        "llm_health_fleet_verdicts_not_owner_total",
        "verdicts_not_owner_total",
        "Verdicts Redis refused: another member owns the endpoint.",
    ),
    ("llm_health_fleet_redis_errors_total", "redis_errors_total", "Redis commands that failed."),
    (
        "llm_health_fleet_fallbacks_total",
        "fallbacks_total",
        "Times this replica fell back to probing every endpoint.",
    ),
    (
        "llm_health_fleet_takeovers_total",
        "takeovers_total",
        "Endpoints taken over from a member that left.",
    ),
    (
        "llm_health_fleet_rejoins_total",
        "rejoins_total",
        "Times this replica joined the fleet again (a new epoch).",
    ),
    (
        "llm_health_fleet_actions_shared_total",
        "actions_shared_total",
        "Operator actions taken here shared with the fleet.",
    ),
    (
        "llm_health_fleet_actions_applied_total",
        "actions_applied_total",
        "Operator actions from other replicas applied here.",
    ),
)


class FleetComponent:
    name = "fleet"

    def __init__(
        self,
        settings: FleetSettings,
        keeper: BoardKeeper,
        catalog: EndpointCatalog,
        *,
        store: FleetStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.me = settings.member_id
        self._keeper = keeper
        self._catalog = catalog
        self._store = store or FleetStore(settings)
        self._clock = clock
        self._wall_clock = wall_clock
        self.mode = "starting"  # sharing | fallback
        self.epoch: int | None = None
        self.members: dict[str, Member] = {}
        self._owners: dict[str, str | None] = {}  # endpoint key -> owner (cache)
        self._owned: set[str] = set()
        self._applied: dict[str, int] = {}  # endpoint key -> seq of the verdict applied
        self._seen: dict[str, tuple[str, int]] = {}  # key -> (owner, published ms)
        self._pending: dict[str, None] = {}  # owned keys whose verdict is to publish
        self._publish_wake = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._last_ok = clock()
        self._synced_at = clock()
        self._server_offset_ms = 0.0  # Redis time - our wall time, from heartbeats
        self._problems: dict[str, float] = {}
        self.counters = {
            "verdicts_published_total": 0,
            "verdicts_applied_total": 0,
            "verdicts_rejected_total": 0,
            "verdicts_fenced_total": 0,  # refused: not a live member with our epoch
            "verdicts_not_owner_total": 0,  # refused: another member owns it (lists differ)
            "redis_errors_total": 0,
            "fallbacks_total": 0,
            "takeovers_total": 0,
            "rejoins_total": 0,
            "actions_shared_total": 0,
            "actions_applied_total": 0,
        }
        keeper.on_transition(self._on_transition)
        keeper.on_action(self._on_action)
        catalog.set_probe_filter(self._probes_here)
        catalog.on_targets(lambda _targets: self._endpoints_changed())

    # --- Component protocol -------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """No gRPC service."""

    def tasks(self) -> list[Job]:
        return [self._heartbeats, self._events, self._publisher]

    def status(self) -> dict[str, Any]:
        now_ms = self._wall_clock() * 1000 + self._server_offset_ms
        return {
            "mode": self.mode,
            "fallback": self.mode != "sharing",
            "member_id": self.me,
            "epoch": self.epoch,
            "redis": self.settings.where,
            "members": len(self.members),
            "member_ids": sorted(self.members),
            "owned_endpoints": len(self._owned) if self.mode == "sharing" else None,
            "redis_commands_total": self._store.commands,
            **self.counters,
            "endpoints": {key: self._endpoint_status(key, now_ms) for key in self._keys()},
        }

    def metrics(self) -> Iterator[Metric]:
        counters = self.counters
        yield gauge(
            "llm_health_fleet_fallback",
            "1 while this replica probes every endpoint itself (Redis unreachable, or starting).",
            self.mode != "sharing",
        )
        if self.epoch is not None:
            yield gauge("llm_health_fleet_epoch", "This replica's membership epoch.", self.epoch)
        yield gauge("llm_health_fleet_members", "Live fleet members.", len(self.members))
        if self.mode == "sharing":
            yield gauge(
                "llm_health_fleet_owned_endpoints",
                "Endpoints this replica owns (probes for the fleet).",
                len(self._owned),
            )
        yield counter(
            "llm_health_fleet_redis_commands_total", "Redis commands sent.", self._store.commands
        )
        for name, key, what in _FLEET_COUNTERS:
            yield counter(name, what, counters[key])

    async def prepare(self) -> None:
        """Before the first probe: join and adopt the fleet's fresh verdicts (warm start:
        this replica's Envoy gets the right weights without waiting for its own round).
        Redis unreachable: fallback at once, with a clear message."""
        try:
            await self._join()
            await self._sync(warm=True)
            await self._apply_overrides()
        except RedisFailure as exc:
            self._enter_fallback(
                f"Redis at {self.settings.where} unreachable at start ({_why(exc)})"
            )

    # --- ownership ----------------------------------------------------------------------

    def _probes_here(self, cluster: str, address: str) -> bool:
        return self.mode != "sharing" or endpoint_key(cluster, address) in self._owned

    def owner(self, key: str) -> str | None:
        if key not in self._owners:
            self._owners[key] = owner_of(key, self.members)
        return self._owners[key]

    def _keys(self) -> list[str]:
        snapshot = self._keeper.snapshot()
        return [
            endpoint_key(name, e.spec.address)
            for name, cluster in snapshot.clusters.items()
            for e in cluster.endpoints
        ]

    def _endpoints_changed(self) -> None:
        """Endpoints added or removed (reload, discovery): owners of new keys."""
        if self.mode == "sharing":
            owned = {k for k in self._keys() if self.owner(k) == self.me}
            if owned != self._owned:
                self._owned = owned  # a new key owned here: the catalog already refilters

    async def _set_members(self, membership: Membership) -> None:
        self._server_offset_ms = membership.now_ms - self._wall_clock() * 1000
        same = _epochs(membership.members) == _epochs(self.members)
        self.members = dict(membership.members)  # beats (verdict ages) are always fresh
        if same:
            return  # who is a member did not change: owners neither (the common case)
        self._owners.clear()
        owned = {k for k in self._keys() if self.owner(k) == self.me}
        gained = owned - self._owned
        self._owned = owned
        if gained and self.mode == "sharing":
            await self._take_over(gained)
        self._catalog.refilter()
        await self._sync(warm=False)  # verdicts refused under the old member list

    async def _take_over(self, keys: set[str]) -> None:
        """Endpoints now ours continue from their last stored verdict (no return to
        STARTING, no state change unless our own probes say so), then carry our name."""
        self.counters["takeovers_total"] += len(keys)
        verdicts = self._decode_all(await self._store.stored(sorted(keys)))
        await self._adopt_all(v for v in verdicts if self._handed_over(v))
        # Published in our name unless the stored verdict is already ours (a rejoin after
        # an eviction: republishing a thousand unchanged verdicts would only add load to
        # a replica that was evicted for being too busy).
        ours = {_key(v) for v in verdicts if v.owner == self.me}
        for key in keys - ours:
            self._pending[key] = None
        self._publish_wake.set()
        log.info("fleet: took over endpoints", extra={"endpoints": len(keys)})

    def _handed_over(self, verdict: Verdict) -> bool:
        """A stored verdict a new owner continues from: written by a member that is live
        now with that epoch (the former owner, still alive: a join moved the endpoint),
        newer than what we applied. A verdict from before an outage (its writer has joined
        again since, with a new epoch) or from a dead member is not: our own board, fed
        by that member's verdicts or by our own fallback probes, is newer."""
        member = self.members.get(verdict.owner)
        return (
            verdict.owner != self.me
            and member is not None
            and member.epoch == verdict.epoch
            and verdict.seq > self._applied.get(_key(verdict), 0)
        )

    # --- membership loop ----------------------------------------------------------------

    async def _join(self) -> None:
        """Join (a new epoch) and act on the first member list (prepare)."""
        membership = await self._join_redis()
        self._last_ok = self._clock()
        await self._joined(membership)

    async def _join_redis(self) -> Membership:
        self.epoch = await self._store.join()
        membership = await self._store.heartbeat(self.epoch)
        if membership is None:
            raise WireError("evicted right after joining (is member_id used twice?)")
        return membership

    async def _joined(self, membership: Membership) -> None:
        was = self.mode
        self.mode = "sharing"
        self.members = {}
        await self._set_members(membership)
        if was == "fallback":
            log.info("fleet: Redis answers again; sharing probes", extra=self._fields())
            self._keeper.announce(Notice("fleet_recovered", "*", "sharing probes again"))
            self._republish_owned()  # Redis may have restarted empty meanwhile
        log.info("fleet: joined", extra=self._fields())

    async def _heartbeats(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.heartbeat_s):
                        await self._beat_now.wait()
                self._beat_now.clear()
                await self._beat()
        finally:
            await self._leave()

    async def _beat(self) -> None:
        """One heartbeat (a join when we are not a member) within the heartbeat's budget;
        what follows from its answer (takeover reads, a full sync) gets a longer one: a
        large fleet's verdicts must not look like a dead Redis."""
        try:
            async with asyncio.timeout(max(0.5, self.settings.heartbeat_s)):
                membership, joined = await self._heartbeat_or_join()
            self._last_ok = self._clock()
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            silent_for = self._clock() - self._last_ok
            if self.mode != "fallback" and silent_for >= self.settings.member_ttl_s:
                self._enter_fallback(f"Redis unreachable for {silent_for:.1f} s ({_why(exc)})")
            return
        try:
            async with asyncio.timeout(FOLLOW_UP_BUDGET_S):
                if joined:
                    await self._joined(membership)
                else:
                    await self._set_members(membership)
                if self._clock() - self._synced_at >= FULL_SYNC_EVERY_S:
                    await self._sync(warm=False)  # a safety net under the event stream
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            self._problem("sync", f"fleet: reading the fleet's verdicts failed ({_why(exc)})")

    async def _heartbeat_or_join(self) -> tuple[Membership, bool]:
        if self.epoch is not None and self.mode == "sharing":
            membership = await self._store.heartbeat(self.epoch)
            if membership is not None:
                return membership, False
            self._problem("evicted", "fleet: this member was evicted (paused?); joining again")
            self.mode = "starting"
        self.counters["rejoins_total"] += 1
        return await self._join_redis(), True

    def _enter_fallback(self, why: str) -> None:
        self.mode = "fallback"
        self.epoch = None
        self.counters["fallbacks_total"] += 1
        self._pending.clear()
        log.warning(f"fleet: {why}; probing every endpoint here (fallback)", extra=self._fields())
        self._keeper.announce(
            Notice("fleet_fallback", "*", f"{why}; every replica probes every endpoint")
        )
        self._catalog.refilter()

    async def _leave(self) -> None:
        if self.epoch is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LEAVE_BUDGET_S):
                await self._store.leave(self.epoch)
        with contextlib.suppress(Exception):
            await self._store.close()

    # --- verdicts out -----------------------------------------------------------------------

    def _on_transition(self, cluster: str, address: str, transition: Any, result: Any) -> None:
        key = endpoint_key(cluster, address)
        if self.mode == "sharing" and key in self._owned:
            self._pending[key] = None
            self._publish_wake.set()

    def _republish_owned(self) -> None:
        """After an outage: Redis may have lost what we published (a restart)."""
        for key in self._owned:
            self._pending[key] = None
        self._publish_wake.set()

    async def _publisher(self) -> None:
        while True:
            await self._publish_wake.wait()
            self._publish_wake.clear()
            if self.mode != "sharing" or self.epoch is None:
                self._pending.clear()
                continue
            keys, self._pending = list(self._pending), {}
            items = [(k, verdict_body(v)) for k in keys if (v := self._verdict_of(k)) is not None]
            try:
                statuses = await self._store.publish(self.epoch, items)
            except RedisFailure as exc:
                self.counters["redis_errors_total"] += 1
                self._problem("publish", f"fleet: publishing verdicts failed ({_why(exc)})")
                continue
            self.counters["verdicts_published_total"] += statuses.count("ok")
            self.counters["verdicts_fenced_total"] += statuses.count("fenced")
            self.counters["verdicts_not_owner_total"] += statuses.count("not_owner")
            if any(s != "ok" for s in statuses):
                self._beat_now.set()  # our member list or epoch is stale: heartbeat now

    def _verdict_of(self, key: str) -> Verdict | None:
        cluster, address = split_key(key)
        board = self._keeper.board
        if not board.has_endpoint(cluster, address):
            return None
        health = board.health(cluster, address)
        last = board.last_result(cluster, address)
        assert self.epoch is not None
        return Verdict(
            cluster=cluster,
            address=address,
            state=health.state,
            reason=health.reason,
            cause=health.cause,
            since=health.since + (self._wall_clock() - self._clock()),
            outcome=None if last is None else last.outcome,
            ttft_ms=None if last is None else last.ttft_ms,
            successes=health.successes,
            fast_streak=health.fast_streak,
            failures=health.failures,
            owner=self.me,
            epoch=self.epoch,
        )

    # --- verdicts in ------------------------------------------------------------------------

    async def _events(self) -> None:
        while True:
            try:
                async for data in self._store.events():
                    await self._on_event(data)
            except RedisFailure as exc:
                self._problem("events", f"fleet: event stream lost ({_why(exc)})")
            await asyncio.sleep(self.settings.heartbeat_s)
            if self.mode == "sharing":
                with contextlib.suppress(*RedisFailure):
                    await self._sync(warm=False)  # what we may have missed meanwhile

    async def _on_event(self, data: bytes) -> None:
        kind, _, rest = data.partition(b"\n")
        try:
            if kind == b"v":
                key_bytes, _, stored = rest.partition(b"\n")
                key = key_bytes.decode()
                await self._adopt_all(self._acceptable([decode_stored(key, stored)]))
            elif kind == b"a":
                await self._apply_action(decode_action(rest))
            elif kind == b"m":
                self._beat_now.set()  # membership changed: learn it now, not in a second
        except (WireError, UnicodeDecodeError, ValueError, KeyError) as exc:
            self.counters["verdicts_rejected_total"] += 1
            self._problem("event", f"fleet: unusable event ({_why(exc)})")

    async def _sync(self, *, warm: bool) -> None:
        """Read every stored verdict. ``warm``: at start, adopt every fresh one (younger
        than ``fresh_s``, whoever wrote it: it was the owner when it was written);
        otherwise only by the fencing rules."""
        stored = await self._store.verdicts()
        self._synced_at = self._clock()
        verdicts = self._decode_all(stored)
        if warm:
            fresh = [v for v in verdicts if self._age_s(v) <= self.settings.fresh_s]
            await self._adopt_all(fresh)
            return
        await self._adopt_all(self._acceptable(verdicts))

    def _acceptable(self, verdicts: Iterable[Verdict]) -> list[Verdict]:
        kept = []
        for verdict in verdicts:
            key = _key(verdict)
            owner = self.owner(key)
            member = self.members.get(owner) if owner is not None else None
            why = rejection(
                verdict,
                me=self.me,
                owner=owner,
                owner_epoch=None if member is None else member.epoch,
                last_seq=self._applied.get(key, 0),
            )
            if why is None and self.mode == "sharing" and key not in self._owned:
                kept.append(verdict)
        return kept

    async def _adopt_all(self, verdicts: Iterable[Verdict]) -> None:
        chosen = [v for v in verdicts if self._keeper.board.has_endpoint(v.cluster, v.address)]
        if not chosen:
            return
        wall_now = self._wall_clock()

        def adopt(board: Board, now: float) -> int:
            changed = 0
            for verdict in chosen:
                health = _health(
                    board.health(verdict.cluster, verdict.address), verdict, now, wall_now
                )
                transition = board.adopt(verdict.cluster, verdict.address, health, _result(verdict))
                if transition.changed:
                    changed += 1
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
            return len(chosen)

        await self._keeper.update(adopt, publish_when=bool)
        for verdict in chosen:
            key = _key(verdict)
            self._applied[key] = max(self._applied.get(key, 0), verdict.seq)
            self._seen[key] = (verdict.owner, verdict.published_ms)
        self.counters["verdicts_applied_total"] += len(chosen)

    def _decode_all(self, stored: dict[str, bytes]) -> list[Verdict]:
        verdicts = []
        for key, text in stored.items():
            try:
                verdicts.append(decode_stored(key, text))
            except WireError as exc:
                self.counters["verdicts_rejected_total"] += 1
                self._problem("verdict", f"fleet: unusable stored verdict ({exc})")
        return verdicts

    def _age_s(self, verdict: Verdict) -> float:
        """Seconds since the verdict was last confirmed: published, or its owner's
        heartbeat since (an owner alive confirms every verdict it owns)."""
        now_ms = self._wall_clock() * 1000 + self._server_offset_ms
        member = self.members.get(verdict.owner)
        confirmed = max(verdict.published_ms, member.beat_ms if member else 0)
        return max(0.0, (now_ms - confirmed) / 1000)

    # --- operator actions ----------------------------------------------------------------

    def _on_action(self, action: OperatorAction) -> None:
        if self.mode != "sharing" or self.epoch is None:
            log.warning(
                "fleet: operator action applied on this replica only (no Redis)",
                extra={"cluster": action.cluster, "endpoint": action.address, "kind": action.kind},
            )
            return
        shared = Action(
            action.kind,
            action.cluster,
            action.address,
            action.reason,
            self.me,
            action.state,
            action.until,
        )
        asyncio.get_running_loop().create_task(self._share(shared))

    async def _share(self, action: Action) -> None:
        assert self.epoch is not None
        try:
            status = await self._store.act(
                self.epoch, endpoint_key(action.cluster, action.address), action
            )
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            self._problem("act", f"fleet: sharing an operator action failed ({_why(exc)})")
            return
        if status == "ok":
            self.counters["actions_shared_total"] += 1

    async def _apply_overrides(self) -> None:
        """At start: the operators' forced states still running in the fleet."""
        for text in (await self._store.overrides()).values():
            try:
                action = decode_action(text)
            except WireError as exc:
                self._problem("override", f"fleet: unusable stored override ({exc})")
                continue
            if action.until is not None and action.until > self._wall_clock():
                await self._apply_action(action, own_ok=True)

    async def _apply_action(self, action: Action, *, own_ok: bool = False) -> None:
        if action.sender == self.me and not own_ok:
            return
        board = self._keeper.board
        if not board.has_endpoint(action.cluster, action.address):
            return
        cluster, address, wall_now = action.cluster, action.address, self._wall_clock()
        if action.kind == "drain":
            transition = await self._keeper.update(
                lambda b, now: b.drain(cluster, address, now, action.reason)
            )
        elif action.kind == "undrain":
            transition = await self._keeper.update(lambda b, now: b.undrain(cluster, address, now))
        elif action.kind == "force" and action.state is not None and action.until is not None:
            state, left = action.state, action.until - wall_now
            await self._keeper.update(
                lambda b, now: b.set_override(cluster, address, state, now + left, action.reason)
            )
            transition = None
        else:
            await self._keeper.update(lambda b, _now: b.clear_override(cluster, address))
            transition = None
        if transition is not None and transition.changed:
            self._keeper.notify(cluster, address, transition, None)
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

    # --- helpers ------------------------------------------------------------------------

    def _endpoint_status(self, key: str, now_ms: float) -> dict[str, Any]:
        if self.mode != "sharing":
            return {"owner": self.me, "verdict_age_s": 0.0}
        owner = self.owner(key)
        if owner == self.me:
            return {"owner": owner, "verdict_age_s": 0.0}
        seen = self._seen.get(key)
        if seen is None:
            return {"owner": owner, "verdict_age_s": None}
        member = self.members.get(seen[0])
        confirmed = max(seen[1], member.beat_ms if member else 0)
        return {"owner": owner, "verdict_age_s": round(max(0.0, now_ms - confirmed) / 1000, 3)}

    def _fields(self) -> dict[str, Any]:
        return {
            "member": self.me,
            "epoch": self.epoch,
            "members": len(self.members),
            "owned": len(self._owned),
            "redis": self.settings.where,
        }

    def _problem(self, kind: str, message: str) -> None:
        """Log ``message`` at most once per PROBLEM_LOG_EVERY_S for each ``kind``."""
        now = self._clock()
        if now - self._problems.get(kind, -PROBLEM_LOG_EVERY_S) >= PROBLEM_LOG_EVERY_S:
            self._problems[kind] = now
            log.warning(message, extra={"member": self.me})


def _epochs(members: dict[str, Member]) -> dict[str, int]:
    return {member: entry.epoch for member, entry in members.items()}


def _key(verdict: Verdict) -> str:
    return endpoint_key(verdict.cluster, verdict.address)


def _why(exc: BaseException) -> str:
    """An error's class only: a Redis error text may quote the URL (and its password)."""
    return type(exc).__name__


def _health(
    current: EndpointHealth, verdict: Verdict, now: float, wall_now: float
) -> EndpointHealth:
    """The owner's verdict as this board's health (our monotonic clock; the counters
    the machine continues from if this replica takes the endpoint over)."""
    failed = verdict.failures > 0 and verdict.outcome in FAILURES
    return EndpointHealth(
        state=verdict.state,
        since=now - max(0.0, wall_now - verdict.since),
        reason=verdict.reason,
        first_seen=current.first_seen,
        qualify_after=current.qualify_after,
        known_at_boot=current.known_at_boot,
        successes=verdict.successes,
        all_fast=verdict.fast_streak >= verdict.successes,
        fast_streak=verdict.fast_streak,
        failures=verdict.failures,
        failure_kinds=frozenset({verdict.outcome}) if failed and verdict.outcome else frozenset(),
        last_outcome=verdict.outcome,
        cause=verdict.cause,
        silenced=False,
    )


def _result(verdict: Verdict) -> ProbeResult | None:
    if verdict.outcome is None:
        return None
    return ProbeResult(
        outcome=verdict.outcome,
        started_at=verdict.published_ms / 1000,
        ttft_ms=verdict.ttft_ms,
        detail=f"verdict of fleet member {verdict.owner}",
    )


__all__ = ["FleetComponent", "State"]
