"""``llm-health agent --config``'s file (``config.agent``): the same ``probe:`` section as
``serve``, an ``agent:`` section, nothing else; loaded by the same loader (file:line
messages, ``${ENV}``, the size limit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_health.config.agent import (
    ENGINE_CLUSTER,
    AgentFile,
    load_agent_config,
    parse_agent_config,
)
from llm_health.config.reading import MAX_FILE_BYTES
from llm_health.errors import ConfigError


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(text, "agent.yaml", environ or {})
    return caught.value.messages


def test_an_empty_file_is_every_default() -> None:
    assert parse_agent_config("", "agent.yaml", {}) == AgentFile()
    assert parse_agent_config("# only a comment\n", "agent.yaml", {}) == AgentFile()


def test_probe_and_agent_sections() -> None:
    text = (
        "probe:\n"
        "  api: openai-chat\n"
        "  model: ${MODEL}\n"
        "  timeout: 2s\n"
        "  healthy_ttft: 500ms\n"
        "  headers: {Authorization: 'Bearer ${KEY}'}\n"
        "agent:\n"
        "  ready_when_degraded: false\n"
        "  restart_after: 10m\n"
    )
    environ = {"MODEL": "llama-70b", "KEY": "s3cret-s3cret"}
    file = parse_agent_config(text, "agent.yaml", environ)
    assert file.agent.ready_when_degraded is False and file.agent.restart_after == 600.0
    target = file.target("127.0.0.1:8000")
    assert (target.cluster, target.address, target.model) == (
        ENGINE_CLUSTER,
        "127.0.0.1:8000",
        "llama-70b",
    )
    assert target.url == "http://127.0.0.1:8000/v1/chat/completions"
    assert target.timeout_s == 2.0 and target.models_path == "/v1/models"
    assert "s3cret-s3cret" in file.secret_values()
    spec = file.cluster("127.0.0.1:8000")
    assert spec.name == ENGINE_CLUSTER and spec.policy.timeout_s == 2.0
    assert [(e.host, e.port) for e in spec.endpoints] == [("127.0.0.1", 8000)]


def test_a_discovered_model_is_probed_but_not_checked() -> None:
    target = AgentFile().target("127.0.0.1:8000", "found-model")
    assert target.model == "found-model" and target.models_path is None
    configured = parse_agent_config("probe: {model: mine}", "agent.yaml", {})
    assert configured.target("127.0.0.1:8000", "found-model").model == "mine"


def test_restart_after_null_is_never() -> None:
    file = parse_agent_config("agent: {restart_after: null}", "agent.yaml", {})
    assert file.agent.restart_after is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "probe: {}\nclusters:\n  - name: a\n",
            "agent.yaml:2 clusters: not used by the agent; it probes --engine",
        ),
        (
            "server: {http: 0.0.0.0:1}\n",
            "agent.yaml:1 server: not used by the agent; it listens on --http",
        ),
        (
            "hds: {}\n",
            "agent.yaml:1 hds: not used by the agent (a section of llm-health serve's file)",
        ),
        (
            "agnet: {}\n",
            'agent.yaml:1 agnet: unknown key (did you mean "agent"?); the agent\'s file takes '
            "probe and agent",
        ),
        (
            "agent:\n  restart_after: 5x\n",
            'agent.yaml:2 agent.restart_after: "5x" is not a duration (use e.g. "800ms", "1s", "5m")',
        ),
        (
            "agent:\n  restart_after: 300\n",
            'agent.yaml:2 agent.restart_after: 300 is not a duration: write it as a string, e.g. "800ms"',
        ),
        (
            "agent:\n  restart_afer: 5m\n",
            'agent.yaml:2 agent.restart_afer: unknown key (did you mean "restart_after"?)',
        ),
        (
            "agent: {ready_when_degraded: maybe}\n",
            "agent.yaml:1 agent.ready_when_degraded: 'maybe': Input should be a valid boolean, unable to interpret input",
        ),
        (
            "probe:\n  timeout: 80x\n",
            'agent.yaml:2 probe.timeout: "80x" is not a duration (use e.g. "800ms", "1s", "5m")',
        ),
        (
            "probe: {scheme: https}\n",
            "agent.yaml:1 probe.scheme: the agent probes --engine over http; remove probe.scheme",
        ),
        (
            "- probe\n",
            "agent.yaml:1 the file must be a YAML mapping with the sections probe and agent",
        ),
        (
            "probe: {model: '${NOPE}'}\n",
            "agent.yaml:1 probe.model: environment variable NOPE is not set",
        ),
    ],
)
def test_problems_name_the_line_and_the_key(text: str, message: str) -> None:
    assert problems(text) == [message]


def test_every_serve_section_is_named_at_once() -> None:
    found = problems("clusters: []\nxds: {}\nfleet: null\n")
    assert [m.split(" ", 2)[1] for m in found] == ["clusters:", "xds:", "fleet:"]


def test_the_file_is_read_with_the_loaders_limits(tmp_path: Path) -> None:
    big = tmp_path / "agent.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than the limit"):
        load_agent_config(big)
    with pytest.raises(ConfigError, match="cannot read"):
        load_agent_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("agent: {restart_after: 2s}\n")
    assert load_agent_config(good).agent.restart_after == 2.0


def test_a_secret_from_the_environment_never_shows() -> None:
    found = problems(
        "probe: {headers: {Authorization: '${KEY}'}, timeout: '${KEY}'}\n",
        {"KEY": "tok-abcdef-123456"},
    )
    assert found and all("tok-abcdef-123456" not in m for m in found)
    assert "${KEY}" in found[0]
