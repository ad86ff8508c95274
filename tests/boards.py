"""Boards the tests share: one builder per kind, built through the board's public methods.

``healthy_board``: every endpoint HEALTHY after one FAST probe. ``every_state_board``: one
endpoint per docs/design.md §4 row (HEALTHY, DEGRADED, UNHEALTHY, DRAINING, STARTING), the
EDS table the xDS tests check.
"""

from __future__ import annotations

from llm_health.model.board import Board, ClusterSpec, EndpointSpec
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State

# The §4 table's endpoints: address -> base weight (DRAINING's and STARTING's differ, so
# that a wrong weight shows), and a degraded endpoint of base weight 1.
HEALTHY, DEGRADED, UNHEALTHY, DRAINING, STARTING, TINY = (
    EndpointSpec(f"127.0.0.1:{port}", "127.0.0.1", port, weight)
    for port, weight in ((9001, 100), (9002, 100), (9003, 100), (9004, 80), (9005, 50), (9006, 1))
)


def result(outcome: Outcome, ttft_ms: float | None = None) -> ProbeResult:
    """A probe result started at 0."""
    return ProbeResult(outcome, 0.0, ttft_ms=ttft_ms)


def healthy_board(
    *addresses: str,
    policy: Policy,
    cluster: str = "c",
    wall_offset: float = 0.0,
    ttft_ms: float = 10.0,
) -> Board:
    """One cluster of ``addresses`` ("host:port"), each HEALTHY after a FAST probe at 1 s."""
    endpoints = tuple(
        EndpointSpec(a, a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in addresses
    )
    board = Board([ClusterSpec(cluster, policy, endpoints)], now=0.0, wall_offset=wall_offset)
    for address in addresses:
        board.record(cluster, address, result(Outcome.FAST, ttft_ms), 1.0)
    assert {board.health(cluster, a).state for a in addresses} == {State.HEALTHY}
    return board


def every_state_board(cluster: str, *also_degraded: EndpointSpec, warm: bool = False) -> Board:
    """One endpoint per docs/design.md §4 row in ``cluster`` (STARTING never probed),
    then ``also_degraded``. ``warm``: pushed anyway, as after the warm-start timeout."""
    endpoints = (HEALTHY, DEGRADED, UNHEALTHY, DRAINING, STARTING, *also_degraded)
    board = Board([ClusterSpec(cluster, Policy(), endpoints)], now=0.0, wall_offset=0.0)
    board.record(cluster, HEALTHY.address, result(Outcome.FAST, 10), 1.0)
    board.record(cluster, DEGRADED.address, result(Outcome.SLOW, 500), 1.0)
    board.record(cluster, UNHEALTHY.address, result(Outcome.FATAL), 1.0)
    board.record(cluster, DRAINING.address, result(Outcome.FAST, 10), 1.0)
    board.drain(cluster, DRAINING.address, 2.0, "operator drain")
    for spec in also_degraded:
        board.record(cluster, spec.address, result(Outcome.SLOW, 500), 1.0)
    if warm:
        board.mark_warm()
    return board
