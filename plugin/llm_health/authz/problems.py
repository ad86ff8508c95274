"""Log odd requests without letting a misbehaving client flood the log.

The first problem of each kind is logged at once; after that at most one line per kind
every ``every_s`` seconds, saying how many of that kind were not logged in between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from llm_health.authz.decision import Problem

log = logging.getLogger("llm_health.authz")


class ProblemLog:
    """Not thread-safe: call from the event loop (or under the ext_authz component's lock). ``clock`` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 10.0) -> None:
        self._clock = clock
        self._every_s = every_s
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def report(self, problem: Problem, cluster: str | None = None) -> bool:
        """Log ``problem`` unless its kind was logged less than ``every_s`` ago.
        Returns whether a line was written."""
        now = self._clock()
        kind = problem.kind
        if now < self._next.get(kind, float("-inf")):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._next[kind] = now + self._every_s
        fields = {
            "problem": kind,
            "detail": problem.detail,
            "cluster": cluster,
            "suppressed": self._suppressed.pop(kind, 0),
        }
        log.warning("ext_authz request problem", extra=fields)
        return True
