"""Processes the benchmarks start: simulators on fixed ports, and /proc readings.

Unlike ``tests/processes.py`` (blocking, for tests), :class:`Sim` never blocks the event
loop: it spawns with ``subprocess.Popen`` and waits for its ports with ``asyncio``, so a
benchmark can kill and restart a backend while its load keeps running. Every process
started here is stopped by whoever started it (``stop``/``kill`` in a ``finally``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from common import wait_port

ROOT = Path(__file__).resolve().parents[1]
_TICKS = os.sysconf("SC_CLK_TCK")


def child_env() -> dict[str, str]:
    """The environment of every process started here: this tree's plugin code first."""
    path = os.pathsep.join([str(ROOT / "plugin"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


class Sim:
    """``llm-health sim`` serving ``port .. port+count-1`` (one shared fault state)."""

    def __init__(self, port: int, count: int = 1, args: tuple[str, ...] = ()) -> None:
        self.port, self.count, self.args = port, count, args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    def spawn(self) -> Sim:
        command = [sys.executable, "-m", "llm_health.cli", "sim", "--port", str(self.port)]
        command += ["--port-count", str(self.count), *self.args]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=child_env(),
            cwd=ROOT,
        )
        return self

    async def up(self, timeout_s: float = 30.0) -> Sim:
        """Wait until the last port accepts connections."""
        await wait_port(self.port + self.count - 1, timeout_s)
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"sim on {self.port} exited with {self.process.returncode}")
        return self

    async def set_fault(self, session: aiohttp.ClientSession, knobs: dict[str, Any]) -> None:
        async with session.post(f"{self.base_url}/sim/fault", json=knobs) as response:
            if response.status != 200:
                raise RuntimeError(f"sim {self.port}: {response.status} {await response.text()}")

    def kill(self) -> None:
        """SIGKILL (a crash: connections reset, port closed) and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 5 s; always reaps."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (``/proc/PID/stat``)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a live process (``/proc/PID/stat``'s utime, stime):
    what ran in the process's own code, and what the kernel did for it (the syscalls)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size in MiB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"
