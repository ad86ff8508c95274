"""The ``authz:`` section of the config (llm_health.authz.settings.AuthzConfig)."""

from __future__ import annotations

import textwrap

import pytest

from llm_health.authz import AuthzConfig
from llm_health.config import parse_config
from llm_health.errors import ConfigError

CLUSTERS = """\
clusters:
  - name: llama-70b
    endpoints: [{address: 10.0.0.11:8000}]
"""


def parse(authz: str) -> AuthzConfig:
    text = textwrap.dedent(authz).strip("\n") + "\n" + CLUSTERS
    return parse_config(text, "x.yaml", {}).authz


def problems(authz: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(authz)
    return info.value.messages


def test_no_section_gives_the_defaults() -> None:
    assert parse("") == AuthzConfig()
    assert AuthzConfig().enabled and AuthzConfig().probe_header == "strip"
    assert AuthzConfig().retry_after_s == 1


def test_every_key() -> None:
    settings = parse(
        """
        authz:
          enabled: false
          cluster_key: model_pool
          cluster_header: X-Pool
          probe_header: deny
          probe_header_name: X-Health-Probe
          shed_below: 0.25
          priority_header: X-Prio
          route_header: X-Subset
          route_value: gold
          capacity_header: X-Cap
          retry_after: 1500ms
        """
    )
    assert settings == AuthzConfig(
        enabled=False,
        cluster_key="model_pool",
        cluster_header="x-pool",
        probe_header="deny",
        probe_header_name="x-health-probe",
        shed_below=0.25,
        priority_header="x-prio",
        route_header="x-subset",
        route_value="gold",
        capacity_header="x-cap",
        retry_after="1500ms",
    )
    assert settings.retry_after_s == 2  # whole seconds, rounded up


@pytest.mark.parametrize(
    ("authz", "expected"),
    [
        ("authz: {probe_header: drop}", "x.yaml:1 authz.probe_header: 'drop' is not one of"),
        (
            "authz: {shed_bellow: 0.3}",
            'x.yaml:1 authz.shed_bellow: unknown key (did you mean "shed_below"?)',
        ),
        (
            "authz: {shed_below: 1.5}",
            "x.yaml:1 authz.shed_below: 1.5: Input should be less than or equal to 1",
        ),
        ("authz:\n  retry_after: 2", "x.yaml:2 authz.retry_after: 2 is not a duration"),
        ("authz:\n  priority_header: 'x prio'", "x.yaml:2 authz.priority_header: 'x prio'"),
        ("authz:\n  route_header: ':path'", "x.yaml:2 authz.route_header"),
        ("authz: {route_value: none}", 'route_value "none" is reserved'),
        ("authz: {capacity_header: X-LLM-Priority}", "the authz header names must all differ"),
    ],
)
def test_bad_values_name_line_and_field(authz: str, expected: str) -> None:
    (message,) = problems(authz)
    assert expected in message, message
