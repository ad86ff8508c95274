"""HDS decision state (llm_health.hds.ledger, llm_health.hds.fleet), table-driven and on a
fake clock: quorum, reasons, report TTL, first-check grace, membership, reassignment."""

from __future__ import annotations

import pytest

from llm_health.hds.assign import assign
from llm_health.hds.fleet import Fleet, NodePlan, ReportEntry
from llm_health.hds.ledger import Counted, Ledger, Said
from llm_health.hds.settings import HdsConfig

A = ("llama", "10.0.0.1:8000")
B = ("llama", "10.0.0.2:8000")
TTL, GRACE = 5.0, 2.0
UP, DOWN, SLOW, NONE = Said.HEALTHY, Said.UNHEALTHY, Said.TIMEOUT, Said.UNKNOWN


def ledger(nodes: list[str], quorum: int | None = None, count: int = 3) -> Ledger:
    book = Ledger(quorum=quorum, ttl_s=TTL, grace_s=GRACE)
    book.reassign(assign([A, B], nodes, count), nodes, now=0.0)
    return book


# --------------------------------------------------------------------------- ledger


@pytest.mark.parametrize(
    ("nodes", "quorum", "words", "expected"),
    [
        (["gw-1"], None, {"gw-1": DOWN}, "unreachable from gw-1"),
        (["gw-1"], None, {"gw-1": UP}, None),
        (["gw-1", "gw-2"], None, {"gw-1": DOWN}, None),  # majority of 2 is 2
        (["gw-1", "gw-2"], None, {"gw-1": DOWN, "gw-2": UP}, None),
        (["gw-1", "gw-2"], None, {"gw-2": DOWN, "gw-1": DOWN}, "unreachable from gw-1, gw-2"),
        (["gw-1", "gw-2"], 1, {"gw-2": DOWN, "gw-1": UP}, "unreachable from gw-2"),
        (["gw-1", "gw-2", "gw-3"], None, {"gw-2": DOWN, "gw-1": UP}, None),
        (
            ["gw-1", "gw-2", "gw-3"],
            None,
            {"gw-1": UP, "gw-2": DOWN, "gw-3": SLOW},
            "unreachable from gw-2, gw-3 (timeout)",
        ),
        (["gw-1", "gw-2", "gw-3"], 3, {"gw-2": DOWN, "gw-3": DOWN}, None),
        ([], None, {}, None),  # nobody checks: unknown, not down
    ],
)
def test_quorum_and_reason(
    nodes: list[str], quorum: int | None, words: dict[str, Said], expected: str | None
) -> None:
    book = ledger(nodes, quorum)
    for node, said in words.items():
        assert book.record(node, A, said, now=GRACE + 1) is Counted.COUNTED
    assert book.decide(A, now=GRACE + 1) == expected
    assert book.decide(B, now=GRACE + 1) is None


def test_quorum_is_capped_at_the_number_of_electors() -> None:
    book = ledger(["gw-1"], quorum=2)
    book.record("gw-1", A, DOWN, now=3.0)
    assert book.decide(A, now=3.0) == "unreachable from gw-1"


def test_unhealthy_in_the_first_check_grace_is_not_counted() -> None:
    """Envoy reports a freshly assigned host UNHEALTHY until its first check ran."""
    book = ledger(["gw-1"])
    assert book.record("gw-1", A, DOWN, now=GRACE - 0.1) is Counted.FIRST_CHECK
    assert book.decide(A, now=GRACE - 0.1) is None
    assert book.record("gw-1", A, DOWN, now=GRACE + 0.1) is Counted.COUNTED
    assert book.decide(A, now=GRACE + 0.1) == "unreachable from gw-1"


def test_after_a_healthy_report_unhealthy_counts_even_in_the_grace() -> None:
    book = ledger(["gw-1"])
    assert book.record("gw-1", A, UP, now=0.5) is Counted.COUNTED
    assert book.record("gw-1", A, SLOW, now=1.0) is Counted.COUNTED
    assert book.decide(A, now=1.0) == "unreachable from gw-1 (timeout)"


def test_reports_expire_after_the_ttl() -> None:
    book = ledger(["gw-1"])
    book.record("gw-1", A, DOWN, now=3.0)
    assert book.decide(A, now=3.0 + TTL) == "unreachable from gw-1"
    assert book.decide(A, now=3.0 + TTL + 0.01) is None  # silent: unknown, not down
    assert book.expire(now=3.0 + TTL + 0.01) == 1
    assert book.reporters(A, now=9.0)[0].said is None


def test_a_node_that_went_away_still_counts_until_its_reports_expire() -> None:
    """gw-2 said UP and vanished; gw-1 says DOWN. Until gw-2's word expires the quorum
    (2 of 2 electors) is not met; then gw-1 alone decides."""
    book = ledger(["gw-1", "gw-2"])
    book.record("gw-1", A, DOWN, now=3.0)
    book.record("gw-2", A, UP, now=3.0)
    book.reassign(assign([A, B], ["gw-1"], 3), ["gw-1"], now=3.5)  # gw-2 disconnected
    book.record("gw-1", A, DOWN, now=4.0)
    assert book.decide(A, now=4.0) is None
    assert [r.node for r in book.reporters(A, now=4.0)] == ["gw-1", "gw-2"]
    assert not book.reporters(A, now=4.0)[1].assigned
    assert book.decide(A, now=3.0 + TTL + 0.5) == "unreachable from gw-1"


def test_a_connected_node_reassigned_away_loses_its_word_at_once() -> None:
    book = ledger(["gw-1", "gw-2"], count=1)
    (checker,) = book.assignment.checkers_of(A)
    book.record(checker, A, DOWN, now=3.0)
    assert book.decide(A, now=3.0) == f"unreachable from {checker}"
    other = "gw-2" if checker == "gw-1" else "gw-1"
    forced = assign([A], [other], 1)
    book.reassign(forced, ["gw-1", "gw-2"], now=3.5)
    assert book.decide(A, now=3.5) is None
    assert book.record(checker, A, DOWN, now=3.6) is Counted.UNASSIGNED


def test_unknown_status_keeps_the_previous_word() -> None:
    book = ledger(["gw-1"])
    book.record("gw-1", A, DOWN, now=3.0)
    assert book.record("gw-1", A, NONE, now=3.5) is Counted.NO_VERDICT
    assert book.decide(A, now=3.5) == "unreachable from gw-1"


def test_removed_endpoints_lose_their_reports() -> None:
    book = ledger(["gw-1"])
    book.record("gw-1", A, DOWN, now=3.0)
    book.reassign(assign([B], ["gw-1"], 3), ["gw-1"], now=3.5)
    assert book.decide(A, now=3.5) is None
    assert book.reporters(A, now=3.5) == ()


# --------------------------------------------------------------------------- fleet

TARGETS = {
    ("llama", "10.0.0.1:8000"): ("10.0.0.1", 8000),
    ("llama", "10.0.0.2:8000"): ("10.0.0.2", 8000),
    ("qwen", "10.0.0.1:8000"): ("10.0.0.1", 8000),  # same backend in two clusters
    ("qwen", "[::1]:9000"): ("::1", 9000),
}


def fleet(count: int = 2, check: str = "tcp") -> Fleet:
    settings = HdsConfig(
        check="http" if check == "http" else "tcp",
        timeout="1s",
        checkers_per_endpoint=count,
        report_ttl=f"{TTL}s",
    )
    return Fleet(settings, TARGETS, now=0.0)


def test_two_nodes_two_checkers_each_checks_everything() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["HTTP", "TCP"], now=0.0)
    f.open_stream(2, "gw-2", ["HTTP", "TCP"], now=0.0)
    expected = NodePlan(
        (
            ("llama", (("10.0.0.1", 8000), ("10.0.0.2", 8000))),
            ("qwen", (("10.0.0.1", 8000), ("::1", 9000))),
        )
    )
    assert f.plan("gw-1") == f.plan("gw-2") == expected
    assert expected.endpoint_count == 4
    assert f.plan("nobody") == NodePlan()


def test_generation_moves_only_when_the_assignment_changes() -> None:
    f = fleet(count=1)
    start = f.generation
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    assert f.generation == start + 1
    f.open_stream(1, "gw-1", ["TCP"], now=0.1)  # a repeated request: nothing moves
    f.open_stream(3, "gw-1", ["TCP"], now=0.1)  # a second stream of the same node
    assert not f.set_endpoints(dict(TARGETS), now=0.2)
    assert f.generation == start + 1
    f.open_stream(2, "gw-2", ["TCP"], now=0.3)
    assert f.generation == start + 2
    assert f.plan("gw-1").endpoint_count + f.plan("gw-2").endpoint_count == 4
    f.close_stream(2, now=0.4)  # gw-2 leaves: gw-1 takes everything back
    assert f.generation == start + 3
    assert f.plan("gw-1").endpoint_count == 4


def test_a_node_leaves_with_its_last_stream() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    f.open_stream(2, "gw-1", ["TCP"], now=0.0)  # reconnected before the old stream closed
    f.close_stream(1, now=0.1)
    assert [n.node_id for n in f.nodes()] == ["gw-1"]
    assert f.plan("gw-1").endpoint_count == 4
    f.close_stream(2, now=0.2)
    f.close_stream(2, now=0.2)  # twice: harmless
    assert f.nodes() == ()
    assert f.assignment.checkers_of(A) == ()


def test_a_stream_keeps_its_first_node_id() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    f.open_stream(1, "gw-evil", ["TCP"], now=0.1)
    assert f.node_of(1) == "gw-1"
    assert [n.node_id for n in f.nodes()] == ["gw-1"]


def test_a_node_that_cannot_run_the_check_gets_nothing() -> None:
    f = fleet(check="http")
    f.open_stream(1, "gw-tcp-only", ["TCP"], now=0.0)
    f.open_stream(2, "gw-1", ["HTTP", "TCP"], now=0.0)
    assert f.plan("gw-tcp-only") == NodePlan()
    assert f.plan("gw-1").endpoint_count == 4


def test_reports_flat_form_matches_every_cluster_cluster_form_only_its_own() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    flat = f.report(1, [ReportEntry(None, "10.0.0.1", 8000, DOWN)], now=3.0)
    assert flat.counted == 2
    assert f.decisions(3.0)[("llama", "10.0.0.1:8000")] == "unreachable from gw-1"
    assert f.decisions(3.0)[("qwen", "10.0.0.1:8000")] == "unreachable from gw-1"
    tally = f.report(1, [ReportEntry("qwen", "10.0.0.1", 8000, UP)], now=3.5)
    assert tally.counted == 1
    assert f.decisions(3.5)[("qwen", "10.0.0.1:8000")] is None
    assert f.decisions(3.5)[("llama", "10.0.0.1:8000")] == "unreachable from gw-1"


def test_report_addresses_are_compared_as_ips() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    tally = f.report(1, [ReportEntry("qwen", "0:0::0001", 9000, DOWN)], now=3.0)
    assert tally.counted == 1
    assert f.decisions(3.0)[("qwen", "[::1]:9000")] == "unreachable from gw-1"


def test_unknown_endpoints_and_early_reports_are_counted_not_used() -> None:
    f = fleet()
    early = f.report(9, [ReportEntry(None, "10.0.0.1", 8000, DOWN)], now=0.0)
    assert early.counted == 0
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    tally = f.report(
        1,
        [
            ReportEntry(None, "10.9.9.9", 8000, DOWN),
            ReportEntry("llama", "[::1]", 9000, DOWN),  # exists only in qwen
            ReportEntry("nope", "10.0.0.1", 8000, DOWN),
            ReportEntry("llama", "10.0.0.2", 8000, DOWN),  # first-check grace
        ],
        now=0.5,
    )
    assert (tally.unknown_endpoint, tally.first_check, tally.counted) == (3, 1, 0)
    assert set(f.decisions(0.5).values()) == {None}


def test_a_silent_node_stops_being_used_and_comes_back_when_it_speaks() -> None:
    f = fleet(count=1)
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    f.open_stream(2, "gw-2", ["TCP"], now=0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        f.touch(2, now=t)
        f.tick(now=t)
    assert f.plan("gw-1").endpoint_count + f.plan("gw-2").endpoint_count == 4
    f.tick(now=5.5)  # gw-1 silent for 5.5 s > TTL
    assert f.plan("gw-1") == NodePlan()
    assert f.plan("gw-2").endpoint_count == 4
    assert not f.usable(f.nodes()[0])
    f.report(1, [], now=6.0)  # an empty report is a sign of life
    assert f.plan("gw-1").endpoint_count > 0


def test_endpoint_changes_reassign() -> None:
    f = fleet()
    f.open_stream(1, "gw-1", ["TCP"], now=0.0)
    generation = f.generation
    assert f.set_endpoints({A: ("10.0.0.1", 8000)}, now=1.0)
    assert f.generation == generation + 1
    assert f.plan("gw-1") == NodePlan((("llama", (("10.0.0.1", 8000),)),))
    assert f.endpoints() == (A,)
