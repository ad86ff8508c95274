"""The HDS component: serves ``HealthDiscoveryService`` and turns the Envoys' reports into
the board's "hds" signal (DESIGN §5).

Three tasks on the runtime's loop:
- follow endpoints: every published snapshot's endpoint set (endpoints being removed
  from the config excluded) goes to the service, which re-assigns only on change;
- tick: expire old reports and silent Envoys (``report_ttl``) about twice a second;
- apply: whenever the service says a verdict may have changed, compare its verdicts with
  the board's "hds" signals and set or clear the ones that differ, through
  ``Runtime.update_board`` (one publish per batch). A verdict that takes an endpoint
  down is a state change logged and sent to the transition observers; clearing it lets
  the endpoint recover through the normal probe hysteresis (``Board.set_signal``).

Settings are read once at start (``hds:`` changes apply after a restart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import grpc

from llm_health.hds.assign import EndpointKey
from llm_health.hds.fleet import Target
from llm_health.hds.service import HdsService
from llm_health.model.board import Board, HealthSnapshot
from llm_health.model.machine import Transition
from llm_health.servers.hds import add_hds_servicer

if TYPE_CHECKING:
    from llm_health.app.runtime import Runtime

SIGNAL = "hds"
MAX_TICK_S = 0.5
log = logging.getLogger("llm_health")


def endpoints_of(snapshot: HealthSnapshot) -> dict[EndpointKey, Target]:
    """Every endpoint HDS should check: all but those being removed from the config."""
    return {
        (cluster.name, e.spec.address): (e.spec.host, e.spec.port)
        for cluster in snapshot.clusters.values()
        for e in cluster.endpoints
        if not e.removing
    }


def hds_signals(snapshot: HealthSnapshot) -> dict[EndpointKey, str | None]:
    return {
        (cluster.name, e.spec.address): e.signals.get(SIGNAL)
        for cluster in snapshot.clusters.values()
        for e in cluster.endpoints
    }


class HdsComponent:
    name = "hds"

    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.monotonic) -> None:
        self._runtime = runtime
        self._wake = asyncio.Event()
        settings = runtime.config.hds.to_settings()
        self.tick_s = min(MAX_TICK_S, settings.report_interval_s / 2)
        self.service = HdsService(
            settings,
            endpoints=endpoints_of(runtime.hub.current()),
            clock=clock,
            on_change=self._wake.set,
        )

    def register(self, server: grpc.aio.Server) -> None:
        add_hds_servicer(server, self.service)

    def tasks(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        if not self.service.settings.enabled:
            return []
        return [self._follow_endpoints, self._tick, self._apply]

    def status(self) -> dict[str, Any]:
        return self.service.status()

    async def _follow_endpoints(self) -> None:
        revision = self._runtime.hub.current().revision
        while True:
            snapshot = await self._runtime.hub.wait_newer(revision)
            revision = snapshot.revision
            self.service.set_endpoints(endpoints_of(snapshot))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.service.tick()

    async def _apply(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.sync()

    async def sync(self) -> None:
        """Make the board's "hds" signals match the service's verdicts."""
        current = hds_signals(self._runtime.board.snapshot())
        changes = {
            key: reason
            for key, reason in self.service.decisions().items()
            if key in current and current[key] != reason
        }
        if not changes:
            return
        transitions = await self._runtime.update_board(lambda board, now: _set(board, changes, now))
        for (cluster, address), transition in transitions.items():
            reason = changes[(cluster, address)]
            fields = {"cluster": cluster, "endpoint": address, "reason": reason}
            log.info("HDS verdict: down" if reason else "HDS verdict: reachable", extra=fields)
            if transition.changed:
                self._runtime.notify_transition(cluster, address, transition, None)


def _set(
    board: Board, changes: dict[EndpointKey, str | None], now: float
) -> dict[EndpointKey, Transition]:
    return {
        (cluster, address): board.set_signal(cluster, address, SIGNAL, reason, now)
        for (cluster, address), reason in changes.items()
        if board.has_endpoint(cluster, address)
    }
