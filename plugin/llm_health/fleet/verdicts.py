"""Which verdicts a replica publishes and which it adopts (docs/design.md §12.3-§12.5,
§12.7), between the board's terms (``EndpointHealth``, ``ProbeResult``, monotonic
seconds) and the wire's (``wire.Verdict``, wall seconds, Redis milliseconds).

- out: ``verdict_of`` (an owned endpoint's health, in our name);
- in: ``acceptable`` (the read-side fencing rule, ``wire.rejection``, for what others
  own), ``takeover`` (endpoints now ours continue from the former owner's last verdict,
  without a flap), ``fresh`` (the warm start), ``adopt`` (onto the board, as it is, but
  within the ejection cap), ``taken_as_is`` (what the ledger records);
- ``Ledger``: what was applied, for the next fencing check and for /status.

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llm_health.fleet.membership import Roster
from llm_health.fleet.ownership import endpoint_key
from llm_health.fleet.wire import Member, Verdict, rejection
from llm_health.model.board import Board
from llm_health.model.machine import Transition
from llm_health.model.outcome import FAILURES, ProbeResult
from llm_health.model.states import EndpointHealth


def key_of(verdict: Verdict) -> str:
    return endpoint_key(verdict.cluster, verdict.address)


class Ledger:
    """Per endpoint key: the sequence number of the last verdict applied (fencing: only
    newer ones), and who published it when (the verdict's age in /status)."""

    def __init__(self) -> None:
        self._applied: dict[str, int] = {}
        self._seen: dict[str, tuple[str, int]] = {}  # key -> (owner, published ms)

    def last_seq(self, key: str) -> int:
        return self._applied.get(key, 0)

    def seen(self, key: str) -> tuple[str, int] | None:
        return self._seen.get(key)

    def record(self, verdicts: Iterable[Verdict]) -> None:
        for verdict in verdicts:
            key = key_of(verdict)
            self._applied[key] = max(self.last_seq(key), verdict.seq)
            self._seen[key] = (verdict.owner, verdict.published_ms)


# --- out --------------------------------------------------------------------------------


def verdict_of(
    cluster: str,
    address: str,
    health: EndpointHealth,
    last: ProbeResult | None,
    *,
    owner: str,
    epoch: int,
    wall_offset: float,
) -> Verdict:
    """An endpoint's health as its owner publishes it; ``wall_offset``: wall clock minus
    the board's monotonic clock (``since`` goes out in wall seconds)."""
    return Verdict(
        cluster=cluster,
        address=address,
        state=health.state,
        reason=health.reason,
        cause=health.cause,
        since=health.since + wall_offset,
        outcome=None if last is None else last.outcome,
        ttft_ms=None if last is None else last.ttft_ms,
        successes=health.successes,
        fast_streak=health.fast_streak,
        failures=health.failures,
        owner=owner,
        epoch=epoch,
    )


# --- in ---------------------------------------------------------------------------------


def acceptable(verdicts: Iterable[Verdict], roster: Roster, ledger: Ledger) -> list[Verdict]:
    """The verdicts to adopt of endpoints others own (docs/design.md §12.4, read side):
    only from the owner in our member list, with its current epoch, newer than what we
    applied; none while we are not sharing (fallback judges alone)."""
    kept = []
    for verdict in verdicts:
        key = key_of(verdict)
        why = rejection(
            verdict,
            me=roster.me,
            owner=roster.owner(key),
            owner_epoch=roster.owner_epoch(key),
            last_seq=ledger.last_seq(key),
        )
        if why is None and roster.sharing and key not in roster.owned:
            kept.append(verdict)
    return kept


def handed_over(verdict: Verdict, roster: Roster, ledger: Ledger) -> bool:
    """A stored verdict a new owner continues from: written by a member that is live
    now with that epoch (the former owner, still alive: a join moved the endpoint),
    newer than what we applied. A verdict from before an outage (its writer has joined
    again since, with a new epoch) or from a dead member is not: our own board, fed
    by that member's verdicts or by our own fallback probes, is newer."""
    member = roster.members.get(verdict.owner)
    return (
        verdict.owner != roster.me
        and member is not None
        and member.epoch == verdict.epoch
        and verdict.seq > ledger.last_seq(key_of(verdict))
    )


@dataclass(frozen=True, slots=True)
class Takeover:
    """What taking over endpoints does (docs/design.md §12.5): ``adopt`` the former
    owners' last verdicts, then ``publish`` these keys in our name."""

    adopt: list[Verdict]
    publish: frozenset[str]


def takeover(
    keys: Iterable[str], stored: Iterable[Verdict], roster: Roster, ledger: Ledger
) -> Takeover:
    """Endpoints now ours (``keys``) continue from their last stored verdicts
    (``stored``): no return to STARTING, no state change unless our own probes say so.
    Each is published in our name unless the stored verdict is already ours in this
    epoch (the endpoint moved away and back within it). After a rejoin the epoch is new:
    readers apply no verdict of a former one, and what we wrote while evicted was
    fenced, so every endpoint is published again, or other replicas would keep what they
    last applied (STARTING, at a start) until its state changed."""
    verdicts = list(stored)
    ours = {key_of(v) for v in verdicts if v.owner == roster.me and v.epoch == roster.epoch}
    return Takeover(
        adopt=[v for v in verdicts if handed_over(v, roster, ledger)],
        publish=frozenset(keys) - ours,
    )


def fresh(
    verdicts: Iterable[Verdict], members: Mapping[str, Member], now_ms: float, fresh_s: float
) -> list[Verdict]:
    """The warm start (docs/design.md §12.7): every verdict younger than ``fresh_s``,
    whoever wrote it (it was the owner when it was written)."""
    return [v for v in verdicts if age_s(v.owner, v.published_ms, members, now_ms) <= fresh_s]


def age_s(owner: str, published_ms: int, members: Mapping[str, Member], now_ms: float) -> float:
    """Seconds since a verdict was last confirmed: published, or its owner's last
    heartbeat that vouched for its verdicts since (``Member.beat_ms``)."""
    member = members.get(owner)
    confirmed = max(published_ms, member.beat_ms if member else 0)
    return max(0.0, now_ms - confirmed) / 1000


def endpoint_status(key: str, roster: Roster, ledger: Ledger, now_ms: float) -> dict[str, Any]:
    """An endpoint's part of /status: its owner and the age of the verdict we hold
    (0 for what we judge ourselves, None before any verdict from its owner)."""
    if not roster.sharing:
        return {"owner": roster.me, "verdict_age_s": 0.0}
    owner = roster.owner(key)
    if owner == roster.me:
        return {"owner": owner, "verdict_age_s": 0.0}
    seen = ledger.seen(key)
    if seen is None:
        return {"owner": owner, "verdict_age_s": None}
    return {"owner": owner, "verdict_age_s": round(age_s(*seen, roster.members, now_ms), 3)}


def adopt(
    board: Board, now: float, verdicts: Iterable[Verdict], wall_now: float
) -> list[tuple[Verdict, Transition]]:
    """Take each verdict of an endpoint on ``board`` as its health (``Board.adopt``: no
    state machine); the verdicts adopted, each with its transition."""
    adopted = []
    for verdict in verdicts:
        if board.has_endpoint(verdict.cluster, verdict.address):
            current = board.health(verdict.cluster, verdict.address)
            health = as_health(current, verdict, now, wall_now)
            transition = board.adopt(verdict.cluster, verdict.address, health, as_result(verdict))
            adopted.append((verdict, transition))
    return adopted


def taken_as_is(adopted: Iterable[tuple[Verdict, Transition]]) -> list[Verdict]:
    """The adopted verdicts the board took as they are: the ones the ledger records. One
    held back here (the ejection cap, ``Board.adopt``; a signal) is offered again at the
    next sync, when room may have freed up (docs/design.md §7.3)."""
    return [verdict for verdict, transition in adopted if transition.to_state is verdict.state]


def as_health(
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


def as_result(verdict: Verdict) -> ProbeResult | None:
    """The verdict's last outcome as this board's last result (None: no probe yet)."""
    if verdict.outcome is None:
        return None
    return ProbeResult(
        outcome=verdict.outcome,
        started_at=verdict.published_ms / 1000,
        ttft_ms=verdict.ttft_ms,
        detail=f"verdict of fleet member {verdict.owner}",
    )
