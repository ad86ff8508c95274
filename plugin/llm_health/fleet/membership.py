"""This replica's place in the fleet (docs/design.md §12.2, §12.6): its mode, its epoch,
the live members the last heartbeat returned, the endpoint owners that follow from them
(rendezvous, ``ownership.owner_of``) and the endpoints it owns.

Modes: ``starting`` (not a member: at start, or evicted and joining again), ``sharing``
(a member: it probes only what it owns) and ``fallback`` (Redis silent for
``member_ttl``: it probes everything itself). Pure: no I/O; times are passed in.

Its heartbeat vouches for the verdicts it owns (``vouches``) while its prober keeps
up with them (``vouches`` is called on the heartbeat's thread, ``fleet.pulse``: the vouch
state is under a lock); a member that stops vouching is evicted after ``fresh`` like a silent
one (``scripts.HEARTBEAT``), so a member that beats but no longer judges what it owns
(a stuck prober, or a member written into Redis from outside) keeps nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from llm_health.fleet.ownership import owner_of
from llm_health.fleet.wire import Member, Membership

Mode = Literal["starting", "sharing", "fallback"]


class Roster:
    def __init__(self, me: str, now: float) -> None:
        self.me = me
        self.mode: Mode = "starting"
        self.epoch: int | None = None
        self.members: dict[str, Member] = {}
        self.owned: frozenset[str] = frozenset()  # endpoint keys owned here (while sharing)
        self._owners: dict[str, str | None] = {}  # endpoint key -> owner (cache)
        self._last_ok = now  # when Redis last answered a heartbeat or a join
        self._server_offset_ms = 0.0  # Redis time - our wall time, from heartbeats
        self._progress = now  # last probe result of an owned endpoint (or first owning it)
        self._vouched_for: frozenset[str] = frozenset()  # what we owned at the last vouch
        self._vouch_lock = threading.Lock()  # _progress and _vouched_for: two threads

    # --- reading ----------------------------------------------------------------------

    @property
    def sharing(self) -> bool:
        return self.mode == "sharing"

    @property
    def write_epoch(self) -> int | None:
        """The epoch our writes (verdicts, actions) carry; None: we write nothing (not
        sharing: Redis would refuse them, or cannot be reached)."""
        return self.epoch if self.sharing else None

    def probes_here(self, key: str) -> bool:
        """The catalog's probe filter: only what we own while sharing, else everything."""
        return not self.sharing or key in self.owned

    def owns(self, key: str) -> bool:
        """Whether we publish ``key``'s verdicts (sharing, and ours)."""
        return self.sharing and key in self.owned

    def owner(self, key: str) -> str | None:
        if key not in self._owners:
            self._owners[key] = owner_of(key, self.members)
        return self._owners[key]

    def owner_epoch(self, key: str) -> int | None:
        """The current epoch of ``key``'s owner (None: no owner)."""
        owner = self.owner(key)
        member = self.members.get(owner) if owner is not None else None
        return None if member is None else member.epoch

    def server_now_ms(self, wall_now: float) -> float:
        """Redis server time now (ms), from our wall clock and the last heartbeat."""
        return wall_now * 1000 + self._server_offset_ms

    # --- membership -------------------------------------------------------------------

    def joined(self, epoch: int) -> None:
        """Redis handed us ``epoch`` (a join; its heartbeat's answer follows)."""
        self.epoch = epoch

    def answered(self, now: float) -> None:
        """Redis answered a heartbeat (or a join)."""
        self._last_ok = now

    def start_sharing(self) -> bool:
        """The first member list after a join follows; returns whether we were in fallback.
        Every owner is computed afresh from it."""
        was_fallback = self.mode == "fallback"
        self.mode = "sharing"
        self.members = {}
        return was_fallback

    def evicted(self) -> None:
        """Redis says we are no member (paused past ``member_ttl``): join again. We own
        nothing until then, so the join's member list hands every endpoint we own again
        back as gained: a takeover, which publishes it in our new epoch (docs/design.md
        §12.5). Readers apply only an owner's current epoch, and what we published while
        evicted was fenced: kept as owned, an endpoint whose state did not change again
        would show its old verdict, or none, on every other replica for good. What we
        own again counts as newly ours for vouching too (``vouches``): no probe result of
        it was counted while we owned nothing."""
        self.mode = "starting"
        with self._vouch_lock:
            self.owned = frozenset()
            self._vouched_for = frozenset()

    def set_members(
        self, membership: Membership, keys: Iterable[str], wall_now: float
    ) -> frozenset[str] | None:
        """Take a heartbeat's member list; ``keys``: every endpoint on the board. None: who
        is a member (and with which epoch) did not change, nor did any owner (the common
        case; the beats, which date verdicts, are taken anyway). Otherwise the keys that
        became ours (a takeover when sharing)."""
        self._server_offset_ms = membership.now_ms - wall_now * 1000
        same = _epochs(membership.members) == _epochs(self.members)
        self.members = dict(membership.members)
        if same:
            return None
        self._owners.clear()
        owned = self._owned_of(keys)
        gained = owned - self.owned
        self.owned = owned
        return gained

    def endpoints_changed(self, keys: Iterable[str]) -> None:
        """Endpoints added or removed (reload, discovery): the owners of the new keys."""
        if self.sharing:
            self.owned = self._owned_of(keys)

    # --- vouching for our verdicts -------------------------------------------------------

    def probed(self, key: str, now: float) -> None:
        """A probe result of ``key`` came in (our prober's progress, if we own it)."""
        if key in self.owned:
            with self._vouch_lock:
                self._progress = now

    def vouches(self, now: float, stall_s: float) -> bool:
        """Whether our heartbeat vouches for our verdicts: we own nothing, or a probe
        result of an endpoint we own came in within ``stall_s`` (counted from when
        endpoints became ours: their first probes are yet to come)."""
        with self._vouch_lock:
            owned = self.owned
            if owned - self._vouched_for:
                self._progress = now
            self._vouched_for = owned
            return not owned or now - self._progress <= stall_s

    # --- fallback ---------------------------------------------------------------------

    def fallback_due(self, now: float, member_ttl: float) -> float | None:
        """Seconds Redis has been silent, when that calls for fallback (silent for
        ``member_ttl`` and not in fallback yet); None otherwise."""
        silent_for = now - self._last_ok
        if self.mode != "fallback" and silent_for >= member_ttl:
            return silent_for
        return None

    def fall_back(self) -> None:
        """Probe everything here: we are no member and write nothing until we join."""
        self.mode = "fallback"
        self.epoch = None

    def _owned_of(self, keys: Iterable[str]) -> frozenset[str]:
        return frozenset(k for k in keys if self.owner(k) == self.me)


def _epochs(members: dict[str, Member]) -> dict[str, int]:
    return {member: entry.epoch for member, entry in members.items()}
