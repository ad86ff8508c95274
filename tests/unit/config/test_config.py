"""Configuration loading and validation (docs/design.md §6).

Every bad config must raise ConfigError whose message starts with "file.yaml:LINE path:",
LINE being computed here from the YAML text itself (``line_of``), never from the code.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from llm_health.config import load_config, parse_config
from llm_health.errors import ConfigError
from llm_health.model.policy import Policy

SOURCE = "x.yaml"
SECRET = "sk-live-4f1c9e2b77d0"
ENVIRON = {"VLLM_API_KEY": SECRET, "TGI_TOKEN": "tgi-token-8c3d", "PROBE_TIMEOUT": "1200ms"}

GOOD = """\
server: {grpc: 127.0.0.1:18000, http: 127.0.0.1:18080}
probe:                # defaults; any cluster may override any key
  api: openai-completions
  interval: 1s
  timeout: 800ms
  healthy_ttft: 200ms
  healthy_after: 3
  unhealthy_after: 2
  degraded_weight: 0.3
  startup_grace: 600s
  cache_bust: salt
  prompt: "hi"
  headers: {Authorization: "Bearer ${VLLM_API_KEY}"}
clusters:
  - name: llama-70b
    model: meta-llama/Llama-3.1-70B-Instruct
    endpoints:
      - {address: 10.0.0.11:8000, weight: 100}
      - {address: 10.0.0.12:8000}
  - name: qwen-7b
    model: Qwen/Qwen2.5-7B-Instruct
    probe:
      api: openai-chat
      timeout: ${PROBE_TIMEOUT}
      healthy_ttft: ${QWEN_TTFT:-300ms}
      healthy_after: 5
      degraded_weight: 0.5
      startup_grace: 10m
      headers: {X-Token: "${TGI_TOKEN}"}
    endpoints:
      - {address: "[fd00::12]:9000", weight: 7}
      - {address: 10.0.0.13:8000}
"""


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line of the ``occurrence``-th line containing ``needle``."""
    hits = [n for n, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) >= occurrence, f"test bug: {needle!r} not in the YAML"
    return hits[occurrence - 1]


def messages_for(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, SOURCE, ENVIRON if environ is None else environ)
    assert info.value.messages, "ConfigError without messages"
    assert str(info.value) == "\n".join(info.value.messages)
    return info.value.messages


def one_message(text: str, environ: dict[str, str] | None = None) -> str:
    messages = messages_for(text, environ)
    assert len(messages) == 1, messages
    return messages[0]


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --- a good config ------------------------------------------------------------------------


def test_good_config_loads() -> None:
    config = parse_config(GOOD, SOURCE, ENVIRON)
    assert [c.name for c in config.clusters] == ["llama-70b", "qwen-7b"]
    assert config.server.grpc == "127.0.0.1:18000"
    assert config.probe.timeout == pytest.approx(0.8)
    assert config.probe.headers["Authorization"].get_secret_value() == f"Bearer {SECRET}"
    llama, qwen = config.clusters
    assert [(e.address, e.weight) for e in llama.endpoints] == [
        ("10.0.0.11:8000", 100),
        ("10.0.0.12:8000", 100),
    ]
    assert [(e.address, e.weight) for e in qwen.endpoints] == [
        ("[fd00::12]:9000", 7),
        ("10.0.0.13:8000", 100),
    ]


def test_probe_for_merges_overrides_over_defaults() -> None:
    config = parse_config(GOOD, SOURCE, ENVIRON)
    llama, qwen = config.clusters

    base = config.probe_for(llama)
    assert base.api == "openai-completions"
    assert base.timeout == pytest.approx(0.8)
    assert base.healthy_ttft == pytest.approx(0.2)
    assert base.healthy_after == 3
    assert base.model == "meta-llama/Llama-3.1-70B-Instruct"  # the cluster's model
    assert base.headers["Authorization"].get_secret_value() == f"Bearer {SECRET}"

    merged = config.probe_for(qwen)
    assert merged.api == "openai-chat"
    assert merged.timeout == pytest.approx(1.2)  # ${PROBE_TIMEOUT}
    assert merged.healthy_ttft == pytest.approx(0.3)  # ${QWEN_TTFT:-300ms}, unset
    assert merged.healthy_after == 5
    assert merged.degraded_weight == pytest.approx(0.5)
    assert merged.startup_grace == pytest.approx(600.0)  # "10m"
    assert merged.model == "Qwen/Qwen2.5-7B-Instruct"
    # Not overridden: the defaults.
    assert merged.unhealthy_after == 2
    assert merged.interval == pytest.approx(1.0)
    assert merged.cache_bust == "salt"
    assert merged.prompt == "hi"
    assert {k: v.get_secret_value() for k, v in merged.headers.items()} == {
        "X-Token": "tgi-token-8c3d"
    }


def test_env_default_is_not_used_when_the_variable_is_set() -> None:
    config = parse_config(GOOD, SOURCE, {**ENVIRON, "QWEN_TTFT": "150ms"})
    assert config.probe_for(config.clusters[1]).healthy_ttft == pytest.approx(0.15)


def test_cluster_specs_give_policies_in_seconds() -> None:
    config = parse_config(GOOD, SOURCE, ENVIRON)
    llama, qwen = config.cluster_specs()
    assert llama.name == "llama-70b"
    assert llama.policy == Policy(
        healthy_ttft_s=pytest.approx(0.2),  # type: ignore[arg-type]
        timeout_s=pytest.approx(0.8),  # type: ignore[arg-type]
        healthy_after=3,
        unhealthy_after=2,
        degraded_weight=pytest.approx(0.3),  # type: ignore[arg-type]
        startup_grace_s=600.0,
        drain_time_s=30.0,
        max_loop_lag_s=pytest.approx(0.1),  # type: ignore[arg-type]
    )
    assert qwen.policy.timeout_s == pytest.approx(1.2)
    assert qwen.policy.healthy_ttft_s == pytest.approx(0.3)
    assert qwen.policy.healthy_after == 5
    assert qwen.policy.unhealthy_after == 2
    assert qwen.policy.degraded_weight == pytest.approx(0.5)
    assert qwen.policy.startup_grace_s == pytest.approx(600.0)
    assert [(e.host, e.port, e.weight) for e in llama.endpoints] == [
        ("10.0.0.11", 8000, 100),
        ("10.0.0.12", 8000, 100),
    ]
    assert [(e.address, e.host, e.port, e.weight) for e in qwen.endpoints] == [
        ("[fd00::12]:9000", "fd00::12", 9000, 7),
        ("10.0.0.13:8000", "10.0.0.13", 8000, 100),
    ]


def test_minimal_config_gets_design_defaults() -> None:
    config = parse_config(
        "clusters: [{name: a, endpoints: [{address: 10.0.0.1:80}]}]\n", SOURCE, {}
    )
    (spec,) = config.cluster_specs()
    assert spec.policy.healthy_ttft_s == pytest.approx(0.2)
    assert spec.policy.timeout_s == pytest.approx(0.8)
    assert spec.policy.healthy_after == 3
    assert spec.policy.unhealthy_after == 2
    assert spec.policy.degraded_weight == pytest.approx(0.3)
    assert spec.policy.startup_grace_s == pytest.approx(600.0)
    assert spec.endpoints[0].weight == 100
    assert config.server.grpc == "127.0.0.1:18000"
    assert config.server.http == "127.0.0.1:18080"


@pytest.mark.parametrize(
    "address",
    ["10.0.0.1:1", "10.0.0.1:65535", "[::1]:8000", "[fe80::1]:80", "0.0.0.0:443"],
)
def test_good_addresses(address: str) -> None:
    text = f'clusters: [{{name: a, endpoints: [{{address: "{address}"}}]}}]\n'
    assert parse_config(text, SOURCE, {}).clusters[0].endpoints[0].address == address


# --- secrets ------------------------------------------------------------------------------


def test_secret_headers_never_in_repr_or_str() -> None:
    config = parse_config(GOOD, SOURCE, ENVIRON)
    texts = [repr(config), str(config), repr(config.clusters), str(config.clusters[1])]
    texts += [repr(config.probe_for(c)) for c in config.clusters]
    texts += [str(config.probe_for(c)) for c in config.clusters]
    for text in texts:
        assert SECRET not in text
        assert "tgi-token-8c3d" not in text
    assert "Authorization" in repr(config)  # the names are fine, only values are hidden


# --- bad configs: exact "file:LINE path:" prefixes ---------------------------------------

BASE = dedent(
    """
    probe:
      timeout: 800ms
      healthy_ttft: 200ms
      healthy_after: 3
      unhealthy_after: 2
    clusters:
      - name: llama-70b
        probe:
          interval: 2s
          timeout: 1s
        endpoints:
          - {address: 10.0.0.11:8000, weight: 100}
          - {address: 10.0.0.12:8000}
    """
)


def with_(old: str, new: str, text: str = BASE) -> str:
    assert old in text, f"test bug: {old!r} not in the YAML"
    return text.replace(old, new, 1)


def test_base_is_valid() -> None:
    parse_config(BASE, SOURCE, {})


BAD = [
    pytest.param(
        with_("timeout: 1s", 'timeout: "80x"'),
        'timeout: "80x"',
        "clusters[0].probe.timeout",
        r'"80x" is not a duration \(use e\.g\. "800ms", "1s", "5m"\)$',
        id="bad-duration-in-cluster-override",
    ),
    pytest.param(
        with_("timeout: 800ms", "timeout: 80x"),
        "timeout: 80x",
        "probe.timeout",
        r'"80x" is not a duration',
        id="bad-duration-unquoted",
    ),
    pytest.param(
        with_("timeout: 800ms", "timeout: 800"),
        "timeout: 800",
        "probe.timeout",
        r"800 is not a duration",
        id="duration-without-unit",
    ),
    pytest.param(
        with_("healthy_after: 3", "healthy_aftr: 3"),
        "healthy_aftr",
        "probe.healthy_aftr",
        r'unknown key \(did you mean "healthy_after"\?\)$',
        id="unknown-key-did-you-mean",
    ),
    pytest.param(
        with_("interval: 2s", "intervall: 2s"),
        "intervall",
        "clusters[0].probe.intervall",
        r'unknown key \(did you mean "interval"\?\)$',
        id="unknown-key-in-override",
    ),
    pytest.param(
        with_("{address: 10.0.0.12:8000}", "{address: 10.0.0.12:8000, wieght: 5}"),
        "wieght",
        "clusters[0].endpoints[1].wieght",
        r'unknown key \(did you mean "weight"\?\)$',
        id="unknown-key-in-endpoint",
    ),
    pytest.param(
        with_("clusters:", "clusterz: []\nclusters:"),
        "clusterz",
        "clusterz",
        r'unknown key \(did you mean "clusters"\?\)$',
        id="unknown-top-level-key",
    ),
    pytest.param(
        with_("healthy_after: 3", 'healthy_after: "three"'),
        "healthy_after",
        "probe.healthy_after",
        r"'three'.*integer",
        id="wrong-type",
    ),
    pytest.param(
        with_("unhealthy_after: 2", "unhealthy_after: -1"),
        "unhealthy_after",
        "probe.unhealthy_after",
        r"-1.*greater than or equal to 1",
        id="negative-threshold",
    ),
    pytest.param(
        with_("interval: 2s", "interval: 2s\n      healthy_after: 0"),
        "healthy_after: 0",
        "clusters[0].probe.healthy_after",
        r"0.*greater than or equal to 1",
        id="zero-threshold-in-override",
    ),
    pytest.param(
        with_("weight: 100", "weight: 0"),
        "weight: 0",
        "clusters[0].endpoints[0].weight",
        r"0.*greater than or equal to 1",
        id="weight-0",
    ),
    pytest.param(
        with_("10.0.0.12:8000", "10.0.0.12"),
        "10.0.0.12}",
        "clusters[0].endpoints[1].address",
        r'"10\.0\.0\.12" is not host:port',
        id="address-without-port",
    ),
    pytest.param(
        with_("10.0.0.12:8000", "10.0.0.12:0"),
        "10.0.0.12:0",
        "clusters[0].endpoints[1].address",
        r"port 0 is out of range 1-65535",
        id="port-0",
    ),
    pytest.param(
        with_("10.0.0.12:8000", "10.0.0.12:70000"),
        "10.0.0.12:70000",
        "clusters[0].endpoints[1].address",
        r"port 70000 is out of range 1-65535",
        id="port-70000",
    ),
    pytest.param(
        with_("10.0.0.12:8000", '"gpu_1!:8000"'),
        "gpu_1!",
        "clusters[0].endpoints[1].address",
        r'"gpu_1!" is not a valid host name or IP address',
        id="bad-host-chars",
    ),
    pytest.param(
        with_("10.0.0.12:8000", '"[::zz]:8000"'),
        "::zz",
        "clusters[0].endpoints[1].address",
        r"zz",
        id="bad-ipv6",
    ),
    pytest.param(
        with_("10.0.0.12:8000", '"[::1]"'),
        "[::1]",
        "clusters[0].endpoints[1].address",
        r"is not host:port",
        id="ipv6-without-port",
    ),
    pytest.param(
        with_("10.0.0.12:8000", '"::1:8000"'),
        "::1:8000",
        "clusters[0].endpoints[1].address",
        r"not a valid host name or IP address",
        id="ipv6-without-brackets",
    ),
    pytest.param(
        with_("10.0.0.12:8000", "10.0.0.300:8000"),
        "10.0.0.300",
        "clusters[0].endpoints[1].address",
        r"300",
        id="bad-ipv4-octet",
    ),
    pytest.param(
        with_("- name: llama-70b", "- name: llama-70b\n    modell: x"),
        "modell",
        "clusters[0].modell",
        r'unknown key \(did you mean "model"\?\)$',
        id="unknown-key-in-cluster",
    ),
    pytest.param(
        with_("    endpoints:\n", "    endpoints:\n      - {weight: 3}\n"),
        "{weight: 3}",
        "clusters[0].endpoints[0].address",
        r"required key is missing",
        id="endpoint-without-address",
    ),
    pytest.param(
        with_("  unhealthy_after: 2", "  unhealthy_after: 2\n  cache_bust: sometimes"),
        "cache_bust",
        "probe.cache_bust",
        r"'sometimes' is not one of",
        id="bad-enum",
    ),
]


@pytest.mark.parametrize(("text", "needle", "path", "detail"), BAD)
def test_bad_config_names_line_and_path(text: str, needle: str, path: str, detail: str) -> None:
    message = one_message(text, {})
    prefix = f"{SOURCE}:{line_of(text, needle)} {path}: "
    assert message.startswith(prefix), f"{message!r} does not start with {prefix!r}"
    assert re.search(detail, message[len(prefix) :]), message


def test_bad_duration_exact_message() -> None:
    """The docs/design.md §6.1 example, to the letter."""
    text = with_("timeout: 1s", 'timeout: "80x"')
    line = line_of(text, '"80x"')
    assert one_message(text, {}) == (
        f'x.yaml:{line} clusters[0].probe.timeout: "80x" is not a duration '
        '(use e.g. "800ms", "1s", "5m")'
    )


def test_every_problem_is_reported() -> None:
    text = with_("healthy_after: 3", "healthy_aftr: 3")
    text = with_("10.0.0.12:8000", "10.0.0.12:0", text)
    text = with_("timeout: 1s", "timeout: 1y", text)
    messages = messages_for(text, {})
    prefixes = sorted(m.split(": ", 1)[0] for m in messages)
    assert prefixes == sorted(
        [
            f"x.yaml:{line_of(text, 'healthy_aftr')} probe.healthy_aftr",
            f"x.yaml:{line_of(text, '10.0.0.12:0')} clusters[0].endpoints[1].address",
            f"x.yaml:{line_of(text, 'timeout: 1y')} clusters[0].probe.timeout",
        ]
    )


# --- duplicates ---------------------------------------------------------------------------

DUP_CLUSTERS = dedent(
    """
    clusters:
      - name: a
        endpoints: [{address: 10.0.0.1:80}]
      - name: b
        endpoints: [{address: 10.0.0.2:80}]
      - name: a
        endpoints: [{address: 10.0.0.3:80}]
    """
)
DUP_ENDPOINTS = dedent(
    """
    clusters:
      - name: a
        endpoints:
          - address: 127.0.0.1:8000
          - address: 127.0.0.2:8000
          - address: 127.0.0.1:8000
    """
)


def test_duplicate_cluster() -> None:
    message = one_message(DUP_CLUSTERS, {})
    assert re.match(r"^x\.yaml:\d+ clusters(\[2\](\.name)?)?: ", message), message
    assert 'duplicate cluster name "a"' in message


@pytest.mark.parametrize(
    "second",
    ["127.0.0.1:8000", "127.0.0.1:08000"],
    ids=["same-text", "same-port-written-differently"],
)
def test_duplicate_endpoint(second: str) -> None:
    head, _, rest = DUP_ENDPOINTS.rpartition("127.0.0.1:8000")
    text = head + second + rest  # the third endpoint repeats the first
    message = one_message(text, {})
    assert re.match(r"^x\.yaml:\d+ clusters\[0\]\.endpoints(\[2\](\.address)?)?: ", message)
    assert "duplicate endpoint" in message
    assert f'"{second}"' in message


def test_same_address_in_two_clusters_is_fine() -> None:
    text = dedent(
        """
        clusters:
          - name: a
            endpoints: [{address: 10.0.0.1:80}]
          - name: b
            endpoints: [{address: 10.0.0.1:80}]
        """
    )
    assert len(parse_config(text, SOURCE, {}).clusters) == 2


def test_duplicate_cluster_points_at_the_duplicate() -> None:
    message = one_message(DUP_CLUSTERS, {})
    line = line_of(DUP_CLUSTERS, "- name: a", occurrence=2)
    assert message.startswith(f"x.yaml:{line} clusters[2]"), message


def test_duplicate_endpoint_points_at_the_duplicate() -> None:
    message = one_message(DUP_ENDPOINTS, {})
    line = line_of(DUP_ENDPOINTS, "127.0.0.1:8000", occurrence=2)
    assert message.startswith(f"x.yaml:{line} clusters[0].endpoints[2]"), message


# --- healthy_ttft < timeout ---------------------------------------------------------------

TTFT_TOP = with_("healthy_ttft: 200ms", "healthy_ttft: 900ms")
TTFT_EQUAL = with_("healthy_ttft: 200ms", "healthy_ttft: 0.8s")
# Valid defaults; only the cluster's override (healthy_ttft 1.5s > its timeout 1s) breaks it.
TTFT_OVERRIDE = with_("interval: 2s", "interval: 2s\n      healthy_ttft: 1.5s")
# The override lowers timeout below the default healthy_ttft (200ms).
TTFT_OVERRIDE_TIMEOUT = with_("timeout: 1s", "timeout: 150ms")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (TTFT_TOP, "probe"),
        (TTFT_EQUAL, "probe"),
        (TTFT_OVERRIDE, "clusters[0].probe"),
        (TTFT_OVERRIDE_TIMEOUT, "clusters[0].probe"),
    ],
    ids=["defaults", "equal", "override-ttft", "override-timeout"],
)
def test_healthy_ttft_must_be_below_timeout(text: str, path: str) -> None:
    message = one_message(text, {})
    assert re.match(rf"^x\.yaml:\d+ {re.escape(path)}(\.\w+)?: ", message), message
    assert "healthy_ttft must be shorter than timeout" in message


def test_healthy_ttft_override_error_points_at_the_override() -> None:
    message = one_message(TTFT_OVERRIDE, {})
    probe_key = line_of(TTFT_OVERRIDE, "    probe:")
    offender = line_of(TTFT_OVERRIDE, "healthy_ttft: 1.5s")
    line = int(message.split(" ", 1)[0].rsplit(":", 1)[1])
    assert line in (probe_key, offender), message


def test_healthy_ttft_default_error_points_at_probe_or_ttft() -> None:
    message = one_message(TTFT_TOP, {})
    line = int(message.split(" ", 1)[0].rsplit(":", 1)[1])
    assert line in (line_of(TTFT_TOP, "probe:"), line_of(TTFT_TOP, "healthy_ttft")), message


# --- environment --------------------------------------------------------------------------


def test_unset_env_var_names_field_and_line_without_leaking_values() -> None:
    text = with_("interval: 2s", 'interval: 2s\n      headers: {Authorization: "Bearer ${NOPE}"}')
    text = with_("healthy_after: 3", "healthy_after: ${HA:-3}", text)
    environ = {"VLLM_API_KEY": SECRET, "OTHER_SECRET": "hunter2-xyz", "HA": "4"}
    message = one_message(text, environ)
    line = line_of(text, "${NOPE}")
    assert message.startswith(f"x.yaml:{line} clusters[0].probe.headers.Authorization: ")
    assert "NOPE" in message and "not set" in message
    for value in environ.values():
        assert value not in message


def test_env_expansion_in_any_string() -> None:
    text = dedent(
        """
        clusters:
          - name: ${CLUSTER:-fallback}
            endpoints: [{address: "${HOST}:${PORT:-8000}"}]
        """
    )
    config = parse_config(text, SOURCE, {"HOST": "10.9.8.7"})
    assert config.clusters[0].name == "fallback"
    assert config.clusters[0].endpoints[0].address == "10.9.8.7:8000"


def test_env_value_is_not_reparsed_as_yaml() -> None:
    text = 'probe: {prompt: "${P}"}\nclusters: [{name: a, endpoints: [{address: "127.0.0.1:1"}]}]\n'
    config = parse_config(text, SOURCE, {"P": "a: [b, c] # d"})
    assert config.probe.prompt == "a: [b, c] # d"


# --- file-level problems ------------------------------------------------------------------


def test_invalid_yaml_names_the_line() -> None:
    text = with_("healthy_after: 3", "healthy_after: [3")
    (message,) = messages_for(text, {})
    match = re.match(r"^x\.yaml:(\d+) invalid YAML: ", message)
    assert match, message
    # The parser notices at the unclosed bracket's line or the line after it.
    opened = line_of(text, "[3")
    assert int(match.group(1)) in (opened, opened + 1), message


def test_invalid_yaml_tab_indent() -> None:
    text = "clusters:\n\t- name: a\n"
    (message,) = messages_for(text, {})
    assert re.match(r"^x\.yaml:2 invalid YAML: ", message), message


@pytest.mark.parametrize(
    "text",
    ["", "# only a comment\n", "- a\n- b\n", "just a string\n", "42\n"],
    ids=["empty", "comment-only", "list", "string", "number"],
)
def test_not_a_mapping(text: str) -> None:
    (message,) = messages_for(text, {})
    assert message.startswith("x.yaml:1 ")
    assert "mapping" in message


def test_missing_clusters() -> None:
    (message,) = messages_for("server: {grpc: 127.0.0.1:18000}\n", {})
    assert message == "x.yaml:1 clusters: required key is missing"


def test_no_clusters() -> None:
    (message,) = messages_for("clusters: []\n", {})
    assert message.startswith("x.yaml:1 clusters: "), message


@pytest.mark.parametrize(
    "text",
    ["clusters:\n  - name: a\n    endpoints: []\n", "clusters:\n  - name: a\n"],
    ids=["empty-list", "absent"],
)
def test_cluster_without_endpoints_or_discovery(text: str) -> None:
    (message,) = messages_for(text, {})
    assert message == "x.yaml:2 clusters[0]: cluster a: give endpoints, discovery, or both"


def test_load_config_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD, encoding="utf-8")
    config = load_config(path, environ=ENVIRON)
    assert len(config.clusters) == 2


def test_load_config_names_the_file_in_messages(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    text = with_("unhealthy_after: 2", "unhealthy_after: -1")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    (message,) = info.value.messages
    assert message.startswith(f"gateway.yaml:{line_of(text, 'unhealthy_after')} ")


# --- CLI ----------------------------------------------------------------------------------


def test_cli_validate_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_health.cli import main

    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("QWEN_TTFT", raising=False)
    path = tmp_path / "good.yaml"
    path.write_text(GOOD, encoding="utf-8")
    assert main(["validate", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "ok" in out
    assert SECRET not in out + err


def test_cli_validate_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llm_health.cli import main

    path = tmp_path / "bad.yaml"
    text = with_("healthy_after: 3", 'healthy_after: "three"')
    text = with_("10.0.0.12:8000", "10.0.0.12:70000", text)
    path.write_text(text, encoding="utf-8")
    assert main(["validate", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert sorted(line.split(": ", 1)[0] for line in lines) == sorted(
        [
            f"bad.yaml:{line_of(text, 'three')} probe.healthy_after",
            f"bad.yaml:{line_of(text, '70000')} clusters[0].endpoints[1].address",
        ]
    )
    assert "ok" not in out


def test_cli_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llm_health.cli import main

    assert main(["validate", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_env_values_are_not_echoed_in_errors() -> None:
    text = with_("timeout: 800ms", "timeout: ${KEY}")  # (once: a duplicate key is an error)
    message = one_message(text, {"KEY": "sk-VERYSECRET"})
    assert "sk-VERYSECRET" not in message
    assert "${KEY}" in message and "probe.timeout" in message


def test_same_ipv6_endpoint_written_twice_is_a_duplicate() -> None:
    text = textwrap.dedent(
        """\
        clusters:
          - name: a
            endpoints:
              - {address: "[::1]:80"}
              - {address: "[0::1]:80"}
        """
    )
    message = one_message(text, {})
    assert message.startswith("x.yaml:5 clusters[0].endpoints[1].address: duplicate endpoint")


@pytest.mark.parametrize("address", ["gpu-1:8000", "a.b.c:443", "localhost:8000"])
def test_host_names_are_refused_because_envoy_eds_needs_ips(address: str) -> None:
    text = with_("10.0.0.12:8000", address)
    message = one_message(text, ENVIRON)
    assert "clusters[0].endpoints[1].address" in message
    assert "IP literals" in message


@pytest.mark.parametrize("value", ["0", "2", "64", "auto"])
def test_probe_workers_accepts_a_count_or_auto(value: str) -> None:
    text = GOOD.replace(
        "http: 127.0.0.1:18080}", f"http: 127.0.0.1:18080, probe_workers: {value}}}"
    )
    config = parse_config(text, SOURCE, ENVIRON)
    count = config.server.probe_worker_count()
    assert count >= 1 if value == "auto" else count == int(value)


@pytest.mark.parametrize("value", ["-1", "65", "many", "1.5"])
def test_probe_workers_rejects_anything_else(value: str) -> None:
    text = GOOD.replace(
        "http: 127.0.0.1:18080}", f"http: 127.0.0.1:18080, probe_workers: {value}}}"
    )
    message = one_message(text)
    assert message.startswith("x.yaml:1 server.probe_workers:"), message


def test_authz_defaults_to_the_main_server_and_takes_its_own_address() -> None:
    assert parse_config(GOOD, SOURCE, ENVIRON).server.authz is None
    text = GOOD.replace("http: 127.0.0.1:18080}", 'http: 127.0.0.1:18080, authz: "[::1]:18003"}')
    assert parse_config(text, SOURCE, ENVIRON).server.authz == "[::1]:18003"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:18000", 'authz "127.0.0.1:18000" must differ from grpc and http'),
        ("127.0.0.1:18080", 'authz "127.0.0.1:18080" must differ from grpc and http'),
        ("0.0.0.0:18003", 'authz "0.0.0.0:18003" is not a loopback address or Unix socket'),
        ("nonsense", "server.authz:"),
    ],
)
def test_authz_address_is_checked(value: str, expected: str) -> None:
    text = GOOD.replace("http: 127.0.0.1:18080}", f'http: 127.0.0.1:18080, authz: "{value}"}}')
    message = one_message(text)
    assert message.startswith("x.yaml:1 server"), message
    assert expected in message, message


def test_authz_off_loopback_is_fine_with_a_token() -> None:
    text = GOOD.replace(
        "http: 127.0.0.1:18080}",
        'http: 127.0.0.1:18080, authz: "0.0.0.0:18003", token: "0123456789abcdef0"}',
    )
    assert parse_config(text, SOURCE, ENVIRON).server.authz == "0.0.0.0:18003"
