"""The fleet's rules against members that are no replica (docs/design.md §12.2-§12.4,
§7.3), without Redis: a member's heartbeat vouches for its verdicts only while its
prober keeps up with what it owns (``Roster.vouches``), and a verdict adopted from the
fleet takes an endpoint out only within ``max_ejection_percent`` (``Board.adopt``),
whatever cause it names; one held back is offered again (``taken_as_is``)."""

from __future__ import annotations

from llm_health.fleet.membership import Roster
from llm_health.fleet.ownership import endpoint_key, owner_of
from llm_health.fleet.verdicts import adopt, taken_as_is
from llm_health.fleet.wire import Member, Membership, Verdict
from llm_health.model.board import Board
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from tests import boards

KEYS = [endpoint_key("c", f"10.0.0.{i}:8000") for i in range(1, 41)]
STALL_S = 10.0


def sharing(now: float, **epochs: int) -> Roster:
    roster = Roster("a", now=now)
    roster.joined(epochs["a"])
    roster.start_sharing()
    members = {m: Member(epoch, 0) for m, epoch in epochs.items()}
    roster.set_members(Membership(0, members), KEYS, wall_now=0.0)
    return roster


def test_a_heartbeat_vouches_while_probe_results_of_owned_endpoints_come_in() -> None:
    roster = sharing(100.0, a=1, b=2)
    ours = sorted(roster.owned)[0]
    theirs = next(k for k in KEYS if k not in roster.owned)
    assert roster.vouches(100.0, STALL_S)
    assert roster.vouches(110.0, STALL_S)  # the first probes may take that long
    assert not roster.vouches(110.5, STALL_S)  # nothing came in: a stuck prober
    roster.probed(theirs, 111.0)  # not ours: proves nothing about what we own
    assert not roster.vouches(111.0, STALL_S)
    roster.probed(ours, 112.0)
    assert roster.vouches(121.0, STALL_S) and not roster.vouches(122.5, STALL_S)


def test_endpoints_newly_ours_get_time_for_their_first_probes() -> None:
    roster = sharing(100.0, a=1, b=2, c=3)
    assert roster.vouches(100.0, STALL_S) and not roster.vouches(200.0, STALL_S)
    gone_c = Membership(0, {"a": Member(1, 0), "b": Member(2, 0)})
    gained = roster.set_members(gone_c, KEYS, wall_now=0.0)
    assert gained  # a takeover: those are probed at once, not yet answered
    assert roster.vouches(201.0, STALL_S) and roster.vouches(211.0, STALL_S)
    assert not roster.vouches(212.0, STALL_S)


def test_owning_nothing_always_vouches() -> None:
    keys = KEYS[:3]
    name = next(
        f"m{i}" for i in range(1000) if all(owner_of(k, ["a", f"m{i}"]) != "a" for k in keys)
    )
    roster = Roster("a", now=0.0)
    roster.joined(1)
    roster.start_sharing()
    roster.set_members(Membership(0, {"a": Member(1, 0), name: Member(2, 0)}), keys, 0.0)
    assert roster.owned == frozenset() and roster.vouches(1e6, STALL_S)


# --- the ejection cap on adopted verdicts ------------------------------------------------

ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
FAST = ProbeResult(Outcome.FAST, started_at=0.0, ttft_ms=20.0)


def healthy_board() -> Board:
    policy = Policy(healthy_after=1, unhealthy_after=1, max_ejection_percent=50)
    return boards.healthy_board(*ADDRESSES, policy=policy, wall_offset=1_000.0, ttft_ms=20.0)


def out(address: str, seq: int, cause: Cause = Cause.FATAL) -> Verdict:
    outcome = Outcome.FATAL if cause is Cause.FATAL else Outcome.TIMEOUT
    return Verdict(
        "c", address, State.UNHEALTHY, "CUDA error", cause, 1_001.0, outcome, None,
        0, 0, 3, "b", 2, seq=seq, published_ms=1_001_000,
    )  # fmt: skip


def test_adopted_verdicts_take_out_no_more_than_the_cap_whatever_their_cause() -> None:
    board = healthy_board()
    adopted = adopt(board, 2.0, [out(a, 10) for a in ADDRESSES], wall_now=1_002.0)
    states = [board.health("c", a).state for a in ADDRESSES]
    assert states == [State.UNHEALTHY, State.UNHEALTHY, State.DEGRADED, State.DEGRADED]
    held = board.health("c", ADDRESSES[2])
    assert held.reason.startswith("held: 2 of 4 endpoints already out for probe failures")
    assert [v.address for v in taken_as_is(adopted)] == ADDRESSES[:2]  # the held: again


def test_adopted_ejections_count_against_this_replicas_own() -> None:
    board = healthy_board()
    adopt(board, 2.0, [out(a, 10, Cause.TIMEOUT) for a in ADDRESSES[:2]], wall_now=1_002.0)
    timeout = ProbeResult(Outcome.TIMEOUT, started_at=0.0, ttft_ms=None)
    transition = board.record("c", ADDRESSES[2], timeout, 3.0)  # our own probe fails
    assert transition.to_state is State.DEGRADED and transition.after.reason.startswith("held:")


def test_a_held_verdict_goes_through_once_room_frees_up() -> None:
    board = healthy_board()
    adopt(board, 2.0, [out(a, 10) for a in ADDRESSES[:3]], wall_now=1_002.0)
    assert board.health("c", ADDRESSES[2]).state is State.DEGRADED
    back = Verdict(
        "c", ADDRESSES[0], State.HEALTHY, "ok", Cause.RECOVERED, 1_003.0, Outcome.FAST,
        20.0, 3, 3, 0, "b", 2, seq=11, published_ms=1_003_000,
    )  # fmt: skip
    adopt(board, 3.0, [back], wall_now=1_003.0)
    (again,) = adopt(board, 4.0, [out(ADDRESSES[2], 10)], wall_now=1_004.0)  # the resync
    assert again[1].changed and board.health("c", ADDRESSES[2]).state is State.UNHEALTHY
    assert taken_as_is([again]) == [again[0]]


def test_an_endpoint_already_out_is_no_new_ejection() -> None:
    board = healthy_board()
    adopt(board, 2.0, [out(a, 10) for a in ADDRESSES[:2]], wall_now=1_002.0)
    (same,) = adopt(board, 3.0, [out(ADDRESSES[0], 11)], wall_now=1_003.0)
    assert same[1].to_state is State.UNHEALTHY and not same[1].changed
