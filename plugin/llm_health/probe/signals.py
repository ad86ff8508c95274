"""Signals from a probe in flight to whoever started it.

``FIRST_TOKEN``: set by the scheduler in the task that runs a probe; the micro-probe sets
the event the moment it reads the first token (before it closes the stream and builds its
result). The scheduler's in-flight silence check waits on it, so a token that arrived a
hair before the silence point is never mistaken for silence. A context variable, not a
parameter: probe functions keep their one-argument shape, and a probe that does not know
of it (a test's fake) simply ends, which the scheduler sees as well.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

FIRST_TOKEN: ContextVar[asyncio.Event | None] = ContextVar("first_token", default=None)


def first_token_seen() -> None:
    """Tell the scheduler (if it is listening) that the first token has arrived."""
    event = FIRST_TOKEN.get()
    if event is not None:
        event.set()
