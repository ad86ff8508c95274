"""``make demo-vllm``'s backends: three real vLLM servers (docs/engines/vllm.md). vllm-a
stays as it is; vllm-b's EngineCore is frozen (SIGSTOP) a third of the way in, while its
API server goes on answering ``/health`` 200, and thawed two thirds in; vllm-c is
saturated for the whole run by streamed users beyond its batch (docs/design.md §3.5: busy
is not broken). The table adds each server's own ``/health`` answer; every state change
``serve`` reports is an event line, and a summary follows the run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llm_health.bootstrap import free_port

from . import engine
from .show import (
    HEADER,
    Shares,
    StateLog,
    Timeline,
    envoy_requests,
    envoy_sees,
    find_endpoint,
    probe_cells,
    share_cell,
)
from .stage import Spawner, Stage, read

START_WITHIN_S = 300.0  # 25-35 s alone on an idle 2-core machine; three at once are slower
HEALTHY_WITHIN_S = 90.0  # all three HEALTHY in serve before the clock starts
STOP_GRACE_S = 20.0
USERS_STOP_S = 15.0  # the users' last streams, before the servers stop
WATCH_EVERY_S = 0.25
# Three engines on two cores answer an idle probe in 500-730 ms at first
# (docs/engines/vllm.md): the product's 200 ms / 800 ms would call them slow or dead.
PROBE = {"interval": "1s", "timeout": "2s", "healthy_ttft": "1s"}
USERS, USER_TOKENS, SATURATED_SEQS = 12, 16, 2  # a queue of about 10
ENGINE_NICE = 10  # below serve, Envoy and the stage (see ``VllmCast.__init__``)
VLLM_HEADER = [*HEADER[:5], "own /health", *HEADER[5:]]


@dataclass
class Server:
    name: str
    cpus: str  # VLLM_CPU_OMP_THREADS_BIND: core ids, or "nobind"
    max_num_seqs: int
    nice: int = 0
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    fault: str = "none"
    frozen: int | None = None  # the EngineCore's pid while SIGSTOPped
    ready_s: float = 0.0
    own_health: str = "-"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Freeze:
    """What the demo measured about vllm-b's freeze."""

    at: float | None = None
    thawed_at: float | None = None
    out_after: float | None = None  # seconds from the freeze to UNHEALTHY in serve
    back_after: float | None = None  # from the thaw to HEALTHY
    states: StateLog = field(default_factory=StateLog)  # while frozen


class VllmCast:
    header = VLLM_HEADER
    model = engine.SERVED_NAME
    rate_per_s = 2.0
    user_timeout_s = 10.0

    def __init__(self, timeline: Timeline, venv: Path, model_dir: Path) -> None:
        self.timeline = timeline
        self.venv, self.model_dir = venv, model_dir
        # No engine's threads bound to a core: an idle vLLM worker spins on its message
        # queue for a second after each read, and an engine bound to a core beside
        # another starved (docs/engines/vllm.md, "The demo"). The engines run at a lower
        # priority: each stands for an engine on hardware of its own, so they must not
        # take the CPU serve and Envoy need (a starved serve discards its own probes as
        # "prober event loop lagged" and judges nothing: docs/design.md §7).
        self.normal = Server("vllm-a", "nobind", 8, nice=ENGINE_NICE)
        self.frozen = Server("vllm-b", "nobind", 8, nice=ENGINE_NICE)
        self.saturated = Server("vllm-c", "nobind", SATURATED_SEQS, nice=ENGINE_NICE)
        self.servers = [self.normal, self.frozen, self.saturated]
        self.shares = Shares()
        self.states = StateLog()
        self.freeze = Freeze()
        self.load_log: Path | None = None
        self.users: subprocess.Popen[bytes] | None = None
        self.events: list[str] = []  # the stage's, once started
        self.sampled_for = 0.0

    def addresses(self) -> list[str]:
        return [server.address for server in self.servers]

    def probe_yaml(self) -> str:
        return (
            f"{{interval: {PROBE['interval']}, timeout: {PROBE['timeout']}, "
            f"healthy_ttft: {PROBE['healthy_ttft']},\n"
            f"   api: openai-chat, model: {engine.SERVED_NAME}, verify: {{enabled: false}},\n"
            "   quality: {window: 15s, min_requests: 20}}"
        )  # random weights have no known answer (docs/engines/vllm.md)

    def title(self, elapsed: float) -> str:
        t = self.timeline
        return (
            f"llm-health demo on vLLM   t={elapsed:4.0f}s / {t.end_at:.0f}s   "
            f"({self.frozen.name} frozen at {t.break_at:.0f}s, thawed at {t.heal_at:.0f}s; "
            f"{self.saturated.name}: {USERS} users)\n"
            f"probes every {PROBE['interval']}, timeout {PROBE['timeout']}, healthy TTFT < "
            f"{PROBE['healthy_ttft']} (three engines on two cores are slow even when idle)"
        )

    # --- start ---------------------------------------------------------------------------

    async def start(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        self.events = stage.events
        python = self.venv / "bin" / "python"
        if not python.exists() or not (self.model_dir / "config.json").exists():
            raise SystemExit(
                f"no vLLM at {self.venv} or no model at {self.model_dir}: run `make demo-vllm`"
                " (installs vLLM and makes the model)"
            )
        print(
            f"starting {len(self.servers)} vLLM servers (about 2.6 GB each; 25-35 s each "
            "alone, longer together on a small machine)...",
            flush=True,
        )
        await asyncio.gather(*(self._start(stage, session, s) for s in self.servers))

    async def _start(self, stage: Stage, session: aiohttp.ClientSession, server: Server) -> None:
        started = time.monotonic()
        state = self.venv.parent / "state"
        await stage.start_on_free_ports(session, server.name, self._spawner(stage, server, state),
                                        START_WITHIN_S)  # fmt: skip
        server.ready_s = time.monotonic() - started
        print(f"{server.name} on {server.address}: /health 200 after {server.ready_s:.0f} s")

    def _spawner(self, stage: Stage, server: Server, state: Path) -> Spawner:
        def spawn() -> tuple[subprocess.Popen[bytes], str]:
            server.port = free_port()
            server.process = stage.spawn(
                server.name,
                engine.command(self.venv, self.model_dir, server.port, server.max_num_seqs),
                env=engine.environment(state, server.cpus),
                own_group=True,  # the API server, its EngineCore and its worker
                nice=server.nice,
                grace_s=STOP_GRACE_S,
            )
            return server.process, f"http://{server.address}/health"

        return spawn

    async def ready(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        """Wait (bounded) until serve calls all three HEALTHY: the clock starts then."""
        print("waiting for llm-health to call the three servers HEALTHY...", flush=True)
        started = time.monotonic()
        states: dict[str, str] = {}
        while time.monotonic() - started < HEALTHY_WITHIN_S:
            states = self._states(await stage.status(session))
            if all(s == "HEALTHY" for s in states.values()):
                print(f"all HEALTHY after {time.monotonic() - started:.0f} s", flush=True)
                return
            await asyncio.sleep(0.5)
        print(f"not all HEALTHY within {HEALTHY_WITHIN_S:.0f} s ({states}); going on", flush=True)

    def _states(self, status: dict[str, Any]) -> dict[str, str]:
        return {
            s.name: str(find_endpoint(status, s.address).get("state", "?")).upper()
            for s in self.servers
        }

    # --- the timeline ----------------------------------------------------------------------

    async def act(self, stage: Stage, session: aiohttp.ClientSession, elapsed: float) -> None:
        t = self.timeline
        if self.load_log is None:
            self._saturate(stage, elapsed, t.end_at - elapsed)
        if self.freeze.at is None and elapsed >= t.break_at:
            await self._freeze(stage, session, elapsed)
        if self.freeze.thawed_at is None and elapsed >= t.heal_at:
            self._thaw(stage, elapsed)

    def _saturate(self, stage: Stage, at: float, seconds: float) -> None:
        server = self.saturated
        name = f"users-{server.name}"
        self.load_log = stage.workdir / f"{name}.log"
        self.users = stage.spawn(
            name,
            [sys.executable, "-m", "llm_health.demo.users", "--port", str(server.port),
             "--users", str(USERS), "--seconds", f"{seconds:.1f}", "--model", self.model,
             "--max-tokens", str(USER_TOKENS)],
            nice=10,  # the users stand for clients on other machines
            grace_s=5.0,
        )  # fmt: skip
        server.fault = f"{USERS} users"
        stage.event(at, f"{server.name}: {USERS} streamed users start (batch of {SATURATED_SEQS})")

    async def _freeze(self, stage: Stage, session: aiohttp.ClientSession, at: float) -> None:
        server = self.frozen
        assert server.process is not None
        try:
            pid = engine.engine_core(server.process.pid)
        except LookupError as exc:
            raise SystemExit(f"{server.name}: {exc}; is it vLLM V1?") from exc
        os.kill(pid, signal.SIGSTOP)
        server.frozen, server.fault, self.freeze.at = pid, "frozen", at
        code = await own_health(session, server)
        stage.event(at, f"{server.name} EngineCore (pid {pid}) frozen; its /health still {code}")

    def _thaw(self, stage: Stage, at: float) -> None:
        server = self.frozen
        self._cont(server)
        server.fault, self.freeze.thawed_at = "thawed", at
        stage.event(at, f"{server.name} EngineCore thawed")

    @staticmethod
    def _cont(server: Server) -> None:
        if server.frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.frozen, signal.SIGCONT)
            server.frozen = None

    async def watch(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        """serve's verdicts every WATCH_EVERY_S: an event at each change, the time the
        frozen server took to go out and come back, the seconds in each state."""
        while True:
            status = await stage.status(session)
            at = time.monotonic() - stage.start
            for server in self.servers:
                endpoint = find_endpoint(status, server.address)
                if not endpoint:
                    continue  # no answer from serve in time: no sample
                state = str(endpoint.get("state", "?")).upper()
                if self.states.sample(server.name, state, at):
                    stage.event(at, f"{server.name} {state}: {endpoint.get('reason', '')}")
                if server is self.frozen:
                    self._watch_freeze(state, at)
            self.sampled_for = at
            await asyncio.sleep(WATCH_EVERY_S)

    def _watch_freeze(self, state: str, at: float) -> None:
        freeze = self.freeze
        if freeze.at is None:
            return
        if freeze.thawed_at is None:
            freeze.states.sample(self.frozen.name, state, at)
            if state == "UNHEALTHY" and freeze.out_after is None:
                freeze.out_after = at - freeze.at
        elif state == "HEALTHY" and freeze.back_after is None:
            freeze.back_after = at - freeze.thawed_at

    # --- the table -----------------------------------------------------------------------

    async def rows(
        self, session: aiohttp.ClientSession, status: dict[str, Any], envoy: dict[str, Any]
    ) -> list[list[str]]:
        counts = {s.name: envoy_requests(envoy, s.port) for s in self.servers}
        shares = self.shares.update(time.monotonic(), counts)
        codes = await asyncio.gather(*(own_health(session, s) for s in self.servers))
        rows = []
        for server, code in zip(self.servers, codes, strict=True):
            endpoint = find_endpoint(status, server.address)
            state, weight, ttft, outcome = probe_cells(endpoint)
            rows.append(
                [
                    server.name,
                    server.fault,
                    state,
                    weight,
                    envoy_sees(envoy, server.port),
                    code,
                    ttft,
                    outcome,
                    share_cell(shares.get(server.name, 0.0)),
                    str(endpoint.get("reason", "")),
                ]
            )
        return rows

    # --- the end -------------------------------------------------------------------------

    def before_stop(self) -> None:
        """A stopped EngineCore cannot act on its API server's shutdown: thaw it first.
        The users end their streams before the servers go (else they count as failed)."""
        self._cont(self.frozen)
        if self.users is not None and self.users.poll() is None:
            self.users.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.users.wait(USERS_STOP_S)

    def report(self) -> list[str]:
        lines = [
            "",
            "vLLM servers' /health 200 after "
            + ", ".join(f"{s.name} {s.ready_s:.0f} s" for s in self.servers),
            f"serve's states, sampled every {WATCH_EVERY_S} s over {self.sampled_for:.0f} s "
            "of traffic:",
        ]
        for server in self.servers:
            lines.append(f"  {server.name}: {self.states.summary(server.name)}")
        freeze = self.freeze
        if freeze.at is not None:
            out = "never" if freeze.out_after is None else f"{freeze.out_after:.1f} s"
            back = "not seen" if freeze.back_after is None else f"{freeze.back_after:.1f} s"
            lines += [
                f"  {self.frozen.name} while frozen: {freeze.states.summary(self.frozen.name)}",
                f"  {self.frozen.name} UNHEALTHY after the freeze: {out}; "
                f"HEALTHY after the thaw: {back}",
            ]
        lines += ["events:", *(f"  {event}" for event in self.events)]
        if self.load_log is not None:
            counted = _last_json(read(self.load_log))
            lines.append(
                f"{self.saturated.name}'s {USERS} users: {counted.get('completed', '?')} "
                f"streams completed, {counted.get('errors', '?')} failed"
            )
        return lines


async def own_health(session: aiohttp.ClientSession, server: Server) -> str:
    """vLLM's own ``GET /health``: its status code, or why there is none."""
    try:
        async with session.get(
            f"http://{server.address}/health", timeout=aiohttp.ClientTimeout(total=1)
        ) as response:
            return str(response.status)
    except TimeoutError:
        return "no answer"
    except aiohttp.ClientError:
        return "refused"


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}
