"""The HDS stream engine: ``StreamHealthCheck`` over any request iterator (no gRPC here).

Shape (a thin dispatcher, like ``llm_health.xds.stream``): one task reads the stream's
messages into the shared ``Fleet`` (``HealthCheckRequest`` -> the node joins;
``EndpointHealthResponse`` -> its reports are folded in); the generator sends the node's
specifier whenever it is due: after every ``HealthCheckRequest`` (so each new stream gets
one, docs/design.md §7) and whenever the node's plan changes (a node joined or left, endpoints
changed). Nothing else is sent. Both end when the client goes away or the caller stops
iterating; the node leaves the fleet with its last stream.

Bad input never ends a stream (only bytes that are not protobuf at all do: the engine
raises ``ProtocolError``, which the servicer answers with INVALID_ARGUMENT). A message
with neither field set before the stream identified itself (after it, that is how Envoy
sends an empty report), a report before the stream identified itself, entries without
an address, for unknown endpoints or for clusters we never sent are counted
(``HdsStats``) and ignored.

Reports count only from nodes that take their endpoints from us: with ``xds_open`` (a
``Callable[[str], bool]``, the xDS streams' registry of open node ids, passed in by the
app) a report from a node id with no open xDS stream is ignored and counted
(``reports_without_xds``), and logged once per node (``core.problems``, a bounded table).
A client that opens HDS streams under made-up node ids, and nothing else, then ejects
nothing (docs/design.md §7.6).

Logging follows docs/design.md §10: a node id (the peer's text) is cut to
MAX_LOGGED_CHARS and escaped in every line; "HDS stream open" and "HDS stream closed",
and the problems a peer can repeat per stream, go through ``core.problems.ProblemLog``
per peer host (the first at once, then at most one a minute with a count of those left
out), so churning streams or made-up node ids cannot grow the log.

One event loop; ``on_change`` is called (synchronously, must not raise) after anything
that may change an endpoint's HDS verdict, so the owner can re-read ``decisions()``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeAlias

from envoy.service.health.v3 import hds_pb2
from google.protobuf.message import DecodeError

from llm_health.core.problems import ProblemLog, peer_host
from llm_health.errors import ProtocolError
from llm_health.hds import wire
from llm_health.hds.fleet import Fleet, NodeInfo, NodePlan, ReportTally, Target
from llm_health.hds.settings import HdsConfig
from llm_health.model.redact import printable
from llm_health.model.states import EndpointKey

_LOG = logging.getLogger("llm_health.hds")
MAX_WARNED_NODES = 1024  # node ids remembered for "logged once": bounded memory
MAX_LOGGED_CHARS = 200  # a node id in a log line
MAX_LOGGED_PROTOCOLS = 8  # capability names in a log line (a peer may send any number)

Request: TypeAlias = hds_pb2.HealthCheckRequestOrEndpointHealthResponse
Specifier: TypeAlias = hds_pb2.HealthCheckSpecifier


@dataclass(slots=True)
class HdsStats:
    """Counters of the HDS service (JSON-ready via ``as_dict``)."""

    streams_open: int = 0
    streams_total: int = 0
    refused_streams: int = 0
    health_check_requests: int = 0
    reports: int = 0
    empty_reports: int = 0
    empty_messages: int = 0
    undecodable_messages: int = 0
    reports_before_request: int = 0
    malformed_entries: int = 0
    specifiers_sent: int = 0
    reports_without_xds: int = 0  # from a node id with no open xDS stream: ignored
    held_verdicts: int = 0  # "down" verdicts held by the max_ejection_percent cap
    entries: ReportTally = field(default_factory=ReportTally)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, eq=False)
class _Session:
    stream: int
    peer: str
    node: str | None = None
    requests: int = 0  # HealthCheckRequests seen
    answered: int = 0  # ... and answered with a specifier
    sent: NodePlan | None = None
    done: bool = False
    error: str | None = None  # why the client's messages could not be read
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class HdsService:
    """Owns the ``Fleet``; serves any number of streams. Not thread-safe (one loop)."""

    def __init__(
        self,
        settings: HdsConfig,
        *,
        endpoints: Mapping[EndpointKey, Target] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
        xds_open: Callable[[str], bool] | None = None,
    ) -> None:
        self.settings = settings
        self._xds_open = xds_open
        self._warned_nodes: set[str] = set()
        self._churn = ProblemLog(_LOG, level=logging.INFO)  # streams opened and closed
        self._problems = ProblemLog(_LOG)
        self.stats = HdsStats()
        self.fleet = Fleet(settings, endpoints, clock())
        self._clock = clock
        self._on_change = on_change
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count(1)

    # --- for the owner (the app component) --------------------------------------------

    def set_endpoints(self, endpoints: Mapping[EndpointKey, Target]) -> None:
        self._mutate(lambda now: self.fleet.set_endpoints(endpoints, now))

    def tick(self) -> None:
        """Expire old reports and silent nodes; call about every second."""
        self._mutate(self.fleet.tick)

    def decisions(self) -> dict[EndpointKey, str | None]:
        return self.fleet.decisions(self._clock())

    # --- the stream -------------------------------------------------------------------

    async def stream(
        self, requests: AsyncIterator[Request], peer: str = "?"
    ) -> AsyncIterator[Specifier]:
        """Serve one ``StreamHealthCheck`` stream until the client goes away."""
        session = _Session(next(self._ids), peer)
        self._sessions[session.stream] = session
        self.stats.streams_open += 1
        self.stats.streams_total += 1
        reader = asyncio.create_task(self._read(session, requests))
        try:
            while (plan := await self._due(session)) is not None:
                yield wire.specifier(plan, self.settings)
                self.stats.specifiers_sent += 1
            if session.error is not None:
                raise ProtocolError(session.error)
        finally:
            # Leave the fleet before any await: a second cancellation of this task (gRPC
            # may deliver more than one when a peer vanishes) must not skip it.
            self._end(session)
            reader.cancel()
            await asyncio.wait([reader])

    async def _due(self, session: _Session) -> NodePlan | None:
        """Wait until a specifier is due on ``session`` (None: the stream is over)."""
        while True:
            session.wake.clear()
            if session.done:
                return None
            if session.node is not None:
                plan = self.fleet.plan(session.node)
                if session.requests != session.answered or plan != session.sent:
                    session.answered, session.sent = session.requests, plan
                    return plan
            await session.wake.wait()

    async def _read(self, session: _Session, requests: AsyncIterator[Request]) -> None:
        try:
            async for message in requests:
                self._dispatch(session, message)
        except DecodeError:
            self.stats.undecodable_messages += 1
            session.error = "a message is not a HealthCheckRequestOrEndpointHealthResponse"
            self._problems.report(
                f"undecodable {peer_host(session.peer)}",
                f"HDS stream of {_who(session)}: {session.error}",
            )
        except Exception:  # a transport error, or a bug: end this stream, keep serving
            _LOG.exception("HDS stream of %s ended by an error", _who(session))
        finally:
            session.done = True
            session.wake.set()
            self._end(session)  # the client is gone: leave now, not when the generator is

    def _dispatch(self, session: _Session, message: Request) -> None:
        kind = message.WhichOneof("request_type")
        if kind == "health_check_request":
            self._identify(session, message.health_check_request)
        elif kind == "endpoint_health_response":
            self._report(session, message.endpoint_health_response)
        elif session.node is not None:
            # Envoy with nothing to check sends its periodic report with neither field set
            # (sendResponse only creates endpoint_health_response per HDS cluster): that
            # is an empty report, and the sign of life that keeps the node usable.
            self._report(session, hds_pb2.EndpointHealthResponse())
        else:
            self.stats.empty_messages += 1

    def _identify(self, session: _Session, request: hds_pb2.HealthCheckRequest) -> None:
        self.stats.health_check_requests += 1
        who = wire.identity(request)
        node_id = who.node_id or f"unnamed@{session.peer}"
        if session.node is not None and node_id != session.node:
            self._problems.report(
                f"node id {peer_host(session.peer)}",
                f"HDS stream of {_who(session)} sent node id {node_id[:MAX_LOGGED_CHARS]!r}: ignored",
            )
        first = session.node is None
        self._mutate(
            lambda now: self.fleet.open_stream(session.stream, node_id, who.protocols, now)
        )
        session.node = self.fleet.node_of(session.stream)
        session.requests += 1
        session.wake.set()
        if first:
            self._log_join(session, who)

    def _report(self, session: _Session, response: hds_pb2.EndpointHealthResponse) -> None:
        if session.node is None:
            self.stats.reports_before_request += 1
            return
        if self._xds_open is not None and not self._xds_open(session.node):
            self._without_xds(session)
            return
        report = wire.read_report(response)
        self.stats.reports += 1
        self.stats.empty_reports += int(report.form == "empty")
        self.stats.malformed_entries += report.malformed
        tally = self._mutate(lambda now: self.fleet.report(session.stream, report.entries, now))
        self.stats.entries.add(tally)

    def _without_xds(self, session: _Session) -> None:
        """A report from a node with no open xDS stream: not counted, not even as a sign of
        life (the node goes stale after ``report_ttl`` and loses its assignment)."""
        self.stats.reports_without_xds += 1
        node = session.node or "?"
        if node in self._warned_nodes or len(self._warned_nodes) >= MAX_WARNED_NODES:
            return
        self._warned_nodes.add(node)
        shown = repr(node[:MAX_LOGGED_CHARS])  # the peer's text: cut and escaped
        _LOG.warning(
            "HDS reports of node %s ignored: it holds no xDS stream with this node id "
            "(counted in hds.stats.reports_without_xds; logged once per node)",
            shown,
            extra={"node": shown, "peer": session.peer},
        )

    def _end(self, session: _Session) -> None:
        """Idempotent: called by whichever of reader and generator finishes first."""
        if self._sessions.pop(session.stream, None) is None:
            return
        self.stats.streams_open -= 1
        self._mutate(lambda now: self.fleet.close_stream(session.stream, now))
        if session.node is not None:
            fields = {"node": _shown(session.node), "peer": session.peer}
            self._churn.report(f"closed {peer_host(session.peer)}", "HDS stream closed", fields)

    def _mutate(self, change: Callable[[float], Any]) -> Any:
        """Apply ``change(now)`` to the fleet; wake streams whose plan may have changed."""
        generation = self.fleet.generation
        result = change(self._clock())
        if self.fleet.generation != generation:
            for session in self._sessions.values():
                session.wake.set()
        self._on_change()
        return result

    def _log_join(self, session: _Session, who: wire.Identity) -> None:
        host = peer_host(session.peer)
        capability = [_shown(p) for p in sorted(who.protocols)[:MAX_LOGGED_PROTOCOLS]]
        fields = {"node": _who(session), "peer": session.peer, "capability": capability}
        self._churn.report(f"open {host}", "HDS stream open", fields)
        protocol = self.settings.protocol
        if protocol not in who.protocols:
            self._problems.report(
                f"capability {host}",
                f"HDS node {_who(session)} cannot run {protocol} checks: it is assigned nothing",
            )

    # --- /status ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "enabled": self.settings.enabled,
            "check": self.settings.check,
            "checkers_per_endpoint": self.settings.checkers_per_endpoint,
            "quorum": self.settings.quorum or "majority",
            "nodes": [self._node_status(node, now) for node in self.fleet.nodes()],
            "endpoints": [self._endpoint_status(key, now) for key in self.fleet.endpoints()],
            "stats": self.stats.as_dict(),
        }

    def _node_status(self, node: NodeInfo, now: float) -> dict[str, Any]:
        return {
            "node": node.node_id,
            "streams": len(node.streams),
            "capability": sorted(node.protocols),
            "usable": self.fleet.usable(node),
            "assigned_endpoints": len(self.fleet.assignment.endpoints_of(node.node_id)),
            "reports": node.reports,
            "last_seen_s_ago": round(now - node.last_seen, 3),
        }

    def _endpoint_status(self, key: EndpointKey, now: float) -> dict[str, Any]:
        return {
            "cluster": key[0],
            "address": key[1],
            "checkers": list(self.fleet.assignment.checkers_of(key)),
            "verdict": self.fleet.ledger.decide(key, now),
            "reporters": [
                {
                    "node": r.node,
                    "said": None if r.said is None else r.said.value,
                    "age_s": r.age_s,
                    "assigned": r.assigned,
                }
                for r in self.fleet.reporters(key, now)
            ],
        }


def _shown(text: str) -> str:
    """A peer's text (a node id) for one log line: cut and escaped."""
    return printable(text, MAX_LOGGED_CHARS)


def _who(session: _Session) -> str:
    return _shown(session.node or session.peer)
