"""Signals from a probe in flight to whoever started it.

``FIRST_TOKEN``: set by the scheduler in the task that runs a probe; the micro-probe calls
its listener the moment it reads the first token (before it closes the stream and builds its
result). The scheduler's in-flight silence check waits on it, so a token that arrived a
hair before the silence point is never mistaken for silence. A context variable, not a
parameter: probe functions keep their one-argument shape, and a probe that does not know
of it (a test's fake) simply ends, which the scheduler sees as well.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol


class TokenListener(Protocol):
    """Told once a probe's first token has arrived (an ``asyncio.Event`` is one)."""

    def set(self) -> None: ...


FIRST_TOKEN: ContextVar[TokenListener | None] = ContextVar("first_token", default=None)


def first_token_seen() -> None:
    """Tell the scheduler (if it is listening) that the first token has arrived."""
    listener = FIRST_TOKEN.get()
    if listener is not None:
        listener.set()
