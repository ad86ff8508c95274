"""Fleet mode, the decisions a replica takes without Redis (docs/design.md §12): its
membership and fallback (``fleet.membership``), which verdicts it publishes and adopts
(``fleet.verdicts``: fencing, takeover without flap, warm start), operator actions from
the fleet (``fleet.actions``), and the wiring order of the catalog's probe filter."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llm_health.app.assemble import build_runtime
from llm_health.app.endpoints import EndpointCatalog
from llm_health.app.live import LiveConfig
from llm_health.config import parse_config
from llm_health.core.control import OperatorAction
from llm_health.fleet import actions
from llm_health.fleet.component import FleetComponent
from llm_health.fleet.membership import Roster
from llm_health.fleet.ownership import endpoint_key, owner_of
from llm_health.fleet.verdicts import (
    Ledger,
    acceptable,
    adopt,
    age_s,
    as_health,
    endpoint_status,
    fresh,
    takeover,
    verdict_of,
)
from llm_health.fleet.wire import Action, Member, Membership, Verdict
from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.traffic.component import TrafficComponent

KEYS = [endpoint_key("c", f"10.0.0.{i}:8000") for i in range(1, 201)]


def membership(now_ms: int = 10_000, **epochs: int) -> Membership:
    return Membership(now_ms, {m: Member(epoch, now_ms) for m, epoch in epochs.items()})


def sharing(me: str = "a", **epochs: int) -> Roster:
    roster = Roster(me, now=0.0)
    roster.joined(epochs[me])
    roster.start_sharing()
    roster.set_members(membership(**epochs), KEYS, wall_now=10.0)
    return roster


def owned_by(member: str, members: str) -> list[str]:
    return [k for k in KEYS if owner_of(k, members) == member]


# --- membership ----------------------------------------------------------------------------


def test_owners_follow_the_member_list_and_beats_alone_change_nothing() -> None:
    roster = sharing(a=1, b=2)
    assert roster.owned == frozenset(owned_by("a", "ab"))
    assert all(roster.owner(k) == owner_of(k, "ab") for k in KEYS)
    later = Membership(12_000, {"a": Member(1, 11_900), "b": Member(2, 11_950)})
    assert roster.set_members(later, KEYS, wall_now=10.0) is None  # same members, epochs
    assert roster.members["b"].beat_ms == 11_950  # the beats are taken anyway
    assert roster.server_now_ms(10.5) == 12_500  # Redis time, from the last heartbeat


def test_an_eviction_hands_its_endpoints_to_the_survivors() -> None:
    roster = sharing(a=1, b=2, c=3)
    gained = roster.set_members(membership(a=1, c=3), KEYS, wall_now=10.0)
    assert gained == frozenset(k for k in owned_by("b", "abc") if owner_of(k, "ac") == "a")
    assert gained and roster.owned == frozenset(owned_by("a", "ac"))


def test_a_member_that_joined_again_is_a_new_member_list() -> None:
    roster = sharing(a=1, b=2)
    gained = roster.set_members(membership(a=1, b=5), KEYS, wall_now=10.0)
    assert gained == frozenset()  # not None: refilter and resynchronise
    assert roster.owner_epoch(owned_by("b", "ab")[0]) == 5
    assert roster.owner_epoch(owned_by("a", "ab")[0]) == 1


def test_probe_filter_by_mode() -> None:
    roster = Roster("a", now=0.0)
    assert all(roster.probes_here(k) for k in KEYS) and roster.write_epoch is None
    roster = sharing(a=1, b=2)
    assert {k for k in KEYS if roster.probes_here(k)} == set(owned_by("a", "ab"))
    assert roster.write_epoch == 1 and roster.owns(owned_by("a", "ab")[0])
    roster.fall_back()
    assert all(roster.probes_here(k) for k in KEYS)
    assert roster.epoch is None and roster.write_epoch is None
    assert not roster.owns(owned_by("a", "ab")[0])  # fallback publishes nothing


def test_evicted_member_writes_nothing_until_it_joins_again() -> None:
    roster = sharing(a=1, b=2)
    roster.evicted()
    assert roster.mode == "starting" and roster.write_epoch is None
    roster.joined(7)
    assert not roster.start_sharing()  # not back from fallback: no "recovered"
    assert roster.write_epoch == 7


def test_a_rejoin_takes_over_again_everything_it_owns() -> None:
    # Evicted and back with a new epoch, the same endpoints are ours: all of them are
    # gained (a takeover publishes them in the new epoch; readers apply no other).
    roster = sharing(a=1, b=2)
    mine = roster.owned
    assert mine and roster.vouches(now=1.0, stall_s=5.0)  # vouched for them before
    roster.evicted()
    assert roster.owned == frozenset() and not roster.owns(next(iter(mine)))
    roster.joined(7)
    roster.start_sharing()
    gained = roster.set_members(membership(a=7, b=2), KEYS, 0.0)
    assert gained == mine == roster.owned
    # Owned afresh: vouched for from the rejoin on, not from before the eviction.
    assert roster.vouches(now=100.0, stall_s=5.0) and roster.vouches(104.0, stall_s=5.0)
    assert not roster.vouches(106.0, stall_s=5.0)


def test_fallback_after_member_ttl_of_silence_then_recovery() -> None:
    roster = Roster("a", now=100.0)
    assert roster.fallback_due(102.9, member_ttl=3.0) is None
    roster.answered(102.0)
    assert roster.fallback_due(104.9, member_ttl=3.0) is None
    assert roster.fallback_due(105.0, member_ttl=3.0) == pytest.approx(3.0)
    roster.fall_back()
    assert roster.fallback_due(200.0, member_ttl=3.0) is None  # once, not every beat
    roster.joined(9)
    assert roster.start_sharing() is True  # back from fallback: say so, republish


def test_new_endpoints_get_owners_only_while_sharing() -> None:
    roster = Roster("a", now=0.0)
    roster.endpoints_changed(KEYS)
    assert roster.owned == frozenset()
    roster = sharing(a=1)
    roster.endpoints_changed(KEYS[:10])
    assert roster.owned == frozenset(KEYS[:10])


# --- verdicts --------------------------------------------------------------------------------


def verdict(key: str, owner: str, epoch: int, seq: int = 7, **changes: Any) -> Verdict:
    cluster, _, address = key.partition("|")
    made = Verdict(
        cluster, address, State.DEGRADED, "slow", Cause.SLOW, 1_000.0, Outcome.SLOW, 412.0,
        2, 0, 0, owner, epoch, seq=seq, published_ms=9_000,
    )  # fmt: skip
    return replace(made, **changes)


def test_only_the_owners_current_incarnation_and_newer_verdicts_are_acceptable() -> None:
    roster, ledger = sharing(a=1, b=2), Ledger()
    theirs, ours = owned_by("b", "ab")[0], owned_by("a", "ab")[0]
    good = verdict(theirs, "b", 2)
    offered = [
        good,
        verdict(theirs, "b", 1),  # a former incarnation of b
        verdict(theirs, "c", 3),  # not the owner
        verdict(ours, "b", 2),  # ours: we judge it ourselves
    ]
    assert acceptable(offered, roster, ledger) == [good]
    ledger.record([good])
    assert acceptable([good], roster, ledger) == []  # not newer than the one applied
    assert acceptable([replace(good, seq=8)], roster, ledger) == [replace(good, seq=8)]
    roster.fall_back()
    assert acceptable([replace(good, seq=9)], roster, ledger) == []  # fallback judges alone


def test_takeover_adopts_a_live_former_owners_verdict_and_publishes_in_our_name() -> None:
    roster, ledger = sharing(a=1, b=2), Ledger()
    k1, k2, k3, k4, k5 = owned_by("b", "ab")[:5]
    stored = [
        verdict(k1, "b", 2),  # b alive (a join moved it): continue from its verdict
        verdict(k2, "b", 1),  # b before an outage: our board is newer
        verdict(k3, "gone", 4),  # a dead member
        verdict(k4, "a", 1),  # ours already, in this epoch: no republishing
        verdict(k5, "a", 0),  # ours in a former epoch (a rejoin): no reader applies it
    ]
    plan = takeover({k1, k2, k3, k4, k5}, stored, roster, ledger)
    assert plan.adopt == [stored[0]]
    assert plan.publish == frozenset({k1, k2, k3, k5})
    ledger.record([stored[0]])
    assert takeover({k1}, stored[:1], roster, ledger).adopt == []  # applied already


def test_warm_start_takes_verdicts_confirmed_within_fresh() -> None:
    members = {"b": Member(2, beat_ms=19_000)}
    old_but_confirmed = verdict(KEYS[0], "b", 2, published_ms=1_000)
    old_of_the_dead = verdict(KEYS[1], "gone", 3, published_ms=1_000)
    recent = verdict(KEYS[2], "gone", 3, published_ms=15_000)
    offered = [old_but_confirmed, old_of_the_dead, recent]
    assert fresh(offered, members, now_ms=20_000, fresh_s=6.0) == [old_but_confirmed, recent]
    assert age_s("gone", 1_000, members, 20_000) == 19.0
    assert age_s("b", 1_000, members, 18_000) == 0.0  # never negative (clock skew)


def test_endpoint_status_owner_and_verdict_age() -> None:
    roster, ledger = sharing(a=1, b=2), Ledger()
    theirs, ours = owned_by("b", "ab")[0], owned_by("a", "ab")[0]
    assert endpoint_status(ours, roster, ledger, 10_000) == {"owner": "a", "verdict_age_s": 0.0}
    assert endpoint_status(theirs, roster, ledger, 10_000) == {
        "owner": "b",
        "verdict_age_s": None,
    }
    ledger.record([verdict(theirs, "b", 2)])  # published at 9 000, b beat at 10 000
    assert endpoint_status(theirs, roster, ledger, 12_345) == {
        "owner": "b",
        "verdict_age_s": 2.345,
    }
    roster.fall_back()
    assert endpoint_status(theirs, roster, ledger, 0) == {"owner": "a", "verdict_age_s": 0.0}


POLICY = Policy(healthy_after=3, unhealthy_after=2)
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def board() -> Board:
    endpoints = tuple(EndpointSpec(a, a.split(":")[0], 8000) for a in (A, B))
    return Board([ClusterSpec("c", POLICY, endpoints)], now=0.0, wall_offset=1_000.0)


def test_adopted_verdict_is_the_health_as_it_is_and_survives_a_round_trip() -> None:
    here = board()
    offered = verdict(endpoint_key("c", A), "b", 2, since=1_003.0)
    unknown = verdict(endpoint_key("c", "10.9.9.9:8000"), "b", 2)
    adopted = adopt(here, 10.0, [offered, unknown], wall_now=1_010.0)
    assert [(v, t.changed, t.to_state) for v, t in adopted] == [
        (offered, True, State.DEGRADED)  # no state machine: STARTING -> DEGRADED at once
    ]
    health, last = here.health("c", A), here.last_result("c", A)
    assert health.since == pytest.approx(3.0)  # 7 s ago, on our monotonic clock
    assert last is not None and last.detail == "verdict of fleet member b"
    again = verdict_of("c", A, health, last, owner="b", epoch=2, wall_offset=1_000.0)
    assert again == replace(offered, seq=0, published_ms=0)  # what the owner would publish


def test_counters_carried_over_let_the_machine_continue() -> None:
    failing = verdict(endpoint_key("c", A), "b", 2, outcome=Outcome.TIMEOUT, failures=1)
    health = as_health(board().health("c", A), failing, 10.0, 1_010.0)
    assert (health.failures, health.failure_kinds) == (1, frozenset({Outcome.TIMEOUT}))
    assert health.all_fast is False  # fast_streak 0 < successes 2
    assert health.first_seen == 0.0  # ours, not the owner's


# --- operator actions --------------------------------------------------------------------------


def test_shared_action_carries_the_sender() -> None:
    action = OperatorAction("force", "c", A, "maintenance", State.UNHEALTHY, 2_000.0)
    assert actions.shared(action, "gw-1") == Action(
        "force", "c", A, "maintenance", "gw-1", State.UNHEALTHY, 2_000.0
    )


def test_actions_from_the_fleet_on_this_board() -> None:
    here = board()
    drain = actions.mutation(Action("drain", "c", A, "maintenance", "b"), wall_now=1_000.0)
    transition = drain(here, 5.0)
    assert transition is not None and transition.to_state is State.DRAINING
    undrain = actions.mutation(Action("undrain", "c", A, "", "b"), wall_now=1_000.0)
    assert undrain(here, 6.0) is not None and here.health("c", A).state is not State.DRAINING
    force = Action("force", "c", B, "upgrade", "b", State.UNHEALTHY, until=1_030.0)
    assert actions.mutation(force, wall_now=1_010.0)(here, 7.0) is None
    forced = here.snapshot().endpoint("c", B)
    assert forced.state is State.UNHEALTHY
    assert forced.override_until == pytest.approx(1_027.0)  # 20 s left, from our now
    actions.mutation(Action("clear", "c", B, "", "b"), wall_now=1_010.0)(here, 8.0)
    cleared = here.snapshot().endpoint("c", B)
    assert cleared.override_until is None and cleared.state is State.STARTING


def test_only_running_overrides_apply_at_start() -> None:
    force = Action("force", "c", A, "upgrade", "b", State.UNHEALTHY, until=1_030.0)
    assert actions.still_forced(force, 1_029.0)
    assert not actions.still_forced(force, 1_030.0)
    assert not actions.still_forced(Action("drain", "c", A, "", "b"), 0.0)


# --- wiring: the probe filter before its readers -----------------------------------------------

FLEET = """
fleet: {redis: "redis://127.0.0.1:1/0", name: it, member_id: me}
clusters:
  - name: c
    endpoints: [{address: "127.0.0.1:8000"}]
    discovery: {dns: vllm.example, port: 8000}
"""


async def test_a_found_endpoint_owned_here_is_probed_by_every_reader_of_the_filter() -> None:
    """The fleet follows an endpoint change before the components that read its filter:
    built after them, it would tell them the new endpoint is someone else's."""
    runtime = build_runtime(parse_config(FLEET, "t.yaml", {}))
    fleet = next(c for c in runtime.components if isinstance(c, FleetComponent))
    traffic = next(c for c in runtime.components if isinstance(c, TrafficComponent))
    fleet.roster.joined(1)  # alone in the fleet: every endpoint is ours
    fleet.roster.start_sharing()
    keys = [endpoint_key("c", "127.0.0.1:8000")]  # the configured endpoint
    fleet.roster.set_members(Membership(0, {"me": Member(1, 0)}), keys, 0.0)
    assert fleet.mode == "sharing" and len(fleet.roster.owned) == 1
    new = EndpointSpec("10.0.0.9:8000", "10.0.0.9", 8000)
    await runtime.catalog.set_discovered("c", (new,))
    assert fleet.probes_here("c", "10.0.0.9:8000")
    assert ("c", "10.0.0.9:8000") in traffic.probed


def test_the_probe_filter_cannot_change_after_it_was_read() -> None:
    config = parse_config(FLEET, "t.yaml", {})
    runtime = build_runtime(config)
    catalog = EndpointCatalog(LiveConfig(config, None), runtime.control)
    catalog.set_probe_filter(lambda _c, _a: False)
    assert catalog.probed(catalog.targets()) == []
    with pytest.raises(RuntimeError, match="after components read it"):
        catalog.set_probe_filter(None)
