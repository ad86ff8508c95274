"""argparse value types shared by every subcommand: clear, specific errors (exit 2)."""

from __future__ import annotations

import argparse
import re

from llm_health.model.durations import parse_duration

MAX_PORT = 65535


def duration(text: str) -> float:
    """A duration string such as ``800ms`` -> seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")


def integer(text: str) -> int:
    """ASCII digits only: int() would also take "٨٠٠٠" (Arabic-Indic digits), "8_000" or
    " 8000 "."""
    if not _INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (digits 0-9)")
    return int(text)


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port(text: str) -> int:
    """A TCP port 1..65535."""
    value = integer(text)
    if not 1 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"port must be between 1 and {MAX_PORT}, got {value}")
    return value
