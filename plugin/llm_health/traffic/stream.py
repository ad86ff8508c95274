"""Consuming Envoy's access-log streams (docs/design.md §15.1): each
``StreamAccessLogsMessage`` of a ``StreamAccessLogs`` call, entry by entry, into a sink.

The streams are untrusted and may flood (a misconfigured Envoy, a retry storm, a hostile
peer): every stream has a budget of ``max_rate`` entries per second (a token bucket of one
second's worth); entries beyond it are dropped and counted, never queued. The consumer
yields to the event loop every ``YIELD_EVERY`` entries, so a burst can never hold up the
prober or an xDS push for more than that many decodes (a few milliseconds).
Entries that do not count (probes, no upstream, intermediate) are counted by kind.

Entries count only from nodes that take their endpoints from us, as HDS reports do
(docs/design.md §7.6): with ``xds_open`` (the xDS streams' registry of open node ids,
passed in by the app) the entries of a stream whose node id (``identifier.node.id`` of
its first message, where Envoy sends it) holds no open xDS stream are not decoded, only
counted (``without_xds_total``), and logged once per node.
Dropping is logged at most once per ``LOG_EVERY_S`` per peer host (``core.problems``),
whatever number of streams that peer opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from llm_health.core.problems import ProblemLog, peer_host
from llm_health.model.redact import printable_line
from llm_health.traffic.entries import Request, decode

YIELD_EVERY = 50  # entries between yields: a few ms of work at most
LOG_EVERY_S = 60.0
DEFAULT_MAX_RATE = 20_000.0  # entries per second per stream
MAX_WARNED_NODES = 1024  # node ids remembered for "logged once": bounded memory
log = logging.getLogger("llm_health")


@dataclass(slots=True)
class StreamStats:
    streams_total: int = 0
    streams_open: int = 0
    messages_total: int = 0
    entries_total: int = 0
    counted_total: int = 0  # became a Request for the sink
    skipped_total: int = 0  # probes, intermediate entries, no upstream host
    dropped_total: int = 0  # over a stream's rate budget
    tcp_messages_total: int = 0  # TCP logs: not ours to read
    without_xds_total: int = 0  # from a node id with no open xDS stream: ignored


class LogStreams:
    """``sink(request, now)`` receives every counted request; ``clock``: monotonic s.
    ``xds_open``: whether a node id holds an open xDS stream (None: count every stream's
    entries, for tests of the stream alone)."""

    def __init__(
        self,
        sink: Callable[[Request, float], None],
        clock: Callable[[], float],
        max_rate: float = DEFAULT_MAX_RATE,
        *,
        xds_open: Callable[[str], bool] | None = None,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._max_rate = max_rate
        self._xds_open = xds_open
        self._warned_nodes: set[str] = set()
        self._drops = ProblemLog(log, every_s=LOG_EVERY_S, clock=clock)
        self.stats = StreamStats()

    async def consume(self, messages: AsyncIterator[Any], peer: str) -> None:
        """Read one stream to its end. A protobuf DecodeError from the transport
        propagates (the adapter answers INVALID_ARGUMENT)."""
        stats = self.stats
        stats.streams_total += 1
        stats.streams_open += 1
        tokens, refilled = self._max_rate, self._clock()
        since_yield = 0
        host, shown = printable_line(peer_host(peer), 100), printable_line(peer, 100)
        node: str | None = None  # the stream's node id, from its first message
        try:
            async for message in messages:
                stats.messages_total += 1
                if message.HasField("identifier") and stats.messages_total <= 1_000_000:
                    _note_identifier(message.identifier, peer)
                if node is None:
                    node = message.identifier.node.id
                if message.HasField("tcp_logs"):
                    stats.tcp_messages_total += 1
                    continue
                entries = message.http_logs.log_entry
                if self._xds_open is not None and not self._xds_open(node):
                    self._without_xds(node, peer, len(entries))
                    continue
                now = self._clock()
                tokens = min(self._max_rate, tokens + (now - refilled) * self._max_rate)
                refilled = now
                dropping = False
                for entry in entries:
                    stats.entries_total += 1
                    if tokens < 1:
                        stats.dropped_total += 1
                        dropping = True
                        continue
                    tokens -= 1
                    self._one(entry, now)
                    since_yield += 1
                    if since_yield >= YIELD_EVERY:
                        since_yield = 0
                        await asyncio.sleep(0)
                if dropping:  # one report per message, not per entry: the flood stays cheap
                    self._log_dropping(host, shown)
        finally:
            stats.streams_open -= 1

    def _log_dropping(self, host: str, shown: str) -> None:
        self._drops.report(
            host,
            "access-log stream over its budget: dropping entries",
            {"peer": shown, "max_per_s": self._max_rate},
        )

    def _without_xds(self, node: str, peer: str, entries: int) -> None:
        """Entries from a node with no open xDS stream: counted, never decoded."""
        self.stats.entries_total += entries
        self.stats.without_xds_total += entries
        shown = printable_line(node, 100)  # the peer's text: cut, and made one line
        if shown in self._warned_nodes or len(self._warned_nodes) >= MAX_WARNED_NODES:
            return
        self._warned_nodes.add(shown)
        log.warning(
            "access-log entries of node %r ignored: it holds no xDS stream with this node id "
            "(counted in traffic.without_xds_total; logged once per node)",
            shown,
            extra={"node": shown, "peer": printable_line(peer, 100)},
        )

    def _one(self, entry: Any, now: float) -> None:
        request = decode(entry)
        if request is None:
            self.stats.skipped_total += 1
            return
        self.stats.counted_total += 1
        self._sink(request, now)


def _note_identifier(identifier: Any, peer: str) -> None:
    node = printable_line(identifier.node.id, 100)
    name = printable_line(identifier.log_name, 100)
    log.debug(
        "access-log stream",
        extra={"peer": printable_line(peer, 100), "node": node, "log_name": name},
    )
