"""The ext_authz admission rules (llm_health.authz): pure, table-driven, no network."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.authz import (
    PROBLEM_LOG_EVERY_S,
    PROBLEM_MESSAGE,
    AdmissionRequest,
    AuthzConfig,
    AuthzCounters,
    Decision,
    Gate,
    Problem,
    Rule,
    build_view,
    cluster_capacity,
    decide,
)
from llm_health.authz.settings import UNROUTED_VALUE
from llm_health.core.problems import ProblemLog
from llm_health.model.board import ClusterSnapshot, EndpointSnapshot, EndpointSpec, HealthSnapshot
from llm_health.model.envoy_view import envoy_view
from llm_health.model.states import State

H, D, U, S, DR = State.HEALTHY, State.DEGRADED, State.UNHEALTHY, State.STARTING, State.DRAINING
NAME = "llama-70b"
DEFAULT = AuthzConfig()


def endpoint(
    index: int, state: State, weight: int = 100, removing: bool = False
) -> EndpointSnapshot:
    spec = EndpointSpec(f"10.0.0.{index}:8000", f"10.0.0.{index}", 8000, weight)
    return EndpointSnapshot(
        cluster=NAME,
        spec=spec,
        state=state,
        reason="",
        since=0.0,
        view=envoy_view(state, weight, 0.3),
        last=None,
        removing=removing,
    )


def cluster(*states: State, warm: bool = True, name: str = NAME) -> ClusterSnapshot:
    endpoints = tuple(endpoint(i, s) for i, s in enumerate(states))
    return ClusterSnapshot(name, endpoints, warm, "v")


def snapshot(*clusters: ClusterSnapshot, revision: int = 1) -> HealthSnapshot:
    return HealthSnapshot(revision, MappingProxyType({c.name: c for c in clusters}))


def req(
    headers: Mapping[str, str] | None = None, cluster_name: str | None = NAME, size: int = 0
) -> AdmissionRequest:
    extensions = {"llm_cluster": cluster_name} if cluster_name is not None else {}
    return AdmissionRequest(dict(headers or {}), extensions, size)


def run(
    request: AdmissionRequest, *states: State, warm: bool = True, **overrides: object
) -> Decision:
    config = DEFAULT.model_copy(update=overrides)
    view = build_view(snapshot(cluster(*states, warm=warm)), config)
    return decide(request, view, config)


# --------------------------------------------------------------------------- capacity


@pytest.mark.parametrize(
    ("states", "ratio", "routable"),
    [
        ((H, H, H), 1.0, 3),
        ((H, H, D), (100 + 100 + 30) / 300, 3),
        ((H, U, U), 100 / 300, 1),
        ((D, D), 60 / 200, 2),
        ((U, S, DR), 0.0, 0),
    ],
)
def test_capacity(states: tuple[State, ...], ratio: float, routable: int) -> None:
    capacity = cluster_capacity(cluster(*states))
    assert capacity.ratio == pytest.approx(ratio)
    assert capacity.routable == routable


def test_capacity_counts_weights_and_leaves_out_endpoints_being_removed() -> None:
    endpoints = (endpoint(0, H, 300), endpoint(1, D, 100), endpoint(2, DR, 100, removing=True))
    capacity = cluster_capacity(ClusterSnapshot(NAME, endpoints, True, "v"))
    assert (capacity.sent_weight, capacity.base_weight) == (300 + 30, 400)
    assert capacity.down == 1


def test_empty_cluster_has_no_capacity() -> None:
    assert cluster_capacity(ClusterSnapshot(NAME, (), True, "v")).ratio == 0.0


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("headers", "states", "rule", "status"),
    [
        ({}, (H, H), Rule.OK, 200),
        ({"x-llm-priority": "high"}, (H, D), Rule.PRIORITY_ROUTED, 200),
        ({"x-llm-priority": " High "}, (H, D), Rule.PRIORITY_ROUTED, 200),
        ({"x-llm-priority": "high"}, (D, D), Rule.OK, 200),  # no HEALTHY: no routing
        ({"x-llm-priority": "low"}, (H, H), Rule.OK, 200),  # capacity 1.0: no shedding
        ({"x-llm-priority": "low"}, (H, U, U), Rule.SHED, 429),
        ({"x-llm-priority": "LOW"}, (H, U, U), Rule.SHED, 429),
        ({"x-llm-priority": "low"}, (H, U), Rule.OK, 200),  # 0.5 is not below 0.5
        ({"x-llm-priority": "high"}, (H, U, U), Rule.PRIORITY_ROUTED, 200),
        ({}, (H, U, U), Rule.OK, 200),
        ({"x-llm-priority": "low,high"}, (H, U, U), Rule.OK, 200),  # repeated header
        ({"x-llm-priority": "high"}, (U, U), Rule.NO_CAPACITY, 503),
        ({}, (U, S, DR), Rule.NO_CAPACITY, 503),
        ({}, (), Rule.NO_CAPACITY, 503),
    ],
)
def test_rules(headers: dict[str, str], states: tuple[State, ...], rule: Rule, status: int) -> None:
    decision = run(req(headers), *states)
    assert (decision.rule, decision.status) == (rule, status)
    assert decision.cluster == NAME


def test_ok_adds_the_capacity_header() -> None:
    decision = run(req(), H, H, D)
    assert decision.allowed
    assert decision.set_headers == (("x-llm-capacity", "0.77"),)
    assert decision.remove_headers == ()


def test_priority_routing_sets_the_route_header() -> None:
    decision = run(req({"x-llm-priority": "high"}), H, D)
    assert dict(decision.set_headers) == {"x-llm-route": "healthy", "x-llm-capacity": "0.65"}


def test_no_capacity_answer() -> None:
    decision = run(req(), U, U, S)
    assert dict(decision.reply_headers) == {
        "retry-after": "1",
        "content-type": "application/json",
        "x-llm-capacity": "0.00",
    }
    error = json.loads(decision.body)["error"]
    assert error == {
        "message": "no healthy backend in cluster llama-70b: 3 of 3 endpoints are out of service",
        "type": "no_capacity",
        "code": 503,
        "cluster": NAME,
        "retry_after_s": 1,
    }


def test_shed_answer_and_settings() -> None:
    decision = run(req({"x-llm-priority": "low"}), H, D, U, shed_below=0.6, retry_after=7.0)
    assert decision.status == 429
    assert dict(decision.reply_headers)["retry-after"] == "7"
    error = json.loads(decision.body)["error"]
    assert error["type"] == "shed" and error["retry_after_s"] == 7
    assert "43% of its capacity (below 60%)" in error["message"]


def test_shed_below_zero_never_sheds() -> None:
    assert run(req({"x-llm-priority": "low"}), H, U, U, U, shed_below=0.0).rule is Rule.OK


def test_cold_cluster_is_allowed_untouched_even_with_nothing_routable() -> None:
    """Just after a plugin restart nothing is probed yet: Envoy still has the last
    endpoints it was sent, so the plugin must not turn users away (docs/design.md §7)."""
    decision = run(req({"x-llm-priority": "low"}), U, U, warm=False)
    assert (decision.rule, decision.allowed, decision.set_headers) == (Rule.COLD, True, ())


def test_disabled_allows_everything_untouched() -> None:
    decision = run(req({"x-llm-probe": "true"}), U, U, enabled=False)
    assert decision.rule is Rule.DISABLED
    assert (decision.set_headers, decision.remove_headers) == ((), ())


# --------------------------------------------------------------------------- the cluster


def test_context_extension_wins_over_the_header() -> None:
    view = build_view(snapshot(cluster(H), cluster(U, name="qwen")), DEFAULT)
    request = AdmissionRequest({"x-llm-cluster": "qwen"}, {"llm_cluster": NAME})
    assert decide(request, view, DEFAULT).cluster == NAME


def test_header_is_the_fallback() -> None:
    view = build_view(snapshot(cluster(H), cluster(U, name="qwen")), DEFAULT)
    decision = decide(AdmissionRequest({"x-llm-cluster": " qwen "}), view, DEFAULT)
    assert (decision.cluster, decision.rule) == ("qwen", Rule.NO_CAPACITY)


def test_no_cluster_is_allowed_and_reported() -> None:
    decision = run(req(cluster_name=None), U)
    assert (decision.rule, decision.allowed, decision.cluster) == (Rule.NO_CLUSTER, True, None)
    assert decision.set_headers == ()
    assert decision.problem is not None and decision.problem.kind == "no_cluster"


def test_unknown_cluster_is_allowed_and_reported_with_a_clipped_name() -> None:
    decision = run(req(cluster_name="x" * 100_000), U)
    assert (decision.rule, decision.allowed, decision.cluster) == (
        Rule.UNKNOWN_CLUSTER,
        True,
        None,
    )
    assert decision.problem is not None and decision.problem.kind == "unknown_cluster"
    assert "(100000 characters)" in decision.problem.detail
    assert len(decision.problem.detail) < 300


# --------------------------------------------------------------------------- headers


def test_probe_header_is_stripped_and_the_rules_go_on() -> None:
    decision = run(req({"x-llm-probe": "true", "x-llm-priority": "high"}), H)
    assert decision.rule is Rule.PRIORITY_ROUTED
    assert decision.remove_headers == ("x-llm-probe",)
    assert decision.probe_stripped


def test_probe_header_is_not_stripped_from_a_denial() -> None:
    decision = run(req({"x-llm-probe": "true"}), U)
    assert (decision.status, decision.remove_headers, decision.probe_stripped) == (503, (), False)


@pytest.mark.parametrize("cluster_name", [NAME, "unknown", None])
def test_probe_header_deny_mode(cluster_name: str | None) -> None:
    decision = run(req({"x-llm-probe": "anything"}, cluster_name), H, probe_header="deny")
    assert (decision.rule, decision.status) == (Rule.PROBE_DENIED, 403)
    assert decision.cluster == (NAME if cluster_name == NAME else None)
    assert json.loads(decision.body)["error"]["type"] == "probe_denied"


def test_client_route_header_is_overwritten_unless_routed() -> None:
    forged = {"x-llm-route": "healthy"}
    assert dict(run(req(forged), H).set_headers)["x-llm-route"] == UNROUTED_VALUE
    assert dict(run(req(forged, "unknown"), H).set_headers) == {"x-llm-route": UNROUTED_VALUE}
    routed = run(req({**forged, "x-llm-priority": "high"}), H)
    assert dict(routed.set_headers)["x-llm-route"] == "healthy"
    assert run(req(forged), U).reply_headers  # a denial has nothing to overwrite


def test_oversized_headers_are_reported_on_any_answer() -> None:
    big = 2 * DEFAULT.max_header_bytes
    for decision in (run(req(size=big), H), run(req(size=big), U)):
        assert decision.problem is not None and decision.problem.kind == "oversized_headers"
    assert run(req(size=DEFAULT.max_header_bytes), H).problem is None


def test_a_huge_priority_value_is_no_priority() -> None:
    assert run(req({"x-llm-priority": "low" + " " * 1_000_000}), H, U, U).rule is Rule.OK


def test_renamed_headers_are_used() -> None:
    names = {
        "priority_header": "x-prio",
        "route_header": "x-subset",
        "route_value": "gold",
        "capacity_header": "x-cap",
    }
    decision = run(req({"x-prio": "high"}), H, **names)
    assert dict(decision.set_headers) == {"x-subset": "gold", "x-cap": "1.00"}


_HEADER_NAMES = st.sampled_from(
    ["x-llm-probe", "x-llm-priority", "x-llm-cluster", "x-llm-route", "x-other", ":path"]
)
_VALUES = st.one_of(
    st.sampled_from(["low", "high", "healthy", NAME, "", " LOW "]), st.text(max_size=50)
)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(_HEADER_NAMES, _VALUES, max_size=6),
    extensions=st.dictionaries(st.sampled_from(["llm_cluster", "other"]), _VALUES, max_size=2),
    states=st.lists(st.sampled_from(list(State)), max_size=5),
    warm=st.booleans(),
    mode=st.sampled_from(["strip", "deny"]),
)
def test_invariants_for_any_request(
    headers: dict[str, str],
    extensions: dict[str, str],
    states: list[State],
    warm: bool,
    mode: str,
) -> None:
    config = DEFAULT.model_copy(update={"probe_header": mode})
    view = build_view(snapshot(cluster(*states, warm=warm)), config)
    decision = decide(AdmissionRequest(headers, extensions, 0), view, config)
    assert decision.status in (200, 403, 429, 503)
    if decision.allowed:
        routed = dict(decision.set_headers).get("x-llm-route") == "healthy"
        assert routed == (decision.rule is Rule.PRIORITY_ROUTED)
        if routed:
            assert headers.get("x-llm-priority", "").strip().lower() == "high"
            assert H in states and warm
        assert ("x-llm-probe" in decision.remove_headers) == ("x-llm-probe" in headers)
    else:
        assert json.loads(decision.body)["error"]["code"] == decision.status
        assert decision.status != 403 or ("x-llm-probe" in headers and mode == "deny")
        assert decision.status != 429 or headers.get("x-llm-priority", "").strip().lower() == "low"


# --------------------------------------------------------------------------- gate


def test_gate_rebuilds_only_when_the_snapshot_or_the_settings_change() -> None:
    current = {"snapshot": snapshot(cluster(H), revision=1), "settings": DEFAULT}
    gate = Gate(lambda: current["snapshot"], lambda: current["settings"])  # type: ignore[arg-type,return-value]
    for _ in range(5):
        assert gate.check(req()).rule is Rule.OK
    assert gate.rebuilds == 1
    current["snapshot"] = snapshot(cluster(U), revision=2)
    assert gate.check(req()).rule is Rule.NO_CAPACITY
    assert gate.check(req()).rule is Rule.NO_CAPACITY
    assert gate.rebuilds == 2
    current["settings"] = DEFAULT.model_copy(update={"enabled": False})
    assert gate.check(req()).rule is Rule.DISABLED
    assert gate.rebuilds == 3


# --------------------------------------------------------------------------- bookkeeping


def test_counters_by_cluster_and_rule_with_bounded_labels() -> None:
    counters = AuthzCounters()
    counters.count(run(req(), H), 0.000_03)
    counters.count(run(req({"x-llm-probe": "1"}), H), 0.000_2)
    counters.count(run(req(), U), 0.003)
    for i in range(50):  # client-chosen names must not become labels
        counters.count(run(req(cluster_name=f"junk-{i}"), H), 1.0)
    counters.count(run(req(cluster_name=None), H), 0.0)
    data = counters.as_dict()
    json.dumps(data)
    assert data["checks"] == 54
    assert data["decisions"] == {
        NAME: {"ok": 2, "no_capacity": 1},
        "(unknown)": {"unknown_cluster": 50},
        "(none)": {"no_cluster": 1},
    }
    assert data["probe_headers_stripped"] == 1
    assert data["problems"] == {"unknown_cluster": 50, "no_cluster": 1}
    buckets = data["latency_s"]["buckets"]
    assert buckets["5e-05"] == 2  # 0.0 and 30 us
    assert buckets["0.00025"] == 3
    assert buckets["0.005"] == 4
    assert buckets["0.025"] == 4
    assert buckets["+Inf"] == data["latency_s"]["count"] == 54


def test_problem_log_is_rate_limited_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    problems = ProblemLog(
        logging.getLogger("llm_health.authz"), every_s=PROBLEM_LOG_EVERY_S, clock=lambda: now[0]
    )

    def report(problem: Problem, cluster: str | None = None) -> bool:
        return problems.report(problem.kind, PROBLEM_MESSAGE, problem.log_fields(cluster))

    caplog.set_level(logging.WARNING, logger="llm_health.authz")
    assert report(Problem("unknown_cluster", "unknown cluster 'a'"))
    assert not report(Problem("unknown_cluster", "unknown cluster 'b'"))
    assert not report(Problem("unknown_cluster", "unknown cluster 'c'"))
    assert report(Problem("no_cluster", "none"), cluster=None)  # other kind
    now[0] += 9.9
    assert not report(Problem("unknown_cluster", "unknown cluster 'x'"))
    now[0] += 0.1
    assert report(Problem("unknown_cluster", "unknown cluster 'd'"))
    records = [r for r in caplog.records if r.name == "llm_health.authz"]
    assert {r.getMessage() for r in records} == {"ext_authz request problem"}
    assert [(r.problem, r.suppressed) for r in records] == [  # type: ignore[attr-defined]
        ("unknown_cluster", 0),
        ("no_cluster", 0),
        ("unknown_cluster", 3),
    ]
    assert records[-1].detail == "unknown cluster 'd'"  # type: ignore[attr-defined]
