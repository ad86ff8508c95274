"""A stream's bounded log of peer protocol problems (other type URLs, unknown names).

Logs stay bounded whatever a peer sends: one line per kind of problem per stream with a
running count and at most ``MAX_SAMPLES`` names, repeated at most every ``REPEAT_LOG_S``
while the count grows. Peer-supplied text is cut to ``MAX_LOGGED_CHARS`` and escaped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

from llm_health.core.problems import ProblemLog

MAX_LOGGED_CHARS = 200  # any other peer-supplied text in a log line (names, node, type URL)
MAX_SAMPLES = 3  # names quoted in one log line
REPEAT_LOG_S = 60.0  # a kind of problem already logged on a stream: again at most this often


def quoted(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """A peer-supplied name in a list: ``'ghost'`` (cut, escaped by ``repr``)."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


@dataclass(slots=True)
class _Tally:
    count: int = 0  # running total on this stream
    unlogged: int = 0  # added since the last line
    samples: list[str] = field(default_factory=list)  # the first MAX_SAMPLES seen


class ProblemTally:
    """One stream's bounded log of peer protocol problems: per kind a count and a few
    samples; a line when a kind is first seen, then at most every ``REPEAT_LOG_S`` while
    its count grows. Memory is O(kinds x MAX_SAMPLES), whatever the peer sends.

    The tally is this stream's own (its line quotes the running count and samples); when
    a kind is due is ``core.problems.ProblemLog``'s decision (``claim``), as on every
    other surface."""

    def __init__(
        self,
        log: logging.Logger,
        label: Callable[[], str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._label = log, label
        self._due = ProblemLog(log, every_s=REPEAT_LOG_S, clock=clock)
        self._tallies: dict[str, _Tally] = {}

    def add(self, kind: str, count: int, samples: Iterable[str] = ()) -> None:
        """Count ``count`` occurrences; only the first few ``samples`` are looked at."""
        if count <= 0:
            return
        tally = self._tallies.setdefault(kind, _Tally())
        tally.count += count
        tally.unlogged += count
        room = MAX_SAMPLES - len(tally.samples)
        if room > 0:
            tally.samples.extend(s for s in islice(samples, room) if s not in tally.samples)

    def flush(self) -> None:
        """Log every kind that is due."""
        for kind, tally in self._tallies.items():
            if not tally.unlogged or not self._due.claim(kind):
                continue
            tally.unlogged = 0
            more = ", ..." if tally.count > len(tally.samples) else ""
            self._log.warning(
                "%s: %s: %d (first: %s%s)",
                self._label(),
                kind,
                tally.count,
                ", ".join(quoted(s) for s in tally.samples),
                more,
            )
