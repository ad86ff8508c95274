"""Duration strings ("800ms", "1.5s", "10m") to seconds and back."""

from __future__ import annotations

import re

from llm_health.errors import DurationError

_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)\s*$")


def parse_duration(text: str) -> float:
    """Return seconds for ``text`` such as ``"800ms"``; raise DurationError otherwise.

    A unit is required: a bare number is ambiguous (seconds? ms?) and is refused.
    """
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise DurationError(f'"{text}" is not a duration (use e.g. "800ms", "1s", "5m")')
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def format_duration(seconds: float) -> str:
    """Render seconds the way a human writes them in the config: 0.8 -> "800ms"."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
