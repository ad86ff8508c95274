"""Board snapshots are rebuilt incrementally (only touched endpoints and their clusters):
after any sequence of operations they must equal a rebuild from scratch."""

from __future__ import annotations

import random

import pytest

from llm_health.model.board import Board, ClusterSpec, EndpointSpec, HealthSnapshot
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.snapshot_builder import SnapshotBuilder
from llm_health.model.states import State

POLICY = Policy(healthy_after=2, unhealthy_after=2, drain_time_s=5.0)
OUTCOMES = [Outcome.FAST, Outcome.FAST, Outcome.SLOW, Outcome.TIMEOUT, Outcome.ERROR]


def spec(name: str, count: int, offset: int = 0) -> ClusterSpec:
    endpoints = tuple(
        EndpointSpec(f"10.0.0.{i}:80", f"10.0.0.{i}", 80, 100) for i in range(offset, count)
    )
    return ClusterSpec(name, POLICY, endpoints)


def from_scratch(board: Board, snapshots: SnapshotBuilder) -> HealthSnapshot:
    snapshots.touch()  # everything dirty: the reference rebuild
    return board.snapshot()


def step(board: Board, rng: random.Random, now: float) -> None:
    cluster = rng.choice(board.cluster_names)
    addresses = [e.spec.address for e in board.snapshot().clusters[cluster].endpoints]
    if not addresses:
        return
    address = rng.choice(addresses)
    action = rng.randrange(9)
    if action <= 3:
        outcome = rng.choice(OUTCOMES)
        ttft = 10.0 if outcome in (Outcome.FAST, Outcome.SLOW) else None
        board.record(cluster, address, ProbeResult(outcome, now, ttft_ms=ttft), now)
    elif action == 4:
        board.set_signal(cluster, address, "hds", rng.choice(["down", None]), now)
    elif action == 5:
        board.set_limit(cluster, address, "engine", rng.choice(["9 waiting", None]), now)
    elif action == 6:
        board.set_override(cluster, address, State.DRAINING, now + 3, "maintenance")
    elif action == 7:
        board.silence(cluster, address, now, 250.0)
    else:
        count = rng.randrange(1, 6)
        board.apply_specs([spec("a", count), spec("b", 4, rng.randrange(3))], now)
    if rng.random() < 0.1:
        board.expire(now)


@pytest.mark.parametrize("seed", range(20))
def test_incremental_snapshot_equals_a_rebuild_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    snapshots = SnapshotBuilder()
    board = Board([spec("a", 4), spec("b", 3)], now=0.0, wall_offset=1000.0, snapshots=snapshots)
    for i in range(300):
        now = i * 0.25
        step(board, rng, now)
        if rng.random() < 0.5:  # snapshots taken after one change or after several
            incremental = board.snapshot().clusters
            assert dict(incremental) == dict(from_scratch(board, snapshots).clusters), f"step {i}"


def test_unchanged_endpoints_and_clusters_are_reused_and_the_version_kept() -> None:
    board = Board([spec("a", 3), spec("b", 3)], now=0.0, wall_offset=0.0)
    for address in ("10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"):
        for name in ("a", "b"):
            board.record(name, address, ProbeResult(Outcome.FAST, 0.0, ttft_ms=5.0), 0.0)
    before = board.snapshot()
    board.record("a", "10.0.0.1:80", ProbeResult(Outcome.FAST, 1.0, ttft_ms=6.0), 1.0)
    after = board.snapshot()
    assert after.clusters["b"] is before.clusters["b"]
    old, new = before.clusters["a"].endpoints, after.clusters["a"].endpoints
    assert old[0] is new[0] and old[2] is new[2] and old[1] is not new[1]
    assert new[1].last is not None and new[1].last.ttft_ms == 6.0
    assert after.clusters["a"].envoy_version == before.clusters["a"].envoy_version
    for _ in range(2):  # unhealthy_after 2: now Envoy's view changes
        board.record("a", "10.0.0.1:80", ProbeResult(Outcome.TIMEOUT, 2.0), 2.0)
    assert board.snapshot().clusters["a"].envoy_version != before.clusters["a"].envoy_version
