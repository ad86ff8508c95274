"""A node id is the peer's text: in a down reason (logged, shown and sent with the state
change it makes) it is cut and escaped (docs/design.md §10)."""

from __future__ import annotations

from llm_health.hds.assign import assign
from llm_health.hds.ledger import MAX_NAMED_CHARS, Ledger, Said

A = ("llama", "10.0.0.1:8000")


def test_a_long_node_id_is_cut_and_escaped_in_the_down_reason() -> None:
    nodes = ["gw-1\n\x1b[31m" + "x" * 1_000_000, "gw-2"]
    book = Ledger(quorum=None, ttl_s=5.0, grace_s=0.0)
    book.reassign(assign([A], nodes, 2), nodes, now=0.0)
    book.record(nodes[0], A, Said.TIMEOUT, now=1.0)
    book.record(nodes[1], A, Said.UNHEALTHY, now=1.0)
    reason = book.decide(A, now=1.0)
    assert reason is not None
    assert reason.startswith("unreachable from gw-1\\n\\x1b[31mxxx")
    assert reason.endswith("... (timeout), gw-2")
    assert len(reason) < 2 * MAX_NAMED_CHARS + 100
    assert reason.isprintable()
