"""Real processes for end-to-end tests: simulators and the plugin (`llm-health serve`).

Each class starts a subprocess on loopback, waits until it answers, and is always stopped
by the test that started it (context manager, or ``stop()``/``kill()`` in a finally).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.polling import WaitTimeout, wait_until
from tests.ports import free_port

T = TypeVar("T")

#: How long a process may take to come up. Generous: on a loaded 2-core machine starting
#: a Python interpreter alone can take many seconds. A process that exits meanwhile fails
#: the wait at once, so this bounds only a slow start, never a broken one.
START_WITHIN_S = 60.0

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "plugin"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
    """GET (or POST ``body`` as JSON) and decode the JSON answer; proxies ignored."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    with _OPENER.open(request, timeout=timeout) as response:
        return json.loads(response.read())


class ProcessExited(RuntimeError):
    """The process died while a test waited for it."""


class _Process:
    name = "process"

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.log_path = workdir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._terminated_at: float | None = None

    def _spawn(self, args: list[str]) -> None:
        self._terminated_at = None
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llm_health.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=ROOT,
            )

    def _check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ProcessExited(f"{self.name} exited: {self.log_tail()}")

    def _wait(self, predicate: Callable[[], T], timeout: float, what: str) -> T:
        """:func:`tests.polling.wait_until`, failing at once if the process exits, with the
        log tail on a timeout. Only connection-level errors count as "not yet"."""

        def check() -> T:
            self._check_running()
            return predicate()

        try:
            return wait_until(check, timeout, what, ignore=(OSError, http.client.HTTPException))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n--- {self.name} log tail ---\n{self.log_tail()}") from exc

    def _wait_http(self, url: str, timeout: float) -> None:
        def answers() -> bool:
            _OPENER.open(url, timeout=1).close()
            return True

        self._wait(answers, timeout, f"{url} to answer")

    def terminate(self) -> None:
        """SIGTERM (once), without waiting: :meth:`stop` waits."""
        if self.process is not None and self.process.poll() is None and not self._terminated_at:
            self._terminated_at = time.monotonic()
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 5.0) -> tuple[int | None, float]:
        """SIGTERM (unless :meth:`terminate` sent it); returns (exit code, seconds since
        the signal). SIGKILL if it overstays ``timeout``."""
        if self.process is None or (self.process.poll() is not None and not self._terminated_at):
            return (self.process.returncode if self.process else None), 0.0
        self.terminate()
        started = self._terminated_at or time.monotonic()
        try:
            code = self.process.wait(max(0.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        self._terminated_at = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class SimProcess(_Process):
    """``llm-health sim`` on its own port; faults and counters over its HTTP API."""

    def __init__(
        self, workdir: Path, name: str, *args: str, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.name = f"sim-{name}"
        super().__init__(workdir)
        self.host = host
        self.port = port or free_port()
        self._first_fault: dict[str, Any] = {}
        self._spawn(["sim", "--host", host, "--port", str(self.port), *args])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_up(self, timeout: float = START_WITHIN_S) -> SimProcess:
        self._wait_http(f"http://{self.address}/health", timeout)
        self._first_fault = http_json(f"http://{self.address}/sim/fault")
        return self

    def set_fault(self, **knobs: Any) -> None:
        http_json(f"http://{self.address}/sim/fault", knobs)

    def reset(self) -> None:
        """Back to how it came up: the fault settings of its command line, counters and
        recent requests cleared. One simulator can then serve several tests in turn
        (each with a runtime of its own, stopped before the next test)."""
        http_json(f"http://{self.address}/sim/fault", self._first_fault)
        http_json(f"http://{self.address}/sim/stats/reset", {})

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"http://{self.address}/sim/stats")
        return result

    def user_requests(self) -> int:
        """Inference requests that were not probes (i.e. routed by Envoy)."""
        stats = self.stats()
        return int(stats["requests"]) - int(stats["probe_requests"])


class PluginProcess(_Process):
    """``llm-health serve`` with a config written from ``settings`` (the ``grpc`` and
    ``http`` ports filled in; other ``server`` keys in ``settings`` are kept)."""

    name = "plugin"

    def __init__(self, workdir: Path, settings: dict[str, Any]) -> None:
        super().__init__(workdir)
        self.grpc_port, self.http_port = free_port(), free_port()
        settings = {
            **settings,
            "server": {
                **settings.get("server", {}),
                "grpc": f"127.0.0.1:{self.grpc_port}",
                "http": f"127.0.0.1:{self.http_port}",
            },
        }
        self.config_path = workdir / "llm-health.yaml"
        self.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))

    def start(self) -> PluginProcess:
        self._spawn(["serve", "--config", str(self.config_path), "--log-format", "json"])
        return self

    def wait_ready(self, timeout: float = START_WITHIN_S) -> PluginProcess:
        self._wait_http(f"http://127.0.0.1:{self.http_port}/livez", timeout)
        self._wait(
            lambda: http_json(f"http://127.0.0.1:{self.http_port}/readyz") or True,
            timeout,
            "the plugin to be ready",
        )
        return self

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"http://127.0.0.1:{self.http_port}/status")
        return result

    def states(self) -> dict[str, str]:
        """endpoint address -> plugin state, over every cluster."""
        return {e["address"]: e["state"] for c in self.status()["clusters"] for e in c["endpoints"]}

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


@contextlib.contextmanager
def running_sims(workdir: Path, prefix: str, count: int, *args: str) -> Iterator[list[SimProcess]]:
    """``count`` simulators (``llm-health sim *args``), each up before the block runs;
    all stopped at its end."""
    started: list[SimProcess] = []
    try:
        started.extend(SimProcess(workdir, f"{prefix}{i}", *args) for i in range(count))
        yield [s.wait_up() for s in started]
    finally:
        stop_all(started)


def stop_all(processes: Iterable[Any]) -> None:
    """Stop what a test started (simulators, plugins, Envoys: anything with ``stop()``),
    side by side: SIGTERM to every simulator and plugin first, then each stopped and
    waited for in the given order. One that fails to stop does not keep the others up."""
    processes = list(processes)
    for process in processes:
        if isinstance(process, _Process):
            process.terminate()
    for process in processes:
        with contextlib.suppress(Exception):
            process.stop()


class AgentProcess(_Process):
    """``llm-health agent --engine ENGINE`` on its own HTTP port, with ``--config`` written
    from ``settings`` (None: no ``--config``, every default)."""

    name = "agent"

    def __init__(self, workdir: Path, engine: str, settings: dict[str, Any] | None = None) -> None:
        super().__init__(workdir)
        self.engine = engine
        self.http_port = free_port()
        self.config_path: Path | None = None
        if settings is not None:
            self.config_path = workdir / "agent.yaml"
            self.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> AgentProcess:
        args = ["agent", "--engine", self.engine, "--http", f"127.0.0.1:{self.http_port}"]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        self._spawn([*args, "--log-format", "json"])
        return self

    def wait_up(self, timeout: float = 20.0) -> AgentProcess:
        self._wait_http(f"{self.base_url}/healthz", timeout)
        return self

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(status, body) of ``GET path``; a new connection each time, as the kubelet's."""
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            connection.close()

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"{self.base_url}/status")
        return result
