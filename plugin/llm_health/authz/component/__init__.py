"""The ext_authz component: registers ``Authorization/Check`` and reports its counters.

It also serves RTDS on the main gRPC server: the runtime layer ``authz.native`` works out
from the published snapshot, for an Envoy that admits requests with its own filters
instead of calling ``Check`` (docs/admission.md "Admission inside Envoy"); its stream
counters are ``status()["native"]``.

Settings follow config reloads: the gate asks the ``settings`` getter (the live
``authz:`` section, ``authz.settings.AuthzConfig``) on every check, and rebuilds its view
only when that returns a new object.

``listen`` (``server.authz``) set: ``Check`` is not served on the main gRPC server but on
a server of its own (docs/design.md §16.9), with the main server's token and TLS
(``security``), started and stopped by this component's task. ``isolation``
(``server.authz_isolation``):

- ``process``: in a child process (``process.AdmissionProcess``, ``child``), fed the
  view over a pipe; its counters come back 4 times a second. Its interpreter is its own, so
  a check never waits for the prober's.
- ``threads``: on threads of this process. They answer while the event loop that times
  the probes is busy, but share its interpreter lock; they read the published snapshot by
  reference (the hub replaces it whole, never mutates it) and take ``lock`` for the gate's
  cache, the counters and the problem log, as ``status()`` does here.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Literal

import grpc
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from llm_health.authz import PROBLEM_LOG_EVERY_S, AuthzConfig, AuthzCounters, Gate
from llm_health.authz.component.process import AdmissionProcess
from llm_health.authz.native import shed_layer
from llm_health.core.control import SnapshotSource
from llm_health.core.families import gauge
from llm_health.core.problems import ProblemLog
from llm_health.model.board import HealthSnapshot
from llm_health.servers.auth import GrpcSecurity, SecurityProvider
from llm_health.servers.authz import add_authz_servicer, add_threaded_authz_servicer
from llm_health.servers.grpc import (
    GRPC_SERVER_OPTIONS,
    GrpcAuthStats,
    bind_grpc,
    create_threaded_grpc_server,
)
from llm_health.servers.xds import XdsCounters, add_runtime_servicer

log = logging.getLogger("llm_health.authz")
STOP_GRACE_S = 1.0
THREADS = 4
# How long a thread that holds the interpreter lock keeps it while another waits (Python's
# default: 5 ms). A check crosses several threads of the gRPC server (its poller, a
# worker), each waiting for the busy event loop to hand the lock over: at 5 ms a check
# waited ~17 ms p50 behind a loaded prober. Only matters while a check is waiting: idle
# gRPC threads sit in C without asking for the lock.
SWITCH_INTERVAL_S = 0.0005


class AuthzComponent:
    name = "authz"

    def __init__(
        self,
        published: SnapshotSource,
        settings: Callable[[], AuthzConfig],
        *,
        listen: str | None = None,
        security: SecurityProvider = GrpcSecurity,
        isolation: Literal["process", "threads"] = "process",
        auth_stats: GrpcAuthStats | None = None,
    ) -> None:
        self.settings = settings
        self.published = published
        self.runtime = XdsCounters()  # the RTDS streams (admission inside Envoy)
        self.counters = AuthzCounters()
        self.problems = ProblemLog(log, every_s=PROBLEM_LOG_EVERY_S)
        self.gate = Gate(published.current, settings)
        self.listen = listen
        self._security = security
        self.lock = threading.Lock()
        self.own_port: int | None = None  # bound port of the own server (0: Unix socket)
        self.own_error = ""
        self.process: AdmissionProcess | None = None
        if listen is not None and isolation == "process":
            self.process = AdmissionProcess(listen, published, settings, security, auth_stats)

    def register(self, server: grpc.aio.Server) -> None:
        add_runtime_servicer(server, self.published, self._layer, self.runtime)
        if self.listen is None:
            add_authz_servicer(server, self.gate, self.counters, self.problems)

    def _layer(self, snapshot: HealthSnapshot) -> dict[str, float]:
        return shed_layer(snapshot, self.settings())

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        if self.process is not None:
            return [self.process.run]
        return [self._serve_own] if self.listen is not None else []

    def _counted(self) -> tuple[AuthzCounters, int]:
        """The counters and view rebuilds of whoever answers the checks (call under
        ``lock``: the own threads update them)."""
        if self.process is not None:
            return self.process.counters(), self.process.rebuilds
        return self.counters, self.gate.rebuilds

    async def _serve_own(self) -> None:
        """Run the threaded ext_authz server until cancelled. A bind failure is logged and
        shown in /status; the rest of the service goes on (Envoy's failure_mode_allow
        decides what unanswered checks mean)."""
        assert self.listen is not None
        try:
            server = self._start_own(self.listen)
        except Exception as exc:
            self.own_error = str(exc)[:300]
            log.error(
                "ext_authz server not started",
                extra={"listen": self.listen, "error": self.own_error},
            )
            return
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        try:
            await asyncio.Event().wait()
        finally:
            self.own_port = None
            await asyncio.to_thread(lambda: server.stop(STOP_GRACE_S).wait())
            sys.setswitchinterval(switch)

    def _start_own(self, listen: str) -> grpc.Server:
        security = self._security()
        server = create_threaded_grpc_server(
            GRPC_SERVER_OPTIONS, interceptors=security.threaded_interceptors, threads=THREADS
        )
        add_threaded_authz_servicer(server, self.gate, self.counters, self.problems, self.lock)
        port = bind_grpc(server, listen, security.credentials)
        server.start()
        self.own_port = port
        log.info("ext_authz serving on its own threads", extra={"listen": listen})
        return server

    def status(self) -> dict[str, Any]:
        settings = self.settings()
        with self.lock:
            counted, rebuilds = self._counted()
            counters = counted.as_dict()
        return {
            "enabled": settings.enabled,
            "probe_header": settings.probe_header,
            "shed_below": settings.shed_below,
            "view_rebuilds": rebuilds,
            "own_server": self._own_status() if self.listen is not None else None,
            **counters,
            "native": _runtime_status(self.runtime),
        }

    def _own_status(self) -> dict[str, Any]:
        if self.process is not None:
            return self.process.status()
        own: dict[str, Any] = {
            "listen": self.listen,
            "isolation": "threads",
            "serving": self.own_port is not None,
        }
        if self.own_error:
            own["error"] = self.own_error
        return own

    def _own_serving(self) -> bool:
        if self.process is not None:
            return self.process.port is not None
        return self.own_port is not None

    def metrics(self) -> Iterator[Metric]:
        # Gauges, though most only grow: the types they were first exported with, which
        # dashboards and rules query. Taken under the lock the own server's threads hold.
        settings = self.settings()
        with self.lock:
            counters, rebuilds = self._counted()
            found = list(_counter_families(counters))
            if counters.decisions:
                found.append(_decisions(counters))
        yield gauge(
            "llm_health_authz_enabled",
            "1 while ext_authz decides (authz.enabled).",
            settings.enabled,
        )
        yield gauge(
            "llm_health_authz_shed_below",
            "Capacity (0 to 1) under which low-priority requests get 429 (authz.shed_below).",
            settings.shed_below,
        )
        yield gauge(
            "llm_health_authz_view_rebuilds",
            "Rebuilds of the admission view (a new snapshot or settings).",
            rebuilds,
        )
        if self.listen is not None:
            yield gauge(
                "llm_health_authz_own_server_serving",
                "1 while ext_authz's own server (server.authz) serves.",
                self._own_serving(),
            )
        if self.process is not None:
            yield gauge(
                "llm_health_authz_own_server_restarts",
                "Restarts of the admission process (server.authz_isolation: process).",
                self.process.restarts,
            )
        yield from found


def _runtime_status(counters: XdsCounters) -> dict[str, Any]:
    """The RTDS streams' counters (Envoys admitting with their own filters)."""
    keys = ("streams_open", "streams_total", "pushes", "acks", "nacks", "last_nack")
    return {key: getattr(counters, key) for key in keys}


def _counter_families(counters: AuthzCounters) -> Iterator[Metric]:
    yield gauge("llm_health_authz_checks", "ext_authz Checks answered.", counters.checks)
    yield gauge(
        "llm_health_authz_probe_headers_stripped",
        "Client requests the probe header was stripped from (authz.probe_header: strip).",
        counters.probe_headers_stripped,
    )
    for kind, count in sorted(counters.problems.items()):
        # ``kind``: one of Problem's few fixed words (no_cluster, unknown_cluster,
        # oversized_headers); a family shows once its first problem is counted.
        yield gauge(f"llm_health_authz_problems_{kind}", f"Requests with a {kind} problem.", count)
    yield gauge(
        "llm_health_authz_internal_errors",
        "Checks that failed inside the plugin (answered INTERNAL: failure_mode_allow decides).",
        counters.internal_errors,
    )
    yield gauge(
        "llm_health_authz_latency_s_sum",
        "Seconds the plugin spent on Checks, all together.",
        round(counters.latency_sum_s, 6),
    )
    yield gauge("llm_health_authz_latency_s_count", "Checks timed.", sum(counters.latency_counts))


def _decisions(counters: AuthzCounters) -> Metric:
    """Decisions per cluster and rule; cluster names are labels (any name, "(none)" and
    "(unknown)" included)."""
    family = CounterMetricFamily(
        "llm_health_authz_decisions",
        "ext_authz decisions by cluster and rule (ok, priority_routed, cold, no_capacity, "
        "shed, probe_denied, unknown_cluster, no_cluster, disabled).",
        labels=["cluster", "rule"],
    )
    for cluster, rules in sorted(counters.decisions.items()):
        for rule, count in rules.items():
            family.add_metric([cluster, rule], count)
    return family
