"""A file of many problems costs the work of the MAX_MESSAGES shown (docs/design.md §7.11):
unknown keys past the first MAX_MESSAGES of a mapping never reach pydantic, suggestions
and messages are written only for the problems shown, and what is shown is the same.
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from llm_health.config import composer, loader, parse_config, pruning
from llm_health.config.messages import MAX_MESSAGES
from llm_health.config.schema import Config
from llm_health.errors import ConfigError

CLUSTER = "clusters: [{name: a, endpoints: [{address: 10.0.0.1:80}]}]\n"


def messages_for(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "x.yaml", {})
    return caught.value.messages


def unknown(prefix: str, count: int, indent: str = "") -> str:
    return "".join(f"{indent}{prefix}{i}: 1\n" for i in range(count))


SHAPES = {
    "top level, after a field error": "probe: {timeout: 80x}\n" + CLUSTER + unknown("kx", 300),
    "in a cluster's probe": "clusters:\n  - name: a\n    endpoints: [{address: 10.0.0.1:80}]\n"
    "    probe:\n" + unknown("tmeout", 120, "      "),
    "in two sections and two endpoints": "server:\n"
    + unknown("s", 70, "  ")
    + "clusters:\n  - name: a\n    endpoints:\n"
    + "".join(
        f"      - address: 10.0.0.{n}:80\n" + unknown("adress", 60, "        ") for n in (1, 2)
    ),
    "in a mapping shared by an alias": "probe: &shared\n  timeout: 2s\n"
    + unknown("x", 80, "  ")
    + "alerts: {webhooks: [{url: 'http://h/', headers: {}}]}\n"
    + CLUSTER.replace("name: a,", "name: a, probe: *shared,"),
}


@pytest.mark.parametrize("text", list(SHAPES.values()), ids=list(SHAPES))
def test_the_messages_are_those_of_a_full_validation(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bounded = messages_for(text)
    monkeypatch.setattr(loader, "unknown_keys_cut", lambda value, _annotation: (value, 0))
    full = messages_for(text)
    assert bounded == full
    assert len(bounded) == MAX_MESSAGES + 1
    assert bounded[-1].startswith("... and ")


def test_suggestions_are_computed_only_for_the_messages_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    close_matches = difflib.get_close_matches

    def counted(*args: Any, **kwargs: Any) -> list[str]:
        nonlocal calls
        calls += 1
        return close_matches(*args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    messages = messages_for(CLUSTER + unknown("clustrs", 5_000))
    assert messages[0] == 'x.yaml:2 clustrs0: unknown key (did you mean "clusters"?)'
    assert messages[-1] == f"... and {5_000 - MAX_MESSAGES} more problems"
    assert calls <= MAX_MESSAGES


def test_reading_problems_are_collected_up_to_the_messages_shown() -> None:
    text = CLUSTER + "".join(f"k{i}: !!binary eA==\n" for i in range(5_000))
    document = composer.Document("x.yaml", {})
    document.build(text)
    assert len(document.problems) == MAX_MESSAGES
    assert document.unlisted == 5_000 - MAX_MESSAGES
    messages = messages_for(text)
    assert messages[0] == "x.yaml:2 k0: the YAML tag tag:yaml.org,2002:binary is not supported"
    assert messages[-1] == f"... and {5_000 - MAX_MESSAGES} more problems"


def test_the_shared_mapping_is_left_as_it_was() -> None:
    document = composer.Document("x.yaml", {})
    raw = document.build(SHAPES["in a mapping shared by an alias"])
    shared = raw["probe"]
    keys = len(shared)
    cut, count = pruning.unknown_keys_cut(raw, Config)
    assert count == 2 * (80 - MAX_MESSAGES)
    assert len(shared) == keys and raw["probe"] is shared
    assert len(cut["probe"]) == keys - (80 - MAX_MESSAGES)


def test_a_valid_file_is_untouched() -> None:
    document = composer.Document("x.yaml", {})
    raw = document.build("probe: {timeout: 2s}\n" + CLUSTER)
    assert pruning.unknown_keys_cut(raw, Config) == (raw, 0)
