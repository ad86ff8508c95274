"""The ``llm-health`` command line: one subcommand per module, dispatched by argparse.

Exit codes: 0 success, 1 the command ran and found a problem (e.g. a failed probe),
2 bad usage or invalid input (argparse's own convention, also used for a bad config).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from llm_health import __version__
from llm_health.cli.admin import register as register_admin
from llm_health.cli.agent import register as register_agent
from llm_health.cli.probe import register as register_probe
from llm_health.cli.serve import register as register_serve
from llm_health.cli.sim import register as register_sim
from llm_health.cli.validate import register as register_validate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-health",
        description="TTFT micro-probe health checking for Envoy-based LLM gateways.",
    )
    parser.add_argument("--version", action="version", version=f"llm-health {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_serve(commands)
    register_probe(commands)
    register_validate(commands)
    register_sim(commands)
    register_agent(commands)
    register_admin(commands)  # status, drain, undrain, force, clear-override, probe-now
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
