"""The ``llm-health`` command line: one subcommand per module, dispatched by argparse.

Exit codes: 0 success, 1 the command ran and found a problem (e.g. a failed probe),
2 bad usage or invalid input (argparse's own convention, also used for a bad config).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from llm_health import __version__

# Each command's module (llm_health.cli.<module>, whose ``register`` adds it). Only the
# module of the command being run is imported: a process costs what its imports cost, and
# importing every command made ``llm-health sim`` start in 0.6 s of CPU.
COMMANDS = {
    "serve": "serve",
    "probe": "probe",
    "validate": "validate",
    "sim": "sim",
    "agent": "agent",
    **dict.fromkeys(
        ("status", "drain", "undrain", "force", "clear-override", "probe-now"), "admin"
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` (a name of COMMANDS), only that command's module is
    imported and registered, else every one (top-level help, a mistyped command)."""
    parser = argparse.ArgumentParser(
        prog="llm-health",
        description="TTFT micro-probe health checking for Envoy-based LLM gateways.",
    )
    parser.add_argument("--version", action="version", version=f"llm-health {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in chosen:
        importlib.import_module(f"llm_health.cli.{module}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # The first word that is no option is the command (the top level has no valued option).
    command = next((word for word in args_in if not word.startswith("-")), None)
    args = build_parser(command).parse_args(args_in)
    code: int = args.func(args)
    return code
