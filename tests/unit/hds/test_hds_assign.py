"""Rendezvous assignment of endpoints to Envoys (llm_health.hds.assign): even, stable,
deterministic, never more checkers than asked or than there are nodes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.hds.assign import EndpointKey, assign, checkers, score

ENDPOINTS: list[EndpointKey] = [("llama", f"10.0.{i // 250}.{i % 250}:8000") for i in range(1000)]


def test_every_endpoint_gets_count_distinct_checkers() -> None:
    result = assign(ENDPOINTS[:50], ["gw-1", "gw-2", "gw-3"], 2)
    assert set(result.by_endpoint) == set(ENDPOINTS[:50])
    for chosen in result.by_endpoint.values():
        assert len(chosen) == 2
        assert len(set(chosen)) == 2
    # by_node is the exact inverse of by_endpoint
    pairs = {(e, n) for e, nodes in result.by_endpoint.items() for n in nodes}
    assert pairs == {(e, n) for n, eps in result.by_node.items() for e in eps}


def test_fewer_nodes_than_count_means_every_node_checks_everything() -> None:
    result = assign(ENDPOINTS[:4], ["gw-b", "gw-a"], 3)
    assert all(set(c) == {"gw-a", "gw-b"} for c in result.by_endpoint.values())
    assert result.endpoints_of("gw-a") == tuple(sorted(ENDPOINTS[:4]))


def test_no_nodes_leaves_every_endpoint_unassigned() -> None:
    result = assign(ENDPOINTS[:3], [], 2)
    assert dict(result.by_endpoint) == {e: () for e in ENDPOINTS[:3]}
    assert dict(result.by_node) == {}
    assert result.checkers_of(("nope", "1.2.3.4:1")) == ()


def test_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        assign(ENDPOINTS[:1], ["gw-1"], 0)


def test_load_is_even() -> None:
    """1,000 endpoints x 2 checkers over 4 nodes: 500 each expected; the binomial spread
    is about 16, so +-100 is a 6-sigma bound that still catches a skewed hash."""
    result = assign(ENDPOINTS, ["gw-1", "gw-2", "gw-3", "gw-4"], 2)
    load = {node: len(eps) for node, eps in result.by_node.items()}
    assert sum(load.values()) == 2000
    assert all(400 <= count <= 600 for count in load.values()), load


def test_deterministic_and_order_independent() -> None:
    first = assign(ENDPOINTS[:200], ["gw-1", "gw-2", "gw-3"], 2)
    second = assign(list(reversed(ENDPOINTS[:200])), ["gw-3", "gw-1", "gw-2", "gw-1"], 2)
    assert first == second
    assert score(("a", "1.1.1.1:1"), "gw") == score(("a", "1.1.1.1:1"), "gw")
    assert score(("a", "1.1.1.1:1"), "gw") != score(("b", "1.1.1.1:1"), "gw")


def test_checkers_are_the_best_scores() -> None:
    endpoint = ENDPOINTS[7]
    nodes = [f"gw-{i}" for i in range(10)]
    best = sorted(nodes, key=lambda n: score(endpoint, n), reverse=True)[:3]
    assert checkers(endpoint, nodes, 3) == tuple(best)


node_sets = st.sets(st.sampled_from([f"gw-{i}" for i in range(8)]), min_size=2, max_size=8)


@settings(max_examples=60, deadline=None)
@given(nodes=node_sets, count=st.integers(1, 4), data=st.data())
def test_a_node_leaving_moves_only_its_own_endpoints(
    nodes: set[str], count: int, data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(sorted(nodes)))
    before = assign(ENDPOINTS[:120], nodes, count)
    after = assign(ENDPOINTS[:120], nodes - {gone}, count)
    for endpoint, old in before.by_endpoint.items():
        new = after.by_endpoint[endpoint]
        if gone not in old:
            assert new == old, endpoint
        else:
            kept = [n for n in old if n != gone]
            assert new[: len(kept)] == tuple(kept)  # the others stay, in rank order
            assert gone not in new


@settings(max_examples=60, deadline=None)
@given(nodes=node_sets, count=st.integers(1, 4))
def test_a_node_joining_takes_over_only_slots_it_wins(nodes: set[str], count: int) -> None:
    before = assign(ENDPOINTS[:120], nodes, count)
    after = assign(ENDPOINTS[:120], nodes | {"gw-new"}, count)
    changed = 0
    for endpoint, old in before.by_endpoint.items():
        new = after.by_endpoint[endpoint]
        if new != old:
            assert "gw-new" in new
            assert len(set(old) - set(new)) <= 1  # at most one node displaced
            changed += 1
    assert changed == len(after.endpoints_of("gw-new"))


def test_a_huge_node_id_is_scored_by_its_digest_computed_once() -> None:
    """A peer's node id may be a megabyte: each pair's score must not hash all of it
    (1,000 endpoints x 30 such nodes took minutes on the event loop)."""
    from llm_health.hds.assign import MAX_PLAIN_NODE_ID, node_part, score

    short = "gateway-1"
    assert node_part(short) == short.encode()  # ordinary ids: scores as before
    huge = "x" * 1_000_000
    part = node_part(huge)
    assert len(part) < 64 and part != node_part("x" * (MAX_PLAIN_NODE_ID + 1))
    before = node_part.cache_info().hits
    scores = {score(("pool", f"10.0.0.{n}:8000"), huge) for n in range(100)}
    assert len(scores) > 90  # still spread over endpoints
    assert node_part.cache_info().hits - before == 100  # the digest was computed once
