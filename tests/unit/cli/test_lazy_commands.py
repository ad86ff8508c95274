"""``llm-health --help`` and ``--version`` import no command's module (nor what those
import: aiohttp, grpc, pydantic, yaml; ``--help`` not even importlib.metadata); a command
imports its own module only, and its ``--help`` still shows every option it has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm_health.cli import build_parser
from llm_health.cli.commands import COMMANDS

PLUGIN = Path(__file__).resolve().parents[3] / "plugin"
HEAVY = ("aiohttp", "grpc", "pydantic", "yaml", "orjson", "llm_health.probe", "llm_health.sim")

# Runs main() in a fresh interpreter; prints the modules it had imported when it exited.
IMPORTED = """
import contextlib, io, json, sys
from llm_health.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(*args: str) -> set[str]:
    env = {"PYTHONPATH": str(PLUGIN), "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"], ["no-such-command"]])
def test_top_level_imports_no_command(args: list[str]) -> None:
    modules = imported_by(*args)
    assert heavy_in(modules) == []
    assert sorted(m for m in modules if m.startswith("llm_health.cli.")) == [
        "llm_health.cli.commands"
    ]
    if "--version" not in args:  # the version's metadata is read only when it is shown
        assert "importlib.metadata" not in modules


def test_a_command_imports_its_own_module_only() -> None:
    modules = imported_by("validate", "--help")
    commands = {m for m in modules if m.startswith("llm_health.cli.")}
    assert "llm_health.cli.validate" in commands
    assert not commands & {f"llm_health.cli.{c.module}" for c in COMMANDS.values()} - {
        "llm_health.cli.validate"
    }
    assert "aiohttp" not in modules and "grpc" not in modules


def test_the_top_level_help_lists_every_command_with_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    for name, command in COMMANDS.items():
        assert f"{name} {command.summary}" in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_help_is_the_one_its_module_registers(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary in the table is the one the command's own parser is built with, and
    its own help still shows its options."""
    with pytest.raises(SystemExit):
        build_parser(name).parse_args([name, "--help"])
    own = capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args([name, "--help"])
    listed_only = capsys.readouterr().out
    assert own.startswith(f"usage: llm-health {name} [-h]")
    assert own.count("--") > listed_only.count("--")  # its options: only when it runs
