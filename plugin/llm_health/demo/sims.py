"""``make demo``'s backends: three ``llm-health sim`` processes, a fast one, a slow one
(Degraded) and a zombie whose /health says 200 while inference hangs. A third of the way
in the fast one starts failing with a CUDA error; two thirds in, it heals."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from llm_health.bootstrap import free_port

from .show import (
    HEADER,
    Shares,
    Timeline,
    envoy_sees,
    find_endpoint,
    probe_cells,
    share_cell,
)
from .stage import CLI, Spawner, Stage, get_json

MODEL = "demo-model"


@dataclass
class Sim:
    name: str
    role: str
    args: list[str]
    port: int = 0
    fault: str = "none"


class SimCast:
    header = HEADER
    model = MODEL
    rate_per_s = 10.0
    user_timeout_s = 5.0

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.sims = [
            Sim("fast", "healthy (TTFT 40 ms)", ["--ttft", "40ms", "--ttft-jitter", "10ms"]),
            Sim(
                "slow",
                "slow (TTFT 350 ms) -> Degraded",
                ["--ttft", "350ms", "--ttft-jitter", "20ms"],
            ),
            Sim("zombie", "/health 200, inference hangs", ["--fault", "hang_after_headers"]),
        ]
        self.shares = Shares()
        self.broken = self.healed = False

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{sim.port}" for sim in self.sims]

    def probe_yaml(self) -> str:
        return (
            f"{{interval: 1s, timeout: 800ms, healthy_ttft: 200ms, model: {MODEL},\n"
            "   quality: {window: 15s, min_requests: 20}}"
        )

    def title(self, elapsed: float) -> str:
        t = self.timeline
        return (
            f"llm-health demo   t={elapsed:4.0f}s / {t.end_at:.0f}s   "
            f"(CUDA error at {t.break_at:.0f}s, heal at {t.heal_at:.0f}s)"
        )

    async def start(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        for sim in self.sims:
            sim.fault = "hang_after_headers" if sim.name == "zombie" else "none"

        def spawner(sim: Sim) -> Spawner:
            def spawn() -> tuple[subprocess.Popen[bytes], str]:
                sim.port = free_port()
                command = [*CLI, "sim", "--port", str(sim.port), "--model", MODEL]
                process = stage.spawn("sim-" + sim.name, [*command, *sim.args])
                return process, f"http://127.0.0.1:{sim.port}/health"

            return spawn

        await asyncio.gather(
            *(stage.start_on_free_ports(session, "sim-" + s.name, spawner(s)) for s in self.sims)
        )

    async def ready(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        return None

    async def watch(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        return None

    async def act(self, stage: Stage, session: aiohttp.ClientSession, elapsed: float) -> None:
        fast = self.sims[0]
        if not self.broken and elapsed >= self.timeline.break_at:
            self.broken = await self._set_fault(stage, session, fast, "cuda_error", elapsed)
        if not self.healed and elapsed >= self.timeline.heal_at:
            self.healed = await self._set_fault(stage, session, fast, "none", elapsed)

    async def _set_fault(
        self, stage: Stage, session: aiohttp.ClientSession, sim: Sim, fault: str, at: float
    ) -> bool:
        url = f"http://127.0.0.1:{sim.port}/sim/fault"
        async with session.post(url, json={"fault": fault}) as response:
            response.raise_for_status()
        sim.fault = fault
        what = "now fails with a CUDA error" if fault != "none" else "healed"
        stage.event(at, f"backend '{sim.name}' {what}")
        return True

    async def rows(
        self, session: aiohttp.ClientSession, status: dict[str, Any], envoy: dict[str, Any]
    ) -> list[list[str]]:
        shares = self.shares.update(time.monotonic(), await self._user_requests(session))
        return [self._row(sim, status, envoy, shares) for sim in self.sims]

    async def _user_requests(self, session: aiohttp.ClientSession) -> dict[str, int]:
        """Each simulator's requests but the probes (it counts both: /sim/stats)."""
        counts = {}
        for sim in self.sims:
            stats = await get_json(session, f"http://127.0.0.1:{sim.port}/sim/stats")
            counts[sim.name] = int(stats.get("requests", 0)) - int(stats.get("probe_requests", 0))
        return counts

    def _row(
        self,
        sim: Sim,
        status: dict[str, Any],
        envoy: dict[str, Any],
        shares: dict[str, float],
    ) -> list[str]:
        endpoint = find_endpoint(status, f"127.0.0.1:{sim.port}")
        state, weight, ttft, outcome = probe_cells(endpoint)
        return [
            sim.name,
            sim.fault,
            state,
            weight,
            envoy_sees(envoy, sim.port),
            ttft,
            outcome,
            share_cell(shares.get(sim.name, 0.0)),
            str(endpoint.get("reason", "")),
        ]

    def before_stop(self) -> None:
        return None

    def report(self) -> list[str]:
        return []
