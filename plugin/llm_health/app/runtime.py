"""Wiring and lifecycle of ``llm-health serve``.

Task order (one TaskGroup; shutdown cancels in reverse of importance):
  HTTP server (liveness first) -> gRPC server (xDS + components' services) -> loop-lag
  monitor -> prober -> warm-start timer -> expiry ticker -> components' tasks.

Components (HDS, ext_authz, admin API, alerts ...) plug in through ``Component``: they
register gRPC services, run background tasks, add to /status, and change the board only
through ``Runtime.update_board`` (which publishes the new snapshot).
Shutdown: stop probing, then stop gRPC with a short grace (Envoy keeps its last accepted
EDS data: DESIGN §7), then the HTTP server. The whole stop stays well under 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from aiohttp import web

from llm_health.app.admin import AdminComponent
from llm_health.app.alerts import attach as attach_alerts
from llm_health.app.authz import AuthzComponent
from llm_health.app.hds import HdsComponent
from llm_health.app.http import build_http_app, start_http
from llm_health.app.metrics import RuntimeMetrics
from llm_health.app.status import status_document
from llm_health.config import Config, load_config
from llm_health.errors import ConfigError
from llm_health.hub import SnapshotHub
from llm_health.model.board import Board
from llm_health.model.machine import Transition, trusted
from llm_health.model.outcome import ProbeResult
from llm_health.probe.client import MicroProbe, new_session
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.target import ProbeTarget, targets_from_config
from llm_health.servers.xds import add_xds_servicers, start_grpc_server
from llm_health.xds.stream import XdsStats

GRPC_STOP_GRACE_S = 0.5
EXPIRY_TICK_S = 1.0
RELOAD_POLL_S = 2.0
log = logging.getLogger("llm_health")
T = TypeVar("T")


class Component(Protocol):
    """A feature wired into the runtime. All methods are called on the runtime's loop."""

    name: str

    def register(self, server: grpc.aio.Server) -> None:
        """Add gRPC servicers (before the server starts)."""

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """Long-running coroutines, started after the prober, cancelled on shutdown."""

    def status(self) -> dict[str, Any]:
        """This component's part of /status (JSON-ready)."""


ProbeObserver = Callable[[ProbeTarget, ProbeResult], None]
TransitionObserver = Callable[[str, str, Transition, ProbeResult | None], None]


class Runtime:
    """Owns the board and every server. ``run`` until ``stop`` is set. One event loop."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] = time.monotonic,
        config_path: Path | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.reloads = {"applied": 0, "rejected": 0}
        self._reload_requested = asyncio.Event()
        self.scheduler: Scheduler | None = None
        self._clock = clock
        now = clock()
        self.board = Board(config.cluster_specs(), now, time.time() - now)
        self.hub = SnapshotHub(self.board.snapshot())
        self.targets = targets_from_config(config)
        self.lag = LoopLagMonitor()
        self.xds_stats = XdsStats()
        self.grpc_serving = False
        self.probes_total = 0
        self.probes_untrusted = 0
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        # Observers are plain callables run synchronously on the loop: keep them O(1) and
        # non-blocking (metrics, alert queues). They must not raise.
        self.probe_observers: list[ProbeObserver] = []
        self.transition_observers: list[TransitionObserver] = []
        self._probe: Callable[[ProbeTarget], Coroutine[Any, Any, ProbeResult]] | None = None
        self.metrics = RuntimeMetrics(self)
        self.components: list[Component] = self._build_components()

    def _build_components(self) -> list[Component]:
        """Each feature adds itself here (one line each)."""
        components: list[Component] = []
        components.append(AdminComponent(self))
        components.append(attach_alerts(self.config.alerts, self.transition_observers))
        components.append(AuthzComponent(self.hub, lambda: self.config.authz))
        components.append(HdsComponent(self, self._clock))
        return components

    async def update_board(self, mutate: Callable[[Board, float], T]) -> T:
        """Run ``mutate(board, now)`` and publish the result (for components and admin)."""
        result = mutate(self.board, self._clock())
        await self.hub.publish(self.board.snapshot())
        return result

    async def run(self, stop: asyncio.Event) -> None:
        async with new_session() as session:
            self._probe = _one_at_a_time(MicroProbe(session, self.lag).probe)
            scheduler = Scheduler(self.targets, self._probe, self.on_result)
            self.scheduler = scheduler
            http = await start_http(self.http_app(), self.config.server.http)
            self.http_port = _bound_port(http)
            try:
                server = await self._start_grpc()
                try:
                    await self._supervise(scheduler, stop)
                finally:
                    self.grpc_serving = False
                    await server.stop(GRPC_STOP_GRACE_S)
            finally:
                await http.cleanup()

    async def _start_grpc(self) -> grpc.aio.Server:
        server, port = await start_grpc_server(self.config.server.grpc)
        add_xds_servicers(server, self.hub, self.xds_stats, coalesce_s=self.config.xds.coalesce)
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
            ]
            for component in self.components:
                for index, job in enumerate(component.tasks()):
                    tasks.append(group.create_task(job(), name=f"{component.name}-{index}"))
            await stop.wait()
            log.info("shutting down")
            for task in tasks:
                task.cancel()

    def request_reload(self) -> None:
        """Ask for a config reload (SIGHUP handler). Safe to call from a signal handler
        installed with loop.add_signal_handler."""
        self._reload_requested.set()

    async def _reload_watcher(self) -> None:
        """Reload on request (SIGHUP) or when the config file's content changes."""
        seen = _fingerprint(self.config_path)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELOAD_POLL_S):
                    await self._reload_requested.wait()
            requested = self._reload_requested.is_set()
            self._reload_requested.clear()
            current = _fingerprint(self.config_path)
            if requested or current != seen:
                seen = current
                await self.reload()

    async def reload(self) -> bool:
        """Re-read the config file. An invalid file is rejected with its validation
        messages and the running config stays. Clusters/endpoints added start STARTING,
        removed ones go DRAINING and disappear after drain_time, changed thresholds apply
        from the next probe, unchanged endpoints keep their state."""
        if self.config_path is None:
            return False
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            self.reloads["rejected"] += 1
            log.error(
                "config reload rejected; the running config stays", extra={"errors": exc.messages}
            )
            return False
        self._apply(new)
        self.reloads["applied"] += 1
        await self.hub.publish(self.board.snapshot())
        return True

    def _apply(self, new: Config) -> None:
        if new.server != self.config.server:
            log.warning("server addresses changed in the config: they apply after a restart")
            new = new.model_copy(update={"server": self.config.server})
        changes = self.board.apply_specs(new.cluster_specs(), self._clock())
        self.config = new
        self.targets = targets_from_config(new)
        if self.scheduler is not None:
            self.scheduler.update(self.targets)
        for change in changes:
            log.info(change.what, extra={"cluster": change.cluster, "endpoint": change.address})
        log.info("config reloaded", extra={"changes": len(changes)})

    async def _expiry_ticker(self) -> None:
        """Expire overrides and endpoints removed from the config after drain_time."""
        while True:
            await asyncio.sleep(EXPIRY_TICK_S)
            changes = self.board.expire(self._clock())
            for change in changes:
                log.info(change.what, extra={"cluster": change.cluster, "endpoint": change.address})
            if changes:
                await self.hub.publish(self.board.snapshot())

    async def on_result(self, target: ProbeTarget, result: ProbeResult) -> None:
        """Fold a probe result into the board; publish when what Envoy sees may change."""
        if not self.board.has_endpoint(target.cluster, target.address):
            return  # removed by a reload while this probe was in flight
        self.probes_total += 1
        if not trusted(result, self.board.policy(target.cluster)):
            self.probes_untrusted += 1
            log.warning(
                "probe ignored: prober event loop lagged", extra=_probe_fields(target, result)
            )
            return
        for observe in self.probe_observers:
            observe(target, result)
        was_warm = self.board.is_warm(target.cluster)
        transition = self.board.record(target.cluster, target.address, result, self._clock())
        if transition.changed or transition.alert:
            self.notify_transition(target.cluster, target.address, transition, result)
        if transition.changed or was_warm != self.board.is_warm(target.cluster):
            await self.hub.publish(self.board.snapshot())

    def notify_transition(
        self, cluster: str, address: str, transition: Transition, result: ProbeResult | None
    ) -> None:
        """Log a state change once and tell every transition observer. Components that
        change the board (HDS, admin) call this for the transitions they cause."""
        if transition.changed:
            _log_transition(cluster, address, result, transition)
        for observe in self.transition_observers:
            observe(cluster, address, transition, result)

    async def probe_now(self, cluster: str, address: str) -> tuple[ProbeResult, bool]:
        """Probe one endpoint at once (admin API) and fold the result in like a scheduled
        one. Returns (result, trusted). Never overlaps a probe of the same endpoint in
        flight (waits for it). KeyError: not a probed endpoint; RuntimeError: no prober yet."""
        found = [t for t in self.targets if (t.cluster, t.address) == (cluster, address)]
        if not found:
            raise KeyError(f"{cluster}/{address}")
        if self._probe is None:
            raise RuntimeError("the prober is not running yet")
        result = await self._probe(found[0])
        await self.on_result(found[0], result)
        return result, trusted(result, self.board.policy(cluster))

    async def _warm_start_timer(self) -> None:
        """After warm_start_timeout, push whatever we know (DESIGN §7): an endpoint that
        never answered its first probe must not hold its whole cluster out of Envoy."""
        await asyncio.sleep(self.config.xds.warm_start_timeout)
        cold = [name for name in self.board.cluster_names if not self.board.is_warm(name)]
        if cold:
            log.warning(
                "warm-start timeout: pushing clusters not fully probed", extra={"clusters": cold}
            )
            self.board.mark_warm()
            await self.hub.publish(self.board.snapshot())

    def ready_problems(self) -> list[str]:
        problems = [
            f"first probe round of cluster {n}"
            for n in self.board.cluster_names
            if not self.board.is_warm(n)
        ]
        if not self.grpc_serving:
            problems.append("gRPC server")
        return problems

    def status(self) -> dict[str, Any]:
        return status_document(
            self.board.snapshot(),
            {
                "prober": {
                    "probes_total": self.probes_total,
                    "probes_ignored_loop_lag": self.probes_untrusted,
                    "loop_lag_ms": round(self.lag.current_ms, 2),
                },
                "reloads": dict(self.reloads),
                "xds": self.xds_stats.as_dict(),
                **{c.name: c.status() for c in self.components},
            },
        )

    def http_app(self) -> web.Application:
        return build_http_app(self.ready_problems, self.status, metrics=self.metrics.exposition)


def _one_at_a_time(
    probe: Callable[[ProbeTarget], Coroutine[Any, Any, ProbeResult]],
) -> Callable[[ProbeTarget], Coroutine[Any, Any, ProbeResult]]:
    """``probe`` with at most one call in flight per endpoint (scheduled and probe-now
    share it; DESIGN §2). An uncontended asyncio.Lock does not yield: no added latency."""
    locks: dict[str, asyncio.Lock] = {}

    async def exclusive(target: ProbeTarget) -> ProbeResult:
        async with locks.setdefault(target.key, asyncio.Lock()):
            return await probe(target)

    return exclusive


def _bound_port(runner: web.AppRunner) -> int | None:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return None


def _fingerprint(path: Path | None) -> bytes | None:
    """The config file's content hash (None if absent/unreadable): a touch without a
    change does not reload; an editor's atomic rename does."""
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


def _probe_fields(target: ProbeTarget, result: ProbeResult) -> dict[str, Any]:
    return {"cluster": target.cluster, "endpoint": target.address, **_timings(result)}


def _timings(result: ProbeResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome.value,
        "ttft_ms": _r(result.ttft_ms),
        "connect_ms": _r(result.connect_ms),
        "headers_ms": _r(result.headers_ms),
        "loop_lag_ms": _r(result.loop_lag_ms),
        "detail": result.detail,
    }


def _log_transition(
    cluster: str, address: str, result: ProbeResult | None, transition: Transition
) -> None:
    fields: dict[str, Any] = {
        "cluster": cluster,
        "endpoint": address,
        "from": transition.before.value,
        "to": transition.health.state.value,
        "reason": transition.health.reason,
    }
    if result is not None:
        fields.update(_timings(result))
    level = logging.WARNING if transition.alert else logging.INFO
    log.log(level, "state change", extra=fields)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
