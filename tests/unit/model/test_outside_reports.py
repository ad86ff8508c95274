"""The board's one cap on outside reports (``Board.report``, ``outside_allowed``): what
unauthenticated HDS verdicts and access-log limits may hold out of a cluster together."""

from __future__ import annotations

import pytest

from llm_health.model.board import Board, ClusterSpec, EndpointSpec, outside_allowed
from llm_health.model.causes import Cause
from llm_health.model.outcome import Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import State

FAST = ProbeResult(Outcome.FAST, 0.0, ttft_ms=10)
ERROR = ProbeResult(Outcome.ERROR, 0.0)


def board(*sizes: int, percent: int = 50) -> Board:
    """Clusters c1, c2, … of ``sizes`` endpoints, every one HEALTHY."""
    policy = Policy(healthy_after=1, unhealthy_after=1, max_ejection_percent=percent)
    specs = [
        ClusterSpec(
            f"c{i}",
            policy,
            tuple(EndpointSpec(f"10.0.{i}.{n}:80", f"10.0.{i}.{n}", 80) for n in range(size)),
        )
        for i, size in enumerate(sizes, start=1)
    ]
    made = Board(specs, now=0.0, wall_offset=0.0)
    for spec in specs:
        for endpoint in spec.endpoints:
            made.record(spec.name, endpoint.address, FAST, 1.0)
    return made


def addresses(made: Board, cluster: str) -> list[str]:
    return [e.spec.address for e in made.snapshot().clusters[cluster].endpoints]


def states(made: Board, cluster: str) -> list[State]:
    return [e.state for e in made.snapshot().clusters[cluster].endpoints]


def down_all(
    made: Board, cluster: str, reason: str = "unreachable from gw"
) -> dict[tuple[str, str], str | None]:
    return {(cluster, a): reason for a in addresses(made, cluster)}


@pytest.mark.parametrize(
    ("total", "percent", "allowed"),
    [(0, 50, 0), (1, 50, 0), (1, 100, 0), (2, 50, 1), (3, 50, 1), (4, 50, 2), (3, 30, 0),
     (3, 100, 2), (10, 0, 0), (10, 25, 2)],
)  # fmt: skip
def test_outside_allowed_rounds_down_and_never_takes_all(
    total: int, percent: int, allowed: int
) -> None:
    assert outside_allowed(total, percent) == allowed


def test_capped_signals_never_take_the_last_endpoint() -> None:
    made = board(1, 3)
    verdicts = {**down_all(made, "c1"), **down_all(made, "c2")}
    result = made.report("hds", verdicts, 2.0, cause=Cause.SIGNAL, capped=True)
    assert states(made, "c1") == [State.HEALTHY]
    assert states(made, "c2").count(State.UNHEALTHY) == 1
    assert len(result.held) == 3 and len(result.transitions) == 1
    again = made.report("hds", verdicts, 3.0, cause=Cause.SIGNAL, capped=True)
    assert again.held == result.held  # re-submitted: still held, nothing more goes out
    assert states(made, "c2").count(State.UNHEALTHY) == 1


def test_uncapped_reports_apply_as_designed() -> None:
    made = board(1, 3)
    verdicts = {**down_all(made, "c1"), **down_all(made, "c2")}
    result = made.report("hds", verdicts, 2.0, cause=Cause.SIGNAL, capped=False)
    assert not result.held and len(result.transitions) == 4
    assert states(made, "c1") == [State.UNHEALTHY] and set(states(made, "c2")) == {State.UNHEALTHY}


def test_limits_and_signals_share_one_cap() -> None:
    made = board(4)  # 50 %: two may be held out
    first, second, third, _ = addresses(made, "c1")
    made.report("hds", {("c1", first): "unreachable"}, 2.0, cause=Cause.SIGNAL, capped=True)
    limits = {("c1", a): "error rate 100.0 %" for a in addresses(made, "c1")}
    result = made.report("quality", limits, 2.0, cause=Cause.QUALITY, limit=True, capped=True)
    assert states(made, "c1").count(State.DEGRADED) == 1  # one more: the room left
    assert ("c1", first) in result.transitions  # out already: no room needed
    assert len(result.held) == 2
    signals = {("c1", a): "unreachable" for a in (second, third)}
    held = made.report("hds", signals, 3.0, cause=Cause.SIGNAL, capped=True).held
    out = [s for s in states(made, "c1") if s is not State.HEALTHY]
    assert len(out) == 2 and held  # the reported limit counts against the HDS verdicts


def test_lifts_go_first_and_free_room() -> None:
    made = board(3)
    one, two, _ = addresses(made, "c1")
    made.report("quality", {("c1", one): "slow"}, 2.0, cause=Cause.QUALITY, limit=True, capped=True)
    swap = {("c1", two): "slow", ("c1", one): None}
    result = made.report("quality", swap, 3.0, cause=Cause.QUALITY, limit=True, capped=True)
    assert not result.held
    snapshot = {e.spec.address: e for e in made.snapshot().clusters["c1"].endpoints}
    assert dict(snapshot[two].limits) == {"quality": "slow"} and not snapshot[one].limits


def test_a_lifted_signal_still_counts_until_probes_bring_it_back() -> None:
    made = board(3)
    one, two, _ = addresses(made, "c1")
    made.report("hds", {("c1", one): "down"}, 2.0, cause=Cause.SIGNAL, capped=True)
    swap = {("c1", two): "down", ("c1", one): None}
    result = made.report("hds", swap, 3.0, cause=Cause.SIGNAL, capped=True)
    assert result.held == {("c1", two)}  # one is still UNHEALTHY: recovery is the probes'
    made.record("c1", one, FAST, 4.0)  # healthy_after 1
    assert not made.report("hds", {("c1", two): "down"}, 5.0, cause=Cause.SIGNAL, capped=True).held


def test_probe_failures_count_but_engine_limits_do_not() -> None:
    made = board(3)
    one, two, three = addresses(made, "c1")
    made.set_limit("c1", two, "engine", "12 waiting", 2.0)  # our own reading: not reported
    made.record("c1", one, ERROR, 2.0)
    assert made.health("c1", one).state is State.UNHEALTHY
    limits = {("c1", a): "p95 TTFT 2.00 s" for a in (one, two, three)}
    result = made.report("quality", limits, 3.0, cause=Cause.QUALITY, limit=True, capped=True)
    assert ("c1", one) in result.transitions  # out already
    assert result.held == {("c1", two), ("c1", three)}  # the room went to the probe failure


def test_endpoints_not_on_the_board_are_skipped() -> None:
    made = board(2)
    result = made.report(
        "hds", {("c1", "10.9.9.9:80"): "down", ("zz", "x"): "down"}, 2.0,
        cause=Cause.SIGNAL, capped=True,
    )  # fmt: skip
    assert not result.transitions and not result.held


def test_a_reported_limit_repeated_changes_nothing() -> None:
    made = board(3)
    (one, *_) = addresses(made, "c1")
    key = {("c1", one): "error rate 5.0 %"}
    made.report("quality", key, 2.0, cause=Cause.QUALITY, limit=True, capped=True)
    revision = made.snapshot().revision
    again = made.report("quality", key, 3.0, cause=Cause.QUALITY, limit=True, capped=True)
    assert not again.transitions[("c1", one)].changed
    assert made.snapshot().revision == revision
