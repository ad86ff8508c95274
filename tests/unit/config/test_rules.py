"""config/rules.py: each rule across fields or sections, as a pure function (the loader's
messages built from them are checked in test_config.py)."""

from __future__ import annotations

from llm_health.config import rules


def test_each_rule_names_its_problem_and_passes_a_good_value() -> None:
    assert rules.ttft_within_timeout(0.2, 0.8) is None
    assert rules.ttft_within_timeout(0.8, 0.8) == "healthy_ttft must be shorter than timeout"
    assert rules.endpoints_or_discovery("a", 0, discovery=True) is None
    assert rules.endpoints_or_discovery("a", 0, discovery=False) == (
        "cluster a: give endpoints, discovery, or both"
    )
    assert rules.weights_fit([rules.MAX_WEIGHT_SUM]) is None
    assert rules.weights_fit([rules.MAX_WEIGHT_SUM, 1]) is not None
    assert rules.endpoints_total(rules.MAX_ENDPOINTS) is None


def test_duplicates_name_the_field_of_the_second_one() -> None:
    clusters = [("a", ["[::1]:80", "10.0.0.1:80"]), ("b", []), ("a", ["[0::1]:80"])]
    assert list(rules.duplicates(clusters)) == [
        (("clusters", 2, "name"), 'duplicate cluster name "a"')
    ]
    same = [("a", ["[::1]:80", "[0::1]:80"])]
    assert list(rules.duplicates(same)) == [
        (("clusters", 0, "endpoints", 1, "address"), 'duplicate endpoint "[0::1]:80"')
    ]


def test_counts_look_at_the_raw_mapping_only_when_it_has_clusters() -> None:
    assert list(rules.counts({"clusters": "x"})) == []
    many = {"clusters": [{}] * (rules.MAX_CLUSTERS + 1)}
    ((path, message),) = rules.counts(many)
    assert path == ("clusters",) and message.endswith(f"at most {rules.MAX_CLUSTERS} are allowed")


def test_the_server_is_authenticated_off_loopback() -> None:
    local = ("127.0.0.1:18000", "127.0.0.1:18080")
    assert rules.server_reachable(*local, None, authenticated=False) is None
    assert rules.server_reachable(*local, "127.0.0.1:18000", authenticated=True) == (
        'authz "127.0.0.1:18000" must differ from grpc and http'
    )
    assert rules.server_reachable("0.0.0.0:1", "127.0.0.1:2", None, authenticated=True) is None
    found = rules.server_reachable("0.0.0.0:1", "127.0.0.1:2", None, authenticated=False)
    assert found is not None and found.startswith('grpc "0.0.0.0:1" is not a loopback address')
