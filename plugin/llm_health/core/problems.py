"""One rate-limited log for problems that a peer, a backend or load can repeat at will
(docs/design.md §10: no peer can make us log without bound).

Every surface that logs what others send (ext_authz requests, xDS and access-log streams,
undecodable gRPC messages, refused tokens, the fleet's Redis, ignored probes) uses this:
the first problem of a key is logged at once; after that at most one line per key every
``every_s`` seconds, carrying how many of that key were left out meanwhile (the counters
have them all). A key is a kind of problem, a peer host, or both. The table of keys is
bounded: once ``max_keys`` recent keys are held, new keys are counted, not logged, until
old ones age out, so a peer that invents a new key per request cannot grow memory or log.

Not thread-safe: call from one event loop, or under the caller's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_EVERY_S = 60.0
DEFAULT_MAX_KEYS = 1_000
SUPPRESSED = "suppressed"  # the field that says how many lines were left out


class ProblemLog:
    """``report(key, message, fields)``: log unless ``key`` was logged less than
    ``every_s`` ago. ``clock``: monotonic seconds."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        every_s: float = DEFAULT_EVERY_S,
        max_keys: int = DEFAULT_MAX_KEYS,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._every_s = every_s
        self._max_keys = max_keys
        self._level = level
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.unlogged_total = 0  # lines left out, over every key

    def report(self, key: str, message: str, fields: Mapping[str, Any] | None = None) -> bool:
        """Log ``message`` with ``fields`` (and ``suppressed``: lines left out for this key
        since its last line) unless the key is within its quiet time. Returns whether a
        line was written."""
        now = self._clock()
        if not self._due(key, now):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.unlogged_total += 1
            return False
        self._logged_at[key] = now
        extra = {**(fields or {}), SUPPRESSED: self._suppressed.pop(key, 0)}
        self._log.log(self._level, message, extra=extra)
        return True

    def _due(self, key: str, now: float) -> bool:
        last = self._logged_at.get(key)
        if last is not None:
            return now - last >= self._every_s
        if len(self._logged_at) >= self._max_keys:
            self._forget_quiet(now)
        return len(self._logged_at) < self._max_keys

    def _forget_quiet(self, now: float) -> None:
        """Drop keys whose quiet time is over (their next line would be logged anyway)."""
        self._logged_at = {k: t for k, t in self._logged_at.items() if now - t < self._every_s}
        self._suppressed = {k: n for k, n in self._suppressed.items() if k in self._logged_at}


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.5:51234`` -> ``ipv4:10.0.0.5``: a per-peer limit is per host, since
    the port changes with every connection."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rsplit(":", 1)[0]
    return peer
