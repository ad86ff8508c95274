"""The ``fleet`` component: this replica as one member of a fleet sharing one probe per
endpoint through Redis (docs/design.md §12). It talks to Redis (``store.FleetStore``), to
the board (``core.control.BoardControl``) and to the endpoint catalog (``ProbeRouting``);
what it decides is in the pure modules (``membership``, ``verdicts``, ``actions``); the
verdicts and actions it exchanges through Redis go through ``fleet.exchange``, its
counters are declared in ``fleet.counters``.

- Membership: join (a new epoch), heartbeat every ``heartbeat`` from a thread of its own
  (``pulse``: a busy loop must not cost us our place); the heartbeat's answer, acted on
  here on the loop, is the live member list, from which every endpoint's owner follows
  (rendezvous). A heartbeat vouches for the verdicts we own while probe results of them
  come in; Redis evicts a member that stopped vouching ``fresh`` ago (``scripts``).
- Probing: ``probes_here`` is the catalog's probe filter (set by ``app.assemble`` before
  any other component reads it): the prober probes only the endpoints this replica
  owns; a takeover adopts the last stored verdict and probes at once.
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
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc
from prometheus_client.metrics_core import Metric

from llm_health.core.component import Job
from llm_health.core.control import BoardControl, Notice
from llm_health.core.families import counter, gauge
from llm_health.core.problems import ProblemLog
from llm_health.fleet import counters
from llm_health.fleet.exchange import Exchange
from llm_health.fleet.membership import Mode, Roster
from llm_health.fleet.ownership import endpoint_key
from llm_health.fleet.pulse import Beat, Pulse
from llm_health.fleet.settings import FleetConfig
from llm_health.fleet.store import FleetStore, RedisFailure, failure_name, stop_if_cancelled
from llm_health.fleet.verdicts import (
    endpoint_status,
)
from llm_health.fleet.wire import (
    Member,
    Membership,
    WireError,
)
from llm_health.model.outcome import ProbeResult
from llm_health.probe.target import ProbeTarget

PROBLEM_LOG_EVERY_S = 60.0  # bad Redis entries: one log line per kind per minute
LEAVE_BUDGET_S = 0.3
FOLLOW_UP_BUDGET_S = 10.0  # takeover reads and full syncs after one heartbeat
# Beats the loop has not acted on yet, kept at most (a newer member list supersedes).
MAX_BEATS_WAITING = 8
FULL_SYNC_EVERY_S = 30.0  # read every stored verdict this often even if no event was lost
# Probe intervals without a result of any endpoint we own before our heartbeat stops
# vouching for their verdicts: backoff_when_busy leaves out at most 99 slots in a row
# (docs/design.md §15.4), so a prober that works is never taken for a stuck one.
STALL_SLOTS = 100
log = logging.getLogger("llm_health")


class ProbeRouting(Protocol):
    """What the fleet needs of the endpoint catalog (``app.endpoints.EndpointCatalog``),
    whose probe filter is ``FleetComponent.probes_here``."""

    def on_targets(self, listener: Callable[[list[ProbeTarget]], None]) -> None:
        """Call ``listener`` after every change of the endpoint set or of the filter (with
        the probe targets: the fleet reads their intervals, and the board's keys)."""
        ...

    def refilter(self) -> None:
        """The filter's answers changed (ownership moved): the prober and the others
        that follow the probed endpoints take the new set."""
        ...


class FleetComponent:
    name = "fleet"

    def __init__(
        self,
        settings: FleetConfig,
        member: str,
        control: BoardControl,
        routing: ProbeRouting,
        *,
        store: FleetStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.me = member
        self._control = control
        self._routing = routing
        self._store = store or FleetStore(settings, member)
        self._clock = clock
        self._wall_clock = wall_clock
        self._roster = Roster(member, clock())
        self._beat_now = asyncio.Event()  # join now (while not a member)
        self._pulse = Pulse(
            self._store.heartbeat_blocking, self._vouches, settings.heartbeat, clock
        )
        self._beats: deque[Beat] = deque(maxlen=MAX_BEATS_WAITING)
        self._beat_arrived = asyncio.Event()
        self._stall_s = settings.fresh  # widened by the probe intervals (_targets_changed)
        self._problems = ProblemLog(log, every_s=PROBLEM_LOG_EVERY_S, clock=clock)
        self.counters = counters.zeroed()
        self._exchange = Exchange(
            settings,
            member,
            control,
            self._store,
            self._roster,
            clock=clock,
            wall_clock=wall_clock,
            counters=self.counters,
            problem=self._problem,
            beat_soon=self._beat_soon,
        )
        control.on_transition(self._exchange.on_transition)
        control.on_probe(self._on_probe)
        control.on_action(self._exchange.on_action)
        routing.on_targets(self._targets_changed)

    @property
    def roster(self) -> Roster:
        """Membership and ownership as this replica sees them (what ``mode``, ``epoch``,
        ``members`` and ``probes_here`` read)."""
        return self._roster

    @property
    def mode(self) -> Mode:
        return self._roster.mode

    @property
    def epoch(self) -> int | None:
        return self._roster.epoch

    @property
    def members(self) -> dict[str, Member]:
        return self._roster.members

    def probes_here(self, cluster: str, address: str) -> bool:
        """The catalog's probe filter: whether this replica probes the endpoint."""
        return self._roster.probes_here(endpoint_key(cluster, address))

    def owner(self, key: str) -> str | None:
        return self._roster.owner(key)

    # --- Component protocol -------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """No gRPC service."""

    def tasks(self) -> list[Job]:
        return [self._heartbeats, self._exchange.events, self._exchange.publisher]

    def status(self) -> dict[str, Any]:
        roster = self._roster
        now_ms = roster.server_now_ms(self._wall_clock())
        return {
            "mode": roster.mode,
            "fallback": not roster.sharing,
            "member_id": self.me,
            "epoch": roster.epoch,
            "redis": self.settings.where,
            "members": len(roster.members),
            "member_ids": sorted(roster.members),
            "owned_endpoints": len(roster.owned) if roster.sharing else None,
            "redis_commands_total": self._store.commands,
            **self.counters,
            "endpoints": {
                key: endpoint_status(key, roster, self._exchange.ledger, now_ms)
                for key in self._keys()
            },
        }

    def metrics(self) -> Iterator[Metric]:
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
                len(self._roster.owned),
            )
        yield counter(
            "llm_health_fleet_redis_commands_total", "Redis commands sent.", self._store.commands
        )
        yield from counters.families(self.counters)

    async def prepare(self) -> None:
        """Before the first probe: join and adopt the fleet's fresh verdicts (warm start:
        this replica's Envoy gets the right weights without waiting for its own round).
        Redis unreachable: fallback at once, with a clear message."""
        try:
            await self._join()
            await self._exchange.sync(warm=True)
            await self._exchange.apply_overrides()
        except RedisFailure as exc:
            self._enter_fallback(
                f"Redis at {self.settings.where} unreachable at start ({failure_name(exc)})"
            )

    # --- ownership ----------------------------------------------------------------------

    def _keys(self) -> list[str]:
        snapshot = self._control.snapshot()
        return [
            endpoint_key(name, e.spec.address)
            for name, cluster in snapshot.clusters.items()
            for e in cluster.endpoints
        ]

    def _targets_changed(self, targets: list[ProbeTarget]) -> None:
        gaps = (t.interval_s * STALL_SLOTS + t.timeout_s for t in targets)
        self._stall_s = self.settings.fresh + max(gaps, default=0.0)
        self._endpoints_changed()

    def _endpoints_changed(self) -> None:
        """Endpoints added or removed (reload, discovery): owners of new keys, before the
        catalog's other listeners read the filter (``app.assemble`` builds us first)."""
        if self._roster.sharing:
            self._roster.endpoints_changed(self._keys())

    async def _set_members(self, membership: Membership) -> None:
        gained = self._roster.set_members(membership, self._keys(), self._wall_clock())
        if gained is None:
            return  # who is a member did not change: owners neither (the common case)
        if gained and self._roster.sharing:
            await self._exchange.take_over(gained)
        self._routing.refilter()
        await self._exchange.sync(warm=False)  # verdicts refused under the old member list

    # --- membership loop ----------------------------------------------------------------

    async def _join(self) -> None:
        """Join (a new epoch) and act on the first member list (prepare)."""
        membership = await self._join_redis()
        self._roster.answered(self._clock())
        await self._joined(membership)

    async def _join_redis(self) -> Membership:
        epoch = await self._store.join()
        self._roster.joined(epoch)
        membership = await self._store.heartbeat(epoch)
        if membership is None:
            raise WireError("evicted right after joining (is member_id used twice?)")
        return membership

    async def _joined(self, membership: Membership) -> None:
        self._pulse.start(asyncio.get_running_loop(), self._beat_came)
        self._pulse.follow(self._roster.epoch)  # its first beat a heartbeat after the join
        was_fallback = self._roster.start_sharing()
        await self._set_members(membership)
        if was_fallback:
            log.info("fleet: Redis answers again; sharing probes", extra=self._fields())
            self._control.announce(Notice("fleet_recovered", "*", "sharing probes again"))
            self._exchange.republish_owned()  # Redis may have restarted empty meanwhile
        log.info("fleet: joined", extra=self._fields())

    async def _heartbeats(self) -> None:
        """Membership on the loop: act on each beat of the heartbeat's thread while
        sharing (``fleet.pulse``); join when not a member (at start it failed, after an
        eviction, in fallback: every ``heartbeat``)."""
        try:
            while True:
                stop_if_cancelled()
                epoch = self._roster.write_epoch
                self._pulse.follow(epoch)
                if epoch is None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.settings.heartbeat):
                            await self._beat_now.wait()
                    self._beat_now.clear()
                    await self._rejoin()
                else:
                    await self._next_beat()
        finally:
            self._pulse.stop()
            await self._leave()

    def _beat_came(self, beat: Beat) -> None:
        """From the heartbeat's thread (``call_soon_threadsafe``)."""
        self._beats.append(beat)
        self._beat_arrived.set()

    def _beat_soon(self) -> None:
        """Heartbeat now: the member list changed, or Redis refused a write as stale."""
        self._beat_now.set()
        self._pulse.wake()

    async def _next_beat(self) -> None:
        """Act on the next beat; none within a heartbeat: Redis may be silent."""
        if not self._beats:
            self._beat_arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat):
                    await self._beat_arrived.wait()
        if self._beats:
            await self._on_beat(self._beats.popleft())
        else:
            self._check_silence("no heartbeat answer")

    async def _on_beat(self, beat: Beat) -> None:
        if beat.epoch != self._roster.write_epoch:
            return  # beaten with an epoch we no longer hold (joined again, or fallback)
        if not beat.vouched:
            self._problem(
                "stalled",
                f"fleet: no probe result of the {len(self._roster.owned)} endpoints owned "
                f"here for {self._stall_s:.0f} s; not vouching for their verdicts (the fleet "
                "takes them over)",
            )
        if beat.error is not None:
            if not isinstance(beat.error, RedisFailure):
                raise beat.error  # a bug, not Redis: as if the beat had run here
            self.counters["redis_errors_total"] += 1
            self._check_silence(failure_name(beat.error))
            return
        self._roster.answered(beat.at)
        if beat.membership is None:
            self._problem("evicted", "fleet: this member was evicted (paused?); joining again")
            self._roster.evicted()
            self._pulse.follow(None)
            await self._rejoin()
            return
        await self._follow_up(beat.membership, joined=False)

    def _check_silence(self, why: str) -> None:
        """Fallback once Redis has not answered for ``member_ttl``."""
        silent_for = self._roster.fallback_due(self._clock(), self.settings.member_ttl)
        if silent_for is not None:
            self._enter_fallback(f"Redis unreachable for {silent_for:.1f} s ({why})")

    async def _rejoin(self) -> None:
        """Join again within the heartbeat's budget (a new epoch)."""
        self.counters["rejoins_total"] += 1
        try:
            async with asyncio.timeout(max(0.5, self.settings.heartbeat)):
                membership = await self._join_redis()
            self._roster.answered(self._clock())
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            self._check_silence(failure_name(exc))
            return
        await self._follow_up(membership, joined=True)

    async def _follow_up(self, membership: Membership, *, joined: bool) -> None:
        """What follows from a member list (takeover reads, a full sync) gets a longer
        budget than a heartbeat: a large fleet's verdicts must not look like a dead Redis."""
        try:
            async with asyncio.timeout(FOLLOW_UP_BUDGET_S):
                if joined:
                    await self._joined(membership)
                else:
                    await self._set_members(membership)
                if self._clock() - self._exchange.synced_at >= FULL_SYNC_EVERY_S:
                    await self._exchange.sync(warm=False)  # a safety net under the event stream
        except RedisFailure as exc:
            self.counters["redis_errors_total"] += 1
            self._problem(
                "sync", f"fleet: reading the fleet's verdicts failed ({failure_name(exc)})"
            )

    def _vouches(self) -> bool:
        """Whether a heartbeat vouches for the verdicts we own (docs/design.md §12.3): not
        when no probe result of any of them came in for ``_stall_s``. Called on the
        heartbeat's thread (``Roster.vouches`` is safe there)."""
        return self._roster.vouches(self._clock(), self._stall_s)

    def _enter_fallback(self, why: str) -> None:
        self._roster.fall_back()
        self._pulse.follow(None)
        self.counters["fallbacks_total"] += 1
        self._exchange.drop_pending()
        log.warning(f"fleet: {why}; probing every endpoint here (fallback)", extra=self._fields())
        self._control.announce(
            Notice("fleet_fallback", "*", f"{why}; every replica probes every endpoint")
        )
        self._routing.refilter()

    async def _leave(self) -> None:
        epoch = self._roster.epoch
        if epoch is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LEAVE_BUDGET_S):
                await self._store.leave(epoch)
        with contextlib.suppress(Exception):
            # Bounded too: a Redis that stopped answering must not hold up shutdown.
            async with asyncio.timeout(LEAVE_BUDGET_S):
                await self._store.close()

    def _on_probe(self, cluster: str, address: str, _result: ProbeResult) -> None:
        self._roster.probed(endpoint_key(cluster, address), self._clock())

    # --- helpers ------------------------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        return {
            "member": self.me,
            "epoch": self._roster.epoch,
            "members": len(self._roster.members),
            "owned": len(self._roster.owned),
            "redis": self.settings.where,
        }

    def _problem(self, kind: str, message: str) -> None:
        """Log ``message`` at most once per PROBLEM_LOG_EVERY_S for each ``kind``
        (``core.problems``: the line says how many were left out)."""
        self._problems.report(kind, message, {"member": self.me})
