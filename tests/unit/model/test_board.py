"""Board: effective state from probes, outside signals, overrides; hot reload; expiry."""

from __future__ import annotations

import pytest

from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.envoy_view import EnvoyHealth
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from tests import boards

POLICY = Policy(healthy_after=3, unhealthy_after=2, drain_time_s=30.0)
A, B, C = "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"


def spec(name: str, *addresses: str, weight: int = 100, policy: Policy = POLICY) -> ClusterSpec:
    endpoints = tuple(EndpointSpec(a, a.split(":")[0], 80, weight) for a in addresses)
    return ClusterSpec(name, policy, endpoints)


def fast(board: Board, cluster: str, address: str, now: float, times: int = 1) -> None:
    for i in range(times):
        board.record(cluster, address, ProbeResult(Outcome.FAST, 0.0, ttft_ms=10), now + i)


def endpoint(board: Board, cluster: str, address: str):  # type: ignore[no-untyped-def]
    return board.snapshot().endpoint(cluster, address)


def healthy_board() -> Board:
    return boards.healthy_board(A, B, policy=POLICY, wall_offset=1000.0)


def test_a_snapshot_finds_an_endpoint_by_cluster_and_address() -> None:
    snapshot = healthy_board().snapshot()
    assert snapshot.endpoint("c", B) is snapshot.clusters["c"].endpoints[1]
    with pytest.raises(KeyError):
        snapshot.endpoint("c", C)
    with pytest.raises(KeyError):
        snapshot.endpoint("other", A)


def test_signal_down_forces_unhealthy_and_holds_until_cleared() -> None:
    board = healthy_board()
    t = board.set_signal("c", A, "hds", "unreachable from gw-2, gw-3", now=5.0)
    assert t.changed and t.after.state is State.UNHEALTHY
    assert endpoint(board, "c", A).reason == "unreachable from gw-2, gw-3"
    assert endpoint(board, "c", A).signals == {"hds": "unreachable from gw-2, gw-3"}
    fast(board, "c", A, 6.0, times=5)  # probes fine, but held down
    assert endpoint(board, "c", A).state is State.UNHEALTHY
    board.set_signal("c", A, "hds", None, now=20.0)
    fast(board, "c", A, 21.0, times=2)
    assert endpoint(board, "c", A).state is State.UNHEALTHY  # hysteresis: needs 3
    fast(board, "c", A, 30.0)
    assert endpoint(board, "c", A).state is State.HEALTHY


def test_override_wins_until_it_expires() -> None:
    board = healthy_board()
    board.set_override("c", A, State.DRAINING, until=50.0, reason="maintenance")
    seen = endpoint(board, "c", A)
    assert seen.state is State.DRAINING and seen.probe_state is State.HEALTHY
    assert seen.view.health is EnvoyHealth.DRAINING
    assert seen.override_until == 1050.0
    assert board.expire(49.0) == []
    (change,) = board.expire(50.0)
    assert change.what == "override expired"
    assert endpoint(board, "c", A).state is State.HEALTHY


def test_envoy_version_changes_only_with_what_envoy_sees() -> None:
    board = healthy_board()
    before = board.snapshot().clusters["c"].envoy_version
    fast(board, "c", A, 10.0)  # same state: reasons/timings change, Envoy's view does not
    assert board.snapshot().clusters["c"].envoy_version == before
    board.record("c", A, ProbeResult(Outcome.SLOW, 0.0, ttft_ms=500), 11.0)
    assert board.snapshot().clusters["c"].envoy_version != before


def test_reload_adds_removes_and_keeps_state() -> None:
    board = healthy_board()
    board.record("c", B, ProbeResult(Outcome.SLOW, 0.0, ttft_ms=500), 2.0)
    new_policy = Policy(healthy_after=5, drain_time_s=30.0)
    changes = board.apply_specs([spec("c", B, C, policy=new_policy), spec("d", A)], now=10.0)
    whats = sorted(c.what for c in changes)
    assert whats == ["cluster added", "endpoint added", "endpoint removed from config"]
    assert endpoint(board, "c", A).state is State.DRAINING and endpoint(board, "c", A).removing
    assert endpoint(board, "c", B).state is State.DEGRADED  # kept
    assert endpoint(board, "c", C).state is State.STARTING
    assert board.policy("c").healthy_after == 5
    assert not board.is_warm("d") and board.is_warm("c")
    fast(board, "c", C, 11.0, times=4)
    assert endpoint(board, "c", C).state is State.STARTING  # a new endpoint needs 5 now
    fast(board, "c", C, 15.0)
    assert endpoint(board, "c", C).state is State.HEALTHY
    assert board.expire(39.0) == []
    (gone,) = board.expire(40.0)
    assert gone.address == A
    assert [e.spec.address for e in board.snapshot().clusters["c"].endpoints] == [B, C]


def test_removed_cluster_drains_then_disappears() -> None:
    board = healthy_board()
    board.apply_specs([spec("other", C)], now=5.0)
    drained = board.snapshot().clusters["c"].endpoints
    assert {e.view.health for e in drained} == {EnvoyHealth.DRAINING}
    board.expire(35.0)
    assert set(board.snapshot().clusters) == {"other"}


def test_weight_change_keeps_health() -> None:
    board = healthy_board()
    board.apply_specs([spec("c", A, B, weight=7)], now=5.0)
    seen = endpoint(board, "c", A)
    assert seen.state is State.HEALTHY and seen.view.weight == 7


def test_readding_a_draining_endpoint_starts_it_fresh() -> None:
    board = healthy_board()
    board.apply_specs([spec("c", B)], now=5.0)
    board.apply_specs([spec("c", A, B)], now=6.0)
    seen = endpoint(board, "c", A)
    assert seen.state is State.STARTING and not seen.removing


def timeout(board: Board, cluster: str, address: str, now: float) -> None:
    board.record(cluster, address, ProbeResult(Outcome.TIMEOUT, 0.0, detail="x"), now)


def test_most_of_a_cluster_failing_at_once_is_not_all_ejected() -> None:
    """docs/design.md §7: 3 of 4 endpoints time out together -> max_ejection_percent 50 lets 2
    go out; the third stays routed (DEGRADED) with a reason that names the suspicion."""
    addresses = [f"10.0.0.{i}:80" for i in range(1, 5)]
    board = Board([spec("c", *addresses)], now=0.0, wall_offset=0.0)
    for address in addresses:
        fast(board, "c", address, 1.0)
    for address in addresses[:3]:
        timeout(board, "c", address, 2.0)
        timeout(board, "c", address, 3.0)
    states = [endpoint(board, "c", a).state for a in addresses]
    assert states == [State.UNHEALTHY, State.UNHEALTHY, State.DEGRADED, State.HEALTHY]
    held = endpoint(board, "c", addresses[2])
    assert "max_ejection_percent 50" in held.reason and "prober" in held.reason
    fast(board, "c", addresses[0], 4.0, times=3)  # one recovers: room for another
    timeout(board, "c", addresses[2], 8.0)
    assert endpoint(board, "c", addresses[2]).state is State.UNHEALTHY


def test_fatal_is_never_capped() -> None:
    board = Board([spec("c", A, B)], now=0.0, wall_offset=0.0)
    fast(board, "c", A, 1.0)
    fast(board, "c", B, 1.0)
    for address in (A, B):
        board.record("c", address, ProbeResult(Outcome.FATAL, 0.0, detail="CUDA error"), 2.0)
    assert {e.state for e in board.snapshot().clusters["c"].endpoints} == {State.UNHEALTHY}


def test_one_endpoint_may_always_be_ejected() -> None:
    board = Board([spec("c", A, B)], now=0.0, wall_offset=0.0)
    fast(board, "c", A, 1.0)
    fast(board, "c", B, 1.0)
    timeout(board, "c", A, 2.0)
    timeout(board, "c", A, 3.0)
    assert endpoint(board, "c", A).state is State.UNHEALTHY


def test_signal_reads_one_sources_reason() -> None:
    board = healthy_board()
    assert board.signal("c", A, "verify") is None
    board.set_signal("c", A, "verify", "garbage output: '!!!'", now=5.0)
    assert board.signal("c", A, "verify") == "garbage output: '!!!'"
    assert board.signal("c", A, "hds") is None and board.signal("c", B, "verify") is None
    board.set_signal("c", A, "verify", None, now=6.0)
    assert board.signal("c", A, "verify") is None
