"""docs/configuration.md against the settings models, so that the reference cannot drift.

The page documents the file's keys in tables headed ``| key | default | meaning |``, one
key path per row, in the notation its top explains: ``a.b`` key ``b`` of section ``a``,
``a[].b`` key ``b`` of every item of list ``a``, ``a.*.b`` key ``b`` of every value of
map ``a``. This walks the root model ``llm_health.config.Config`` (only the root: the
sections belong to their features' packages, wherever those keep them), by alias where a
field has one, and checks that

- every key the model takes is on the page: a key that holds a value as a table row, a
  key that holds a section (a model, optional or not, or a list or map of them) at least
  in backticks;
- every key in a table is one the model takes;
- a default the page gives as one literal (`800ms`, `[200]`, `null`) is the model's, read
  as the file would be (YAML; durations in seconds, ``model.durations.parse_duration``),
  and a key the page calls "required" has no default.

The page's last section, "Agent (`llm-health agent --config`)", documents the other file
model, ``llm_health.config.agent.AgentFile``, the same way: its tables hold the agent's own
keys, checked against that model; its ``probe`` section is ``serve``'s, documented once
above (``AGENT_SAME_KEYS_AS``).
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from llm_health.config import Config
from llm_health.config.agent import AgentFile
from llm_health.model.durations import parse_duration

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
# Sections whose keys are another section's, documented once, there (the page says so).
SAME_KEYS_AS = {"clusters[].probe": "probe"}
AGENT_HEADING = "## Agent (`llm-health agent --config`)"
AGENT_SAME_KEYS_AS = {"probe": "probe"}  # the agent's probe: is serve's, documented above
TABLE_HEADER = re.compile(r"\|\s*key\s*\|\s*default\s*\|\s*meaning\s*\|")
ONE_LITERAL = re.compile(r"`([^`]+)`")
KEY_PATH = re.compile(r"[a-z_][a-z0-9_]*(?:\[\])?(?:(?:\.|\.\*\.)[a-z_][a-z0-9_]*(?:\[\])?)*")
REQUIRED = "required"


@dataclass(frozen=True)
class Key:
    """One key the model takes: its path, its field, and the sections it holds."""

    path: str
    field: FieldInfo
    sections: tuple[type[BaseModel], ...]


@dataclass(frozen=True)
class Row:
    """One row of a key table on the page."""

    line: int
    key: str
    default: str


def sections_in(annotation: Any, step: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """The models a field's type holds, each with the step from the field's path to its
    keys: "" for a model (optional or not), "[]" for list or tuple items, ".*" for map
    values."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        yield from sections_in(args[0], step)
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from sections_in(arg, step)
    elif isinstance(origin, type) and issubclass(origin, Mapping):
        yield from sections_in(args[-1], f"{step}.*")
    elif isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset):
        for arg in args:
            if arg is not Ellipsis:
                yield from sections_in(arg, f"{step}[]")
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield step, annotation


def walk(
    model: type[BaseModel], prefix: str = "", same: Mapping[str, str] = SAME_KEYS_AS
) -> Iterator[Key]:
    """Every key of ``model`` and of the sections below it, depth first (not below a
    section whose keys are documented as another's)."""
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        held = tuple(sections_in(field.annotation))
        yield Key(path, field, tuple(section for _, section in held))
        if path in same:
            continue
        for step, section in held:
            yield from walk(section, f"{path}{step}.", same)


def model_keys() -> dict[str, Key]:
    return {key.path: key for key in walk(Config)}


def agent_keys() -> dict[str, Key]:
    return {key.path: key for key in walk(AgentFile, same=AGENT_SAME_KEYS_AS)}


def page_text() -> str:
    return PAGE.read_text(encoding="utf-8")


def serve_text() -> str:
    """The page up to the agent's section: ``serve``'s file."""
    return page_text().partition(AGENT_HEADING)[0]


def agent_rows() -> list[Row]:
    """The rows of the agent's section (line numbers of the whole page)."""
    text = page_text()
    before, heading, _after = text.partition(AGENT_HEADING)
    assert heading, f"docs/configuration.md has no section {AGENT_HEADING!r}"
    first = before.count("\n") + 1
    return [row for row in key_rows(text) if row.line >= first]


def cells(line: str) -> list[str]:
    """A table line's cells; ``\\|`` inside a cell is not a separator."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def key_rows(text: str) -> list[Row]:
    """Every row of every key table, in page order."""
    rows: list[Row] = []
    in_table = False
    for number, line in enumerate(text.splitlines(), start=1):
        if TABLE_HEADER.fullmatch(line.strip()):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not set(line) <= set("|-: "):
            key, default, *_ = cells(line)
            rows.append(Row(number, key, default))
    return rows


def row_key(row: Row) -> str:
    match = ONE_LITERAL.fullmatch(row.key)
    assert match and KEY_PATH.fullmatch(match.group(1)), (
        f"docs/configuration.md:{row.line}: the key cell must be one `key.path`, got {row.key!r}"
    )
    return match.group(1)


def documented(rows: list[Row]) -> dict[str, Row]:
    return {row_key(row): row for row in rows}


def model_default(field: FieldInfo) -> Any:
    return field.get_default(call_default_factory=True)


def same_default(stated: Any, default: Any) -> bool:
    """Whether the page's literal (as YAML reads it) is the model's default."""
    if default is None or isinstance(default, bool) or isinstance(stated, bool):
        return stated is default
    if isinstance(default, int | float):
        if isinstance(stated, str):
            stated = parse_duration(stated)  # the page writes "800ms", the model holds 0.8
        return isinstance(stated, int | float) and math.isclose(stated, default)
    if isinstance(default, tuple):
        return isinstance(stated, list) and tuple(stated) == default
    return bool(stated == default)


def default_problem(row: Row, key: Key) -> str | None:
    """What is wrong with the default the row states, if anything."""
    where = f"docs/configuration.md:{row.line} {key.path}"
    if row.default == REQUIRED:
        return None if key.field.is_required() else f"{where}: said required, has a default"
    literal = ONE_LITERAL.fullmatch(row.default)
    if literal is None:
        return None  # prose ("unset", "by api"): nothing to compare
    if key.field.is_required():
        return f"{where}: the page gives a default, the model requires the key"
    stated = yaml.safe_load(literal.group(1))
    default = model_default(key.field)
    if same_default(stated, default):
        return None
    return f"{where}: the page says {row.default}, the model's default is {default!r}"


def test_every_key_of_the_model_is_on_the_page() -> None:
    text = serve_text()
    rows = documented(key_rows(text))
    missing = [
        key.path
        for key in model_keys().values()
        if (f"`{key.path}`" not in text if key.sections else key.path not in rows)
    ]
    assert not missing, f"keys missing from docs/configuration.md: {missing}"


def test_every_key_on_the_page_is_in_the_model() -> None:
    keys = model_keys()
    unknown = [
        f"line {row.line}: {row_key(row)}"
        for row in key_rows(serve_text())
        if row_key(row) not in keys
    ]
    assert not unknown, f"docs/configuration.md documents keys the model lacks: {unknown}"


def test_each_key_has_one_row() -> None:
    seen: dict[str, int] = {}
    twice = []
    for row in key_rows(page_text()):
        key = row_key(row)
        if key in seen:
            twice.append(f"{key} (lines {seen[key]} and {row.line})")
        seen[key] = row.line
    assert not twice, f"keys documented twice: {twice}"


def test_stated_defaults_are_the_models() -> None:
    keys = model_keys()
    problems = [
        problem
        for row in key_rows(serve_text())
        if row_key(row) in keys and (problem := default_problem(row, keys[row_key(row)]))
    ]
    assert not problems, "\n".join(problems)


def test_a_section_documented_as_another_takes_the_same_keys() -> None:
    keys = model_keys()
    for path, other in SAME_KEYS_AS.items():
        (mirror,) = keys[path].sections
        (original,) = keys[other].sections
        assert set(mirror.model_fields) == set(original.model_fields), path
        assert f"`{path}`" in page_text()


def test_the_page_holds_key_tables() -> None:
    """A parser that reads no row would let every other check here pass vacuously."""
    assert len(key_rows(serve_text())) >= len(model_keys()) // 2


def test_every_key_of_the_agents_file_is_on_the_page() -> None:
    rows = documented(agent_rows())
    section = page_text().partition(AGENT_HEADING)[2]
    missing = [
        key.path
        for key in agent_keys().values()
        if (f"`{key.path}`" not in section if key.sections else key.path not in rows)
    ]
    assert not missing, f"agent keys missing from docs/configuration.md: {missing}"


def test_every_key_of_the_agents_section_is_in_its_model() -> None:
    keys = agent_keys()
    unknown = [f"line {r.line}: {row_key(r)}" for r in agent_rows() if row_key(r) not in keys]
    assert not unknown, f"the agent's section documents keys its model lacks: {unknown}"
    assert agent_rows(), "the agent's section holds no key table"


def test_the_agents_defaults_are_its_models() -> None:
    keys = agent_keys()
    problems = [
        problem
        for row in agent_rows()
        if row_key(row) in keys and (problem := default_problem(row, keys[row_key(row)]))
    ]
    assert not problems, "\n".join(problems)


def test_the_agents_probe_section_is_serves() -> None:
    for path, other in AGENT_SAME_KEYS_AS.items():
        (mirror,) = agent_keys()[path].sections
        (original,) = model_keys()[other].sections
        assert mirror is original, path


class _Leaf(BaseModel):
    weight: int = 1


class _Branch(BaseModel):
    leaves: tuple[_Leaf, ...] = ()
    by_name: dict[str, _Leaf] = Field(default_factory=dict)
    maybe: _Leaf | None = None
    for_: int = Field(0, alias="for")


def test_the_walk_reaches_lists_maps_optional_sections_and_aliases() -> None:
    paths = [key.path for key in walk(_Branch)]
    assert paths == [
        "leaves",
        "leaves[].weight",
        "by_name",
        "by_name.*.weight",
        "maybe",
        "maybe.weight",
        "for",
    ]
