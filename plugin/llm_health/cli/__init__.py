"""The ``llm-health`` command line: one subcommand per module, dispatched by argparse.

Exit codes: 0 success, 1 the command ran and found a problem (e.g. a failed probe),
2 bad usage or invalid input (argparse's own convention, also used for a bad config).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from llm_health.cli.commands import COMMANDS


class _PrintVersion(argparse.Action):
    """argparse's ``action="version"``, with the version read only when it is asked for
    (``llm_health.__version__``: importlib.metadata, a third of the start-up)."""

    def __init__(self, option_strings: Sequence[str], dest: str) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from llm_health import __version__

        print(f"llm-health {__version__}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser. Only the module of ``command`` (a name of COMMANDS) is imported and
    registers its arguments; every other command is listed by its name and one-line help
    alone (all of them for the top-level help, ``--version`` or a mistyped command), which
    is all ``llm-health --help`` shows of them."""
    parser = argparse.ArgumentParser(
        prog="llm-health",
        description="TTFT micro-probe health checking for Envoy-based LLM gateways.",
    )
    parser.add_argument("--version", action=_PrintVersion)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = COMMANDS[command].module if command in COMMANDS else None
    registered = False
    for name, (module, summary) in COMMANDS.items():
        if module != chosen:
            commands.add_parser(name, help=summary)
        elif not registered:  # it adds every command of its own (admin: six), in table order
            importlib.import_module(f"llm_health.cli.{module}").register(commands)
            registered = True
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # The first word that is no option is the command (the top level has no valued option).
    command = next((word for word in args_in if not word.startswith("-")), None)
    args = build_parser(command).parse_args(args_in)
    code: int = args.func(args)
    return code
