"""Admin API translation: the watch diff (pure), and domain <-> protobuf round trips that
keep /status byte-identical (``llm-health status --json`` relies on it)."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State
from llm_health.model.watch import diff
from llm_health.ops.status_document import status_document
from llm_health.servers.admin_codec import (
    duration_from_pb,
    endpoint_from_pb,
    endpoint_to_pb,
    snapshot_from_pb,
    snapshot_to_pb,
    state_from_pb,
)

POLICY = Policy(healthy_after=1, unhealthy_after=2)
A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "[2001:db8::1]:8000"


def spec(name: str, *addresses: str) -> ClusterSpec:
    return ClusterSpec(
        name,
        POLICY,
        tuple(
            EndpointSpec(a, a.rsplit(":", 1)[0].strip("[]"), 8000, 70 + i)
            for i, a in enumerate(addresses)
        ),
    )


def result(outcome: Outcome, **fields: object) -> ProbeResult:
    return ProbeResult(outcome, 1_796_000_000.123456, **fields)  # type: ignore[arg-type]


def busy_board() -> Board:
    """Every kind of field set somewhere: probes with and without timings, an override,
    an outside signal, a drained endpoint, a removal in progress."""
    board = Board([spec("a", A, B), spec("b", C)], now=0.0, wall_offset=1_796_000_000.0)
    board.record(
        "a",
        A,
        result(Outcome.FAST, ttft_ms=41.337, connect_ms=0.21, headers_ms=1.5, status=200),
        1.0,
    )
    board.record(
        "a",
        B,
        result(
            Outcome.TIMEOUT, connect_ms=0.3, detail="no first token within 800 ms", loop_lag_ms=3.25
        ),
        1.0,
    )
    board.record("b", C, result(Outcome.ERROR, detail="connection refused"), 1.0)
    board.set_override("a", A, State.UNHEALTHY, until=600.5, reason="maintenance")
    board.set_signal("a", B, "hds", "unreachable from gw-2", now=2.0)
    board.drain("b", C, now=3.0, reason="kernel upgrade")
    return board


def test_snapshot_round_trip_keeps_status_identical() -> None:
    snapshot = busy_board().snapshot()
    rebuilt = snapshot_from_pb(snapshot_to_pb(snapshot))
    assert rebuilt == snapshot
    original, copy = status_document(snapshot), status_document(rebuilt)
    assert copy["clusters"] == original["clusters"]
    assert copy["revision"] == original["revision"]


def test_round_trip_is_exact_for_every_endpoint_field() -> None:
    for cluster in busy_board().snapshot().clusters.values():
        for endpoint in cluster.endpoints:
            assert endpoint_from_pb(endpoint_to_pb(endpoint)) == endpoint


def test_one_cluster_or_unknown() -> None:
    snapshot = busy_board().snapshot()
    assert [c.name for c in snapshot_to_pb(snapshot, "b").clusters] == ["b"]
    try:
        snapshot_to_pb(snapshot, "nope")
    except KeyError:
        pass
    else:
        raise AssertionError("unknown cluster accepted")


def test_state_from_pb_refuses_unspecified() -> None:
    for bad in (0, 99):
        try:
            state_from_pb(bad)
        except ValueError as exc:
            assert "healthy" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def test_diff_reports_state_changes_not_probes() -> None:
    board = Board([spec("a", A, B)], now=0.0, wall_offset=0.0)
    board.record("a", A, result(Outcome.FAST, ttft_ms=10), 1.0)
    board.record("a", B, result(Outcome.FAST, ttft_ms=10), 1.0)
    before = board.snapshot()
    board.record("a", A, result(Outcome.FAST, ttft_ms=12), 2.0)  # a probe, no change
    assert not diff(before, board.snapshot())
    board.record("a", B, result(Outcome.SLOW, ttft_ms=400), 3.0)  # healthy -> degraded
    changes = diff(before, board.snapshot())
    assert [e.spec.address for e in changes.changed] == [B]
    assert changes.changed[0].state is State.DEGRADED
    assert changes.removed == ()


def test_diff_sees_overrides_additions_removals_and_filters_clusters() -> None:
    board = Board([spec("a", A, B), spec("b", C)], now=0.0, wall_offset=0.0)
    before = board.snapshot()
    board.set_override("a", A, State.DRAINING, until=50.0, reason="m")
    assert [e.spec.address for e in diff(before, board.snapshot()).changed] == [A]
    assert not diff(before, board.snapshot(), cluster="b")
    before = board.snapshot()
    board.apply_specs([spec("a", A, "10.0.0.9:8000")], now=1.0)  # B and cluster b retire
    changes = diff(before, board.snapshot())
    addresses = {e.spec.address for e in changes.changed}
    assert {"10.0.0.9:8000", B, C} <= addresses  # added, and retiring (DRAINING) ones
    board.expire(now=1000.0)
    gone = diff(before, board.snapshot())
    assert set(gone.removed) == {("a", B), ("b", C)}


# --- google.protobuf.Duration (ForceState's duration) -------------------------------------


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [(600, 0, 600.0), (0, 999_999_999, 0.999999999), (1, 500_000_000, 1.5), (-1, -5, -1.000000005)],
)
def test_valid_durations_read_as_seconds(seconds: int, nanos: int, expected: float) -> None:
    assert duration_from_pb(Duration(seconds=seconds, nanos=nanos)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("seconds", "nanos", "why"),
    [
        (0, 2**31 - 1, "nanos must be within ±999,999,999"),  # once read as 2.147 s
        (0, 1_000_000_000, "nanos must be within ±999,999,999"),
        (0, -1_000_000_000, "nanos must be within ±999,999,999"),
        (60, -1, "nanos must have the sign of seconds"),
        (-1, 5, "nanos must have the sign of seconds"),
        (315_576_000_001, 0, "seconds must be within ±315,576,000,000"),
        (-(2**63), 0, "seconds must be within ±315,576,000,000"),
    ],
)
def test_invalid_durations_are_refused(seconds: int, nanos: int, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        duration_from_pb(Duration(seconds=seconds, nanos=nanos))
    assert str(caught.value) == (
        f"duration is not a valid google.protobuf.Duration (seconds={seconds}, nanos={nanos}): "
        + why
    )
