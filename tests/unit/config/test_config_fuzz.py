"""Fuzzing the config loader: whatever the text, ``parse_config`` returns a Config or
raises ConfigError, within a time and memory bound, and its messages are single bounded
lines that never show an ${ENV} value (docs/design.md §7.11).

Hypothesis runs derandomized in CI (tests/conftest.py); locally it keeps exploring.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_health.config import Config, parse_config
from llm_health.config.messages import MAX_MESSAGE_CHARS, MAX_MESSAGES
from llm_health.errors import ConfigError

SECRET = "SECRET-fuzz-4b1d"
ENVIRON = {"VLLM_API_KEY": SECRET, "PORT": "8000", "EMPTY": ""}
MAX_SECONDS = 2.0
MAX_PEAK_BYTES = 64 * 2**20

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load(text: str) -> Config | ConfigError:
    try:
        return parse_config(text, "fuzz.yaml", ENVIRON)
    except ConfigError as exc:
        return exc


def check(text: str) -> None:
    """The property every input must satisfy. Time is measured on a plain run (tracemalloc
    slows allocation-heavy code several times), memory on a second, traced run."""
    started = time.perf_counter()
    result = load(text)
    seconds = time.perf_counter() - started
    assert seconds < MAX_SECONDS, f"{seconds:.2f} s"
    tracemalloc.start()
    try:
        traced = load(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"{peak / 2**20:.1f} MiB"
    assert type(traced) is type(result)
    if isinstance(result, ConfigError):
        assert result.messages
        assert len(result.messages) <= MAX_MESSAGES + 1
        for message in result.messages:
            assert isinstance(message, str)
            assert "\n" not in message and "\r" not in message
            assert len(message) <= MAX_MESSAGE_CHARS
            assert SECRET not in message
            assert message.isprintable(), repr(message)
    else:
        assert isinstance(result, Config)


# --- strategies ---------------------------------------------------------------------------

NASTY_CHARS = (
    "\x00\x01\t\n\r\x1b\x7f\x85\xa0\u2028\u2029\u202e\u2066\ufeff\ufffd٨٠８０²"
    "${}[]{}:,&*!|>'\"#%@`-?<=~/\\. "
)
nasty_text = st.text(
    alphabet=st.sampled_from(NASTY_CHARS) | st.characters(codec="utf-8"), max_size=40
)
env_refs = st.sampled_from(
    ["${VLLM_API_KEY}", "${PORT}", "${EMPTY}", "${UNSET}", "${UNSET:-x}", "${VLLM_API_KEY:-d}"]
)
strings = st.one_of(
    nasty_text,
    st.builds(lambda a, r, b: a + r + b, nasty_text, env_refs, nasty_text),
    st.sampled_from(["10.0.0.1:8000", "[::1]:80", "800ms", "1s", "/v1/x", "..", "٨٠٠٠", "yes"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    strings,
)
KEYS = [
    "clusters", "name", "model", "probe", "endpoints", "address", "weight", "timeout",
    "healthy_ttft", "interval", "path", "headers", "prompt", "server", "hds", "alerts",
    "webhooks", "url", "authz", "admin", "token", "xds", "expected_statuses", "on",
]  # fmt: skip
keys = st.one_of(st.sampled_from(KEYS), nasty_text)
trees = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=5),
    max_leaves=40,
)

VALID: dict[str, Any] = {
    "probe": {"timeout": "800ms", "headers": {"Authorization": "Bearer ${VLLM_API_KEY}"}},
    "clusters": [
        {
            "name": "a",
            "probe": {"timeout": "1s"},
            "endpoints": [{"address": "10.0.0.1:${PORT}"}, {"address": "10.0.0.2:8000"}],
        }
    ],
}


def _mutate(config: Any, steps: list[tuple[int, Any]]) -> Any:
    """Replace nodes of ``config`` (walked in a fixed order) by random trees."""
    config = yaml.safe_load(yaml.safe_dump(config))  # a deep copy
    for index, replacement in steps:
        holders: list[tuple[Any, Any]] = []
        stack: list[Any] = [config]
        while stack:
            node = stack.pop()
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in list(items):
                holders.append((node, key))
                if isinstance(value, dict | list):
                    stack.append(value)
        if holders:
            node, key = holders[index % len(holders)]
            node[key] = replacement
    return config


def dump(value: Any) -> str:
    try:
        return yaml.safe_dump(value, allow_unicode=True, default_flow_style=None)
    except yaml.YAMLError:
        return yaml.safe_dump(repr(value))


def nested(depth: int, flow: bool) -> str:
    if flow:
        return "x: " + "[" * depth + "]" * depth + "\n"
    return "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "b\n"


def laughs(levels: int, fanout: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    return "\n".join(lines) + "\nclusters: [{name: a, endpoints: [{address: 10.0.0.1:80}]}]\n"


ALIAS_SNIPPETS = [
    "x: &x [*x]\n",
    "x: &x {a: *x}\n",
    "x: &x [[[[*x]]]]\n",
    "x: *nowhere\n",
    "a: &a 1\nb: &a 2\n",
    "p: &p {timeout: 1s}\nprobe: *p\n",
    "probe: {<<: *p}\n",
    "probe: &p {<<: *p}\n",
    "probe: {<<: [1, 2]}\n",
    "? &k key\n: *k\n",
    "? *k\n: 1\n",
]


# --- properties ---------------------------------------------------------------------------


@FUZZ
@given(trees)
def test_random_yaml_structures(tree: Any) -> None:
    check(dump(tree))


@FUZZ
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=50), trees), max_size=3))
def test_random_mutations_of_a_valid_config(steps: list[tuple[int, Any]]) -> None:
    check(dump(_mutate(VALID, steps)))


@FUZZ
@given(st.text(alphabet=st.sampled_from(NASTY_CHARS) | st.characters(), max_size=300))
def test_raw_random_text(text: str) -> None:
    check(text)
    check(dump(VALID) + text)


@FUZZ
@given(
    st.lists(st.sampled_from(ALIAS_SNIPPETS), max_size=6),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=1, max_value=12),
    st.booleans(),
)
def test_anchors_aliases_and_bombs(
    snippets: list[str], levels: int, fanout: int, bomb: bool
) -> None:
    check("".join(snippets) + dump(VALID))
    if bomb:
        check(laughs(levels, fanout))


@settings(FUZZ, max_examples=20)
@given(st.integers(min_value=1, max_value=3000), st.booleans(), st.booleans())
def test_deep_nesting(depth: int, flow: bool, inside_config: bool) -> None:
    text = nested(depth, flow)
    check(dump(VALID) + text if inside_config and flow else text)


@settings(FUZZ, max_examples=15)
@given(
    st.sampled_from(["name", "model", "address", "prompt", "path", "header", "key", "list"]),
    st.integers(min_value=1, max_value=200_000),
    st.sampled_from(["x", "٨", "\u2028", "${VLLM_API_KEY}", "a:", "- ", "é"]),
)
def test_big_sizes(where: str, size: int, unit: str) -> None:
    blob = unit * (size // len(unit))
    quoted = yaml.safe_dump(blob, width=10**9, allow_unicode=True).strip()
    if quoted.endswith("..."):
        quoted = quoted[: -len("...")].strip()
    cluster = {"name": "a", "endpoints": [{"address": "10.0.0.1:80"}]}
    config: dict[str, Any] = {"clusters": [cluster]}
    text = dump(config)
    if where == "name":
        text = text.replace("name: a", f"name: {quoted}")
    elif where == "model":
        text += f"probe: {{model: {quoted}}}\n"
    elif where == "address":
        text = text.replace("10.0.0.1:80", quoted)
    elif where == "prompt":
        text += f"probe: {{prompt: {quoted}}}\n"
    elif where == "path":
        text += f"probe: {{path: {quoted}}}\n"
    elif where == "header":
        text += f"probe: {{headers: {{X: {quoted}}}}}\n"
    elif where == "key":
        text += f"probe: {{{quoted}: 1}}\n"
    else:
        text += "x: [" + ", ".join(["1"] * (size // 8)) + "]\n"  # up to 25,000 values
    check(text)
