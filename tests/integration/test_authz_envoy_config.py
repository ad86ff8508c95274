"""envoy-configs/ext-authz.yaml matches the plugin: the settings docs/design.md §5.3 calls for are set,
commented, and name the headers, metadata and cluster key the plugin actually uses.
(Every shipped file is also validated by the real Envoy in test_envoy_configs.py; the
behaviour is proven end to end in tests/e2e/test_authz.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_health.authz import AuthzConfig
from llm_health.model.envoy_view import envoy_view
from llm_health.model.states import State
from llm_health.xds.resources import LB_METADATA_KEY, LB_METADATA_NAMESPACE
from tests.envoy_harness import (
    ENVOY_CONFIGS_DIR,
    XDS_CLUSTER,
    eds_clusters,
    listeners,
    load_config,
    routes,
    validate_config,
)

CONFIG = ENVOY_CONFIGS_DIR / "ext-authz.yaml"
DEFAULTS = AuthzConfig()


def http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = listeners(config)
    (chain,) = listener["filter_chains"]
    (hcm,) = chain["filters"]
    filters: list[dict[str, Any]] = hcm["typed_config"]["http_filters"]
    return filters


def seconds(text: str) -> float:
    assert text.endswith("s") and not text.endswith("ms"), text
    return float(text[:-1])


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return load_config(CONFIG)


@pytest.mark.envoy
def test_validates() -> None:
    result = validate_config(CONFIG)
    assert result.returncode == 0, result.stdout


def test_ext_authz_filter_fails_open_fast_and_re_routes(config: dict[str, Any]) -> None:
    names = [f["name"] for f in http_filters(config)]
    assert names == ["envoy.filters.http.ext_authz", "envoy.filters.http.router"]
    authz = http_filters(config)[0]["typed_config"]
    assert authz["grpc_service"]["envoy_grpc"]["cluster_name"] == XDS_CLUSTER
    assert authz["transport_api_version"] == "V3"
    assert authz["failure_mode_allow"] is True
    assert authz["failure_mode_allow_header_add"] is True
    assert authz["clear_route_cache"] is True
    assert 0.01 <= seconds(authz["grpc_service"]["timeout"]) <= 0.1
    assert "with_request_body" not in authz  # prompts are never sent to the plugin


def test_only_the_headers_the_plugin_reads_are_sent(config: dict[str, Any]) -> None:
    authz = http_filters(config)[0]["typed_config"]
    sent = {p["exact"] for p in authz["allowed_headers"]["patterns"]}
    needed = {
        DEFAULTS.probe_header_name,
        DEFAULTS.priority_header,
        DEFAULTS.cluster_header,
        DEFAULTS.route_header,
    }
    assert sent == needed


def test_every_route_names_its_cluster_for_the_plugin(config: dict[str, Any]) -> None:
    eds_names = {c["name"] for c in eds_clusters(config)}
    for route in routes(config):
        per_route = route["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
        extensions = per_route["check_settings"]["context_extensions"]
        assert extensions == {DEFAULTS.cluster_key: route["route"]["cluster"]}
        assert route["route"]["cluster"] in eds_names


def test_priority_route_selects_the_healthy_subset_first(config: dict[str, Any]) -> None:
    first, last = routes(config)
    assert first["match"]["headers"] == [
        {"name": DEFAULTS.route_header, "string_match": {"exact": DEFAULTS.route_value}}
    ]
    healthy_label = envoy_view(State.HEALTHY, 100, 0.3).lb_label
    metadata = first["route"]["metadata_match"]["filter_metadata"]
    assert metadata == {LB_METADATA_NAMESPACE: {LB_METADATA_KEY: healthy_label}}
    assert "headers" not in last["match"] and "metadata_match" not in last["route"]


def test_the_eds_cluster_has_subsets_on_the_plugin_label(config: dict[str, Any]) -> None:
    (cluster,) = eds_clusters(config)
    subsets = cluster["lb_subset_config"]
    assert subsets["subset_selectors"] == [{"keys": [LB_METADATA_KEY]}]
    assert subsets["fallback_policy"] == "ANY_ENDPOINT"


@pytest.mark.parametrize(
    "word",
    ["failure_mode_allow", "clear_route_cache", "fallback_policy", "ANY_ENDPOINT", "timeout"],
)
def test_the_choices_are_commented(word: str) -> None:
    comments = [
        line for line in Path(CONFIG).read_text().splitlines() if line.lstrip().startswith("#")
    ]
    assert any(word in line for line in comments), f"no comment mentions {word}"
