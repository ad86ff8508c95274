"""A reload's load in a child process (config/apart.py, docs/design.md §6.4): the same
answer as ``load_config`` in the service's own interpreter, every failure a ConfigError,
and a child that does not answer in time is killed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import yaml

from llm_health.config import Config, apart, load_config
from llm_health.config.apart import load_config_apart
from llm_health.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_a_valid_file_gives_the_config_load_config_gives() -> None:
    example = ROOT / "examples" / "llm-health.yaml"
    assert asyncio.run(load_config_apart(example)) == load_config(example)


def test_environment_references_expand_from_the_inherited_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_HEALTH_TEST_KEY", "sk-apart-0123456789")
    path = tmp_path / "c.yaml"
    settings = {
        "probe": {"headers": {"Authorization": "Bearer ${LLM_HEALTH_TEST_KEY}"}},
        "clusters": [{"name": "a", "endpoints": [{"address": "127.0.0.1:9"}]}],
    }
    path.write_text(yaml.safe_dump(settings))
    config = asyncio.run(load_config_apart(path))
    assert config == load_config(path)
    assert "sk-apart-0123456789" in config.secret_values()


def test_an_invalid_file_gives_the_same_problems(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("clusters: [{name: a, endpoints: [{address: 'nope'}]}]\nbogus: 1\n")
    with pytest.raises(ConfigError) as here:
        load_config(path)
    with pytest.raises(ConfigError) as apart:
        asyncio.run(load_config_apart(path))
    assert apart.value.messages == here.value.messages
    assert len(apart.value.messages) >= 2


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    with pytest.raises(ConfigError) as refused:
        asyncio.run(load_config_apart(path, within_s=30))
    assert "not a regular file" in " ".join(refused.value.messages)


def test_a_child_without_an_answer_in_time_is_killed(tmp_path: Path) -> None:
    example = ROOT / "examples" / "llm-health.yaml"
    started = time.monotonic()
    with pytest.raises(ConfigError) as late:
        # shorter than the interpreter's start: the child cannot answer in time
        asyncio.run(load_config_apart(example, within_s=0.01))
    assert late.value.messages == ["cannot load the config: no answer within 0.01 s"]
    assert time.monotonic() - started < 5
    assert not loading_children(), "the child outlived its timeout"


def loading_children() -> list[int]:
    """Our children still running config/apart.py (killed ones are reaped by asyncio)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"config.apart" in command:
            found.append(int(entry.name))
    return found


def test_a_small_file_is_read_on_a_thread_a_large_one_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children: list[object] = []
    real = apart.load_config_apart

    async def counted(path: str | Path) -> Config:
        children.append(path)
        return await real(path)

    monkeypatch.setattr(apart, "load_config_apart", counted)
    example = ROOT / "examples" / "llm-health.yaml"
    assert asyncio.run(apart.load_config_off_loop(example)) == load_config(example)
    assert children == []
    large = tmp_path / "large.yaml"
    padding = "#" * 100 + "\n"
    large.write_text(example.read_text() + padding * (apart.APART_FROM_BYTES // len(padding)))
    assert asyncio.run(apart.load_config_off_loop(large)) == load_config(large)
    assert children == [large]
