"""Lifecycle of ``llm-health serve``: servers, prober, timers, reload. Built by
``app.assemble.build_runtime``, which also builds every component.

Task order (one TaskGroup; shutdown cancels in reverse of importance):
  HTTP server (liveness first) -> gRPC server (xDS + components' services) -> loop-lag
  monitor -> prober -> warm-start timer -> expiry ticker -> reload watcher -> components'
  tasks.

The board belongs to the ``BoardKeeper`` (``control``): the runtime changes it only through
``control.update`` / ``control.fold_probe``, like every component, so there is one publish
path. Shutdown: stop probing, then stop gRPC with a short grace (Envoy keeps its last
accepted EDS data: docs/design.md §7), then the HTTP server. The whole stop stays well under 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from aiohttp import web

from llm_health.app.endpoints import EndpointCatalog
from llm_health.app.heap import settle_heap
from llm_health.app.keeper import BoardKeeper
from llm_health.app.live import LiveConfig
from llm_health.app.probing import probe_scheduler
from llm_health.app.stopping import cancel_within, stop_within
from llm_health.config import Config
from llm_health.config.apart import load_config_off_loop
from llm_health.config.reading import fingerprint
from llm_health.core.component import Component, Preparing, SkipRule
from llm_health.core.control import ProberStats
from llm_health.errors import ConfigError
from llm_health.model.board import Board, Change
from llm_health.model.outcome import ProbeResult
from llm_health.ops.http_server import bound_port, build_http_app, start_http
from llm_health.ops.metrics import RuntimeMetrics
from llm_health.ops.secret_scrubbing import Secrets, scrubbed_logs
from llm_health.ops.status_document import status_document
from llm_health.probe.client import MicroProbe, Prober, ProbeWrapper, new_connections
from llm_health.probe.http1 import Connections
from llm_health.probe.inflight import ProbeSlots
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.pool import STOP_GRACE_S as WORKER_STOP_GRACE_S
from llm_health.probe.pool import WorkerPool
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.signals import Starter
from llm_health.probe.target import ProbeTarget
from llm_health.servers.auth import GrpcSecurity, SecurityProvider
from llm_health.servers.grpc import start_grpc_server
from llm_health.servers.xds import add_xds_servicers
from llm_health.xds.nodes import OpenNodes
from llm_health.xds.stream import XdsStats

GRPC_STOP_GRACE_S = 0.5
# Bounds on the stop (app.stopping), each well past what the step takes when nothing
# hangs (milliseconds) and all together below tests/runtime.py's STOP_WITHIN_S.
TASKS_STOP_S = 2.0
GRPC_STOP_S = GRPC_STOP_GRACE_S + 1.5
HTTP_STOP_S = 5.0  # aiohttp lets in-flight handlers finish (a probe-now: a probe timeout)
WORKERS_STOP_S = WORKER_STOP_GRACE_S + 1.0
PREPARE_BUDGET_S = 2.0  # per component, before probing and xDS start
EXPIRY_TICK_S = 1.0
RELOAD_POLL_S = 2.0
HEAP_POLL_S = 0.25
log = logging.getLogger("llm_health")


class Runtime:
    """Owns the servers and timers. ``run`` until ``stop`` is set. One event loop."""

    def __init__(
        self,
        live: LiveConfig,
        control: BoardKeeper,
        components: Sequence[Component],
        metrics: RuntimeMetrics,
        lag: LoopLagMonitor,
        xds_stats: XdsStats,
        clock: Callable[[], float] = time.monotonic,
        *,
        xds_nodes: OpenNodes | None = None,
        catalog: EndpointCatalog | None = None,
        probe_wrapper: ProbeWrapper | None = None,
        security: SecurityProvider = GrpcSecurity,
        skip: SkipRule | None = None,
        preparing: Sequence[Preparing] = (),
        secrets: Secrets | None = None,
    ) -> None:
        """``security``: the main gRPC server's interceptors and credentials (called when
        it starts); ``skip``: the scheduler's busy rule, if any; ``secrets``: the set
        scrubbed from logs and /status, shared with the components that send text out
        (default: the config's own)."""
        self.live = live
        self.catalog = catalog if catalog is not None else EndpointCatalog(live, control)
        self.xds_nodes = xds_nodes if xds_nodes is not None else OpenNodes()
        self.control = control
        self.components = list(components)
        self.probe_wrapper = probe_wrapper  # the engine checks, when they run
        self.metrics = metrics
        self.lag = lag
        self.xds_stats = xds_stats
        self._security = security
        self._skip_rule = skip
        self._preparing = tuple(preparing)
        self.targets: list[ProbeTarget] = []
        self._by_key: dict[tuple[str, str], ProbeTarget] = {}
        self.scheduler: Scheduler | None = None
        self.prober: Prober | None = None
        self.workers: WorkerPool | None = None
        self.grpc_serving = False
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._clock = clock
        self._reload_requested = asyncio.Event()
        self.secrets = secrets if secrets is not None else Secrets(live.current.secret_values())
        self._set_targets(self.catalog.targets())
        self.catalog.on_targets(self._set_targets)

    @property
    def config(self) -> Config:
        return self.live.current

    @property
    def stats(self) -> ProberStats:
        return self.control.stats

    async def run(self, stop: asyncio.Event) -> None:
        with scrubbed_logs(self.secrets):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        async with new_connections() as connections, self._prober(connections) as starter:
            slots = ProbeSlots(starter)
            self.control.attach_prober(
                lambda cluster, address: slots.probe(self._target(cluster, address))
            )
            http = await start_http(self.http_app(), self.config.server.http)
            self.http_port = bound_port(http)
            await self._prepare_components()
            scheduler = probe_scheduler(
                self.control,
                self.catalog.probed(self.targets),
                slots,
                on_result=self.on_result,
                on_silence=self.on_silence,
                skip=self._skip_rule.skip if self._skip_rule is not None else None,
            )
            self.scheduler = scheduler
            try:
                server = await self._start_grpc()
                try:
                    await self._supervise(scheduler, stop)
                finally:
                    self.grpc_serving = False
                    await stop_within(
                        GRPC_STOP_S, "the gRPC server", server.stop(GRPC_STOP_GRACE_S)
                    )
            finally:
                self.control.attach_prober(None)
                await stop_within(HTTP_STOP_S, "the HTTP server", http.cleanup())

    @contextlib.asynccontextmanager
    async def _prober(self, connections: Connections) -> AsyncIterator[Starter]:
        """The micro-probe (in-process, or in ``server.probe_workers`` processes: docs/
        design.md §16.2), through the engine checks when they run (known-answer probes in
        some slots; the request body by detected engine)."""
        wrapper = self.probe_wrapper
        engines = wrapper.engines if wrapper is not None else None
        local = MicroProbe(connections, self.lag, engines=engines)
        prober: Prober = local
        count = self.config.server.probe_worker_count()
        if count > 0:
            self.workers = WorkerPool(count, fallback=local, engines=engines)
            await self.workers.start()
            self.stats.worker_lag_ms = self.workers.lag_ms
            prober = self.workers
        self.prober = prober
        try:
            yield prober.start_probe if wrapper is None else wrapper.starter(prober)
        finally:
            if self.workers is not None:
                self.stats.worker_lag_ms = None
                await stop_within(WORKERS_STOP_S, "the probe workers", self.workers.close())

    def on_result(self, target: ProbeTarget, result: ProbeResult) -> None:
        """The scheduler's callback: fold the result into the board (a change is
        published in the next loop turn)."""
        self.control.fold_result(target.cluster, target.address, result)

    async def on_silence(self, target: ProbeTarget, silent_ms: float) -> bool:
        """The scheduler's silence callback: a probe in flight has no first token yet."""
        return await self.control.fold_silence(target.cluster, target.address, silent_ms)

    def _target(self, cluster: str, address: str) -> ProbeTarget:
        target = self._by_key.get((cluster, address))
        if target is None:
            raise KeyError(f"{cluster}/{address}")
        return target

    def _set_targets(self, targets: list[ProbeTarget]) -> None:
        """The endpoint set changed (reload, discovery) or who probes what (fleet): the
        scheduler probes the ones this replica probes itself; probe-now reaches all."""
        self.targets = targets
        self._by_key = {(t.cluster, t.address): t for t in targets}
        if self.scheduler is not None:
            self.scheduler.update(self.catalog.probed(targets))

    async def _prepare_components(self) -> None:
        """Before the first probe and before Envoy can connect: each component's
        ``prepare`` (fleet mode loads the fleet's fresh verdicts: warm start), bounded."""
        for component in self._preparing:
            try:
                async with asyncio.timeout(PREPARE_BUDGET_S):
                    await component.prepare()
            except Exception:  # a component's start-up must never stop the service
                log.warning("component start-up failed", extra={"component": component.name})

    async def _start_grpc(self) -> grpc.aio.Server:
        security = self._security()
        server, port = await start_grpc_server(
            self.config.server.grpc,
            interceptors=security.interceptors,
            credentials=security.credentials,
        )
        add_xds_servicers(
            server,
            self.control.hub,
            self.xds_stats,
            coalesce_s=self.config.xds.coalesce,
            nodes=self.xds_nodes,
        )
        for component in self.components:
            component.register(server)
        await server.start()
        self.grpc_port, self.grpc_serving = port, True
        log.info(
            "serving", extra={"grpc": self.config.server.grpc, "http": self.config.server.http}
        )
        return server

    async def _supervise(self, scheduler: Scheduler, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self.lag.run(), name="loop-lag"),
                group.create_task(scheduler.run(), name="prober"),
                group.create_task(self._warm_start_timer(), name="warm-start"),
                group.create_task(self._expiry_ticker(), name="expiry"),
                group.create_task(self._reload_watcher(), name="reload"),
                group.create_task(self._settle_heap_when_warm(), name="settle-heap"),
            ]
            for component in self.components:
                for index, job in enumerate(component.tasks()):
                    tasks.append(group.create_task(job(), name=f"{component.name}-{index}"))
            await stop.wait()
            log.info("shutting down")
            await cancel_within(tasks, TASKS_STOP_S)

    # --- reload ---------------------------------------------------------------------------

    def request_reload(self) -> None:
        """Ask for a config reload (SIGHUP handler). Safe to call from a signal handler
        installed with loop.add_signal_handler."""
        self._reload_requested.set()

    async def _reload_watcher(self) -> None:
        """Reload on request (SIGHUP) or when the config file's content changes."""
        seen = await asyncio.to_thread(fingerprint, self.live.path)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELOAD_POLL_S):
                    await self._reload_requested.wait()
            requested = self._reload_requested.is_set()
            self._reload_requested.clear()
            current = await asyncio.to_thread(fingerprint, self.live.path)
            if requested or current != seen:
                seen = current
                await self.reload()

    async def reload(self) -> bool:
        """Re-read the config file. An invalid file is rejected with its validation
        messages and the running config stays. Clusters/endpoints added start STARTING,
        removed ones go DRAINING and disappear after drain_time, changed thresholds apply
        from the next probe, unchanged endpoints keep their state."""
        if self.live.path is None:
            return False
        try:
            # Off the loop, a large file in a child process: parsing and validating it must
            # not stall the probes' timing or /livez (config/apart.py, docs/design.md §6.4).
            new = await load_config_off_loop(self.live.path)
        except ConfigError as exc:
            return self._reject(exc.messages)
        except Exception as exc:  # a loader bug must not take the service down
            log.debug("config reload failed", exc_info=True)
            return self._reject([f"cannot load the config: {type(exc).__name__}"])
        if new.server != self.config.server:
            log.warning("server addresses changed in the config: they apply after a restart")
            new = new.model_copy(update={"server": self.config.server})
        self.live.current = new
        self.secrets.values = self.secrets.values | new.secret_values()
        changes = await self.catalog.apply()  # board, prober, and discovery follow
        log.info("config reloaded", extra={"changes": len(changes)})
        self.live.reloads["applied"] += 1
        return True

    def _reject(self, messages: list[str]) -> bool:
        self.live.reloads["rejected"] += 1
        log.error("config reload rejected; the running config stays", extra={"errors": messages})
        return False

    # --- timers ---------------------------------------------------------------------------

    async def _expiry_ticker(self) -> None:
        """Expire overrides and endpoints removed from the config after drain_time."""
        while True:
            await asyncio.sleep(EXPIRY_TICK_S)
            changes = await self.control.update(_expire, publish_when=bool)
            _log_changes(changes)

    async def _settle_heap_when_warm(self) -> None:
        """Once every cluster is warm (or the warm-start timeout passed), the start-up
        heap is settled (``heap.settle``): what is alive then lives as long as the process."""
        deadline = self._clock() + self.config.xds.warm_start_timeout
        board = self.control.board
        # Polled: warmth is a board property with no event of its own, and a few polls
        # at start-up cost nothing.
        while self._clock() < deadline and not all(board.is_warm(n) for n in board.cluster_names):  # noqa: ASYNC110
            await asyncio.sleep(HEAP_POLL_S)
        settle_heap()

    async def _warm_start_timer(self) -> None:
        """After warm_start_timeout, push whatever we know (docs/design.md §7): an endpoint that
        never answered its first probe must not hold its whole cluster out of Envoy."""
        await asyncio.sleep(self.config.xds.warm_start_timeout)
        board = self.control.board
        cold = [name for name in board.cluster_names if not board.is_warm(name)]
        if cold:
            log.warning(
                "warm-start timeout: pushing clusters not fully probed", extra={"clusters": cold}
            )
            await self.control.update(lambda b, _now: b.mark_warm())

    # --- HTTP -----------------------------------------------------------------------------

    def ready_problems(self) -> list[str]:
        board = self.control.board
        problems = [
            f"first probe round of cluster {n}" for n in board.cluster_names if not board.is_warm(n)
        ]
        if not self.grpc_serving:
            problems.append("gRPC server")
        return problems

    def status(self) -> dict[str, Any]:
        """/status: the board and every part's numbers, scrubbed of secrets (a detail or a
        reason may quote what a backend answered)."""
        document: dict[str, Any] = self.secrets.scrub(self._status())
        return document

    def _status(self) -> dict[str, Any]:
        return status_document(
            self.control.snapshot(),
            {
                "prober": self.stats.status(self.prober.stale_resends if self.prober else 0),
                "reloads": dict(self.live.reloads),
                "xds": self.xds_stats.as_dict(),
                **self.component_status(),
            },
        )

    def component_status(self) -> dict[str, dict[str, Any]]:
        return {c.name: c.status() for c in self.components}

    def http_app(self) -> web.Application:
        return build_http_app(self.ready_problems, self.status, metrics=self.metrics.exposition)


def _expire(board: Board, now: float) -> list[Change]:
    return board.expire(now)


def _log_changes(changes: list[Change]) -> None:
    for change in changes:
        log.info(change.what, extra={"cluster": change.cluster, "endpoint": change.address})
