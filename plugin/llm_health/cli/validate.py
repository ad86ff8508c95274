"""``llm-health validate --config FILE``: exit 0 if valid, 2 with one line per problem."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from llm_health.cli.commands import summary
from llm_health.config import Config, load_config
from llm_health.errors import ConfigError

T = TypeVar("T")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "validate",
        help=summary("validate"),
        description="Validate a config file: exit 0 if it is valid, else 2 with one line per "
        "problem, each naming the file line and the field.",
    )
    parser.add_argument("--config", "-c", required=True, metavar="FILE")
    parser.set_defaults(func=run)


def load_or_report(path: str) -> Config | None:
    """The config at ``path``, or None after printing every problem to stderr (the
    callers exit 2)."""
    return loaded_or_reported(path, load_config)


def loaded_or_reported(path: str, load: Callable[[str], T]) -> T | None:
    """``load(path)``, or None after printing every problem to stderr. The loaders raise
    nothing but ConfigError, whose messages are one escaped line each; the second clause
    is a last guard so that no file ever ends in a traceback."""
    try:
        return load(path)
    except ConfigError as exc:
        for message in exc.messages:
            print(message, file=sys.stderr)
        return None
    except Exception as exc:
        print(f"{path}: cannot be loaded ({type(exc).__name__})", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return 2
    endpoints = sum(len(c.endpoints) for c in config.clusters)
    discovered = len(config.discoveries())
    found = f", {discovered} discovered from DNS" if discovered else ""
    print(f"{args.config}: ok ({len(config.clusters)} clusters, {endpoints} endpoints{found})")
    return 0
