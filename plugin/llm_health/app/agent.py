"""``llm-health agent``: wiring and lifecycle (docs/agent.md). The gateway side's pieces,
for the one engine of the agent's own pod: one board cluster ``engine`` with the one
endpoint, owned by a ``BoardKeeper``; the scheduler and the micro-probe; the engine
checks (known answer, served model, saturation; their /metrics reads also carry the
admission counter and the process start time the agent's rules read); the loop-lag
monitor; the model found from ``/v1/models`` (when ``probe.model`` is unset: again after
each engine restart); and the HTTP surface (``agent.component.AgentSurface``) on the
shared hardened server. No gRPC server, no xDS: nothing here imports them.

Task order (one TaskGroup): loop-lag monitor, prober, engine checks, the surface's watch,
the model finder. Shutdown: stop probing, then the HTTP server; well under 2 s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llm_health.agent.component import AgentSurface
from llm_health.app.heap import settle_heap
from llm_health.app.keeper import BoardKeeper
from llm_health.app.probing import probe_scheduler
from llm_health.app.stopping import cancel_within, stop_within
from llm_health.config.agent import ENGINE_CLUSTER, AgentFile
from llm_health.core.control import ProberStats
from llm_health.engines.component import EngineChecks
from llm_health.engines.side_reads import READ_ERRORS, SideReads, open_connections
from llm_health.model.board import Board
from llm_health.model.engine_load import EngineLoad
from llm_health.ops.http_server import bound_port, start_http
from llm_health.ops.secret_scrubbing import Secrets, scrubbed_logs
from llm_health.probe.client import MicroProbe, new_connections
from llm_health.probe.inflight import ProbeSlots
from llm_health.probe.lag import LoopLagMonitor
from llm_health.probe.scheduler import Scheduler
from llm_health.probe.target import ProbeTarget

MODELS_PATH = "/v1/models"  # where the model is found when probe.models_path is null
# The loop-lag monitor's tick (docs/design.md §7.4): half of max_loop_lag, so that every
# stall long enough to matter is seen. serve ticks every 20 ms beside thousands of probes;
# the agent's one probe a second does not need that, and each wake-up costs the agent CPU
# (20 ms: ~0.5 % of a core more, docs/agent.md "Footprint").
LAG_TICK_S = 0.05
TASKS_STOP_S = 2.0  # bounds on the stop (app.stopping)
HTTP_STOP_S = 2.0  # the agent's answers are from memory: none is in flight for long
log = logging.getLogger("llm_health")


class Agent:
    """Probes ``address`` (``host:port`` of ``--engine``) with ``file``'s settings and
    answers on ``http``. ``run`` until ``stop`` is set. One event loop."""

    def __init__(
        self,
        file: AgentFile,
        address: str,
        http: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file, self.address, self.http = file, address, http
        now = clock()
        self.lag = LoopLagMonitor(min(LAG_TICK_S, file.probe.max_loop_lag / 2))
        board = Board((file.cluster(address),), now, time.time() - now)
        self.control = BoardKeeper(board, clock, ProberStats(self.lag))
        self.target = file.target(address)
        self.secrets = Secrets(file.secret_values())
        self.checks = EngineChecks(
            self.control, [self.target], file.engine_checks, clock, on_load=self._engine_read
        )
        self.surface = AgentSurface(
            self.control,
            file.agent,
            (ENGINE_CLUSTER, address),
            self.control.stats,
            stall_s=file.stall_s(),
            secrets=self.secrets,
            parts=[self.checks],
            clock=clock,
        )
        self.surface.model = self.target.model
        self.scheduler: Scheduler | None = None
        self.http_port: int | None = None

    def _engine_read(self, target: ProbeTarget, load: EngineLoad) -> None:
        self.surface.on_engine_load(target, load)

    async def run(self, stop: asyncio.Event) -> None:
        with scrubbed_logs(self.secrets):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        async with new_connections() as connections:
            prober = MicroProbe(connections, self.lag, engines=self.checks.engines)
            slots = ProbeSlots(self.checks.starter(prober))
            http = await start_http(self.surface.http_app(), self.http)
            self.http_port = bound_port(http)
            settle_heap()  # what is alive now lives as long as the process (app.heap)
            self.scheduler = probe_scheduler(self.control, [self.target], slots)
            log.info("agent serving", extra={"engine": self.address, "http": self.http})
            try:
                await self._supervise(self.scheduler, stop)
            finally:
                await stop_within(HTTP_STOP_S, "the HTTP server", http.cleanup())

    async def _supervise(self, scheduler: Scheduler, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            jobs = [self.lag.run, scheduler.run, *self.checks.tasks(), *self.surface.tasks()]
            tasks = [group.create_task(job()) for job in jobs]
            if self.file.probe.model is None:
                tasks.append(group.create_task(self._find_model(), name="model"))
            await stop.wait()
            log.info("shutting down")
            await cancel_within(tasks, TASKS_STOP_S)

    async def _find_model(self) -> None:
        """The model to name in the probe: the first id of the engine's model list, found
        once per engine process (``AgentSurface.engine_generation``), retried every
        interval until the engine answers."""
        path = self.file.probe.models_path or MODELS_PATH
        found_for: int | None = None
        async with open_connections() as connections:
            reads = SideReads(connections)
            while True:
                generation = self.surface.engine_generation
                if found_for != generation:
                    try:
                        served = await reads.models(self.target, path)
                    except READ_ERRORS:
                        served = ()
                    if served:
                        found_for = generation
                        self._retarget(self.file.target(self.address, served[0]))
                await asyncio.sleep(self.file.probe.interval)

    def _retarget(self, target: ProbeTarget) -> None:
        if target.model == self.target.model:
            return
        log.info("engine model found", extra={"endpoint": self.address, "model": target.model})
        self.target = target
        self.surface.model = target.model
        if self.scheduler is not None:
            self.scheduler.update([target])
        self.checks.set_targets([target])
