"""Small text renderings shared by the subcommands' human output."""

from __future__ import annotations


def ms(value: float | None, unit: str = " ms") -> str:
    """A timing in milliseconds, one decimal ("41.3 ms"); "-" when there is none."""
    return "-" if value is None else f"{value:.1f}{unit}"
