"""One rate-limited log for problems that a peer, a backend or load can repeat at will
(docs/design.md §10: no peer can make us log without bound).

Every surface that logs what others send (ext_authz requests, xDS and access-log streams,
undecodable gRPC messages, refused tokens, the fleet's Redis, ignored probes) uses this:
the first problem of a key is logged at once; after that at most one line per key every
``every_s`` seconds, carrying how many of that key were left out meanwhile (the counters
have them all). A key is a kind of problem, a peer host, or both. The table of keys is
bounded: once ``max_keys`` recent keys are held, new keys are counted, not logged, until
old ones age out, so a peer that invents a new key per request cannot grow memory or log.
``every_s=math.inf`` logs each key once (while the table has room).

``report`` decides and writes the line; ``claim`` only decides, for a caller that keeps
its own tally and writes its own line (the xDS streams' problem counts and samples).
Thread-safe (the threaded ext_authz server refuses tokens on its own threads): the
decision is taken under a lock, the line written outside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_EVERY_S = 60.0
DEFAULT_MAX_KEYS = 1_000
SUPPRESSED = "suppressed"  # the field that says how many lines were left out


class ProblemLog:
    """``report(key, message, fields)``: log unless ``key`` was logged less than
    ``every_s`` ago. ``count_field``: the name of the field with the left-out count.
    ``clock``: monotonic seconds."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        every_s: float = DEFAULT_EVERY_S,
        max_keys: int = DEFAULT_MAX_KEYS,
        level: int = logging.WARNING,
        count_field: str = SUPPRESSED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._every_s = every_s
        self._max_keys = max_keys
        self._level = level
        self._count_field = count_field
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (time of its last line, lines left out since), oldest line first: a key
        # is put back at the end whenever it gets a line.
        self._held: dict[str, tuple[float, int]] = {}
        self.unlogged_total = 0  # lines left out, over every key

    def report(
        self,
        key: str,
        message: str,
        fields: Mapping[str, Any] | None = None,
        *,
        args: tuple[object, ...] = (),
    ) -> bool:
        """Log ``message % args`` with ``fields`` (and the count of lines left out for
        this key since its last line) unless the key is within its quiet time. Returns
        whether a line was written."""
        with self._lock:
            left_out = self._take(key, count=True)
        if left_out is None:
            return False
        extra = {**(fields or {}), self._count_field: left_out}
        self._log.log(self._level, message, *args, extra=extra)
        return True

    def claim(self, key: str) -> bool:
        """Whether a line for ``key`` is due now; if so its quiet time starts now and the
        caller writes the line. A refusal is not counted: the caller's tally has it."""
        with self._lock:
            return self._take(key, count=False) is not None

    def _take(self, key: str, *, count: bool) -> int | None:
        """The key's left-out count when a line is due (its quiet time restarts), else
        None (counted as left out when ``count``)."""
        now = self._clock()
        held = self._held.get(key)
        if held is not None and now - held[0] < self._every_s:
            if count:
                self._held[key] = (held[0], held[1] + 1)
                self.unlogged_total += 1
            return None
        self._expire(now)
        if held is None and len(self._held) >= self._max_keys:
            self.unlogged_total += count
            return None
        self._held.pop(key, None)
        self._held[key] = (now, 0)
        return 0 if held is None else held[1]

    def _expire(self, now: float) -> None:
        """Drop the keys whose quiet time is over, oldest first (their next line would be
        logged anyway; a dropped key's left-out count stays in ``unlogged_total``)."""
        while self._held:
            oldest = next(iter(self._held))
            if now - self._held[oldest][0] < self._every_s:
                return
            del self._held[oldest]


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.5:51234`` -> ``ipv4:10.0.0.5``: a per-peer limit is per host, since
    the port changes with every connection."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rsplit(":", 1)[0]
    return peer
